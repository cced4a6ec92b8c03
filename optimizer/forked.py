"""Independent parts of a search spread over the machine's cores.

tune's polishes from different starts do not depend on each other, and each is capped by a
work budget of its own (budget.py), so running them side by side returns the plans running
them one after another returns. Each core but this process's own gets a forked child; each
process takes the next part from a queue (a pipe of part indices) whenever it is free, and a
child sends its results back pickled through a pipe of its own. Forking is
cheap where the search's modules are already loaded, and nothing is set up again. Where it is
not safe or not possible (not Linux, other Python threads running, one core, or inside such a
child), or a child fails, this process computes the parts itself.
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
from typing import Any, Callable

Part = tuple[float, Callable[[], Any]]  # (its work budget, what to compute)

_in_child = False  # a child computes its parts alone: no forks of its own


def cores() -> int:
    """The cores this process may run on: 1 where forking is unsafe or unavailable here."""
    if _in_child or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 1
    if threading.active_count() > 1:  # a fork copies only the calling thread, and no lock another holds
        return 1
    return len(os.sched_getaffinity(0))


def run(parts: list[Part]) -> list:
    """The parts' results, in order. Each core (this process and a forked child per further
    core) takes the heaviest part left as soon as it is free: the budgets say how much work a
    part may do, not how long it takes (the first polish in a process runs a third slower than
    the next, on colder caches), so a fixed share can leave one core idle while the other works
    through two parts (gemm 1024^3: 0.43 s against 0.34)."""
    workers = max(1, min(cores(), len(parts)))
    if workers == 1 or len(parts) > 255:  # a part's index is one byte in the queue
        return [fn() for _, fn in parts]
    read, write = os.pipe()  # the queue: the parts' indices, heaviest first, one byte each
    os.write(write, bytes(sorted(range(len(parts)), key=lambda i: -parts[i][0])))
    children = [_start(parts, read, write) for _ in range(workers - 1)]
    os.close(write)  # the queue ends once drained: a read then finds no more bytes
    results: dict[int, Any] = {}
    try:
        results.update(_take(parts, read))
    finally:
        os.close(read)
        for child in children:  # read before waiting: a child blocks until its pipe is read
            results.update(_join(child))
    for i in range(len(parts)):
        if i not in results:  # its child failed: computed here
            results[i] = parts[i][1]()
    return [results[i] for i in range(len(parts))]


def _take(parts: list[Part], queue: int) -> dict:
    """The results of the parts this process takes from the queue until it is drained (a one-byte
    read from a pipe takes one index whole, whichever process reads it). In a child, a part that
    fails ends its taking and the results so far come back (the parent computes the rest); in
    the parent, the failure is raised."""
    results = {}
    while index := os.read(queue, 1):
        i = index[0]
        try:
            results[i] = parts[i][1]()
        except BaseException:  # noqa: BLE001 (the parent computes what is missing itself)
            if not _in_child:
                raise
            break
    return results


def _start(parts: list[Part], queue: int, queue_end: int) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
        global _in_child
        _in_child = True
        try:
            os.close(read)
            os.close(queue_end)
            try:
                payload = pickle.dumps(_take(parts, queue))
            except BaseException:  # noqa: BLE001 (the parent computes these parts itself)
                payload = pickle.dumps({})
            with os.fdopen(write, "wb") as out:
                out.write(payload)
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


def _join(child: tuple[int, int]) -> dict:
    pid, read = child
    with os.fdopen(read, "rb") as source:
        payload = source.read()
    os.waitpid(pid, 0)
    try:
        return pickle.loads(payload)
    except Exception:  # noqa: BLE001 (a child that died midway: the parent computes its parts)
        return {}
