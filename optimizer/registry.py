"""One small registry for every solver, and the types they share.

A solver is a function (Space, Deadline, top) -> SolveResult. Each plan is
ranked by the key (objective, slowest memory link, sum of memory-link costs):
the first entry is the space's objective (predicted time, or one level's DV);
the others break its ties, which are common when compute bounds the time, in
favour of less data movement. A solver that raises is reported as status
`error` with its message, like one that reports its own crash.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..models.costmodel import compute_seconds
from ..models.errors import CachetileError
from ..models.objective import swept
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
    """Wall-clock budget shared by a solve and the steps inside it, and optionally a budget of
    search work (budget.py's units: about one cost-model call each). A pass bounded by work
    instead of a fixed number of seconds finds the same plans on a busy machine as on an idle
    one, so the CLI, the service and a cache miss agree; the time limit still bounds it."""

    def __init__(self, seconds: float, work: float | list[float] | None = None):
        self.start = time.perf_counter()
        self.end = self.start + seconds
        # Work left, in a list shared with the deadlines `part` cuts from this one.
        self._work = work if isinstance(work, list) else None if work is None else [float(work)]

    def part(self, fraction: float) -> Deadline:
        """A deadline `fraction` of the time left away, drawing on the same work budget."""
        return Deadline(self.left() * fraction, self._work)

    def spend(self, units: float) -> None:
        if self._work is not None:
            self._work[0] -= units

    def left(self) -> float:
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        return time.perf_counter() >= self.end or (self._work is not None and self._work[0] <= 0)


def rank(cand: Candidate) -> tuple:
    """What candidates are sorted by: the ranking key. Ties keep the order the search found
    them in (it visits larger tiles first), which is the same in every run: every pass that
    stops early is bounded by work, not by the clock (Deadline), unless the time limit is hit."""
    return cand.key


@dataclass
class TopK:
    """The best k distinct candidates seen so far, best first (rank). With a space (tune's
    final ranking) plans that differ only where one-trip loops sit (Space.canonical) count
    once, as the first of them added. The searches keep such variants apart: each is a
    different start for the polish, whose tile moves can give those loops trips."""

    k: int
    space: Space | None = None
    items: list[Candidate] = field(default_factory=list)

    def _same(self, cand: Candidate) -> Candidate:
        return self.space.canonical(cand) if self.space is not None else cand

    def add(self, cand: Candidate) -> bool:
        """Add `cand` unless held already; returns whether it was new."""
        same = self._same(cand)
        if any(c.orders == same.orders and c.tiles == same.tiles for c in map(self._same, self.items)):
            return False
        self.items = sorted([*self.items, cand], key=rank)[: self.k]
        return True

    def worst_primary(self) -> float:
        """Objective a new plan must beat to enter; inf until k plans are held."""
        return self.items[-1].key[0] if len(self.items) >= self.k else np.inf


TIE = 1e-9  # relative difference of predicted times that the rankings treat as rounding noise


def level_with(seconds: float) -> float:
    """The predicted time over which a plan cannot rank level with one of `seconds`."""
    return seconds * (1 + TIE) + 1e-300


def score(space: Space, orders, tiles, serial: bool = True, bound: float = np.inf,
          least=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised ranking key and feasibility of plans sharing `orders` (tiles may be arrays);
    serial=False leaves out the kernel's serial costs, which are costed one plan at a time.
    The serial costs only add, so a plan already over `bound` without them is not costed
    further: its predicted time is inf (a search that only wants plans under `bound`).
    `least` (True, or a mask broadcast like the tiles): only the feasible plan of least
    predicted time among those (ties within TIE included) is wanted, as a polish's pick is. Plans
    are then costed in full in order of their time without serial costs, and the bound falls to
    the least full time found (level_with), so the others over it are not costed further
    (inf) either: the same least plans, with a fraction of the serial costs."""
    hw = space.hardware
    dv = space.data_volume(orders, tiles)
    secs = space.objective.links(dv, [space.usage(j, tiles[j]) for j in range(space.n_levels)], space.whole,
                                 swept(space.workload, hw, space.whole, orders, tiles))
    memmax = np.maximum.reduce([np.asarray(s, dtype=float) for s in secs])
    memsum = np.add.reduce([np.asarray(s, dtype=float) for s in secs])
    feasible = np.ones_like(memmax, dtype=bool)
    for j in range(space.n_levels):
        feasible &= space.usage(j, tiles[j]) <= space.capacity(j)
        parent = tiles[j + 1] if j + 1 < len(tiles) else space.workload.dims
        for x in space.loops:
            feasible &= (np.asarray(tiles[j][x]) >= 1) & space.legal(x, tiles[j][x], parent[x], j)
    feasible &= space.admits(tiles, orders)
    objective = space.objective
    compute = objective.compute(compute_seconds(space.workload, hw, orders, tiles, space.stages))
    predicted, _ = objective.value(compute, secs)
    if serial:
        full = functools.partial(_with_serial, space, orders, tiles, compute, secs, predicted)
        predicted = full(predicted <= bound) if least is None else _least(full, predicted, bound, feasible & least)
    return predicted, memmax, memsum, feasible


def _with_serial(space: Space, orders, tiles, compute, secs, predicted, within):
    """Predicted times with the serial costs of the plans `within` (a mask); inf for the others."""
    seconds, reads, relief = space.serial_costs(orders, tiles, within=within)
    return predicted + seconds - space.objective.spared(compute, secs, predicted, relief, reads)


def _least(full: Callable, predicted, bound: float, among) -> np.ndarray:
    """score's `least`: `full` (_with_serial) of the plans `among` that may still be the least,
    taken in order of `predicted` (their times without the serial costs, which only add) in
    rounds of 1, 1, 2, 4, ... plans, never past the bound, each round lowering the bound to the
    least full time found so far. Each plan's serial costs are remembered (Space.serial_costs),
    so a round re-costs none."""
    shape = np.broadcast_shapes(np.shape(predicted), np.shape(among))
    before = np.broadcast_to(predicted, shape).ravel()
    rows = np.flatnonzero(np.broadcast_to(among, shape).ravel() & (before <= bound))
    rows = rows[np.argsort(before[rows], kind="stable")]
    ordered = before[rows]
    within = np.zeros(shape, dtype=bool)
    out, taken = np.full(shape, np.inf) if shape else np.inf, 0
    while taken < len(rows) and ordered[taken] <= bound:
        end = min(2 * taken or 1, int(np.searchsorted(ordered, bound, side="right")))
        within.flat[rows[taken:end]] = True
        out = full(within)
        # The bound holds the earlier rounds' least already: this round's plans may only lower it.
        bound = min(bound, level_with(float(np.min(np.broadcast_to(out, shape).ravel()[rows[taken:end]]))))
        taken = end
    return out


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
