"""A TVM RPC tracker and servers on this machine, started and stopped cleanly (tests, benchmarks,
trying `--rpc` out).

    python -m cachetile.backends.rpc_fleet fleet --servers 2 --key cpu --threads 1   # until Ctrl-C
    python -m cachetile.backends.rpc_fleet tracker --port 9190
    python -m cachetile.backends.rpc_fleet server --tracker 127.0.0.1:9190 --key cpu --port 9090

Two launchers start the same TVM daemons: `tvm.exec` runs `python -m
tvm.exec.rpc_tracker` / `rpc_server` (what the README documents; their worker
process needs cloudpickle), `inproc` runs TVM's tracker or server state inside
this module's own process (one process less, no cloudpickle, faster to start).

Every daemon runs in a process group of its own, and stopping one signals the
whole group: TVM's rpc_server runs its listen loop in a child process
(popen_worker) that keeps serving, still registered with the tracker, when only
its parent is killed.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from .rpc_tracker import RpcAddress, RpcError, TrackerClient, servers_for_key


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def has_cloudpickle(python: str = sys.executable) -> bool:
    return subprocess.run([python, "-c", "import cloudpickle"], capture_output=True).returncode == 0


@dataclass
class Daemon:
    name: str
    popen: subprocess.Popen
    log: str
    port: int


class Fleet:
    """A tracker and `servers` servers with `key` on 127.0.0.1; a context manager.

    threads: TVM_NUM_THREADS of each server (servers x threads should not exceed
    the cores, or the servers slow each other's kernels down);
    launcher: "tvm.exec", "inproc", or "auto" (tvm.exec when cloudpickle imports).
    """

    def __init__(self, servers: int = 2, key: str = "cachetile", threads: int = 1, launcher: str = "auto",
                 python: str = sys.executable, start_timeout: float = 60.0):
        self.key, self.n, self.python, self.start_timeout = key, servers, python, start_timeout
        self.env = dict(os.environ, TVM_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        if launcher == "auto":
            launcher = "tvm.exec" if has_cloudpickle(python) else "inproc"
        if launcher not in ("tvm.exec", "inproc"):
            raise ValueError(f"launcher must be auto, tvm.exec or inproc, got {launcher!r}")
        self.launcher = launcher
        self.logdir = tempfile.mkdtemp(prefix="cachetile-rpc-")
        self.tracker: Daemon | None = None
        self.servers: list[Daemon] = []
        self.started: list[Daemon] = []  # every daemon spawned, for stop() and leftover()

    @property
    def rpc(self) -> RpcAddress:
        return RpcAddress("127.0.0.1", self.tracker.port, self.key)

    def _spawn(self, role: str, name: str, args: list[str], port: int) -> Daemon:
        log = os.path.join(self.logdir, f"{name}.log")
        module = f"tvm.exec.rpc_{role}" if self.launcher == "tvm.exec" else "cachetile.backends.rpc_fleet"
        cmd = [self.python, "-m", module, *([] if self.launcher == "tvm.exec" else [role]), *args]
        with open(log, "wb") as out:
            popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True)
        daemon = Daemon(name, popen, log, port)
        self.started.append(daemon)
        return daemon

    def start(self) -> Fleet:
        """Start the tracker and the servers; return once every server is registered and free."""
        try:
            port = free_port()
            self.tracker = self._spawn("tracker", "tracker", ["--host", "127.0.0.1", "--port", str(port),
                                                             "--port-end", str(port + 1)], port)
            self._wait(lambda summary: True, "the tracker to answer")
            for _ in range(self.n):
                self.add_server()
            self.wait_registered(self.n)
        except BaseException:
            self.stop()
            raise
        return self

    def add_server(self) -> Daemon:
        port = free_port()
        server = self._spawn("server", f"server{len(self.servers)}",
                             ["--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
                              "--tracker", f"127.0.0.1:{self.tracker.port}", "--key", self.key], port)
        self.servers.append(server)
        return server

    def _tail(self, daemon: Daemon) -> str:
        try:
            lines = [ln for ln in open(daemon.log, errors="replace").read().splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(empty log)"

    def _wait(self, ok: Callable[[dict], bool], what: str) -> dict:
        deadline, last = time.monotonic() + self.start_timeout, "no answer"
        while time.monotonic() < deadline:
            for d in [self.tracker, *self.servers]:
                if d.popen.poll() is not None:
                    raise RpcError(f"RPC {d.name} exited with status {d.popen.returncode}: {self._tail(d)}")
            try:
                with TrackerClient(self.rpc, 2.0) as tracker:
                    summary = tracker.summary(2.0)
                if ok(summary):
                    return summary
                last = f"{len(servers_for_key(summary, self.key))} server(s) registered"
            except RpcError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RpcError(f"timed out after {self.start_timeout:g} s waiting for {what} ({last})")

    def wait_registered(self, n: int) -> dict:
        """Wait until exactly n servers with the key are registered and free."""
        def ok(s):
            free = s.get("queue_info", {}).get(self.key, {}).get("free", 0)
            return len(servers_for_key(s, self.key)) == n and free == n
        return self._wait(ok, f"{n} server(s) with key {self.key!r} to register")

    def server_at(self, address: str) -> Daemon | None:
        """The server listening on "host:port"."""
        port = int(address.rsplit(":", 1)[1])
        return next((d for d in self.servers if d.port == port), None)

    @staticmethod
    def kill(daemon: Daemon, sig: int = signal.SIGKILL) -> None:
        """Signal a daemon's whole process group (SIGKILL: the machine died; SIGSTOP: it froze)."""
        try:
            os.killpg(daemon.popen.pid, sig)
        except ProcessLookupError:
            pass

    def _stop(self, daemon: Daemon, wait: float = 3.0) -> None:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            self.kill(daemon, sig)
        try:
            daemon.popen.wait(wait)
        except subprocess.TimeoutExpired:
            pass
        self.kill(daemon)  # the group can outlive its leader (TVM's popen_worker)
        try:
            daemon.popen.wait(wait)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + wait
        while self._alive_in({daemon.popen.pid}) and time.monotonic() < deadline:
            time.sleep(0.05)

    @staticmethod
    def _alive_in(groups: set[int]) -> list[int]:
        import psutil

        alive = []
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) in groups and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.append(proc.pid)
            except (ProcessLookupError, psutil.Error):
                pass
        return alive

    def stop(self) -> None:
        """Stop every server, then the tracker (idempotent), and remove the logs."""
        import shutil

        for daemon in reversed(self.started):
            self._stop(daemon)
        shutil.rmtree(self.logdir, ignore_errors=True)

    def leftover(self) -> list[int]:
        """Pids still alive (not zombies) in any group this fleet started: [] after stop()."""
        return self._alive_in({d.popen.pid for d in self.started})

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _serve_tracker(args) -> None:
    from tvm.rpc.tracker import PopenTrackerServerState

    state = PopenTrackerServerState(args.host, args.port, args.port_end, silent=True)
    print(f"tracker on {args.host}:{state.port}", flush=True)
    state.thread.join()


def _serve_server(args) -> None:
    from tvm.rpc import server

    host, port = args.tracker.rsplit(":", 1)
    server._popen_start_rpc_server(args.host, args.port, args.port_end, tracker_addr=(host, int(port)),
                                   key=args.key, silent=True)
    state = server.PopenRPCServerState.current
    print(f"server on {args.host}:{state.port}, key {args.key}, "
          f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}", flush=True)
    state.thread.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cachetile.backends.rpc_fleet", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tracker = sub.add_parser("tracker", help="run a TVM RPC tracker in this process")
    server = sub.add_parser("server", help="run a TVM RPC server in this process (set TVM_NUM_THREADS)")
    for p in (tracker, server):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=9190 if p is tracker else 9090)
        p.add_argument("--port-end", type=int)
    server.add_argument("--tracker", required=True, help="HOST:PORT")
    server.add_argument("--key", required=True)
    fleet = sub.add_parser("fleet", help="a tracker and N servers on 127.0.0.1 until Ctrl-C")
    fleet.add_argument("--servers", type=int, default=2)
    fleet.add_argument("--key", default="cachetile")
    fleet.add_argument("--threads", type=int, default=1, help="TVM_NUM_THREADS per server")
    fleet.add_argument("--launcher", choices=["auto", "tvm.exec", "inproc"], default="auto")
    args = ap.parse_args(argv)
    if args.cmd in ("tracker", "server"):
        args.port_end = args.port_end or args.port + 1
        (_serve_tracker if args.cmd == "tracker" else _serve_server)(args)
        return 0
    with Fleet(args.servers, args.key, args.threads, args.launcher) as running:
        print(f"--rpc {running.rpc}  ({args.servers} servers, launcher {running.launcher}); Ctrl-C stops them",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
