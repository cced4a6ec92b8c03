"""Talking to a TVM RPC tracker with a bound on every step: addresses, the tracker protocol,
and the pre-flight check that runs before anything is built.

TVM's own client cannot be bounded: `tvm.rpc.connect_tracker` retries a refused
connection every 5 s for 60 s, and `TrackerSession.request` waits forever for a
key no server has (the tracker queues the request). So cachetile speaks the
tracker's small protocol (tvm/rpc/tracker.py: a magic number, then
`[int32 length][json]` messages) on its own sockets, with timeouts, and checks
the tracker's summary for the key before it asks for a server.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable

from ..models.errors import InvalidInput, Unavailable


class RpcError(Unavailable):
    """The RPC tracker or a server cannot do what was asked, in one line (exit 2, HTTP 422)."""


@dataclass(frozen=True)
class RpcAddress:
    """A tracker and the key of the servers to measure on."""

    host: str
    port: int
    key: str

    def __str__(self) -> str:
        return f"{self.tracker}:{self.key}"

    @property
    def tracker(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_rpc(spec: str) -> RpcAddress:
    """`HOST:PORT:KEY` (HOST may be `[IPv6]`) -> RpcAddress; InvalidInput in one line otherwise."""
    usage = f"expects HOST:PORT:KEY (e.g. 127.0.0.1:9190:cpu), got {spec!r}"
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInput(usage)
    spec = spec.strip()
    if spec.startswith("["):
        close = spec.find("]")
        parts = spec[close + 2:].split(":") if close > 0 and spec[close + 1:close + 2] == ":" else []
        if len(parts) != 2:
            raise InvalidInput(usage)
        host, (port_text, key) = spec[1:close], parts
    else:
        parts = spec.split(":")
        if len(parts) != 3:
            raise InvalidInput(usage + (": the key may not contain ':'" if len(parts) > 3 else ""))
        host, port_text, key = parts
    if not host:
        raise InvalidInput(f"{usage}: empty host")
    if not port_text.isdigit():
        raise InvalidInput(f"{usage}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise InvalidInput(f"{usage}: port {port} is outside 1-65535")
    if not key or any(c.isspace() for c in key):
        raise InvalidInput(f"{usage}: the key must be non-empty and without spaces")
    return RpcAddress(host, port, key)


def call_with_timeout(fn: Callable, timeout: float, what: str):
    """fn() in a daemon thread; RpcError if it has not returned after `timeout` s.

    The thread is abandoned, not killed: TVM's RPC calls block in C++ and cannot be
    interrupted. It ends when the other side closes its socket.
    """
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"rpc: {what}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RpcError(f"{what}: no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _resolve(host: str, port: int, timeout: float) -> tuple:
    """getaddrinfo with a bound: a lookup with no reachable resolver can block for long."""
    try:
        infos = call_with_timeout(lambda: socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM), timeout,
                                  f"resolving {host}")
    except socket.gaierror as exc:
        raise RpcError(f"cannot resolve RPC tracker host {host!r}: {exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


_MAGIC = 0x2F271  # tvm.rpc.base.RPC_TRACKER_MAGIC
_SUCCESS, _REQUEST, _SUMMARY = 0, 4, 6  # tvm.rpc.base.TrackerCode


def _recvall(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 65536))
        if not chunk:
            raise ConnectionResetError("the peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class TrackerClient:
    """One connection to a tracker; every step has a timeout and fails with a one-line RpcError."""

    def __init__(self, rpc: RpcAddress, timeout: float = 5.0):
        self.rpc = rpc
        family, sockaddr = _resolve(rpc.host, rpc.port, timeout)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            sock.sendall(struct.pack("<i", _MAGIC))
            magic = struct.unpack("<i", _recvall(sock, 4))[0]
        except BaseException as exc:
            sock.close()
            raise self._connect_error(exc, timeout) from None
        if magic != _MAGIC:
            sock.close()
            raise RpcError(f"{rpc.tracker} is not a TVM RPC tracker (bad handshake)")
        self.sock = sock

    def _connect_error(self, exc: BaseException, timeout: float) -> BaseException:
        where = self.rpc.tracker
        if isinstance(exc, ConnectionRefusedError):
            return RpcError(f"no RPC tracker at {where} (connection refused)")
        if isinstance(exc, socket.timeout):
            return RpcError(f"RPC tracker {where} did not answer within {timeout:g} s "
                            "(unreachable, or not a TVM RPC tracker)")
        if isinstance(exc, ConnectionResetError):
            return RpcError(f"{where} is not a TVM RPC tracker (the peer closed the connection)")
        if isinstance(exc, OSError):
            return RpcError(f"RPC tracker {where} unreachable: {exc.strerror or exc}")
        return exc

    def _exchange(self, message: list, timeout: float, waiting_for: str):
        self.sock.settimeout(timeout)
        try:
            raw = json.dumps(message).encode()
            self.sock.sendall(struct.pack("<i", len(raw)) + raw)
            size = struct.unpack("<i", _recvall(self.sock, 4))[0]
            value = json.loads(_recvall(self.sock, size).decode())
        except socket.timeout:
            raise RpcError(f"{waiting_for} within {timeout:g} s") from None
        except OSError as exc:
            raise RpcError(f"RPC tracker {self.rpc.tracker} dropped the connection ({exc})") from None
        if not isinstance(value, list) or not value or value[0] != _SUCCESS:
            raise RpcError(f"RPC tracker {self.rpc.tracker} sent an unexpected answer {value!r:.100}")
        return value[1] if len(value) > 1 else None

    def summary(self, timeout: float = 5.0) -> dict:
        """The tracker's `queue_info` (per key: free, pending) and `server_info` (each server's key, addr)."""
        return self._exchange([_SUMMARY], timeout, f"RPC tracker {self.rpc.tracker} did not send its summary")

    def request(self, key: str, timeout: float, priority: int = 1) -> tuple[str, int, str]:
        """Wait up to `timeout` s for a free server with `key`: (host, port, match key).

        A request the tracker cannot serve stays queued there; closing this connection
        abandons it (the tracker drops requests whose socket is closed).
        """
        value = self._exchange([_REQUEST, key, "", priority], timeout, f"no server with key {key!r} became free")
        host, port, matchkey = value
        return host, int(port), matchkey

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> TrackerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def servers_for_key(summary: dict, key: str) -> list[tuple[str, int]]:
    """Addresses of the servers (free or busy) registered with `key`. `server_info`, not
    `queue_info`: the tracker adds a queue for any key a client merely asked for."""
    return [tuple(s["addr"]) for s in summary.get("server_info", []) if s.get("key") == f"server:{key}"]


def preflight(rpc: RpcAddress, timeout: float = 5.0) -> list[tuple[str, int]]:
    """Check that the tracker answers and has servers with the key; returns their addresses.
    RpcError in one line otherwise (within about `timeout` s)."""
    with TrackerClient(rpc, timeout) as tracker:
        summary = tracker.summary(timeout)
    servers = servers_for_key(summary, rpc.key)
    if not servers:
        keys = sorted({s["key"].split(":", 1)[1] for s in summary.get("server_info", []) if ":" in s.get("key", "")})
        known = f"its keys: {', '.join(keys)}" if keys else "no server is registered"
        raise RpcError(f"RPC tracker {rpc.tracker} has no server with key {rpc.key!r} ({known})")
    return servers
