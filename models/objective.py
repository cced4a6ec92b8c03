"""What a plan is ranked by: its predicted time, or the data moved into one level.

Every solver, the polish and the plan document rank plans through an
Objective, so the formula lives in one place (costmodel.predicted_seconds):
each level's link costs DV_l / divisor_l, compute counts or not, on SIMD CPUs
level 0's link adds to compute, compute and the links overlap as the target's
overlap_norm says (the slowest alone, or on SIMD CPUs a 3-norm), and the
kernel's serial costs (the target's kernel_costs: packing copies, parallel
regions, the call) add to the whole.
`time_objective` divides by each link's bandwidth; `dv_objective(l)` (the
Pareto sweeps) costs DV_l alone, in bytes.

A hardware cache (the target's cache_bytes) is not emptied between the plan's
tiles at its level: it keeps whatever fits. So the time objective costs its link
with `effective_dv`: the least DV of any level, its own or an outer one
(or the whole problem, each tensor once, or its own tile grown along its
innermost loops: `swept`), whose tile fits the cache. The
outermost level's DV counts no intermediate of a chain (the contract), but the
kernel writes each intermediate's buffer and reads it back: standing in for a
cache, that level adds those bytes (WholeProblem.intermediates). DV_l itself
keeps Accera's refill semantics (exact against the simulator); measured on gemm
1024^3, plans with 1x32x2 L2 tiles under a 29 KiB L3 tile ran in 6.5 ms, where
their L2 DV alone predicts 26 ms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from .caches import LINE_BYTES as LINE
from .costmodel import memory_usage, one_of, overlapped, parallel_candidates, parallel_loops, predicted_seconds
from .hardware import Hardware


@dataclass(frozen=True)
class Objective:
    divisors: tuple[float, ...]  # per level, innermost first: DV_l / divisor_l is the link's cost
    counts_compute: bool  # whether the arithmetic's time enters the cost
    shares_issue: bool  # level 0's cost adds to compute instead of overlapping it
    level: int | None = None  # dv_objective's level
    caches: tuple[int | None, ...] = ()  # per level: bytes a hardware cache holds (None: its DV is exact)
    norm: float = np.inf  # how compute and the links overlap (costmodel.overlapped)

    @property
    def counts_serial(self) -> bool:
        """Whether the kernel's serial costs (copies, regions, the call) enter the cost."""
        return self.counts_compute

    def links(self, dv: Sequence, mu: Sequence | None = None, whole: WholeProblem | None = None,
              top: Outermost | None = None) -> list:
        """Each level's cost from its DV in bytes (scalars or arrays); with the levels' MU, the
        whole problem's (DV, MU) and the tiles' sweeps (`swept`), from effective_dv."""
        if mu is not None and self.caches:
            dv = effective_dv(dv, mu, self.caches, whole, top)
        return [d / div for d, div in zip(dv, self.divisors)]

    def compute(self, seconds):
        """The arithmetic's share of the cost (0 when it does not count)."""
        return seconds if self.counts_compute else np.zeros_like(np.asarray(seconds, dtype=np.float64))

    def value(self, compute, links, serial=0.0, relief=None, reads=0.0) -> tuple[np.ndarray, np.ndarray]:
        """The cost of plans and the index of the level that sets it (-1: compute), plus the
        serial seconds when they count, less what the copies inside the loop nest spare the
        links (`spared`). Vectorised."""
        compute = self.compute(compute)
        best, index = predicted_seconds(compute, links, self.shares_issue, self.norm)
        if not self.counts_serial:
            return best, index
        return best + serial - self.spared(compute, links, best, relief, reads), index

    def spared(self, compute, links, best, relief=None, reads=0.0):
        """What the copies inside the loop nest save of `best` (the plans' overlapped compute
        and links): `relief` (per link, bytes) and `reads` (seconds) are what they spare the
        links and spend reading their sources (kernel_costs.relieved). Those reads are the
        links' own bytes, so the plans' time falls by what the links take less without those
        bytes, at most the reads. Vectorised."""
        if relief is None or not np.any(reads):
            return 0.0
        fewer = [np.maximum(t - r / d, 0.0) for t, r, d in zip(links, relief, self.divisors)]
        less, _ = predicted_seconds(compute, fewer, self.shares_issue, self.norm)
        return np.minimum(best - less, reads)

    def overlap(self, *terms):
        """Compute and link times (or what bounds them) combined as `value` combines them."""
        return overlapped(terms, self.norm)


def fitting_dv(fit: int, tiles) -> np.ndarray:
    """The least DV among `tiles`, (DV, MU) pairs (scalars or arrays), whose MU fits a hardware
    cache of `fit` bytes: at most what that cache moves (inf where none fits)."""
    least = np.inf
    for dv, mu in tiles:
        least = np.where(np.asarray(mu) <= fit, np.minimum(least, dv), least)
    return least


class WholeProblem(NamedTuple):
    """One tile holding the whole problem, as effective_dv's last stand-in for a cache."""

    dv: float  # each tensor moved once, a chain's intermediates too
    mu: float  # all of it held
    intermediates: float  # a chain's intermediates written and read back once: what the outermost
    # level's DV leaves out when it stands in for a cache (0 without intermediates)
    buffers: Callable[[Mapping], np.ndarray] | None = None  # outermost tile -> bytes of the buffer
    # a core keeps the intermediates' blocks in (None: no bound)
    written: float = 0.0  # the outputs' bytes, written back to memory once
    cores: int = 1
    footprint: Callable[[Mapping], np.ndarray] | None = None  # outermost tile -> bytes of every
    # tensor's block, over the loops the ops share: what a core touches between writing an
    # intermediate's block and its last read

    def standing(self, level: int, top: int, tile: Mapping | None = None) -> np.ndarray | float:
        """What level `level` (of levels 0..top) adds to its DV when it stands in for an inner
        cache: the outermost, the intermediates its DV leaves out. Standing in, its `tile` fits
        the cache, and so do the buffers the cores keep the intermediates' blocks in, from one
        tile to the next: only their first writes miss, at most the buffers' bytes (a 1-row
        tile of MobileNet's first block at batch 8 keeps a 14 KiB buffer, where a round trip
        of the intermediate is 25.7 MB)."""
        if level != top:
            return 0.0
        if tile is None or self.buffers is None:
            return self.intermediates
        return np.minimum(self.intermediates, self.cores * self.buffers(tile))

    def to_memory(self, tile: Mapping | None, private: int | None) -> np.ndarray | float:
        """What the memory link carries beyond the outermost level's DV, for its `tile`: the
        outputs' write-back (the memory bus carries a cache's write-backs as well as its fills,
        and DV counts the lines fetched for ownership), and a chain's intermediates written and
        read back unless the tile's blocks, the intermediates' buffer among them, fit a core's
        `private` cache (the level inside the outermost): otherwise the producer's input and the
        consumer's output stream through the shared cache between a block's write and its read,
        and evict it. Measured on MobileNet's first block at batch 8 on 2 cores: tiles of 86
        and 431 KiB in a 1 MiB L2 ran the fused kernel in 1709 and 1831 us, of 6.4 and 26 MB
        in 2100 and 2260-2500 us; one round trip of the intermediate at the memory link is
        530 us."""
        if tile is None or self.footprint is None or private is None:
            return self.written
        return self.written + np.where(self.footprint(tile) > private, self.intermediates, 0.0)


class Outermost(NamedTuple):
    """The plan's outermost tile, and the (DV, MU) of each of its sweeps (`outermost`); with
    `swept`, the sweeps of the inner cache levels' tiles too, by level."""

    tile: Mapping
    sweeps: list
    inner: Mapping[int, list] = {}
    private: np.ndarray | float = 0.0  # bytes each core's private caches receive at least (private_floor)
    cores: list = []  # (DV, MU) of the outermost tile grown to one core's share (core_sweeps)
    turns: tuple = (0.0, 0.0, 0.0)  # a chain's outermost tile: its MU, all its blocks' bytes, its trips (turns)


def outermost(workload, hardware: Hardware, whole: WholeProblem, order: Sequence[str], tile: Mapping,
              fit: int | None = None, crowd: Callable | None = None) -> Outermost:
    """The outermost level's tile and its sweeps: the tile grown to the whole extent along the
    innermost one, two, ... loops of `order` that take more than one trip, each with its DV and
    MU (arrays allowed), while some grown tile fits `fit` bytes (default: the largest hardware
    cache that `whole`, the whole problem, overflows; where the whole fits, it moves less than
    any sweep). Accera's refill rule
    reloads a block whole whenever it changes, so windows sliding along an affine dim (a
    convolution's input rows under row tiles) move their overlap again and again; a cache that
    holds a sweep of the loops inside keeps that overlap and moves what the grown tile moves.
    It also keeps what the next trip of the loop around the sweep reuses (a GEMM's B panel
    across row tiles), as an LRU cache that holds the sweep does. (MobileNet's first block at
    batch 8 in 1-row tiles: DV 64.9 MB from memory, 38.5 MB kept in L3; its kernel ran fastest
    of the plans measured.) An inner cache that holds a sweep keeps the same (effective_dv):
    gemm 1000^3 in 22x128x10 outermost tiles, m, k, n outermost, keeps each 22-row block of C
    in L2 across the k loop, which the tiles inside cannot tell it. `crowd`: what a grown tile's
    MU adds for rows that crowd into a share of the sets (crowding.crowding)."""
    if fit is None:
        fit = outer_fit([hardware.target.cache_bytes(i) for i in range(len(hardware.levels))], whole)
    if fit is None or whole.mu <= fit:
        return Outermost(tile, [])
    return Outermost(tile, grown_sweeps(workload, hardware, len(hardware.levels) - 1, [order], [tile],
                                        workload.dims, fit, crowd=crowd))


def outer_fit(caches: Sequence[int | None], whole: WholeProblem) -> int | None:
    """The largest of the hardware caches (bytes per level) that the whole problem overflows: what
    the outermost tile's sweeps must fit (outermost). None where it overflows none."""
    return max((f for f in caches if f is not None and f < whole.mu), default=None)


# Loops an inner cache's tile is grown along (swept): the innermost one. Growing along more
# approaches the parent tile, which stands in already, and each step is one more DV call per
# candidate in the search (ViT attention planned in 1.5 s with every step, 0.98 s with one).
INNER_STEPS = 1


def swept(workload, hardware: Hardware, whole: WholeProblem, orders, tiles,
          steps: int | None = INNER_STEPS, caches: Sequence[int | None] | None = None,
          crowded_apart: bool = False, each_op: bool = False) -> Outermost:
    """`outermost`, with the sweeps of every inner cache level's tile inside its parent tile (along
    its innermost `steps` split loops, None: every one): a cache that holds the tiles one trip of
    that loop walks keeps what the refill rule reloads at each step. (A chain's consumer walking
    four 7 KiB blocks of D across each 5-row tile: refilled 1.16 MiB, while valgrind's L1 missed
    0.76 MiB for the whole kernel.) A grown tile whose inputs are read in place, a piece of each
    row, fits only where the sets their rows crowd into hold it (crowding.crowding). The
    enumeration's caps leave that out, as bounds from below: which inputs are copied is known
    only once every level is fixed, and the polish and the final ranking score each plan here.
    `caches`: the bytes each
    level's cache keeps (default: the hardware's, Target.cache_bytes). `crowded_apart` (one plan,
    scalar tiles): each sweep also stands in with the crowding inputs kept only as far as their
    sets hold them (grown_sweeps' `streamed`). `each_op` (one plan, scalar tiles): a chain's
    sweeps also stand in op by op (op_sweeps)."""
    from .crowding import crowding

    fits = [hardware.target.cache_bytes(i) for i in range(len(tiles))] if caches is None else list(caches)
    private = private_fit(fits)
    crowd = crowding(workload, hardware, tiles)
    overflowed = outer_fit(fits, whole)  # None: the whole problem fits every cache, and no sweep counts
    top = outermost(workload, hardware, whole, orders[-1], tiles[-1], whole.mu if overflowed is None else overflowed,
                    crowd)._replace(
        private=private_floor(workload, hardware, orders, tiles), turns=turns(workload, tiles[-1]),
        cores=core_sweeps(workload, hardware, orders[-1], tiles[-1], private, crowd) if private else [])

    def sweeps(level: int, fit: int) -> list:
        args = (workload, hardware, level, orders[level:], tiles[level:], tiles[level + 1], fit, steps)
        apart = grown_sweeps(*args, streamed=crowd) if crowded_apart and crowd is not None else []
        mine = op_sweeps(*args[:-1], crowd) if each_op else []
        return [*grown_sweeps(*args, crowd), *apart, *mine]

    return top._replace(inner={level: sweeps(level, fit) for level, fit in enumerate(fits[:-1]) if fit is not None})


def core_sweeps(workload, hardware: Hardware, order: Sequence[str], tile: Mapping, fit: int,
                crowd: Callable | None = None) -> list:
    """(DV, MU) of the outermost `tile` (walked by `order`) as one core's private caches see it,
    where the backend runs one of its loops in parallel (the first spatial one with a trip per
    core, costmodel.parallel_loops): each core walks its own consecutive trips of that loop, so
    the tile spans them and the loop over the cores' shares runs outermost; then that tile grown
    along its innermost loops (grown_sweeps) while it fits `fit`. Only tiles in which the loops
    inside that loop (in `order`) are whole count. Arrays allowed; no sweeps on one core;
    `crowd` as in `outermost`.
    (gemm 197x2304x768 in 33x192x6 outermost tiles, k outermost: all of C, 1.8 MB, overflows
    L2, and the refill rule reloads it at every k step, 243 MB; each core's half of C stays in
    its own L2, and the plan ran in 3.3 ms where that charge alone predicts 4.1.)"""
    from .costmodel import data_volume, level_usage

    cores, top = hardware.cores, len(hardware.levels) - 1
    if cores <= 1:
        return []
    # The outermost level alone: the backend's pick among its loops (parallel_loops) is made there.
    pick, trips = parallel_loops(workload, [order, order], [tile, tile], cores)[-1]
    picked = np.asarray(trips) >= cores
    out = []
    for i, (x, _) in enumerate(parallel_candidates(workload, [order, order], workload.ops[-1])):
        mine = picked & (pick == i)
        if not np.any(mine):
            continue
        share = dict(tile)
        share[x] = np.where(mine, np.minimum(np.ceil(trips / cores) * tile[x], workload.dims[x]), tile[x])
        walk = [x, *(y for y in order if y != x)]
        dv = data_volume(workload, [walk], [share], levels=[0], hardware=hardware, offset=top)[0]
        mu = level_usage(workload, hardware, top, share) + (crowd(share) if crowd else 0.0)
        found = [(dv, mu), *grown_sweeps(workload, hardware, top, [walk], [share], workload.dims, fit, crowd=crowd)]
        # The share's tile takes the core's trips of x together, as if x ran inside the loops the
        # order puts inside it. That holds once those loops are grown whole (grown_sweeps grows
        # them first); before, each trip of x streams what they walk again. vit-b/16's MLP
        # (197x3072x768) in 9x32x1 tiles at every level, m outermost and split over the cores,
        # streams all of B in each row tile (210 MB into L2): its cores' shares were charged
        # 22 MB, and it ran in 6.5 ms, 2.8x the prediction (Intel Xeon, 2 cores).
        inside = order[order.index(x) + 1:]
        split = sum(np.asarray(tile[y]) < workload.dims[y] for y in inside)
        out.extend((np.where(mine & (step >= split), d, np.inf), m) for step, (d, m) in enumerate(found))
    return out


def held_bytes(workload, tile: Mapping, names=None) -> np.ndarray | float:
    """Bytes of the blocks under `tile` (arrays allowed) of the tensors `names` (default: every
    one): what a cache holds to keep all of a tile's blocks at once. MU counts one op's blocks
    at a time."""
    return workload.elem_bytes * sum(workload.block(n, tile) for n in (workload.tensors if names is None else names))


def turns(workload, tile: Mapping) -> tuple:
    """A chain's ops take turns at each trip of its outermost `tile` (the backend runs each
    producer at the outermost level's last shared loop): the bytes of the largest op's blocks
    (MU), of all of them (held_bytes), and the number of trips. A cache that holds each op's
    blocks but not all of them keeps none from one trip to the next: LRU evicts the producer's
    blocks while the consumer streams its own, and the consumer's while the next producer runs.
    So it moves every block at every trip, whatever reuse its inner tiles or an outer one
    promise. (Attention 2048 x 128, outermost tiles of 6 and of 12 query rows: each op's K or V
    block, 1 MiB, fits L2's 1.5 MiB usable share, both do not; with L2 charged the inner tiles'
    reuse, that plan was predicted 3% faster than one with 48-row tiles, and ran 1.5x as long.)
    Where not even one op's blocks fit (L1, mostly), the inner tiles' reuse is what the cache
    sees, as bench/cachegrind.py and bench/fidelity.py measure. (0, 0, 0) for one op."""
    if len(workload.ops) == 1:
        return (0.0, 0.0, 0.0)
    # In floats: whole numbers, exact below 2**53 trips, where int64 overflowed on extreme extents.
    trips = math.prod(-(-extent // np.asarray(tile[x], dtype=np.float64)) for x, extent in workload.dims.items())
    return (memory_usage(workload, tile), held_bytes(workload, tile), trips)


def private_floor(workload, hardware: Hardware, orders, tiles) -> np.ndarray | float:
    """Bytes the private caches (every level inside the shared outermost one) of all cores
    receive at least: each output once, and each input once per core that runs part of the
    parallel loop (costmodel.parallel_loops) unless that loop splits it. A cache holding the
    whole of an input still fetches it once per core: gpt-2's decode GEMM 16x3072x768 with its
    4 row tiles split over 2 cores ran in 0.52 ms, with the same tiles and its 48 column tiles
    split in 0.33 ms, at the same DV; both cores read the 9.4 MB of weights in the first
    (BENCHMARKS.md, "Chain session"). 0 on one core."""
    cores = hardware.cores
    if cores <= 1:
        return 0.0
    picks = parallel_loops(workload, orders, tiles, cores)
    cands = {op.name: parallel_candidates(workload, orders, op) for op in workload.ops}

    def splits(op, pick, loops) -> np.ndarray:  # whether the op's parallel loop `pick` indexes one of `loops`
        return one_of(pick, [i for i, (x, _) in enumerate(cands[op.name]) if x in loops])

    last = workload.ops[-1]
    factor: dict[str, np.ndarray] = {}
    for op, (pick, trips) in zip(workload.ops, picks):
        used = np.minimum(cores, np.maximum(trips, 1))
        for name in op.inputs:
            if workload.tensors[name].role != "input":
                continue
            loops = workload.tensors[name].loops
            split = splits(op, pick, loops)
            if op is not last:  # a producer inside the last op's parallel loop
                split = split | ((pick == -1) & splits(last, picks[-1][0], loops))
            factor[name] = np.maximum(factor.get(name, 1.0), np.where(split, 1.0, used))
    elem = workload.elem_bytes
    floor = workload.bytes_of("output")
    for name, f in factor.items():
        floor = floor + f * workload.size(name) * elem
    return floor


def private_levels(caches: Sequence[int | None]) -> list[int]:
    """The levels private_floor applies to, of a hierarchy with these hardware caches per level
    (Objective.caches): each core's own caches, the hardware caches inside the outermost level,
    which the cores share."""
    return [i for i, fit in enumerate(caches[:-1]) if fit is not None]


def private_fit(caches: Sequence[int | None]) -> int | None:
    """The largest of the private caches (private_levels) of a hierarchy with these hardware caches
    per level: what a core's share of the outermost tile must fit (core_sweeps). None without one."""
    return max((caches[i] for i in private_levels(caches)), default=None)


def grown_sweeps(workload, hardware: Hardware, level: int, orders, tiles, parent: Mapping, fit: int,
                 steps: int | None = None, crowd: Callable | None = None, streamed: Callable | None = None,
                 op=None) -> list:
    """(DV, MU) of tiles[0] (the tile of `level`, walked by orders[0] inside `parent`; orders and
    tiles of the outer levels follow) grown to the parent's extent along its innermost one, two,
    ... loops still split, while one fits `fit` bytes (DV inf where it does not), its MU raised by
    `crowd` (the bytes its crowded rows take: crowding.crowding). With `streamed` instead (a
    crowding.crowding), the inputs whose rows crowd a few sets are kept only as far as those
    sets hold them (crowded_misses), and the other tensors in the rest of the sets. With `op`,
    that op's refills alone, and its own blocks for MU (op_sweeps). Arrays allowed."""
    from .costmodel import data_volume, level_usage

    def moved(tile, outer, only=None):
        return data_volume(workload, [orders[0], *orders[1:]], [tile, *outer], levels=[0], hardware=hardware,
                           offset=level, only=only, ops=None if op is None else {op.name})[0]

    # what each crowding input moves where it is not kept: its refills at tiles[0]
    own = {name: moved(tiles[0], tiles[1:], {name}) for name in (streamed.names if streamed else ())}
    order = orders[0]
    sweeps, grown, done = [], dict(tiles[0]), False
    for _ in range(min(len(order), steps or len(order))):
        found = False
        for x in reversed(order):  # the innermost loop still split, grown to the parent's extent
            split = np.asarray(grown[x]) < parent[x]
            grown[x] = np.where(split & ~found, parent[x], grown[x])
            found = found | split
        plain = (level_usage(workload, hardware, level, grown) if op is None
                 else held_bytes(workload, grown, [*op.inputs, op.output]))
        mu = plain + (crowd(grown) if crowd else 0.0)
        done = done | ~found | (mu > fit)
        if np.all(done):
            break
        live = ~np.asarray(done)
        subset = live.ndim and not live.all()  # cost only the candidates whose grown tile still fits
        part = (lambda v: v[live] if np.shape(v) == live.shape else v) if subset else (lambda v: v)
        pick = lambda tile: {x: part(v) for x, v in tile.items()}  # noqa: E731
        live_grown, outer = pick(grown), list(map(pick, tiles[1:]))
        dv = cost = moved(live_grown, outer)
        if streamed:
            for name, miss in crowded_misses(hardware.levels[level], streamed.crowded(grown), plain).items():
                dv = cost = cost + part(miss) * (part(own[name]) - moved(live_grown, outer, {name}))
        if subset:  # the others' grown tiles do not fit: no DV of theirs counts
            dv = np.full(live.shape, np.inf)
            dv[live] = cost
        sweeps.append((np.where(done, np.inf, dv), mu))
    return sweeps


def op_sweeps(workload, hardware: Hardware, level: int, orders, tiles, parent: Mapping, fit: int,
              crowd: Callable | None = None) -> list:
    """A chain's sweeps taken op by op, for one plan (scalar tiles; [] for one op): each op's
    blocks of `level`'s tile and its grown ones (grown_sweeps with `op`) while they fit `fit`
    with the crowded rows (`crowd`), as one (DV, MU) stand-in: each op moving the least its
    fitting tiles move, and the largest of those tiles' blocks. The backend runs a producer's
    whole nest at the outermost level's last shared loop and then the consumer's
    (models/kernel_costs.py's regions), so a cache keeps the tile of the op running, whatever
    the other op's blocks would take. (Chain 2x97x113x64x64 in 9x24x64x8 L1 tiles on a 32 KiB
    L1: the consumer's 9-row block of C, 4.3 KiB, is refilled for each of its 8 column tiles by
    the refill rule, 0.76 MiB, while the producer's B takes 30 KiB, so the tile grown for both
    fits nowhere; valgrind's L1 missed 1.93 MiB for the whole kernel, 0.73x the 2.66 expected
    without this stand-in, 0.97x with it.)"""
    from .costmodel import data_volume

    if len(workload.ops) == 1:
        return []
    total, most = 0.0, 0.0
    for op in workload.ops:
        held = float(held_bytes(workload, tiles[0], [*op.inputs, op.output]))
        if held > fit:  # not even the op's own blocks fit: no stand-in
            return []
        own = float(data_volume(workload, orders, tiles, levels=[0], hardware=hardware, offset=level,
                                ops={op.name})[0])
        grown = grown_sweeps(workload, hardware, level, orders, tiles, parent, fit, crowd=crowd, op=op)
        dv, mu = min([(own, held), *((float(d), float(m)) for d, m in grown if np.isfinite(d))], key=lambda o: o[0])
        total, most = total + dv, max(most, mu)
    return [(total, most)]


def crowded_misses(level, crowded: Mapping[str, tuple], held: np.ndarray | float) -> dict[str, np.ndarray]:
    """Per input whose rows crowd a few sets of the cache `level` (crowding.crowding's `crowded`
    of a kept tile: rows, bytes per row's piece, share of the sets), the share of its reuses that
    miss. Under LRU a set whose lines are used in turn misses them all once one line more than
    its ways lands in it between two uses: the crowded sets hold the input's lines, and the rest
    of the tile's `held` bytes spread over all the sets (a Poisson count per set). batch-gemm
    4x96x128x64 in 4x16 tiles reads 16-column panels of B in place, 64 rows 512 bytes apart: 8
    lines in each of 8 of an 8-way L1's 64 sets, and 20 lines of A and C between two uses, 0.31
    per set: 27% of B's reuses miss. Valgrind's L1 missed 1.93 MiB for the whole kernel; 2.02
    expected, 4.13 with none of B kept, 1.06 with all."""
    if not level.ways:
        return {name: np.ones(()) for name in crowded}
    sets = level.capacity_bytes // (level.ways * LINE)
    out = {}
    for name, (rows, run, share) in crowded.items():
        lines = rows * np.ceil(run / LINE)
        free = level.ways - lines / np.maximum(share * sets, 1.0)  # ways each crowded set has left
        others = np.maximum(held - rows * run, 0.0) / LINE / sets
        fits = sum(np.where(i <= free, np.exp(-others) * others ** i / math.factorial(i), 0.0)
                   for i in range(level.ways + 1))
        out[name] = np.where(free < 0, 1.0, 1.0 - fits)
    return out


def effective_dv(dv: Sequence, mu: Sequence, caches: Sequence[int | None], whole: WholeProblem | None,
                 top: Outermost | None = None) -> list:
    """Per level, the bytes moved into it: its DV, or where it is a hardware cache of
    `caches[l]` bytes, no more than the DV of a level outside it (the outermost with what it
    adds standing in, WholeProblem.standing, for its tile `top.tile`), of its own tile's
    sweeps (`top.inner` for the inner levels: `swept`), of the outermost tile's sweeps
    (`top.sweeps`, with the intermediates its DV leaves out for an inner level), for a core's
    private caches of the outermost tile spanning that core's share of the parallel loop
    (`top.cores`: core_sweeps) or of the whole problem whose MU fits (fitting_dv); and at least
    a chain's outermost blocks at every trip where each op's fit but all do not (`top.turns`).
    Scalars or arrays, innermost level first."""
    last = len(dv) - 1
    outer = [(d + (whole.standing(j, last, top.tile if top else None) if whole is not None else 0.0), m)
             for j, (d, m) in enumerate(zip(dv, mu))]
    out = list(dv)
    extra = whole.intermediates if whole is not None else 0.0
    grown = top.sweeps if top is not None else []
    private = private_levels(caches)
    for i, fit in enumerate(caches):
        if fit is not None:
            # A sweep of this level's tile or of an outer one's (inside its parent) stands in alike.
            inner = [sweep for j, sweeps in (top.inner.items() if top else ()) if j >= i for sweep in sweeps]
            mine = grown if i == last else [*inner, *((d + extra, m) for d, m in grown)]
            if i in private and top is not None:
                mine = [*mine, *((d + extra, m) for d, m in top.cores)]
            outside = [*outer[i + 1:], *mine, *([whole[:2]] if whole is not None else [])]
            out[i] = np.minimum(dv[i], fitting_dv(fit, outside))
            if i in private and top is not None:
                out[i] = np.maximum(out[i], top.private)
            if top is not None:
                each, held, trips = top.turns
                out[i] = np.where((each <= fit) & (held > fit), np.maximum(out[i], trips * held), out[i])
    out[last] = out[last] + memory_extra(whole, caches, top.tile if top else None)
    return out


def memory_extra(whole: WholeProblem | None, caches: Sequence[int | None], tile: Mapping | None = None):
    """What the memory link carries beyond the outermost level's DV where that level is a hardware
    cache (WholeProblem.to_memory for the outermost `tile`; without one, the least it carries:
    the outputs' write-back), else 0."""
    if whole is None or not caches or caches[-1] is None:
        return 0.0
    return whole.to_memory(tile, caches[-2] if len(caches) > 1 else None)


def charged_dv(workload, hardware: Hardware, dv: Sequence, mu: Sequence, orders, tiles,
               caches: Sequence[int | None] | None = None) -> list:
    """The bytes the time objective charges each level of one plan (its DV and MU per level, its
    orders and tiles): effective_dv with this hardware's caches and the workload as a whole.
    Given `caches` (bytes each level keeps of a cycling working set: Target.kept_bytes), what
    the caches are expected to move instead (models/traffic.py): each inner cache's tile swept
    along every loop (the search grows it along INNER_STEPS, for plan time) and the crowding
    inputs streamed apart (swept)."""
    whole = whole_problem(workload, hardware)
    if caches is None:
        return effective_dv(dv, mu, time_objective(hardware).caches, whole, swept(workload, hardware, whole, orders, tiles))
    caches = tuple(caches)
    one_plan = swept(workload, hardware, whole, orders, tiles, None, caches, crowded_apart=True, each_op=True)
    return effective_dv(dv, mu, caches, whole, one_plan)


def whole_problem(workload, hardware: Hardware) -> WholeProblem:
    """The whole problem as one tile: each tensor moved once, a chain's intermediates too (the
    kernel writes and reads their buffers), all of it held; and the intermediates' bytes
    written and read back once."""
    from .costmodel import level_usage

    moved = workload.bytes_of("input", "output", "intermediate")
    names = [n for n, t in workload.tensors.items() if t.role == "intermediate"]
    held = max(float(level_usage(workload, hardware, len(hardware.levels) - 1, dict(workload.dims))),
               float(held_bytes(workload, workload.dims)))

    def buffers(tile: Mapping) -> np.ndarray:
        return held_bytes(workload, tile, names)

    written = workload.bytes_of("output")

    def footprint(tile: Mapping) -> np.ndarray:
        # The consumers walk their own loops whole between writing an intermediate and their last read.
        live = {x: tile[x] if x in workload.shared_loops else workload.dims[x] for x in workload.dims}
        return held_bytes(workload, live)

    return WholeProblem(float(moved), held, 2.0 * workload.bytes_of("intermediate"), buffers if names else None,
                        float(written), hardware.cores, footprint if names else None)


def time_objective(hardware: Hardware, workload=None) -> Objective:
    """Predicted seconds on the hardware; given the workload, the links into the caches that
    hold all of it cost nothing (warm_levels)."""
    target = hardware.target
    caches = tuple(target.cache_bytes(i) for i in range(len(hardware.levels)))
    divisors = [lv.bandwidth_bytes_per_s for lv in hardware.levels]
    if workload is not None:
        for i in warm_levels(whole_problem(workload, hardware).mu, caches):
            divisors[i] = np.inf
    return Objective(tuple(divisors), True, target.registers_share_issue, caches=caches, norm=target.overlap_norm)


def warm_levels(held: float, caches: Sequence[int | None]) -> list[int]:
    """The levels whose fill links a problem of `held` bytes leaves idle: the outermost, filled
    from memory, where it is a hardware cache (`caches[-1]` usable bytes) that holds all of it and
    the cache inside it does not. From one call to the next the problem stays in that cache, so
    in the steady state of repeated calls (a layer run over and over, the benchmarks' timings)
    nothing crosses the memory link; the links inside it carry what they always do, and the
    copies stream their sources from it alike (kernel_costs.stream_level). The bytes (DV,
    expected) are still reported; only their time is 0. Measured on an Intel Xeon with a 480 MiB
    L3 that its calibration found to hold 128 MiB (BENCHMARKS.md, "Warm-L3 session"): numpy's
    GEMV over a 64 MiB matrix streamed it at 59.8 GB/s, the L3's rate (58.0 calibrated), where
    256 and 512 MiB streamed at memory's (32.5 and 31.4; 31.3 calibrated). Charged at memory's
    rate, llama's decode GEMV's plans looked alike, and the one returned copied the matrix and ran
    1.6x slower than the others.
    A problem an inner cache holds keeps every link charged: idle links there leave the compute
    and the register loads alone to rank plans, whose floor real tiles miss by a few percent, so
    the exhaustive search could no longer prune (gemm 16x64x8 on the golden cases' CPU: 1,536
    plans evaluated to prove the optimum, 3.6 million and a timeout with its inner links idle)."""
    if len(caches) < 2 or caches[-1] is None or held > caches[-1]:
        return []
    inner = caches[-2]
    return [len(caches) - 1] if inner is None or held > inner else []


def dv_objective(hardware: Hardware, level: int) -> Objective:
    """Bytes moved into `level` alone (other links and compute cost nothing)."""
    divisors = tuple(1.0 if j == level else np.inf for j in range(len(hardware.levels)))
    return Objective(divisors, False, hardware.target.registers_share_issue and level == 0, level)
