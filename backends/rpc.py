"""Measure exported CPU kernels on a fleet of TVM RPC servers behind a tracker.

`measure_remote` sends each kernel to a free server (one session per kernel,
as many at once as the tracker has servers with the key), checks its result
against the numpy reference there and times it with TVM's time_evaluator on
the server, so the number is the server's. Nothing blocks without a bound:

- the pre-flight (rpc_tracker.preflight) fails in one line before anything is
  sent when the tracker is unreachable, is not a tracker, or has no server
  with the key (TVM's own request would wait forever);
- every session is told its time limit (the server kills it after that), and
  the caller stops waiting at the same limit plus a grace period, since TVM's
  RPC calls have no socket timeout of their own (a frozen server);
- a failed attempt (the server died, froze, dropped the connection) is retried
  once, on another server when the tracker has one; a wrong result or a
  kernel slower than the limit is not retried.

`remote_target` asks a server for its LLVM triple, CPU and thread count, for
cross-compiling; `export_for` writes a .so when the triples match, else a .tar
the server links with its own compiler when it loads it.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from ..models.errors import InvalidInput, KernelMismatch
from .llvm_trials import Kernel, TooSlow, run_and_time
from .rpc_tracker import RpcAddress, RpcError, TrackerClient, call_with_timeout, preflight

GRACE_S = 2.0  # past a session's limit before the caller gives up on a silent server


@dataclass
class RemoteResult:
    name: str
    seconds: float | None = None  # median of the timed repeats
    max_abs_error: float | None = None
    server: str | None = None  # host:port that gave the result (or failed last)
    attempts: int = 0
    error: str | None = None  # one line, when it failed
    kind: str | None = None  # the error's kind: mismatch, timeout, unavailable
    wall: float = 0.0  # seconds from the first attempt to the result
    history: list[str] = field(default_factory=list)  # "server: reason" per failed attempt

    @property
    def ok(self) -> bool:
        return self.error is None


# What TVM's RPC errors mean, by a fragment of their text.
_KNOWN = [
    ("RPCSessionTimeoutError", "the server ended the session at its time limit"),
    ("code=kShutdown", "the server closed the connection mid-measurement (did it die?)"),
    ("SockChannel::Recv", "the connection to the server broke"),
    ("SockChannel::Send", "the connection to the server broke"),
    ("Connect to", "cannot connect to the server the tracker assigned"),
    ("cannot find server that matches key", "the server no longer holds the session the tracker assigned"),
]


def rpc_message(exc: BaseException) -> str:
    """One line for a TVM RPC failure: a known one in words, else its last meaningful line."""
    text = str(exc).strip() or type(exc).__name__
    for fragment, meaning in _KNOWN:
        if fragment in text:
            return meaning
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):  # TVM's errors end with "Kind: message" after their traceback
        if not line.startswith(("File ", "at ", "^", "~", "Traceback")):
            return line[:300]
    return lines[-1][:300]


@dataclass
class _Attempt:
    index: int
    number: int
    avoid: set
    created: float
    deadline: float
    started: float | None = None  # when a server was assigned
    server: str | None = None
    done: bool = False
    value: tuple | None = None  # (median s, max |error|)
    error: str | None = None
    kind: str = "unavailable"
    retryable: bool = True


Event = Callable[[str, str, str], None]  # (event, kernel name, server): "start", "done", "failed"


@dataclass
class _Options:
    rpc: RpcAddress
    timeout: float
    repeat: int
    connect_timeout: float
    queue_timeout: float
    servers: list
    on_event: Event | None


def _attempt(kernel: Kernel, att: _Attempt, cond: threading.Condition, o: _Options) -> None:
    """One try in a daemon thread: get a server from the tracker, upload, load, check, time."""
    from tvm import rpc as tvm_rpc

    def finish(**kw):
        with cond:
            if not att.done:
                for name, value in kw.items():
                    setattr(att, name, value)
                att.done = True
            cond.notify_all()

    try:
        with TrackerClient(o.rpc, o.connect_timeout) as tracker:
            host, port, matchkey = tracker.request(o.rpc.key, o.queue_timeout)
            # A retry prefers another server: leave this assignment unused (the server
            # re-registers it after a few seconds) and ask once more.
            if f"{host}:{port}" in att.avoid and len(o.servers) > 1:
                try:
                    host, port, matchkey = tracker.request(o.rpc.key, min(o.queue_timeout, 10.0))
                except RpcError:
                    pass
        server = f"{host}:{port}"
        with cond:
            if att.done:  # the caller gave up while this queued
                return
            att.server, att.started = server, time.monotonic()
            att.deadline = att.started + o.timeout + GRACE_S
            cond.notify_all()
        if o.on_event:
            o.on_event("start", kernel.name, server)
        # "-timeout=N" in the key: the server kills the session after N s.
        remote = tvm_rpc.connect(host, port, matchkey, session_timeout=int(o.timeout) + 1)
        name = f"{uuid.uuid4().hex[:8]}-{os.path.basename(kernel.path)}"
        remote.upload(kernel.path, name)
        value = run_and_time(kernel, remote.load_module(name), remote.cpu(), o.repeat, o.timeout)
        finish(value=value)
        if o.on_event:
            o.on_event("done", kernel.name, server)
    except KernelMismatch as exc:
        finish(error=str(exc), kind="mismatch", retryable=False)
    except TooSlow as exc:
        finish(error=str(exc), kind="timeout", retryable=False)
    except RpcError as exc:
        if "became free" in str(exc) and not _servers_left(o):
            finish(error=f"RPC tracker {o.rpc.tracker} has no server with key {o.rpc.key!r} any more",
                   retryable=False)
        else:
            finish(error=str(exc))
    except Exception as exc:  # noqa: BLE001 - TVM raises many kinds; each becomes one line
        if "RPCSessionTimeoutError" in str(exc):  # the kernel itself is too slow: a retry would be too
            finish(error=f"took longer than the {o.timeout:g} s time limit (the server ended the session)",
                   kind="timeout", retryable=False)
        else:
            finish(error=rpc_message(exc))
    # The session ends when the last reference to it (module, tensors, device) goes.


def _servers_left(o: _Options) -> bool:
    try:
        return bool(preflight(o.rpc, o.connect_timeout))
    except RpcError:
        return False


def measure_remote(kernels: list[Kernel], rpc: RpcAddress, timeout: float = 30.0, repeat: int = 10,
                   retries: int = 1, connect_timeout: float = 5.0, queue_timeout: float | None = None,
                   on_event: Event | None = None) -> list[RemoteResult]:
    """Measure every kernel on the servers behind `rpc`, in parallel, one session per kernel.

    timeout: seconds one session may take (connect, upload, load, check, time);
    queue_timeout: seconds to wait for a free server (default timeout + 10);
    each kernel gets 1 + `retries` attempts. Raises RpcError (one line) when the
    pre-flight fails; a kernel that fails has `error` set in its result.
    """
    servers = preflight(rpc, connect_timeout)
    o = _Options(rpc, timeout, repeat, connect_timeout, timeout + 10.0 if queue_timeout is None else queue_timeout,
                 servers, on_event)
    cond = threading.Condition()
    results: dict[int, RemoteResult] = {}
    first_seen: dict[int, float] = {}
    history: dict[int, list[str]] = {i: [] for i in range(len(kernels))}
    pending: list[tuple[int, int, set]] = [(i, 1, set()) for i in range(len(kernels))]
    running: list[_Attempt] = []

    def launch(i: int, number: int, avoid: set) -> None:
        now = time.monotonic()
        first_seen.setdefault(i, now)
        att = _Attempt(i, number, avoid, now, now + 2 * connect_timeout + o.queue_timeout + 1.0)
        running.append(att)
        threading.Thread(target=_attempt, args=(kernels[i], att, cond, o), daemon=True,
                         name=f"rpc measure {kernels[i].name}").start()

    def settle(att: _Attempt, now: float) -> None:
        i, name = att.index, kernels[att.index].name
        if att.error is None:
            seconds, error = att.value
            results[i] = RemoteResult(name, seconds, error, att.server, att.number, wall=now - first_seen[i],
                                      history=history[i])
            return
        history[i].append(f"{att.server or '?'}: {att.error}")
        if att.retryable and att.number <= retries:
            pending.insert(0, (i, att.number + 1, att.avoid | ({att.server} if att.server else set())))
            if on_event:
                on_event("failed", name, att.server or "?")
            return
        reason = att.error if att.number == 1 else f"{att.error} (after {att.number} attempts)"
        results[i] = RemoteResult(name, server=att.server, attempts=att.number, error=reason, kind=att.kind,
                                  wall=now - first_seen[i], history=history[i])
        if att.error.endswith("any more"):  # the fleet is gone: fail the queue at once
            for j, number, _ in pending:
                results[j] = RemoteResult(kernels[j].name, attempts=number - 1, error=att.error, kind=att.kind,
                                          history=history[j])
            pending.clear()

    with cond:
        while pending or running:
            while pending and len(running) < len(servers):
                launch(*pending.pop(0))
            now = time.monotonic()
            for att in list(running):
                if not att.done and now >= att.deadline:  # abandon the thread; a late answer is ignored
                    phase = "measuring" if att.started else "waiting for a server"
                    limit = o.timeout if att.started else att.deadline - att.created
                    att.error, att.kind, att.done = (f"no result after {limit:g} s {phase} "
                                                     f"(server {att.server or '?'})"), "timeout", True
                if att.done:
                    running.remove(att)
                    settle(att, now)
            if running and not (pending and len(running) < len(servers)):
                wait = min(a.deadline for a in running) - time.monotonic()
                cond.wait(max(0.0, min(wait, 1.0)) + 0.01)
    return [results[i] for i in range(len(kernels))]


def remote_target(rpc: RpcAddress, timeout: float = 20.0) -> dict:
    """The LLVM target of a server with rpc's key, as TVM's JSON form: kind, mtriple, mcpu and
    num-cores (the threads its runtime uses). A runtime-only server (the C++ tvm_rpc app) has
    no LLVM to ask; RpcError then says to pass --target-host."""
    from tvm import rpc as tvm_rpc

    preflight(rpc, min(timeout, 5.0))

    def ask():
        with TrackerClient(rpc, min(timeout, 5.0)) as tracker:
            host, port, matchkey = tracker.request(rpc.key, timeout)
        remote = tvm_rpc.connect(host, port, matchkey, session_timeout=int(timeout) + 1)
        try:
            triple = remote.get_function("target.llvm_get_system_triple")()
            cpu = remote.get_function("target.llvm_get_system_cpu")()
        except Exception as exc:  # noqa: BLE001
            raise RpcError(f"server {host}:{port} cannot report its LLVM target ({rpc_message(exc)}); "
                           "pass --target-host") from None
        threads = int(remote.get_function("runtime.NumThreads")())
        return {"kind": "llvm", "mtriple": str(triple), "mcpu": str(cpu), "num-cores": threads}

    return call_with_timeout(ask, timeout + 5.0, f"asking {rpc} for its target")


def export_for(lib, path: str, remote_triple: str | None) -> str:
    """Export `lib` so the remote can load it: a .so linked here when the remote has this
    machine's triple (or none is known), else a .tar of object files that the server links
    with its own C compiler when it loads it. Returns the path written."""
    import tvm

    base = os.path.splitext(path)[0]
    if remote_triple in (None, tvm.target.codegen.llvm_get_system_triple()):
        lib.export_library(base + ".so")
        return base + ".so"
    lib.export_library(base + ".tar")
    return base + ".tar"


def parse_target(text: str) -> dict:
    """--target-host: the LLVM target to compile for, as `llvm -mtriple=T -mcpu=C` or TVM's JSON
    form (`{"kind": "llvm", "mtriple": T, "mcpu": C}`) -> {"kind", "mtriple", "mcpu"}; InvalidInput
    in one line when TVM or this LLVM does not know it."""
    import json

    import tvm

    from .base import error_summary

    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--target-host is not valid JSON: {exc.msg}") from None
    else:
        words = text.split()
        if not words or words[0] != "llvm" or not all(w.startswith("-") and "=" in w for w in words[1:]):
            raise InvalidInput(f"--target-host expects 'llvm -mtriple=TRIPLE -mcpu=CPU' or a JSON target, got {text!r}")
        spec = {"kind": "llvm", **dict(w.lstrip("-").split("=", 1) for w in words[1:])}
    if not isinstance(spec, dict) or spec.get("kind") != "llvm":
        raise InvalidInput(f"--target-host must be an llvm target (the CPU backend), got {text!r}")
    try:
        target = tvm.target.Target(spec).export()
    except Exception as exc:  # noqa: BLE001 - TVM's ValueError lists every option it knows
        raise InvalidInput(f"--target-host: {error_summary(exc)[:300]}") from None
    triple = target.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
    if target.get("mcpu") and not tvm.target.codegen.llvm_is_valid_cpu(target["mcpu"], triple):
        raise InvalidInput(f"--target-host: this LLVM does not know CPU {target['mcpu']!r} for {triple}")
    return {k: str(target[k]) for k in ("kind", "mtriple", "mcpu") if target.get(k)}
