"""Closed-form data-movement volume (DV) and memory usage (MU) per memory level.

Semantics (Chimera's block decomposition with Accera's key-slice reloads):

* Level l (0 = innermost) has an `order` (outermost loop first) and a `tile`.
  Level-l loops walk level-l tiles inside the level-(l+1) tile; the outermost
  level's parent is the whole problem; edge tiles are clipped.
* For level l, each op walks only its own loops, in the combined order of all
  levels >= l, outermost level first.
* A tensor's level-l block is refilled whenever it differs from the block of
  the previous iteration; each refill moves the clipped block. Intermediates
  move nothing at the outermost level (the fused kernel keeps that block in a
  local buffer, never in memory); below it they move like any tensor, written
  by their producer and read by their consumer.

Why the closed form is exact. Call the walk's entries *positions* (a loop at a
level); a position of one of tensor T's loops is a *T-position*. T's block is
constant below a position iff every T-position below it has a single trip, so
a non-T position multiplies T's reloads iff some T-position with more than one
trip lies below it. For a given level-l block t of T that is the deepest
T-position with more than one trip on t's own path, d(t). Hence

    DV_T = sum_t |t| * prod_{non-T loop y} N_y(j_y(d(t)))

where N_y(j) is the number of level-j blocks of y and j_y(d) the innermost
level whose y-position lies above d. Trip counts differ between full and edge
blocks, so every loop's blocks are split into classes (full/edge at each level,
at most 2^levels); d(t) is the max over T's dims, so the sum over t factors
into products of per-dimension sums over these classes. For divisible extents
with every loop running more than once this is Chimera's formula, e.g. GEMM in
order m,n,k: DV = MK*ceil(N/Tn) + KN*ceil(M/Tm) + MN.

Everything is numpy-vectorised over tile candidates: any tile may be an array,
and results broadcast.
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from .errors import InvalidInput
from .hardware import Hardware
from .indexing import distinct
from .targets import target_for
from .workload import Workload

Orders = Sequence[Sequence[str]]  # per level, innermost level first; each outermost loop first
Tiles = Sequence[Mapping[str, "np.ndarray | int"]]  # per level, innermost first: loop -> tile extent


# loop_blocks' results by extent and tiles: a search costs the same loop's tiles again and again
# (a polish moves one loop's tile at a time, and costs every order of the same tiles), so about
# two calls in three repeat one already made (gemm 1024^3: 864 calls, 248 distinct).
_BLOCKS: dict = {}
_BLOCKS_HELD = 4096
_PADDED: dict = {}  # padded_extents over arrays, by the tiles' values
_PADDED_HELD = 64


def _tile_key(t) -> tuple | float:
    if isinstance(t, np.ndarray):
        a = t.astype(np.float64, copy=False)
        return a.shape, a.tobytes()
    return float(t)


def any_arrays(values) -> bool:
    """Whether any of `values` is an array of one or more dims (0-d arrays count as numbers): a
    search costs many plans at once, a polish one plan at a time, in plain numbers, several
    times faster than numpy's calls on 0-d arrays."""
    return any(isinstance(v, np.ndarray) and v.ndim for v in values)


def _remembered(cache: dict, limit: int, key, make, arrays):
    """make()'s result, kept in `cache` under `key` (emptied once it holds `limit`), with the
    arrays `arrays(result)` yields made read-only: every caller then shares them."""
    held = cache.get(key)
    if held is None:
        held = make()
        for a in arrays(held):
            a.flags.writeable = False
        if len(cache) >= limit:
            cache.clear()
        cache[key] = held
    return held


def loop_blocks(extent: int, tiles: Sequence[np.ndarray | int]) -> list[tuple[np.ndarray, ...]]:
    """Classes of a loop's blocks at every level (tiles innermost first); see _loop_blocks.
    Remembered (_BLOCKS): the arrays returned are read-only."""
    key = (float(extent), *map(_tile_key, tiles))
    return list(_remembered(_BLOCKS, _BLOCKS_HELD, key, lambda: _loop_blocks(extent, tiles),
                            lambda held: (a for level in held for a in level)))


def _loop_blocks(extent: int, tiles: Sequence[np.ndarray | int]) -> list[tuple[np.ndarray, ...]]:
    """Classes of a loop's blocks at every level (tiles innermost first).

    Level j gets arrays (size, count, deepest), each of shape (classes, *candidates):
    blocks of one class share a size and the deepest level >= j with more than one
    trip on their path (len(tiles) where there is none); and `by_deepest`, of shape
    (len(tiles) + 1, *candidates): the summed size of the blocks whose deepest level
    is each d, which is all a plain dim's volume needs whatever the orders (_dim_volume).
    """
    n = len(tiles)
    size, count, deepest = np.full((1,), float(extent)), np.ones(1), np.full((1,), n)
    per_level: list = [None] * n
    for j in reversed(range(n)):
        t = np.asarray(tiles[j], dtype=np.float64)
        size, t_b = np.broadcast_arrays(size[(...,) + (None,) * (t.ndim + 1 - size.ndim)], t)
        count = np.broadcast_to(count[(...,) + (None,) * (size.ndim - count.ndim)], size.shape)
        deepest = np.broadcast_to(deepest[(...,) + (None,) * (size.ndim - deepest.ndim)], size.shape)
        trips = np.ceil(size / t_b)
        size = np.concatenate([t_b, size - (trips - 1) * t_b])
        count = np.concatenate([count * (trips - 1), count])
        deepest = np.concatenate([np.full(trips.shape, j), np.where(trips > 1, j, deepest)])
        volume = size * count
        by_deepest = np.zeros((n + 1,) + size.shape[1:])
        for d in range(j, n + 1):
            by_deepest[d] = np.where(deepest == d, volume, 0.0).sum(axis=0)
        per_level[j] = (size, count, deepest, by_deepest)
    return per_level


def block_counts(blocks) -> list[np.ndarray]:
    """N(j): the number of level-j blocks of a loop."""
    return [count.sum(axis=0) for _, count, _, _ in blocks]


def _align(a: np.ndarray, ndim: int) -> np.ndarray:
    """Append unit axes so a (cuts, ...) array broadcasts against one with `ndim` axes."""
    return a.reshape(a.shape + (1,) * (ndim - a.ndim))


def _dim_volume(index, walk_pos, level, n_levels, blocks, cuts) -> np.ndarray:
    """For one tensor dim, per cut c: the summed size of its level blocks whose deepest
    multi-trip position is at or above c, shape (cuts, *candidates).

    A plain dim sums its loop's classes. An affine dim's block is the combination
    of its loops' blocks: each combination of classes counts the product of their
    counts, the distinct indices those sizes touch, and the deeper of their positions.
    """
    luts = {x: np.array([walk_pos.get((j, x), -1) for j in range(n_levels)] + [-1]) for x in index.loops}
    if index.plain:
        # Sum the blocks by their deepest level, whose walk position decides each cut.
        (x,) = index.loops
        inside = luts[x][None, :] <= cuts[:, None]
        by_deepest = blocks[x][level][3]
        # tensordot over the first axis; matmul on the flattened candidates spares its overhead
        flat = inside.astype(np.float64) @ by_deepest.reshape(len(by_deepest), -1)
        return flat.reshape((len(cuts),) + by_deepest.shape[1:])
    parts = []
    for x in index.loops:
        size, count, deepest, _ = blocks[x][level]
        parts.append((size, count, luts[x][deepest]))
    m = len(parts)
    cand = np.broadcast_shapes(*[p[0].shape[1:] for p in parts])

    def spread(a, i):  # (classes_i, *cand) -> an axis per loop, then the candidates
        a = np.broadcast_to(a, a.shape[:1] + cand)
        return a.reshape((1,) * i + a.shape[:1] + (1,) * (m - 1 - i) + cand)

    sizes = [spread(s, i) for i, (s, _, _) in enumerate(parts)]
    volume = distinct(index.coefficients, sizes) * math.prod(spread(c, i) for i, (_, c, _) in enumerate(parts))
    pos = np.maximum.reduce(np.broadcast_arrays(*[spread(p, i) for i, (_, _, p) in enumerate(parts)]))
    inside = pos[None] <= cuts.reshape((-1,) + (1,) * pos.ndim)
    return np.where(inside, volume, 0.0).sum(axis=tuple(range(1, m + 1)))


def _tensor_dv(index, nont, walk_pos, level, n_levels, blocks, counts):
    """Elements moved into `level` for one tensor (its per-dim `index`) of one op (see module docstring)."""
    tloops = [x for ix in index for x in ix.loops]
    cuts = [-1, *sorted({walk_pos[(j, x)] for x in tloops for j in range(level, n_levels)})]
    if all(ix.plain and blocks[ix.loops[0]][level][3].ndim == 1 for ix in index) and not any_arrays(
            counts[y][j] for y in nont for j in range(level, n_levels)):
        return _plain_tensor_dv(tloops, cuts, nont, walk_pos, level, n_levels, blocks, counts)
    # covered[c]: total volume of the blocks t whose deepest multi-trip T-position is at or above cut c.
    covered, at = np.ones(len(cuts)), np.array(cuts)
    for ix in index:
        volume = _dim_volume(ix, walk_pos, level, n_levels, blocks, at)
        covered = _align(covered, volume.ndim) * volume
    # Each cut's gain times its own product of counts, cut by cut: stacking every level's counts
    # of each loop over the candidates, to pick one level per cut, took half this call's time in
    # a search's large chunks. Whole numbers of elements throughout, which floats add exactly in
    # any order (the sums before summed the cuts pairwise).
    nd = max([covered.ndim - 1, *(np.ndim(counts[y][j]) for y in nont for j in range(level, n_levels))])
    total, below = 0.0, 0.0
    for c, cut in enumerate(cuts):
        gained = _align(covered[c] - below, nd)
        for y in nont:
            # The innermost level whose y-position lies above the cut: its block count multiplies.
            j = next((j for j in range(level, n_levels) if walk_pos[(j, y)] < cut), None)
            if j is not None:
                gained = gained * _align(np.asarray(counts[y][j]), nd)
        total, below = total + gained, covered[c]
    return total


def _plain_tensor_dv(tloops, cuts, nont, walk_pos, level, n_levels, blocks, counts) -> float:
    """_tensor_dv for one plan (plain numbers) of a tensor whose dims are each one loop
    (`tloops`), over _tensor_dv's `cuts`, in Python: a polish costs one plan at a time, and
    numpy's calls on its few cuts took 1.5 ms a gemm plan. The same products in the same order;
    the sums are of whole numbers of elements, which floats add exactly in any order."""
    covered = [1.0] * len(cuts)
    for x in tloops:
        # The dim's blocks by the walk position of their deepest level (-1: one trip all the way
        # out), summed up to each cut as the cuts rise.
        lut = [walk_pos.get((j, x), -1) for j in range(n_levels)] + [-1]
        by_pos = sorted((lut[d], v) for d, v in enumerate(blocks[x][level][3].tolist()) if v)
        i, volume = 0, 0.0
        for c, cut in enumerate(cuts):
            while i < len(by_pos) and by_pos[i][0] <= cut:
                volume, i = volume + by_pos[i][1], i + 1
            covered[c] = covered[c] * volume
    total, below = 0.0, 0.0
    for c, cut in enumerate(cuts):
        mult = 1.0
        for y in nont:
            # The innermost level whose y-position lies above the cut: its block count multiplies.
            j = next((j for j in range(level, n_levels) if walk_pos[(j, y)] < cut), None)
            mult = mult * (float(counts[y][j]) if j is not None else 1.0)
        total = total + (covered[c] - below) * mult
        below = covered[c]
    return total


def _block_total(index, walk_pos, level, n_levels, blocks) -> np.ndarray:
    """The summed size of all of a tensor's level blocks (its size, unless affine windows overlap)."""
    total = 1.0
    for ix in index:
        total = total * _dim_volume(ix, walk_pos, level, n_levels, blocks, np.array([len(walk_pos)]))[0]
    return total


def loop_classes(workload: Workload, tiles: Tiles, lowest: int):
    """Every loop's block classes (loop_blocks) and counts at the levels from `lowest` out:
    what data_volume needs besides the orders."""
    n = len(tiles)
    blocks = {
        x: loop_blocks(e, [tiles[j][x] if j >= lowest else 1 for j in range(n)]) for x, e in workload.dims.items()
    }
    return blocks, {x: block_counts(b) for x, b in blocks.items()}


def op_volume(workload: Workload, op, orders: Orders, level: int, blocks, counts, weights=None,
              local_level: int | None = None, output_level: int | None = None, only=None) -> np.ndarray:
    """Elements one op moves into `level`, summed over its inputs and outputs (each times
    weights[(op name, tensor)] when given). Intermediates move only below `local_level`
    (default: the outermost level); outputs are counted as they move into `output_level`
    (default: `level`). `only`: count just these tensors."""
    n = len(orders)
    walk = [(j, y) for j in reversed(range(level, n)) for y in orders[j] if y in op.loops]
    pos = {p: i for i, p in enumerate(walk)}
    total = 0.0
    for name in workload.moved_tensors(op, level, n - 1 if local_level is None else local_level):
        if only is not None and name not in only:
            continue
        tensor = workload.tensors[name]
        nont = [y for y in op.loops if y not in tensor.loops]
        if weights and name in op.inputs:
            # Streamed into registers: reloaded at every step of the level's walk.
            steps = 1.0
            for y in nont:
                steps = steps * counts[y][level]
            volume = workload.size(name) if tensor.plain else _block_total(tensor.index, pos, level, n, blocks)
            total = total + weights[(op.name, name)] * volume * steps
        else:
            weight = weights.get((op.name, name), 1) if weights else 1
            at = level if output_level is None else output_level
            total = total + weight * _tensor_dv(tensor.index, nont, pos, at, n, blocks, counts)
    return total


def register_weights(workload: Workload, hardware: Hardware | None) -> dict[tuple[str, str], float] | None:
    """The register model: per (op, input), the cost of an element moved into level 0
    (the hardware's target decides; None: plain DV)."""
    return target_for(hardware).register_weights(workload)


def data_volume(workload: Workload, orders: Orders, tiles: Tiles, levels: Sequence[int] | None = None,
                hardware: Hardware | None = None, offset: int = 0, blocks=None, only=None,
                weighted: bool = True, ops=None) -> list[np.ndarray]:
    """DV_l in bytes for each requested level (default: every level, innermost first).

    `orders` and `tiles` are those of the hardware's levels offset, offset+1, ...
    (indices in `levels` count from there). Level l depends only on the orders and
    tiles of levels >= l, so a search may pass outer levels as scalars and one
    level as candidate arrays. With `hardware`, the registers (level 0) count load
    bandwidth: see register_weights (on GPUs threads stream their fragments from
    shared memory and their accumulators persist through the block's walk, so
    outputs move as the block walk moves them). `blocks`: what loop_classes returned for
    these tiles and levels, when the caller costs several orders of the same tiles. `only`:
    count just these tensors. `weighted=False`: the registers' plain bytes, without those load
    costs (what a plan reports as the level's DV). `ops`: count just the ops of these names.
    """
    levels = range(len(orders)) if levels is None else levels
    blocks, counts = blocks or loop_classes(workload, tiles, min(levels))
    target = target_for(hardware)
    weights = None
    if offset == 0 and 0 in levels and weighted:
        weights = target.register_weights(workload)
    local = target.local_level(len(orders) + offset) - offset
    dv = []
    for level in levels:
        w = weights if level + offset == 0 else None
        out_level = target.output_level(level + offset, len(orders) + offset)
        total = sum(op_volume(workload, op, orders, level, blocks, counts, w, local, out_level, only)
                    for op in workload.ops if ops is None or op.name in ops)
        dv.append(np.asarray(total, dtype=np.float64) * workload.elem_bytes)
    return dv


def single_level_bound(workload: Workload, tile: Mapping[str, np.ndarray | int], weights=None) -> np.ndarray:
    """A lower bound on a level's DV in bytes that holds whatever the levels around it do.

    Each op on its own, walking only this level's tiles over the whole problem in
    its best order. Outer levels only add loops that break reuse; checked against
    multi-level plans in the tests.
    """
    blocks, counts = loop_classes(workload, [tile], 0)
    total = 0.0
    for op in workload.ops:
        walks = _distinct_walks(workload, op, weights)
        if walks is not None:
            shape = np.broadcast_shapes(*[np.shape(blocks[x][0][0])[1:] for x in op.loops])
            total = total + np.minimum.reduce(
                [np.broadcast_to(op_volume(workload, op, [perm], 0, blocks, counts, weights), shape) for perm in walks])
            continue
        # Too many orders to try: each tensor on its own in its best order (its own loops
        # outermost, so each of its blocks moves once), a weaker bound.
        for name in [*op.inputs, op.output]:
            mine = workload.tensors[name].loops
            perm = [x for x in op.loops if x in mine] + [x for x in op.loops if x not in mine]
            total = total + op_volume(workload, op, [perm], 0, blocks, counts, weights, only=(name,))
    return np.asarray(total, dtype=np.float64) * workload.elem_bytes


WALK_LIMIT = 64  # distinct orders single_level_bound tries per op before it settles for a weaker bound


def _distinct_walks(workload: Workload, op, weights) -> list[tuple[str, ...]] | None:
    """One permutation of the op's loops per distinct DV formula: what matters to each tensor
    is the sequence of runs of its own and other loops, less trailing other loops (inputs
    streamed into registers, under `weights`, do not depend on the order at all). None past
    WALK_LIMIT."""
    ordered = [t for t in [*op.inputs, op.output] if not (weights and t in op.inputs)]
    loops = [set(workload.tensors[t].loops) for t in ordered]
    seen: dict[tuple, tuple[str, ...]] = {}
    for perm in itertools.permutations(op.loops):
        key = []
        for mine in loops:
            runs: list[tuple[bool, frozenset]] = []
            for x in perm:
                if runs and runs[-1][0] == (x in mine):
                    runs[-1] = (runs[-1][0], runs[-1][1] | {x})
                else:
                    runs.append((x in mine, frozenset({x})))
            while runs and not runs[-1][0]:
                runs.pop()
            key.append(tuple(runs))
        seen.setdefault(tuple(key), perm)
        if len(seen) > WALK_LIMIT:
            return None
    return list(seen.values())


def memory_usage(workload: Workload, tile: Mapping[str, np.ndarray | int], weights=None) -> np.ndarray:
    """MU of one level in bytes: the largest per-op sum of full (unclipped) tensor blocks
    (each times weights[(op name, tensor)] when given)."""
    worst = 0.0
    for op in workload.ops:
        total = 0.0
        for name in [*op.inputs, op.output]:
            block = workload.block(name, tile)
            total = total + (block * weights.get((op.name, name), 1) if weights else block)
        worst = np.maximum(worst, total)
    return np.asarray(worst) * workload.elem_bytes


def level_usage(workload: Workload, hardware: Hardware, level: int, tile: Mapping[str, np.ndarray | int],
                stages: int = 1) -> np.ndarray:
    """MU of `level` on this hardware, as its target counts it (memory_usage unless the
    target models the level itself: SIMD registers, GPU registers and shared memory)."""
    return target_for(hardware).level_usage(workload, level, tile, stages)


def overlapped(terms, norm: float = np.inf) -> np.ndarray:
    """Times that overlap, combined: their `norm`-norm (inf: the largest). Associative, so a
    search may combine the terms it knows and add the others later. Vectorised."""
    terms = [np.asarray(t, dtype=np.float64) for t in terms]
    top = functools.reduce(np.maximum, terms)
    if np.isinf(norm):
        return top
    scale = np.where((top > 0) & np.isfinite(top), top, 1.0)  # scaled: no under- or overflow
    return np.where(np.isfinite(top), scale * sum((t / scale) ** norm for t in terms) ** (1 / norm), top)


def predicted_seconds(compute, link_seconds, shares_issue: bool = False,
                      norm: float = np.inf) -> tuple[np.ndarray, np.ndarray]:
    """Time of a plan from its compute time and each level's link time, and the index of
    the level that sets most of it (-1: compute). The one formula every solver ranks by:
    compute and the links overlap (`overlapped`: with norm inf, max(compute, slowest link);
    the target's overlap_norm), except that when level 0's link shares the core's issue
    slots with the arithmetic (`shares_issue`, SIMD CPUs) its time adds to compute. Vectorised."""
    links = [np.asarray(s, dtype=np.float64) for s in link_seconds]
    compute = np.asarray(compute, dtype=np.float64)
    first = 0
    if shares_issue:
        compute, first = compute + links[0], 1
    slowest, index = compute, np.full(np.broadcast_shapes(compute.shape, *[s.shape for s in links]), -1)
    for i in range(first, len(links)):
        index = np.where(links[i] > slowest, i, index)
        slowest = np.maximum(slowest, links[i])
    return overlapped([compute, *links[first:]], norm), index


def parallel_candidates(workload: Workload, orders: Orders, op) -> list[tuple[str, int]]:
    """Loops (loop, level >= 1) of `op`'s nest the CPU backend may run in parallel, outermost first.

    Those spatial for the op. The outermost level's shared loops belong to the last
    op's nest and enclose the chain's producers: they qualify only there, and only
    when spatial for every op.
    """
    out = set(workload.tensors[op.output].dims)
    everywhere = out.intersection(*[workload.tensors[o.output].dims for o in workload.ops])
    top, last = len(orders) - 1, op is workload.ops[-1]
    cands = []
    for j in reversed(range(1, len(orders))):
        for x in orders[j]:
            outer_shared = j == top and x in workload.shared_loops and len(workload.ops) > 1
            if x in op.loops and x in out and (not outer_shared or (last and x in everywhere)):
                cands.append((x, j))
    return cands


def _pick(workload, orders, tiles, cores, cands):
    """Index into `cands` and trips of the first candidate with >= cores trips, else the one
    with most trips (-1 and 1 trip when there is none); vectorised over tile arrays.
    Candidates sit at levels >= 1, so the register tiles never enter: a search's arrays of them
    leave the pick a plain number."""
    if not any_arrays(t[x] for t in tiles[1:] for x in workload.dims):  # one pick: plain numbers
        best, best_trips = -1, 1.0
        for i, (x, j) in enumerate(cands):
            parent = tiles[j + 1][x] if j + 1 < len(tiles) else workload.dims[x]
            t = float(math.ceil(float(parent) / float(tiles[j][x])))
            if t >= cores:
                return i, t
            if t > best_trips:
                best, best_trips = i, t
        return best, best_trips
    shape = np.broadcast_shapes(*[np.shape(t[x]) for t in tiles[1:] for x in workload.dims])
    pick, trips = np.full(shape, -1), np.ones(shape)
    best, best_trips = np.full(shape, -1), np.ones(shape)
    for i, (x, j) in enumerate(cands):
        parent = tiles[j + 1][x] if j + 1 < len(tiles) else workload.dims[x]
        t = np.ceil(np.asarray(parent, dtype=np.float64) / np.asarray(tiles[j][x], dtype=np.float64))
        first = (pick < 0) & (t >= cores)
        pick, trips = np.where(first, i, pick), np.where(first, t, trips)
        better = t > best_trips
        best, best_trips = np.where(better, i, best), np.where(better, t, best_trips)
    none = pick < 0
    return np.where(none, best, pick), np.where(none, best_trips, trips)


def parallel_loops(workload: Workload, orders: Orders, tiles: Tiles, cores: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per op, the loop the backend runs in parallel: (index into parallel_candidates or -1, trips).

    The last op takes the first candidate with at least `cores` trips, else the one
    with most. When that loop encloses the producers, they run inside it (index -1,
    its trips); otherwise each producer picks in its own nest the same way.
    """
    cands = parallel_candidates(workload, orders, workload.ops[-1])
    pick, trips = _pick(workload, orders, tiles, cores, cands)
    top = len(orders) - 1
    shared = [i for i, (x, j) in enumerate(cands) if j == top and x in workload.shared_loops]
    encloses = one_of(pick, shared)
    result = []
    for op in workload.ops[:-1]:
        p_pick, p_trips = _pick(workload, orders, tiles, cores, parallel_candidates(workload, orders, op))
        result.append((np.where(encloses, -1, p_pick), np.where(encloses, trips, p_trips)))
    return result + [(pick, trips)]


def one_of(pick, values: Sequence[int]) -> np.ndarray | bool:
    """Whether each `pick` (an index, or an array of them) is among `values`, a few indices:
    np.isin's result, from comparisons, which cost a tenth of isin's sorting on a search's arrays."""
    if not np.ndim(pick):
        return pick in values
    out = np.zeros(np.shape(pick), dtype=bool)
    for v in values:
        out |= pick == v
    return out


def padded_extents(workload: Workload, tiles: Tiles) -> dict[str, np.ndarray]:
    """The extents the backend computes over: each loop rounded up to a multiple of its
    largest tile smaller than the extent (padding computes on zeros, so it costs flops).
    Over arrays, remembered (_PADDED; the arrays returned are read-only): one score asks for
    them four times and more (the compute term, the target's reduction chains and registers)."""
    if not any_arrays(t[x] for t in tiles for x in workload.dims):
        return _padded_extents(workload, tiles)
    key = (tuple(workload.dims.items()), *(_tile_key(t[x]) for t in tiles for x in workload.dims))
    return dict(_remembered(_PADDED, _PADDED_HELD, key, lambda: _padded_extents(workload, tiles),
                            lambda held: (v for v in held.values() if isinstance(v, np.ndarray))))


def _padded_extents(workload: Workload, tiles: Tiles) -> dict[str, np.ndarray]:
    padded = {}
    for x, extent in workload.dims.items():
        # The levels' plain numbers first, in Python: a search's call has a few levels of arrays
        # beside them, and numpy's calls on numbers cost more than the arithmetic (an exhaustive
        # search of a batch gemm spent a quarter of its time here).
        below, arrays = 0.0, []
        for t in tiles:
            v = t[x]
            if isinstance(v, np.ndarray) and v.ndim:
                arrays.append(v)
            elif v < extent:
                below = max(below, float(v))
        if not arrays:
            padded[x] = math.ceil(extent / below) * below if below else float(extent)
            continue
        below = np.float64(below)
        for t in arrays:
            below = np.maximum(below, np.where(t < extent, t, 0))
        padded[x] = np.where(below > 0, np.ceil(extent / np.maximum(below, 1)) * below, float(extent))
    return padded


def _points(op, extents) -> np.ndarray | float:
    """The op's iteration points over these loop extents (arrays allowed)."""
    points = 1.0
    for x in op.loops:
        points = points * extents[x]
    return points


def padding_factor(workload: Workload, tiles: Tiles) -> np.ndarray:
    """The flops the backend computes over padded loops (padded_extents), as a multiple of the
    workload's; vectorised. Padding only grows as inner tiles are added, so outer levels' tiles
    alone give a lower bound."""
    padded = padded_extents(workload, tiles)
    total = sum(_points(op, padded) for op in workload.ops)
    return np.asarray(total / sum(_points(op, workload.dims) for op in workload.ops))


def compute_seconds(workload: Workload, hardware: Hardware, orders: Orders | None = None,
                    tiles: Tiles | None = None, stages: int = 1) -> np.ndarray:
    """Time of the arithmetic alone: peak, unless the plan keeps the cores from it.

    Without a plan that is flops / peak. Loops padded to a multiple of a tile
    (padded_extents) add flops. Each op runs at the fraction of peak its inner
    loop can issue (the target's issue_efficiency: on SIMD CPUs, too few
    accumulator vectors wait on FMA latency). With several cores, the parallel
    loop's trips are shared out in rounds of `cores`; a last partial round idles
    the rest. Last, the target's launch_stretch (on GPUs, blocks run in waves of
    SMs x resident blocks, and too few resident warps slow the arithmetic).
    """
    target = target_for(hardware)
    peak = target.peak_flops(workload)
    if tiles is None:
        return np.asarray(workload.flops / peak)
    total = 0.0
    parallel = parallel_loops(workload, orders, tiles, hardware.cores) if hardware.cores > 1 and orders else None
    padded = padded_extents(workload, tiles)
    for i, op in enumerate(workload.ops):
        seconds = 2.0 * _points(op, padded) / peak / target.issue_efficiency(workload, op, tiles, orders)
        if parallel is not None:
            trips = parallel[i][1]
            seconds = seconds * hardware.cores * np.ceil(trips / hardware.cores) / np.maximum(trips, 1)
        total = total + seconds
    return np.asarray(total * target.launch_stretch(workload, tiles, stages))


def check_order(workload: Workload, order: Sequence[str]) -> None:
    """Raise InvalidInput unless `order` is a permutation of the loops with shared loops first."""
    if isinstance(order, str) or not isinstance(order, Sequence) or sorted(map(str, order)) != sorted(workload.dims):
        raise InvalidInput(f"order {order!r} must list each loop of {list(workload.dims)} once")
    shared = set(workload.shared_loops)
    seen_private = False
    for x in order:
        if x not in shared:
            seen_private = True
        elif seen_private:
            raise InvalidInput(
                f"order {list(order)}: shared loop {x!r} comes after a loop private to one op; "
                "that would recompute an earlier op or hold an unbounded intermediate"
            )


def check_tiles(workload: Workload, tiles: Tiles) -> None:
    """Raise InvalidInput unless every level's tile maps each loop, and only those, to integers
    (or integer arrays) with 1 <= tile_l <= tile_(l+1) <= extent."""
    if isinstance(tiles, Mapping) or not isinstance(tiles, Sequence):
        raise InvalidInput(f"tiles must be a list with one {{loop: tile}} mapping per level, got {type(tiles).__name__}")
    for level, tile in enumerate(tiles):  # every value an integer first: each is compared with the one above
        if not isinstance(tile, Mapping):
            raise InvalidInput(f"level {level} tile must be a {{loop: tile}} mapping, got {type(tile).__name__}")
        unknown = [x for x in tile if x not in workload.dims]
        if unknown:
            raise InvalidInput(f"level {level} tile names unknown loop(s) {unknown}; the loops are {list(workload.dims)}")
        for x in workload.dims:
            if x not in tile:
                raise InvalidInput(f"level {level} tile has no entry for loop {x!r}")
            if np.asarray(tile[x]).dtype.kind not in "iu":
                raise InvalidInput(f"level {level} tile of {x!r} is {tile[x]!r}; tiles must be integers")
    for level, tile in enumerate(tiles):
        for x, extent in workload.dims.items():
            t = np.asarray(tile[x])
            parent = np.asarray(tiles[level + 1][x]) if level + 1 < len(tiles) else extent
            if t.size == 0 or not np.all((1 <= t) & (t <= parent)):
                shown = tile[x] if t.ndim == 0 else "an array"
                raise InvalidInput(f"level {level} tile of {x!r} is {shown}; it must be between 1 and "
                                   f"{parent if np.ndim(parent) == 0 else 'the tile above'}")
