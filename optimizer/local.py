"""Local search on the exact cost model: repair infeasible tiles, then polish.

Used after rounding a continuous solution and to break the objective's ties
(see registry.py) once a solver has a plan: each round tries, for every loop at
every level, the neighbouring candidates, half, double, 1, the full extent and
the adjacent levels' tiles (other levels follow to keep the nesting), and every
other order class at each level; it takes the best move that improves the
ranking key.
"""
from __future__ import annotations

import numpy as np

from ..models.costmodel import memory_usage
from .registry import Candidate, Deadline, score
from .space import Space


def repair(space: Space, tiles: list[dict[str, int]]) -> list[dict[str, int]] | None:
    """Clamp tiles into their nesting bounds and shrink them until every level fits; None if impossible."""
    w, loops = space.workload, space.loops
    tiles = [dict(t) for t in tiles]
    for j in reversed(range(space.n_levels)):
        parent = tiles[j + 1] if j + 1 < space.n_levels else w.dims
        for x in loops:
            tiles[j][x] = int(min(max(tiles[j][x], 1), parent[x]))
        cap = space.hardware.levels[j].capacity_bytes
        while memory_usage(w, tiles[j]) > cap:
            x = max(loops, key=lambda y: tiles[j][y])
            if tiles[j][x] == 1:
                return None
            smaller = space.candidates[x][space.candidates[x] < tiles[j][x]]
            tiles[j][x] = int(smaller[-1])
    return tiles


def _key(space: Space, orders, tiles) -> tuple[tuple, bool]:
    pred, mmax, msum, ok = score(space, orders, tiles)
    return (float(pred), float(mmax), float(msum)), bool(ok)


def polish(space: Space, cand: Candidate, deadline: Deadline, rounds: int = 25) -> Candidate:
    """Improve `cand`'s ranking key by single moves until none helps or time runs short."""
    loops, n = space.loops, space.n_levels
    best = cand
    best_fill = _fill(space, best.tile_dicts(loops))
    for _ in range(rounds):
        if deadline.expired():
            break
        tiles = best.tile_dicts(loops)
        moves = []  # (level, loop, new value)
        for j in range(n):
            for x in loops:
                c = space.candidates[x]
                now = tiles[j][x]
                i = int(np.searchsorted(c, now))
                # Neighbouring candidates, halving and doubling, and the two ends (a single trip
                # at either side changes which loops the model sees).
                targets = {int(c[k]) for k in (i - 1, i + 1 if c[min(i, len(c) - 1)] == now else i) if 0 <= k < len(c)}
                targets |= {max(1, now // 2), now * 2, 1, space.workload.dims[x]}
                if j + 1 < n:
                    targets.add(tiles[j + 1][x])
                if j > 0:
                    targets.add(tiles[j - 1][x])
                moves += [(j, x, v) for v in sorted(targets) if v != now and 1 <= v <= space.workload.dims[x]]
        improved = None
        if moves:
            arrays = [{x: np.full(len(moves), tiles[j][x]) for x in loops} for j in range(n)]
            for m, (j, x, v) in enumerate(moves):
                # Keep the nesting: outer tiles grow to at least v, inner ones shrink to at most v.
                for i in range(n):
                    old = tiles[i][x]
                    arrays[i][x][m] = v if i == j else max(old, v) if i > j else min(old, v)
            pred, mmax, msum, ok = score(space, best.orders, arrays)
            fill = _fill(space, arrays)
            keys = np.where(ok, pred, np.inf)
            order = np.lexsort((fill, msum, mmax, keys))
            m = int(order[0])
            key = (float(pred[m]), float(mmax[m]), float(msum[m]))
            # A move that keeps the key but frees capacity is taken too: it opens the way
            # for the next move (e.g. shrink k so that m and n can grow).
            if ok[m] and (key, float(fill[m])) < (best.key, best_fill):
                moved = tuple(tuple(int(arrays[i][y][m]) for y in loops) for i in range(n))
                improved = Candidate(best.orders, moved, key)
                improved_fill = float(fill[m])
        tiles = best.tile_dicts(loops)
        for j in range(n):
            for order in space.orders:
                if order == best.orders[j]:
                    continue
                orders = best.orders[:j] + (order,) + best.orders[j + 1 :]
                key, ok = _key(space, orders, tiles)
                if ok and key < (improved or best).key:
                    improved, improved_fill = Candidate(orders, best.tiles, key), best_fill
        if improved is None:
            break
        best, best_fill = improved, improved_fill
    return best


def _fill(space: Space, tiles) -> np.ndarray:
    """How full the levels are: the sum over levels of MU / capacity."""
    return sum(
        memory_usage(space.workload, tiles[j]) / lv.capacity_bytes for j, lv in enumerate(space.hardware.levels)
    )
