"""One small registry for every solver, and the types they share.

A solver is a function (Space, Deadline, top) -> SolveResult. Each plan is
ranked by the key (objective, slowest memory link, sum of memory-link costs):
the first entry is the space's objective (predicted time, or one level's DV);
the others break its ties, which are common when compute bounds the time, in
favour of less data movement. A solver that raises is reported as status
`error` with its message, like one that reports its own crash.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..models.costmodel import compute_seconds, data_volume
from ..models.errors import CachetileError
from .space import Space


@dataclass(frozen=True)
class Candidate:
    orders: tuple[tuple[str, ...], ...]  # innermost level first
    tiles: tuple[tuple[int, ...], ...]  # innermost level first, loops in Space.loops order
    key: tuple[float, float, float]

    def tile_dicts(self, loops: list[str]) -> list[dict[str, int]]:
        return [dict(zip(loops, t)) for t in self.tiles]


@dataclass
class SolveResult:
    status: str  # optimal | feasible | timeout | infeasible | error
    plans: list[Candidate]  # best first
    evaluated: int = 0
    message: str = ""


class Deadline:
    """Wall-clock budget shared by a solve and the steps inside it."""

    def __init__(self, seconds: float):
        self.start = time.perf_counter()
        self.end = self.start + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        return time.perf_counter() >= self.end


@dataclass
class TopK:
    """The best k distinct candidates seen so far."""

    k: int
    items: list[Candidate] = field(default_factory=list)

    def add(self, cand: Candidate) -> None:
        if any(c.orders == cand.orders and c.tiles == cand.tiles for c in self.items):
            return
        self.items.append(cand)
        self.items.sort(key=lambda c: c.key)
        del self.items[self.k :]

    def worst_primary(self) -> float:
        """Objective a new plan must beat to enter; inf until k plans are held."""
        return self.items[-1].key[0] if len(self.items) >= self.k else np.inf


def score(space: Space, orders, tiles) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised ranking key and feasibility of plans sharing `orders` (tiles may be arrays)."""
    hw = space.hardware
    dv = data_volume(space.workload, orders, tiles, hardware=hw)
    secs = space.objective.links(dv)
    memmax = np.maximum.reduce([np.asarray(s, dtype=float) for s in secs])
    memsum = np.add.reduce([np.asarray(s, dtype=float) for s in secs])
    feasible = np.ones_like(memmax, dtype=bool)
    for j in range(space.n_levels):
        feasible &= space.usage(j, tiles[j]) <= space.capacity(j)
        parent = tiles[j + 1] if j + 1 < len(tiles) else space.workload.dims
        for x in space.loops:
            feasible &= (np.asarray(tiles[j][x]) >= 1) & space.legal(x, tiles[j][x], parent[x], j)
    feasible &= space.launchable(tiles)
    serial = space.serial_seconds(orders, tiles)
    predicted, _ = space.objective.value(compute_seconds(space.workload, hw, orders, tiles, space.stages), secs, serial)
    return predicted, memmax, memsum, feasible


def rescore(space: Space, cand: Candidate) -> Candidate:
    """The candidate with its exact ranking key (searches may rank with partial costs)."""
    pred, mmax, msum, _ = score(space, cand.orders, cand.tile_dicts(space.loops))
    return Candidate(cand.orders, cand.tiles, (float(pred), float(mmax), float(msum)))


SolverFn = Callable[[Space, Deadline, int], SolveResult]
SOLVERS: dict[str, SolverFn] = {}


def register(name: str):
    """Add a solver under `name`; any exception it raises becomes a SolveResult with status
    `error` (cachetile's own errors, such as a bad argument, pass through)."""

    def wrap(fn: SolverFn) -> SolverFn:
        def guarded(space: Space, deadline: Deadline, top: int) -> SolveResult:
            try:
                return fn(space, deadline, top)
            except CachetileError:
                raise
            except Exception as exc:  # a solver's own failure is a result, not a crash
                return SolveResult("error", [], 0, f"{type(exc).__name__}: {' '.join(str(exc).split())}")

        guarded.__doc__, guarded.__name__ = fn.__doc__, fn.__name__
        SOLVERS[name] = guarded
        return guarded

    return wrap
