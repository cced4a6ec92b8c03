"""Run blocking work (solver, compiler) in child processes without blocking the event loop.

At most `size` children run at once. Each call forks from a server process
that has already imported the worker module, so a call starts in
milliseconds, and cancelling the awaiting task kills its child outright: a
solver or a TVM build cannot be interrupted any other way.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .errors import kind_of, one_line
from .progress import Progress

PRELOAD = ["cachetile.api.worker"]


class WorkerError(Exception):
    """The work failed: `kind` is one of api/errors.STATUS (invalid, infeasible, no-plan, build-failed, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _child(conn, fn: Callable, args: tuple) -> None:
    def progress(fraction: float, message: str) -> None:
        conn.send(("progress", float(fraction), str(message)))

    try:
        conn.send(("ok", fn(*args, progress=progress)))
    except BaseException as exc:  # everything goes back to the parent as one line
        conn.send(("error", kind_of(exc), one_line(exc)))
    finally:
        conn.close()


def _receive(conn):
    try:
        return conn.recv()
    except (EOFError, OSError):
        return ("died",)


class ProcessPool:
    """At most `size` worker processes at once; `await run(fn, *args)` returns fn's result."""

    def __init__(self, size: int):
        self.size = size
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)
        self._slots: asyncio.Semaphore | None = None
        # One thread per slot waits on its child's pipe; the event loop never does.
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="pool")

    async def run(self, fn: Callable, *args: Any, progress: Progress | None = None, timeout: float | None = None) -> Any:
        """Run fn(*args, progress=...) in a child; raises WorkerError with the child's one-line error.

        A child still running `timeout` seconds after it started is killed (WorkerError kind "timeout").
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        async with self._slots:
            try:
                return await asyncio.wait_for(self._run(fn, args, progress), timeout)
            except asyncio.TimeoutError:
                raise WorkerError("timeout", f"the worker did not finish within {timeout:g} s and was stopped") from None

    async def _run(self, fn: Callable, args: tuple, progress: Progress | None) -> Any:
        loop = asyncio.get_running_loop()
        receiver, sender = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=_child, args=(sender, fn, args), daemon=True)
        proc.start()
        sender.close()
        try:
            while True:
                message = await loop.run_in_executor(self._threads, _receive, receiver)
                if message[0] == "progress":
                    if progress:
                        progress(message[1], message[2])
                elif message[0] == "ok":
                    return message[1]
                elif message[0] == "error":
                    raise WorkerError(message[1], message[2])
                else:
                    proc.join(1)
                    raise WorkerError("internal", f"worker process died (exit status {proc.exitcode})")
        finally:
            if proc.is_alive():
                proc.kill()  # cancelled, timed out or done: either way the child has nothing left to say
            proc.join()
            receiver.close()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
