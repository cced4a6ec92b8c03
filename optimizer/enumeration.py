"""`enumerate`: exact branch and bound over the discrete space of optimizer/space.py.

Levels are fixed outermost first, since DV_l depends only on levels >= l. At
each node every (order class, tile) choice for the next level inward is costed
at once with numpy; a child whose partial objective, max(compute, slowest link
so far), cannot beat the k-th best plan is pruned, and the rest are visited best
first. The coarse candidate set is searched first; if its best plan meets the
global lower bound (compute time, or each level loading every tensor once) it
is optimal over the fine set as well, otherwise the fine set is searched with
that incumbent.
"""
from __future__ import annotations

import numpy as np

from ..models.costmodel import data_volume, memory_usage, single_level_bound
from .registry import Candidate, Deadline, SolveResult, TopK, register
from .space import Space


class _Timeout(Exception):
    pass


def level_rows(space: Space, level: int) -> np.ndarray:
    """All candidate tiles of one level (rows, columns in Space.loops order) that fit its capacity."""
    grids = np.meshgrid(*[space.candidates[x] for x in space.loops], indexing="ij")
    rows = np.stack([g.ravel() for g in grids], axis=1)
    mu = memory_usage(space.workload, {x: rows[:, i] for i, x in enumerate(space.loops)})
    return rows[mu <= space.hardware.levels[level].capacity_bytes]


class _Search:
    def __init__(self, space: Space, deadline: Deadline, best: TopK):
        self.space, self.deadline, self.best = space, deadline, best
        self.rows = [level_rows(space, j) for j in range(space.n_levels)]
        self.floors: dict[int, np.ndarray] = {}
        self.evaluated = 0

    def _floor(self, level: int) -> np.ndarray:
        """Per candidate tile of `level`, a bound on its time that no choice elsewhere can lower."""
        if level not in self.floors:
            rows, sp = self.rows[level], self.space
            dv = single_level_bound(sp.workload, {x: rows[:, i] for i, x in enumerate(sp.loops)})
            self.floors[level] = dv / sp.hardware.levels[level].bandwidth_bytes_per_s
        return self.floors[level]

    def _inner_floor(self, level: int, tile: np.ndarray) -> float:
        """Best case for the levels inside `level` when its tile is `tile`."""
        worst = 0.0
        for j in range(level):
            fits = np.all(self.rows[j] <= tile, axis=1)
            if not fits.any():
                return np.inf
            worst = max(worst, float(self._floor(j)[fits].min()))
        return worst

    def run(self) -> None:
        extents = np.array([self.space.workload.dims[x] for x in self.space.loops])
        self._expand(self.space.n_levels - 1, (), [], extents, 0.0, 0.0)

    def _expand(self, level, outer_orders, outer_tiles, parent, pmax, psum):
        sp = self.space
        rows = self.rows[level]
        rows = rows[np.all(rows <= parent, axis=1)]
        if len(rows) == 0:
            return
        tile = {x: rows[:, i] for i, x in enumerate(sp.loops)}
        bw = sp.hardware.levels[level].bandwidth_bytes_per_s
        secs = []
        for order in sp.orders:
            dv = data_volume(sp.workload, (order, *outer_orders), [tile, *outer_tiles], levels=[0])[0]
            secs.append(np.broadcast_to(dv / bw, (len(rows),)))
        self.evaluated += len(rows) * len(sp.orders)
        secs = np.stack(secs)  # (orders, rows)
        cmax = np.maximum(pmax, secs)
        csum = psum + secs
        bound = np.maximum(sp.compute_seconds, cmax)
        keep = np.flatnonzero((bound < self.best.worst_primary()).ravel())
        if len(keep) == 0:
            return
        # Among equal costs visit larger tiles first: they leave the inner levels more room.
        volume = np.broadcast_to(np.prod(rows.astype(float), axis=1), secs.shape).ravel()
        keep = keep[np.lexsort((-volume[keep], csum.ravel()[keep], cmax.ravel()[keep], bound.ravel()[keep]))]
        n_rows = len(rows)
        if level == 0:
            for flat in keep[: self.best.k]:
                o, r = divmod(int(flat), n_rows)
                orders = ((sp.orders[o], *outer_orders))
                tiles = (tuple(int(v) for v in rows[r]), *(tuple(int(t[x]) for x in sp.loops) for t in outer_tiles))
                key = (float(bound.flat[flat]), float(cmax.flat[flat]), float(csum.flat[flat]))
                self.best.add(Candidate(orders, tiles, key))
            return
        for flat in keep:
            if self.deadline.expired():
                raise _Timeout
            cutoff = self.best.worst_primary()
            if bound.flat[flat] >= cutoff or cutoff <= sp.lower_bound * (1 + 1e-12):
                return  # children are sorted by bound, and nothing beats the lower bound
            o, r = divmod(int(flat), n_rows)
            if np.isfinite(cutoff) and max(bound.flat[flat], self._inner_floor(level, rows[r])) >= cutoff:
                continue
            child = {x: int(v) for x, v in zip(sp.loops, rows[r])}
            self._expand(
                level - 1, (sp.orders[o], *outer_orders), [child, *outer_tiles], rows[r],
                float(cmax.flat[flat]), float(csum.flat[flat]),
            )


@register("enumerate")
def solve(space: Space, deadline: Deadline, top: int) -> SolveResult:
    best = TopK(max(top, 1))
    evaluated = 0
    coarse = Space(space.workload, space.hardware, fine=False)
    for sp in (coarse, space):
        if sp is space and all(np.array_equal(sp.candidates[x], coarse.candidates[x]) for x in sp.loops):
            break  # the fine set adds nothing: the coarse search was already exhaustive
        search = _Search(sp, deadline, best)
        try:
            search.run()
        except _Timeout:
            evaluated += search.evaluated
            return SolveResult("timeout", best.items, evaluated, "time limit reached; best plan so far")
        evaluated += search.evaluated
        if best.items and best.items[0].key[0] <= space.lower_bound * (1 + 1e-12):
            break  # meets the lower bound: nothing in the fine set can do better
    if not best.items:
        return SolveResult("infeasible", [], evaluated, "no tiling fits the level capacities")
    return SolveResult("optimal", best.items, evaluated)
