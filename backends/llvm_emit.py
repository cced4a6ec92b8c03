"""A plan as a TensorIR schedule for CPUs (LLVM).

The decisions (nest, key-slices, packed layouts, thrifty skips) come from
models/caches.py; this module turns them into schedule primitives:

1. split every loop by the plan's tiles and reorder into the cost model's walk;
2. compute each producer of a chain at the last shared loop of the outermost
   level (its output block stays in a kernel-local buffer);
3. run the outermost loop that is spatial for every op under it in parallel;
4. the micro-kernel: vectorise the register tile's last loop, unroll the rest
   up to a reduction loop that slides an input window;
5. cache_read each input where models/caches.py says, in its packed layout;
6. accumulate each output in a `local` register tile zeroed before its
   reduction loops and written back at its level-0 key-slice (or, when a
   reduction loop runs above that tile, zero the output's block in a buffer
   whose rows are skewed off the cache sets, and accumulate into it in place).
"""
from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..models.caches import (
    LINE_BYTES, CacheSite, Layout, cache_records, copied_out, crops, double_buffer_reason, effective_tiles,
    input_caches, micro_order, outer_shared, output_plan, output_tile, parallel_positions, row_aliases,
    threads_apart, trips, walk,
)
from ..models.costmodel import data_volume
from ..models.errors import InvalidInput
from ..models.hardware import Hardware
from ..models.kernel_costs import masked_piece, plan_padding
from ..models.plan import Plan
from ..models.targets.simd_cpu import MAX_BAND, SHORT_REDUCTION, UNROLL_LIMIT, banded, windowed_loops
from ..models.workload import Workload
from .base import Emitted
from .tensorir import block_name, inline_padding, pad_name, primfunc, read_index, source_name

# TVM 0.27 legalises bfloat16 buffers to uint16 storage but not explicit bfloat16 vectors (a
# BufferStore dtype mismatch), so these dtypes leave their vector loops to LLVM's auto-vectoriser.
UNVECTORIZED = ("bfloat16",)


class _Nests:
    """Loop handles: loops[(op, (loop, level))]; level -1 is the register tile's point loops.
    A producer's outermost-level shared loops are the consumer's."""

    def __init__(self, workload: Workload, top: int):
        self.workload, self.top, self.loops = workload, top, {}
        self.pieces = {}  # (op, (loop, level)): the outer part _piece_split cut off that loop

    def positions(self, op) -> list:
        """(position, loop) of every loop of `op`'s nest, a split loop's outer part included."""
        return [(pos, rv) for (name, pos), rv in [*self.loops.items(), *self.pieces.items()] if name == op.name]

    def get(self, op, pos):
        owner = self.workload.ops[-1] if outer_shared(self.workload, op, pos, self.top) else op
        return self.loops[(owner.name, pos)]


def emit(workload: Workload, hardware: Hardware, plan: Plan, double_buffer: bool = False) -> Emitted:
    """Schedule the workload's TensorIR by the plan (see the module docstring)."""
    if len(plan.levels) != len(hardware.levels):
        raise InvalidInput(f"the plan has {len(plan.levels)} levels but the hardware {len(hardware.levels)}")
    orders = [lv.order for lv in plan.levels]
    padded, tiles = effective_tiles(workload, [lv.tile for lv in plan.levels])
    names = [lv.name for lv in plan.levels]
    top = len(names) - 1
    lanes = None if workload.dtype in UNVECTORIZED else hardware.target.vector_lanes(workload)
    sch = s_tir.Schedule(primfunc(workload, padded))
    blocks = {op.name: sch.get_sblock(block_name(workload, op, padded)) for op in workload.ops}
    nests = _Nests(workload, top)
    consumer = workload.ops[-1]
    _tile(sch, blocks[consumer.name], workload, orders, consumer, tiles, padded, nests)
    shared_top = [(x, top) for x in orders[top] if x in workload.shared_loops]
    for op in workload.ops[:-1]:
        if shared_top:
            sch.compute_at(blocks[op.name], nests.get(consumer, shared_top[-1]), preserve_unit_loops=True)
        _tile(sch, blocks[op.name], workload, orders, op, tiles, padded, nests)
    # Before caches and split reductions: TensorIR checks the blocks under a parallel loop.
    parallel = _parallelize(sch, workload, plan, hardware, nests)
    sites = input_caches(workload, orders, tiles, padded)
    parallel_at = parallel if double_buffer else None
    # Root copies are split over the cores only when the kernel itself runs in parallel: a kernel
    # too small to split pays no parallel region per copy either (models/kernel_costs.py).
    copy_cores = hardware.cores if parallel else 1
    # An input whose copies would pay the padding's condition again at every refill is padded
    # once, by a pass of its own at the root (kernel_costs.padding_passes).
    passes = plan_padding(workload, hardware, orders, [lv.tile for lv in plan.levels])
    pipelined: list = []  # (cache, attach loop) to double-buffer
    edges: list = []  # zero-padding copies' loops to partition (llvm_partition)
    for op in workload.ops:
        band = _row_band(sch, blocks[op.name], workload, op, tiles, nests, lanes)
        short = None if band is not None else _short_reduction(sch, blocks[op.name], workload, op, nests)
        if band is None and short is None:
            _piece_split(sch, blocks[op.name], workload, op, tiles, nests, parallel.get(op.name),
                         [s.layout for s in sites if s.op == op.name and not s.skipped and s.layout is not None])
        _micro_kernel(sch, nests, op, micro_order(workload, op), lanes, windowed_loops(workload, op), band)
        if short is not None:
            sch.unroll(short)
        for name in dict.fromkeys(s.tensor for s in sites if s.op == op.name):
            _cache_input(sch, blocks[op.name], workload, op, [s for s in sites if s.op == op.name and s.tensor == name],
                         nests, padded, lanes, copy_cores, parallel_at, pipelined, edges, name in passes)
        edges += _accumulate(sch, blocks[op.name], workload, orders, op, tiles, padded, nests, lanes, copy_cores,
                             parallel.get(op.name))
    _double_buffer(sch, pipelined)
    inline_padding(sch, workload, padded, set(passes))
    for name, site in passes.items():
        edges += _copy_loops(sch, sch.get_sblock(pad_name(name)), site.layout, site.level, lanes, copy_cores,
                             extents=[workload.dims[x] for x in site.layout.dims])
    records = cache_records(workload, names, orders, tiles, padded, sites, double_buffer, hardware.cores,
                            list(passes.values()))
    return Emitted(sch, records, padded, prefetches=_prefetch_sites(sch, workload, orders, plan, padded, blocks, nests),
                   edges=edges)


def _restreamed(workload: Workload, orders, plan: Plan, op) -> list[str]:
    """The op's inputs that the plan moves into the last level below the top at least twice
    over: their blocks come back from the top level (L3) each time, where the hardware
    prefetcher starts over at every block. Prefetching the next block pays only there; on
    inputs that stay in L2 it cost 5-7% (gpt-2 decode 16x3072x768, ViT attention)."""
    level, tiles = len(orders) - 2, [lv.tile for lv in plan.levels]
    return [name for name in op.inputs
            if float(data_volume(workload, orders, tiles, [level], only={name})[0])
            >= 2 * workload.size(name) * workload.elem_bytes]


def _prefetch_sites(sch, workload, orders, plan, padded, blocks, nests: _Nests) -> list[tuple[str, int, tuple[str, ...]]]:
    """Per op with re-streamed inputs (_restreamed): its block, the depth of the loop whose
    steps move the micro-kernel from one register tile to the next, and those inputs' packed
    copies (cache_read names them after the buffer read and the scope). The loop: above the
    register tile's walk through L1, the innermost serial spatial loop with more than one trip,
    past the reduction loops the tile stays in registers across (a call inside them keeps LLVM
    from holding the accumulators there: 2.2x slower on bert ffn1).
    backends/llvm_prefetch.py prefetches that loop's next step."""
    sites = []
    for op in workload.ops:
        streamed = _restreamed(workload, orders, plan, op) if len(orders) > 2 else []
        if not streamed:
            continue
        copies = tuple(f"{source_name(workload, name, padded)}_global" for name in streamed)
        loops = [sch.get(rv) for rv in sch.get_loops(blocks[op.name])]
        own = [((x, j), sch.get(rv)) for (x, j), rv in nests.positions(op) if j >= 0]
        micro = [i for i, loop in enumerate(loops) if any(loop.same_as(f) for (_, j), f in own if j == 0)]
        spatial = set(workload.tensors[op.output].dims)
        for depth in reversed(range(min(micro, default=0))):
            loop = loops[depth]
            x = next((x for (x, _), f in own if f.same_as(loop)), None)
            serial = x is not None and loop.kind == tirx.ForKind.SERIAL
            if int(loop.extent) == 1 or (serial and x not in spatial):
                continue
            if serial:
                sites.append((sch.get(blocks[op.name]).name_hint, depth, copies))
            break
    return sites


def _tile(sch, block, workload, orders, op, tiles, padded, nests: _Nests) -> None:
    """Split every loop of `block` by the plan's tiles and reorder into the op's walk."""
    top = len(tiles) - 1
    out = workload.tensors[op.output].dims
    iter_order = list(out) + [x for x in op.loops if x not in out]  # te.compute's loop order
    owned = [p for p in walk(workload, orders, op) if not outer_shared(workload, op, p, top)]
    # A chain's one-trip loops stay out of the bindings, so a consumer's reduction loops above
    # its producer do not hold its init there (_zero_tile); so do a convolution's, whose kh/kw
    # loops cannot move below its input window's copy. A GEMM keeps them: it can move them
    # under its key instead, and unbound, its zeroed tile could not be vectorised.
    keep = len(workload.ops) == 1 and not windowed_loops(workload, op)
    for x, loop in zip(iter_order, sch.get_loops(block)[-len(op.loops):]):
        first = top - 1 if outer_shared(workload, op, (x, top), top) else top
        levels = list(range(first, -1, -1))
        factors = [trips(tiles, padded, x, j) for j in levels] + [tiles[0][x]]
        parts = sch.split(loop, factors=factors, preserve_unit_iters=keep)
        for j, part in zip(levels + [-1], parts):
            nests.loops[(op.name, (x, j))] = part
    plan = output_plan(workload, orders, op, tiles, padded)
    if plan:
        owned = plan.owned
    elif keep:
        owned = _under_key(workload, orders, op, tiles, padded, owned)
    sch.reorder(*[nests.loops[(op.name, p)] for p in owned + [(x, -1) for x in micro_order(workload, op)]])


def _under_key(workload, orders, op, tiles, padded, owned):
    """The walk `owned` with the reduction loops above the output tile's key-slice (one trip
    each, or output_plan would keep the tile in a buffer) moved right under the key, before
    anything attaches between them: a packed copy at a loop between them would keep the tile's
    init in the block (_zero_tile), a branch at every step with the whole output as its
    accumulators. gemm 1024^3 with `nkm:23,16,64 / mnk:23,16,128 / mkn:23,16,512 /
    knm:23,16,1024` (k whole and outermost, B packed per column block below it) ran in 61 ms,
    predicted 14.6; its k split in two at the top, 13.5 (AMD EPYC Zen 4, BENCHMARKS.md)."""
    key, above = output_tile(workload, orders, op, tiles, padded)
    if key is None or not above or key not in owned:
        return owned
    rest = [p for p in owned if p not in above]
    at = rest.index(key) + 1
    return rest[:at] + above + rest[at:]


def _parallelize(sch, workload, plan, hardware, nests: _Nests) -> dict:
    """Run the loops the cost model assumes parallel (costmodel.parallel_loops) over the cores;
    return them (caches.parallel_positions)."""
    orders, tiles = [lv.order for lv in plan.levels], [lv.tile for lv in plan.levels]
    ops = {op.name: op for op in workload.ops}
    found = parallel_positions(workload, orders, tiles, hardware.cores)
    for name, position in found.items():
        sch.parallel(nests.get(ops[name], position))
    return found


def _row_band(sch, block, workload, op, tiles, nests: _Nests, lanes: int | None):
    """The loop of register tiles along the reduction just outside a one-row register tile (a
    GEMV's band of B rows), when it is the last loop with more than one trip above the tile,
    at most MAX_BAND long, and the tile's row spans whole vectors, two or more; else None.

    Interleaving the band's rows inside the tile's vectors (each vector in turn takes a step
    from every row) reads all the band's rows at once instead of one after another, so memory
    serves them in parallel: llama decode 1x4096x4096 (both cores, the AMD EPYC Zen 4 of
    BENCHMARKS.md) ran in 1.05-1.27 ms against 1.94-2.05 with each 1 KiB row piece read whole,
    beside numpy's 1.17-1.36 (a hand-scheduled TensorIR GEMV, 8-row bands, 256-float tiles)."""
    if not banded(workload, op, tiles[0], lanes):
        return None
    reductions = [x for x in op.loops if x not in workload.tensors[op.output].dims]
    band = nests.loops.get((op.name, (reductions[0], 0)))
    last = _last_loop_above(sch, block, op)
    if band is None or last is None or not sch.get(last).same_as(sch.get(band)):
        return None
    return band if sch.get(band).extent.value <= MAX_BAND else None


def _last_loop_above(sch, block, op):
    """The innermost loop with more than one trip above the op's register tile (called before
    _micro_kernel splits the tile's own loops, the block's innermost); None when there is none,
    or when a loop's extent is not a constant."""
    for rv in reversed(sch.get_loops(block)[: -len(op.loops)]):
        extent = sch.get(rv).extent
        if not isinstance(extent, tirx.IntImm):
            return None
        if extent.value > 1:
            return rv
    return None


def _short_reduction(sch, block, workload, op, nests: _Nests):
    """The last loop with more than one trip above the register tile, when it runs along a
    reduction (not a window's) at most SHORT_REDUCTION times; else None. Left to LLVM, a loop of
    two k steps around a 14x32 register tile (gemm 97x211x131) was rotated with its 14 A
    broadcasts hoisted into registers beside the 28 accumulators: 13 vectors spilled in the FMA
    loop, 0.057 ms against 0.035 ms with the loop unrolled (AMD EPYC Zen 4, both cores)."""
    out = workload.tensors[op.output].dims
    reductions = {x for x in op.loops if x not in out} - windowed_loops(workload, op)
    last, pos = _last_position_above(sch, block, op, nests)
    if last is None or sch.get(last).extent.value > SHORT_REDUCTION:
        return None
    return last if pos is not None and pos[0] in reductions else None


def _last_position_above(sch, block, op, nests: _Nests):
    """(loop, its (dim, level) in the op's nest) of _last_loop_above; (None, None) when there is
    none, and the position None when it is not one of the nest's tiling loops."""
    last = _last_loop_above(sch, block, op)
    if last is None:
        return None, None
    return last, next((p for p, rv in nests.positions(op) if p[1] >= 0 and sch.get(rv).same_as(sch.get(last))), None)


def _piece_split(sch, block, workload, op, tiles, nests: _Nests, parallel, layouts: list[Layout]) -> None:
    """Split the last loop with more than one trip above the register tile at the pieces a packed
    input stores its steps in, when it runs along a reduction, serially, over more than a piece.

    packed_layout widens a tile narrower than a cache line along the array's last dim: A's
    1-wide k tiles lie in pieces of 16 floats. A loop over 768 such k steps then indexes the pack
    by (k // 16, k % 16), which LLVM computes anew at every step: bert qkv 512x2304x768's plan
    with 6x16x1 tiles ran its FMA loop as 60 instructions for 24 FMAs and took 15.8 ms, where
    the same nest with the k loop cut in 8-step pieces ran 44 instructions and 13.8 ms (numpy
    14.0; AMD EPYC Zen 3, BENCHMARKS.md). Split at the piece, the inner loop steps linearly.
    The order of the steps does not change: the inner part keeps the loop's place in `nests`
    (what sits inside the loop sits inside it), the outer part goes to nests.pieces."""
    last, pos = _last_position_above(sch, block, op, nests)
    if pos is None or pos[1] < 1 or pos == parallel or pos[0] in workload.tensors[op.output].dims:
        return
    x, j = pos
    n = len(tiles)
    piece = max((lay.bounds[lay.dims.index(x)][n - j] // tiles[j][x] for lay in layouts if x in lay.dims), default=1)
    if 1 < piece < sch.get(last).extent.value:
        nests.pieces[(op.name, pos)], nests.loops[(op.name, pos)] = sch.split(last, factors=[None, piece])


def _micro_kernel(sch, nests: _Nests, op, micro: list[str], lanes: int | None, windowed: set[str],
                  band=None) -> None:
    """Vectorise the register tile's last loop (unless lanes is None); unroll the others while
    the body stays small, up to a windowed reduction loop: unrolled, its steps share input
    elements with the spatial loop's (the window's overlap), and LLVM keeps them all in
    registers beside the accumulators (conv 3x3 with 2x7x32 tiles: 80 spill moves in the FMA
    loop, and 66-141 GFLOP/s on one core depending on where the stack fell). With a `band`
    (_row_band), its steps run inside the row's vectors, all unrolled."""
    if band is not None:
        vectors, vector = sch.split(nests.loops[(op.name, (micro[-1], -1))], factors=[None, lanes])
        sch.reorder(vectors, band)
        sch.unroll(vectors)
        sch.unroll(band)
        sch.vectorize(vector)
        return
    if lanes is not None:
        row = nests.loops[(op.name, (micro[-1], -1))]
        parts = _vector_split(sch, row, lanes, vectors=math.inf)  # a row of 3, 5, ... vectors only
        if parts:
            sch.unroll(parts[0])
            row = parts[1]
        sch.vectorize(row)
    budget = UNROLL_LIMIT
    for x in reversed(micro[:-1]):
        loop = nests.loops[(op.name, (x, -1))]
        extent = sch.get(loop).extent.value
        if extent > budget or (x in windowed and extent > 1):
            break
        budget //= max(extent, 1)
        sch.unroll(loop)


def _cache_input(sch, block, workload, op, sites: list[CacheSite], nests, padded, lanes, cores, parallel_at,
                 pipelined: list, edges: list, padded_apart: bool = False) -> None:
    """Cache the input at `sites`; with `parallel_at` (per op, the position run in parallel; None:
    no double buffering) queue the copies caches.double_buffer_reason allows for pipelining.
    `padded_apart`: the input's zero padding is a pass of its own (kernel_costs.padding_passes),
    so its first copy reads the padded array without the padding's condition."""
    source = source_name(workload, sites[0].tensor, padded)
    padding = source != sites[0].tensor and not padded_apart
    made = []
    for site in sites:  # outermost level first: each cache reads the one before
        if not site.skipped:
            made.append((sch.cache_read(block, read_index(sch, block, source), "global"), site))
            source = sch.get(made[-1][0]).writes[0].source.name
    for cache, site in reversed(made):  # innermost first: a cache's readers must sit below it
        if site.key is not None:
            sch.compute_at(cache, nests.get(op, site.key), preserve_unit_loops=True)
        if site.layout is None:  # an affine input's window: TensorIR's compact row-major region
            _vectorize(sch, sch.get_loops(cache)[-1], lanes)
            if site.key is None and cores > 1:
                sch.parallel(sch.get_loops(cache)[0])
        else:
            sch.transform_layout(cache, ("write", 0), site.layout.index_map())
            first = padding and cache is made[0][0]
            edges += _copy_loops(sch, cache, site.layout, site.level, lanes, parallel=cores if site.key is None else 1,
                                 extents=[workload.dims[x] for x in site.layout.dims] if first else None)
        if parallel_at is not None and double_buffer_reason(workload, site, parallel_at, nests.top) is None:
            pipelined.append((cache, nests.get(op, site.key)))


def _copy_loops(sch, cache, layout: Layout, level: int, lanes: int, parallel: int,
                extents: list[int] | None = None) -> list:
    """Walk the copy's tiles level by level in the array's order, so it reads the source in
    runs as long as the tiles' rows (the pack may store them in the walk's order: each tile
    written is still contiguous), and each level-1 tile in the pack's inner order. Vectorise
    where reads are too, and share a copy made outside every parallel loop among `parallel`
    cores (its outer loops fused until they have a trip per core). `extents`: the input's real
    extents, where the copy reads it zero-padded (the padding folds into it:
    tensorir.inline_padding); the loops llvm_partition splits are returned (_edges)."""
    rank = len(layout.dims)
    first = len(layout.bounds[0]) - level  # index of this cache's own tile in the bounds
    parts = []
    for i, loop in enumerate(sch.get_loops(cache)[-rank:]):
        # The block's own extent: a layout tile widened to a cache line may exceed it (caches.packed_layout)
        block, b = sch.get(loop).extent.value, layout.bounds[i][first:]
        factors = [max(min(b[k], block) // b[k + 1], 1) for k in range(len(b) - 1)] + [min(b[-1], block)]
        parts.append(sch.split(loop, factors=factors))
    order = [parts[i][k] for k in range(len(parts[0]) - 1) for i in range(rank)]
    order += [parts[i][-1] for i in layout.inner_order]
    sch.reorder(*order)
    fused = 0
    if parallel > 1:
        n, count = 1, sch.get(order[0]).extent.value
        while count < parallel and n < len(order) - 1:
            count, n = count * sch.get(order[n]).extent.value, n + 1
        sch.parallel(sch.fuse(*order[:n]) if n > 1 else order[0])
        fused = n
    padding = extents is not None
    piece = sch.get(order[-1]).extent.value if layout.inner_order[-1] == rank - 1 else 0  # 0: not rows
    whole = bool(lanes) and piece > 0 and piece % lanes == 0  # rows in whole vectors: _edges
    edges = _edges(sch, cache, parts, fused, layout, extents) if padding and whole else []
    if piece:
        if lanes and masked_piece(piece, lanes, padding):
            # A zero-padding copy's row that is not a whole number of vectors moves in whole
            # vectors, the last one masked (the split's predicate), as BLAS packs an edge. Under
            # the padding's condition LLVM moves an odd-width vector, or one narrower than a
            # register, element by element with a branch each: gemm 127x251x509's plans packing
            # A in pieces of 30 and 60 floats (in vectors of 2 and 4) ran 1.09-1.34x as long as
            # in masked whole vectors (Intel Xeon, BENCHMARKS.md "Padded-copy session"); copied
            # as one odd vector, gemm 1000^3's pack rows of 100, 50, 40 and 25 floats ran
            # 1.2-1.8x as long as in those narrower vectors (AMD EPYC Zen 4). TVM still moves
            # the masked vectors' lanes one at a time, with fewer tests than those; kernel_costs
            # counts their elements (copy_ops).
            sch.vectorize(sch.split(order[-1], factors=[None, lanes])[1])
            return edges
        _vectorize(sch, order[-1], lanes)
    return edges


def _edges(sch, cache, parts, fused: int, layout: Layout, extents: list[int]) -> list:
    """(block name, [loop depth, ...]) of a zero-padding copy's outermost loop along each dimension
    whose padding lies within that loop's last trip of the last block (less padding than the
    loop's step), for llvm_partition; loops fused into the parallel loop are left whole. Only
    copies whose rows move in whole vectors get here: a copy of narrower pieces gains no vector
    moves from the split, only its loops twice over (gemm 127x251x509 packing A in 3-float pieces
    ran 0.282 ms split against 0.228 whole, BENCHMARKS.md "Prefetch-burst session")."""
    loops = [sch.get(loop) for loop in sch.get_loops(cache)]
    depths = []
    for i in range(fused, len(parts)):
        outer, pad = sch.get(parts[i][0]), layout.bounds[i][0] - extents[i]
        if outer.extent.value > 1 and 0 < pad < math.prod(sch.get(loop).extent.value for loop in parts[i][1:]):
            depths.append(next(d for d, loop in enumerate(loops) if loop.same_as(outer)))
    return [(sch.get(cache).name_hint, sorted(depths))] if depths else []


def _vector_split(sch, loop, lanes: int, vectors: float = 1) -> list | None:
    """The loop split into (outer, one vector of `lanes`) when it spans whole vectors, more than
    `vectors` of them or a count that is not a power of two; None when it stays whole. LLVM
    legalises a <48 x float> FMA through scalar shuffles on the stack: an 8x48 register tile
    of gemm 1000^3 ran at 4 GFLOP/s as one wide loop (252 ms; 6.3 ms split)."""
    extent = sch.get(loop).extent
    if not isinstance(extent, tirx.IntImm):
        return None
    count, rest = divmod(extent.value, lanes)
    if rest or not (count > vectors or count & (count - 1)):
        return None
    return sch.split(loop, factors=[None, lanes])


def _vectorize(sch, loop, lanes: int | None, vectors: int = 1) -> None:
    """Vectorise the loop, split into vectors of `lanes` where _vector_split splits it."""
    extent = sch.get(loop).extent
    if lanes is None:
        return
    if isinstance(extent, tirx.IntImm) and extent.value > 1:
        parts = _vector_split(sch, loop, lanes, vectors)
        sch.vectorize(parts[1] if parts else loop)


# A register tile's row of up to this many vectors is zeroed and stored by one vectorised loop.
# Split into single vectors, LLVM (SROA) holds the tile as <64 x float> values and stores each
# 16-lane slice as an i512, which x86 splits into four 16-byte stores: 63 vextractf32x4 in a
# 4x64 pointwise conv kernel, none stored whole (bench figures in BENCHMARKS.md).
TILE_ROW_VECTORS = 4


def _accumulate(sch, block, workload, orders, op, tiles, padded, nests, lanes, cores: int, split=None) -> list:
    """The output's register tile, at its level-0 key-slice; or, when the tile must resume from
    its running sum (TensorIR has no read-modify-write cache of a reduction), the output's
    block in a contiguous buffer that the tile accumulates into, zeroed at `start` and written
    back once, instead of the row-major array, whose strided rows conflict in the caches
    (models/caches.output_plan; a chain's intermediate is such a buffer already). `cores`: the
    cores a crop pass of its own shares (1 when the kernel runs serially); `split`: the op's
    parallel loop (caches.parallel_positions), if any. Returns the loops llvm_partition splits
    (_crop_vectors)."""
    edges: list = []
    plan = output_plan(workload, orders, op, tiles, padded)
    if plan is not None:
        holder, start = plan.holder, plan.start
        if holder is not None:
            back = sch.cache_write(block, 0, "global")
            row = _threads_apart(sch, block, workload, orders, op, tiles, padded, holder, split)
            _skew_rows(sch, block, row, workload.elem_bytes)
            sch.reverse_compute_at(back, nests.get(op, holder), preserve_unit_loops=True)
            if crops(workload, op, padded):
                sch.reverse_compute_inline(sch.get_sblock(op.output))
            _vectorize(sch, sch.get_loops(back)[-1], lanes)
        elif copied_out(workload, op, padded):
            # Accumulated in place in the padded output, or in a copy of an output whose rows
            # alias: the copy out is a pass of its own, as wide as a root copy (serial and
            # scalar, a crop cost gemm 1024^3 with 6-row tiles about 5%).
            out = sch.get_sblock(op.output) if crops(workload, op, padded) else sch.cache_write(block, 0, "global")
            row = _threads_apart(sch, block, workload, orders, op, tiles, padded, None, split)
            _skew_rows(sch, block, row, workload.elem_bytes)
            crop = sch.get_loops(out)
            if cores > 1:
                sch.parallel(crop[0])
            edges = _crop_vectors(sch, out, crop[-1], lanes)
        moves = sch.decompose_reduction(block, nests.get(op, start))
    else:
        key, _ = output_tile(workload, orders, op, tiles, padded)
        moves = sch.cache_write(block, 0, "local")
        # A producer whose key-slice is one of the consumer's loops it runs inside stores its
        # tile where cache_write put it: inside that loop already.
        if key is not None and not outer_shared(workload, op, key, len(tiles) - 1):
            sch.reverse_compute_at(moves, nests.get(op, key), preserve_unit_loops=True)
        if crops(workload, op, padded):
            # Crop at write-back, as BLAS does: the tile's store writes only the output's real
            # elements, instead of a padded output copied out by a pass of its own.
            sch.reverse_compute_inline(sch.get_sblock(op.output))
        _zero_tile(sch, block, workload, op, nests, key, lanes)
        if workload.tensors[op.output].role == "intermediate":  # its blocks' rows alias like an output's
            _skew_rows(sch, moves, padded[workload.tensors[op.output].dims[-1]], workload.elem_bytes)
    _vectorize(sch, sch.get_loops(moves)[-1], lanes, TILE_ROW_VECTORS)  # zeroing or storing the tile
    return edges


def _crop_vectors(sch, block, loop, lanes: int | None) -> list:
    """Vectorise a crop pass's row loop (_vectorize), except that a row longer than a vector and
    not a whole number of them (the output's real extent, 1000 floats) is split into vectors, the
    last one masked; returned as an edge for llvm_partition to split before that last vector, so
    that the others move whole vectors unconditionally. Vectorised whole, TVM lowers one vector
    of the row's length: gemm 1000^3's crop in `mkn:14,16,2 | nmk:14,16,2 | knm:42,32,2 |
    knm:42,32,46` took 283 s to compile (BENCHMARKS.md "Skylake-SP session")."""
    extent = sch.get(loop).extent
    if not lanes or not isinstance(extent, tirx.IntImm) or extent.value <= lanes or extent.value % lanes == 0:
        _vectorize(sch, loop, lanes)
        return []
    outer, inner = sch.split(loop, factors=[None, lanes])
    sch.vectorize(inner)
    depth = next(d for d, at in enumerate(sch.get_loops(block)) if sch.get(at).same_as(sch.get(outer)))
    return [(sch.get(block).name_hint, [depth])]


def _threads_apart(sch, block, workload, orders, op, tiles, padded, holder, split) -> int:
    """Lay the buffer `block` accumulates into out with each thread's part contiguous where
    caches.threads_apart says so; returns the length of its rows in that layout."""
    shape, apart = threads_apart(workload, orders, op, tiles, padded, holder, split)
    if apart is None:
        return shape[-1]
    axis, chunk = apart
    sch.transform_layout(block, ("write", 0), lambda *v: [v[axis] // chunk, *v[:axis], v[axis] % chunk, *v[axis + 1:]])
    return chunk if axis == len(shape) - 1 else shape[-1]


def _skew_rows(sch, block, row: int, elem_bytes: int) -> None:
    """Pad the rows of the buffer `block` accumulates into (its write 0, `row` elements long
    once compacted) by one cache line when they alias (caches.row_aliases), so consecutive
    rows start in different cache sets."""
    ndim = len(sch.get(block).writes[0].region)
    if ndim < 2 or not row_aliases(row * elem_bytes):
        return
    sch.storage_align(block, 0, ndim - 2, factor=2 * row, offset=row + max(1, LINE_BYTES // elem_bytes))


def _zero_tile(sch, block, workload, op, nests, key, lanes) -> None:
    """Zero the register tile before its reduction loops, not at the first step inside them: an
    init left in the block is a branch in every step, and LLVM then keeps most accumulators in
    memory (gemm 197x2304x768 with 11x32 tiles: 18 of 22 stored and reloaded at every k step,
    3.2 ms against 1.7 ms). TensorIR decomposes only above every reduction loop, so reduction
    loops of one trip above the tile's key-slice move below it first (a no-op on the loop nest).
    Where they cannot move (a fused chain's consumer has them above its producer, a convolution
    its input window's copy), they are out of the bindings (_tile) and the init goes under the
    key as it is: MobileNet's depthwise + pointwise with 1x6x64 tiles ran in 1110 us with the
    init left in the block, 554 without; its 32x112x112 depthwise conv alone 131 us and 90."""
    loops = sch.get_loops(block)
    srefs = [sch.get(lp) for lp in loops]
    below = 0
    if key is not None:
        anchor = sch.get(nests.get(op, key))
        below = next(i for i, lp in enumerate(srefs) if lp.same_as(anchor)) + 1
    out = workload.tensors[op.output].dims
    reductions = {sch.get(lp) for (name, (x, _)), lp in nests.loops.items() if name == op.name and x not in out}
    above = [i for i in range(below) if any(srefs[i].same_as(r) for r in reductions)]
    if any(srefs[i].extent.value != 1 for i in above):
        return  # the output_plan contract: a reduction running above the key has a holder instead
    under_key = loops[below]
    try:
        if above:
            chain = list(range(above[0], below))
            sch.reorder(*[loops[i] for i in chain if i not in above], *[loops[i] for i in above])
            below -= len(above)  # now the first moved loop, right under the key
        zero = sch.decompose_reduction(block, sch.get_loops(block)[below])
    except s_tir.ScheduleError:
        try:  # a producer between the loops: the one-trip loops stay above it
            zero = sch.decompose_reduction(block, under_key)
        except s_tir.ScheduleError:
            return  # a cache attached between the loops: the init stays in the block
    _vectorize(sch, sch.get_loops(zero)[-1], lanes, TILE_ROW_VECTORS)


def _double_buffer(sch, copies) -> None:
    """Software-pipeline each loop that input caches attach to: the copies of the next
    iteration's blocks run one stage ahead of the compute (N = 2 buffers)."""
    by_loop = {}
    for cache, loop in copies:
        by_loop.setdefault(sch.get(loop), (loop, []))[1].append(cache)
    for node, (loop, caches) in by_loop.items():
        body = node.body
        if not isinstance(body, tirx.SeqStmt):
            continue
        heads = []
        for cache in caches:
            loops = [sch.get(lp) for lp in sch.get_loops(cache)]
            below = loops[[lp.same_as(node) for lp in loops].index(True) + 1:]
            heads.append(below[0] if below else None)
        stages = [0 if any(h is not None and s.same_as(h) for h in heads) else 1 for s in body.seq]
        sch.annotate(loop, "software_pipeline_stage", stages)
        sch.annotate(loop, "software_pipeline_order", list(range(len(stages))))
