"""Independent parts of a search spread over the machine's cores.

tune's polishes from different starts do not depend on each other, and each is capped by a
work budget of its own (budget.py), so running them side by side returns the plans running
them one after another returns. Each core but this process's own gets a forked child, which
computes its parts and sends their results back pickled through a pipe. Forking is
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
    """The parts' results, in order. The heaviest part goes to the least loaded core first;
    this process takes the first core's share."""
    shares: list[list[int]] = [[] for _ in range(max(1, min(cores(), len(parts))))]
    load = [0.0] * len(shares)
    for i in sorted(range(len(parts)), key=lambda i: -parts[i][0]):
        core = min(range(len(shares)), key=lambda c: (load[c], c))
        shares[core].append(i)
        load[core] += parts[i][0]
    children = [_start(parts, share) for share in shares[1:] if share]
    results: dict[int, Any] = {}
    try:
        for i in sorted(shares[0]):
            results[i] = parts[i][1]()
    finally:
        for child in children:  # read before waiting: a child blocks until its pipe is read
            results.update(_join(child))
    for i in range(len(parts)):
        if i not in results:  # its child failed: computed here
            results[i] = parts[i][1]()
    return [results[i] for i in range(len(parts))]


def _start(parts: list[Part], share: list[int]) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
        global _in_child
        _in_child = True
        try:
            os.close(read)
            try:
                payload = pickle.dumps({i: parts[i][1]() for i in sorted(share)})
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
