"""Which caches a plan implies, where they are filled and how they are laid out.

Pure Python (no TVM), so every plan can list its caches; backends/emit.py
emits exactly these decisions.

The loop nest is the cost model's walk: level-l loops walk level-l tiles
inside the level-(l+1) tile, outermost level first, and each op walks its own
loops. In a chain, every op but the last is computed inside the last shared
loop of the outermost level, so the outermost-level shared loops belong to
the last op's nest.

Tensor T's block at level l changes at its *key-slice*: the innermost loop of
levels >= l that indexes T and runs more than once. A cache of T at level l
is filled there ("root" when no such loop exists). Inputs are cached at every
level >= 1 in one packed layout (`packed_layout`): tiles of each level inside
the tiles of the level above, in the order the loops walk them (unless the
array's own order lets the thrifty rule skip a copy), and inside a level-1
tile the array's own order with the vectorised dim moved last (the
micro-kernel loads it as vectors);
along the array's last dim, tiles shorter than a cache line are widened.
Accera's thrifty rule skips a cache whose block is already contiguous, in the
same order, in the buffer it would copy from. The packed layout already holds
every inner block, contiguous or in rows of a line or more, so only the
outermost cache of each input copies anything; that one is skipped too when
the original array already stores the block that way, or when each element is
read once (`read_once`), where a copy costs more than it could save. Outputs
accumulate in the register tile, filled at their level-0 key-slice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from typing import Literal, Mapping

import numpy as np
from pydantic import BaseModel, Field

from . import gpu
from .costmodel import any_arrays, padded_extents, parallel_candidates, parallel_loops
from .errors import InvalidInput
from .workload import Op, Workload


class CacheRecord(BaseModel):
    """One cache the plan implies: emitted, or skipped by the thrifty rule."""

    tensor: str
    level: str
    attach_loop: str
    layout: str
    double_buffer: bool
    skipped_thrifty: bool
    note: str | None = Field(None, exclude_if=lambda v: v is None,
                             description="with double buffering asked for: why this cache is not pipelined")
    stages: int = Field(1, description="buffers the cache rotates through (GPU multi-buffering)")
    copy_mode: Literal["blocked", "striped"] | None = Field(
        None, description="GPU: how a block's threads share the copy (Accera's BLOCKED or STRIPED)"
    )


WINDOW = "row-major window of the level-1 block (affine index)"
PADDED_ONCE = "the whole zero-padded array, row-major, made once (its copies read it without the padding's condition)"
Position = tuple[str, int]  # (loop, level); level -1 marks the register tile's point loops


def effective_tiles(workload: Workload, tiles: list[dict[str, int]]) -> tuple[dict[str, int], list[dict[str, int]]]:
    """Padded extents and per-level tiles in the padded space (innermost level first).

    A tile equal to the whole extent becomes the padded extent: the extent
    rounded up to a multiple of the largest smaller tile beneath it. Raises
    ValueError unless each tile divides the one above (plans from `tune` do).
    """
    padded, tiles = _padded(workload, tiles)
    misfit = _misfit(workload, padded, tiles)
    if misfit:
        j, bad = misfit
        raise InvalidInput(f"tiles of {bad} at level {j} do not divide the tiles above; plans from `tune` always nest")
    return padded, tiles


def tiles_nest(workload: Workload, tiles: list[dict[str, int]]) -> bool:
    """Whether every tile divides the one above in the padded space (see effective_tiles)."""
    return _misfit(workload, *_padded(workload, tiles)) is None


def _padded(workload: Workload, tiles):
    padded = {x: int(v) for x, v in padded_extents(workload, tiles).items()}
    return padded, [{x: padded[x] if t[x] >= workload.dims[x] else t[x] for x in workload.dims} for t in tiles]


def _misfit(workload: Workload, padded, tiles) -> tuple[int, list[str]] | None:
    """The first level whose tiles do not divide the tiles above, and those loops."""
    for j in range(len(tiles)):
        parent = tiles[j + 1] if j + 1 < len(tiles) else padded
        bad = [x for x in workload.dims if parent[x] % tiles[j][x]]
        if bad:
            return j, bad
    return None


def trips(tiles, padded, x: str, level: int) -> int:
    parent = tiles[level + 1][x] if level + 1 < len(tiles) else padded[x]
    return parent // tiles[level][x]


def is_producer(workload: Workload, op: Op) -> bool:
    return op is not workload.ops[-1]


def micro_order(workload: Workload, op: Op) -> list[str]:
    """The register tile's loops: reductions outermost, the output's last dim (vectorised) innermost."""
    out = workload.tensors[op.output].dims
    return [x for x in op.loops if x not in out] + list(out)


def walk(workload: Workload, orders: list[list[str]], op: Op) -> list[Position]:
    """The op's walk, outermost first, shared loops of the outermost level included."""
    return [(x, j) for j in reversed(range(len(orders))) for x in orders[j] if x in op.loops]


def key_slice(positions: list[Position], tdims, tiles, padded, level: int) -> Position | None:
    """The innermost position at levels >= level indexing the tensor with more than one trip."""
    for x, j in reversed(positions):
        if j >= level and x in tdims and trips(tiles, padded, x, j) > 1:
            return (x, j)
    return None


@dataclass
class Layout:
    """The packed layout of an input (see module docstring)."""

    dims: list[str]
    bounds: list[list[int]]  # per dim: padded extent, then the tiles of levels top-1 .. 1
    inner_order: list[int]  # dim positions inside a level-1 tile, outermost first
    # per level of tiles (tiles of bounds[k + 1] inside bounds[k]), the dim positions in the
    # order their digits are stored, most significant first
    level_orders: list[list[int]]

    def digits(self, idx, block=None) -> list[tuple[object, int, int]]:
        """(index, size, dim) digits, most significant first, for per-dim indices `idx`;
        sizes are those within `block` (default: the whole tensor), size-1 digits dropped."""
        block = block or [b[0] for b in self.bounds]
        out = []
        for k in range(len(self.bounds[0]) - 1):
            for i in self.level_orders[k]:
                hi, lo = min(self.bounds[i][k], block[i]), self.bounds[i][k + 1]
                out.append(((idx[i] % self.bounds[i][k]) // lo, max(hi // lo, 1), i))
        out += [(idx[i] % self.bounds[i][-1], min(self.bounds[i][-1], block[i]), i) for i in self.inner_order]
        kept = [d for d in out if d[1] > 1]
        return kept or out[-1:]  # TensorIR rejects constant digits

    def index_map(self):
        """The layout as a TensorIR index map over the tensor's (padded) indices."""
        return lambda *idx: [d for d, _, _ in self.digits(idx)]

    def run_order(self, block: list[int]) -> list[tuple[int, int]]:
        """(dim, size) runs a block is stored in, adjacent digits of one dim merged."""
        runs: list[tuple[int, int]] = []
        for _, size, i in self.digits([0] * len(block), block):
            if size == 1:
                continue
            runs[-1:] = [(i, runs[-1][1] * size)] if runs and runs[-1][0] == i else runs[-1:] + [(i, size)]
        return runs

    def name(self) -> str:
        levels = " / ".join(",".join(f"{self.dims[i]}{self.bounds[i][k]}" for i in self.level_orders[k - 1])
                            for k in range(1, len(self.bounds[0])))
        inner = ",".join(self.dims[i] for i in self.inner_order)
        return f"tiles {levels or 'whole'}; [{inner}] inside each"


LINE_BYTES = 64  # a cache line on current x86 and Arm cores
# Rows of an accumulation buffer a multiple of this many bytes apart fall into a few sets of
# the caches: 4 KiB rows all into one L1 set (64 sets of 64-byte lines), so a register tile of
# more rows than the ways (12 on Zen 5's L1d) misses at every step (gemm 1024^3 plans with
# 23- and 61-row tiles accumulating in such rows: 151 and 129 ms, skewed 12 and 22).
ROW_ALIAS_BYTES = 512


def row_aliases(row_bytes: int) -> bool:
    """Whether rows this many bytes long, one after another, crowd a few sets of every cache."""
    return row_bytes % ROW_ALIAS_BYTES == 0


def rows_alias(workload: Workload, tensor: str, padded) -> bool:
    """Whether `tensor` has rows (over the `padded` extents) that alias (row_aliases)."""
    dims = workload.tensors[tensor].dims
    return len(dims) > 1 and row_aliases(padded[dims[-1]] * workload.elem_bytes)


def is_padded(workload: Workload, name: str, padded: Mapping[str, int]) -> bool:
    """Whether ops read the input through a zero-padded copy: a loop indexing it is padded, or
    (affine indices) the stored array does not span exactly the indices read."""
    t = workload.tensors[name]
    if any(padded[x] != workload.dims[x] for x in t.loops):
        return True
    return not t.plain and (any(ix.offset for ix in t.index) or workload.shape(name) != workload.extents(name))


def crops(workload: Workload, op: Op, padded) -> bool:
    """Whether the op computes a padded copy of an output array (a loop of the output is padded),
    which a crop then copies out."""
    out = workload.tensors[op.output]
    return out.role == "output" and any(padded[x] != workload.dims[x] for x in out.dims)


def copied_out(workload: Workload, op: Op, padded) -> bool:
    """Whether an output accumulated in place (output_plan with no holder) accumulates in a
    buffer of its own that a pass then copies to the array: when the op computes a padded
    output (the pass crops it), or when the output's rows alias (rows_alias), so that the
    buffer's rows are skewed apart. On the Xeon of BENCHMARKS.md, gemm 1024^3 plans whose k loop
    ran outermost, accumulating 512-row blocks of 4 KiB rows in the array, took 6.75 and 6.80 ms,
    and 5.97 and 6.25 ms in the skewed buffer, its copy included (with 256-row blocks, which
    alias less: 5.98 and 5.94 ms)."""
    out = workload.tensors[op.output]
    return crops(workload, op, padded) or (out.role == "output" and rows_alias(workload, op.output, padded))


def packed_layout(workload: Workload, tdims, tiles, padded, micro, orders) -> Layout:
    """The input's packed layout: tiles of each level inside those of the level above, stored in
    the order `orders` walks them, and the array's order inside the level-1 tile with the
    vectorised dim moved last.

    In the walk's order, the tiles the micro-kernel visits one after the other lie one after the
    other: a 32-wide panel of B that an 8x32x1 L1 tile walks down k is one contiguous run,
    where in B's own order its rows lie a whole L2 tile's width apart. gemm 127x251x509's plan
    (L1 tile 8x32x1 under a 16x251x509 L2 tile, B's rows 1 KiB apart) ran in 0.144 ms instead
    of 0.169, and the seven other benchmark plans whose layouts changed 0.95-1.00x as long
    (BENCHMARKS.md, Layout-walk session). The copy still reads its source in the array's order
    (backends/llvm_emit._copy_loops): walked in the pack's order instead it read B's rows in
    128-byte pieces, and ViT's projections ran 1-4% slower.

    Along the array's contiguous (last) dim, a tile shorter than a cache line is widened to the
    largest divisor of the tile above that is a multiple of it and spans at most a line, unless
    the vectorised dim moved in front of that dim (a transposing pack). Otherwise the copy reads
    one element per row of the source at each step: LLVM gathers them, and rows a multiple of
    4 KiB apart all fall into one L1 set. The model's copy bytes do not change; the kernels come
    nearer them: gemm 1024^3 plans with 26x1 and 1x1 L1 blocks of A ran in 12-15 ms instead of
    29-45 (the gathers had taken 64% of the time), and the plans `tune` returns for six shapes
    of bench/shapes.py whose layouts changed ran 0.92-1.00x as long. The micro-kernel reads a
    narrower block as part of each row, a few cache lines in all, as it does in L1 anyway."""
    n = len(tiles)
    bounds = [[padded[x]] + [tiles[j][x] for j in range(n - 1, 0, -1)] for x in tdims]
    inner_order = sorted(range(len(tdims)), key=lambda i: tdims[i] == micro[-1])
    last = bounds[-1]
    line = max(LINE_BYTES // workload.elem_bytes, 1)
    if inner_order[-1] == len(tdims) - 1:
        for k in range(1, n):
            own, parent = last[k], last[k - 1]
            if own < min(line, parent):
                last[k] = max(d for d in range(own, min(line, parent) + 1, own) if parent % d == 0)
    # bounds index k holds the tiles of level n-1-k, which orders[n-1-k] walks
    level_orders = [[i for x in orders[n - 1 - k] for i, d in enumerate(tdims) if d == x] for k in range(n - 1)]
    return Layout(dims=list(tdims), bounds=bounds, inner_order=inner_order, level_orders=level_orders)


def contiguous(block: list[int], shape: list[int]) -> bool:
    """True when the array stores the block as one contiguous run: every dim after the first of
    more than one index is whole. Blocks may be arrays (models/crowding.py)."""
    if not any_arrays((*block, *shape)):  # one plan (kernel_costs costs them one at a time)
        seen = False
        for b, whole in zip(block, shape):
            if seen and b != whole:
                return False
            seen = seen or b > 1
        return True
    ok, seen = np.ones((), dtype=bool), np.zeros((), dtype=bool)
    for b, whole in zip(block, shape):
        ok = ok & (~seen | (np.asarray(b) == whole))
        seen = seen | (np.asarray(b) > 1)
    return ok


def row_major_thrifty(layout: Layout, block: list[int], shape: list[int]) -> bool:
    """True when the array already stores the block contiguously and in the layout's order."""
    return contiguous(block, shape) and layout.run_order(block) == [(i, b) for i, b in enumerate(block) if b > 1]


def read_once(workload: Workload, op: Op, name: str, tiles, padded) -> bool:
    """Whether each element of input `name` reaches the registers once: every loop of the op
    that does not index it lies whole in the register tile (a decode step's weights, m <= the
    register tile's rows). A packed copy would then read and write every byte once more for no
    reuse, so the micro-kernel reads the array itself (models/kernel_costs.py charges its runs).
    Tiles may be arrays (models/crowding.py)."""
    loops = [x for x in op.loops if x not in workload.tensors[name].loops]
    if not any_arrays(v for x in loops for v in (tiles[0][x], padded[x])):  # one plan
        return all(tiles[0][x] == padded[x] for x in loops)
    once = np.ones((), dtype=bool)
    for x in loops:
        once = once & (np.asarray(tiles[0][x]) == np.asarray(padded[x]))
    return once


@dataclass
class CacheSite:
    """One input cache level: the decision and, when not skipped, where the emitter fills it."""

    op: str
    tensor: str
    level: int
    key: Position | None
    skipped: bool
    layout: Layout | None  # None: an affine input's window, stored row-major as TensorIR lays it out


def input_caches(workload: Workload, orders, tiles, padded) -> list[CacheSite]:
    """Every input's caches at levels >= 1, outermost level first per tensor."""
    sites = []
    n = len(tiles)
    for op in workload.ops:
        positions = walk(workload, orders, op)
        micro = micro_order(workload, op)
        for name in op.inputs:
            tensor = workload.tensors[name]
            if tensor.role == "intermediate":
                continue  # the producer's own buffer: already the block the model counts
            if not tensor.plain:
                # Windows of neighbouring blocks overlap, so no tiled layout holds them all:
                # each level-1 window is copied compactly where it changes.
                if n > 1:
                    sites.append(CacheSite(op.name, name, 1, key_slice(positions, tensor.loops, tiles, padded, 1),
                                           False, None))
                continue
            tdims = tensor.dims
            padded_input = any(padded[x] != workload.dims[x] for x in tdims)
            once = not padded_input and read_once(workload, op, name, tiles, padded)
            layout = packed_layout(workload, tdims, tiles, padded, micro, orders)
            levels = range(n - 1, 0, -1)
            keys = [key_slice(positions, tdims, tiles, padded, level) for level in levels]
            blocks = [[tiles[level][x] for x in tdims] for level in levels]
            shape = [padded[x] for x in tdims]
            skips = _skips(layout, keys, blocks, shape, padded_input, once)
            own_order = list(range(len(tdims)))
            if any(order != own_order for order in layout.level_orders):
                own = replace(layout, level_orders=[own_order] * len(layout.level_orders))
                if all(skips):  # the kernel reads the array, in its own order
                    layout = own
                elif not padded_input and any(contiguous(b, shape) for b in blocks):
                    # the walk's order, unless the array's spares a copy (only a contiguous block can)
                    kept = _skips(own, keys, blocks, shape, padded_input, once)
                    if kept.count(False) < skips.count(False):
                        layout, skips = own, kept
            sites += [CacheSite(op.name, name, level, key, skip, layout) for level, key, skip in zip(levels, keys, skips)]
    return sites


def _skips(layout: Layout, keys, blocks, shape, padded_input: bool, once: bool) -> list[bool]:
    """Per level of one input, outermost first (its key-slices and blocks), whether its cache is
    skipped in `layout`: only the outermost block not already laid out in its source is copied."""
    skips, copied, last_key = [], False, "none"
    for key, block in zip(keys, blocks):
        # copied: a block of the packed layout is one contiguous run of its parent
        skip = copied or once or key == last_key or (not padded_input and row_major_thrifty(layout, block, shape))
        skips.append(skip)
        if not skip:
            copied, last_key = True, key
    return skips


def attach_name(key: Position | None, names: list[str]) -> str:
    return "root" if key is None else f"{key[0]}.{names[key[1]]}"


def plan_caches(workload: Workload, level_names: list[str], orders, tiles, double_buffer: bool = False,
                cores: int = 1, padding: list[CacheSite] = ()) -> list[CacheRecord]:
    """The cache records of a plan (orders and tiles innermost level first; `padding`:
    cache_records')."""
    padded, tiles = effective_tiles(workload, tiles)
    return cache_records(workload, level_names, orders, tiles, padded, input_caches(workload, orders, tiles, padded),
                         double_buffer, cores, padding)


def parallel_positions(workload: Workload, orders, tiles, cores: int) -> dict[str, Position]:
    """Per op, the loop the CPU backend runs on `cores` threads (costmodel.parallel_loops), if any."""
    if cores < 2:
        return {}
    found = {}
    for op, (index, count) in zip(workload.ops, parallel_loops(workload, orders, tiles, cores)):
        if int(index) >= 0 and int(count) >= 2:
            found[op.name] = parallel_candidates(workload, orders, op)[int(index)]
    return found


def double_buffer_reason(workload: Workload, site: CacheSite, parallel: dict[str, Position], top: int) -> str | None:
    """Why the CPU backend does not software-pipeline this input cache's copy (None: it does,
    when asked). A parallel attach loop is never pipelined: its buffers are shared by the
    threads running its iterations, which would overwrite each other's blocks."""
    if site.skipped:
        return "skipped by the thrifty rule: nothing is copied"
    if site.key is None:
        return "filled once, before every loop: there is no next block to overlap"
    # The outermost level's shared loops belong to the last op's nest.
    owner = workload.ops[-1].name if site.key[1] == top and site.key[0] in workload.shared_loops else site.op
    if parallel.get(owner) == site.key:
        return "its attach loop runs in parallel: the threads would share the rotating buffers"
    return None


def threads_apart(workload: Workload, orders, op: Op, tiles, padded, holder: Position | None,
                  split: Position | None) -> tuple[list[int], tuple[int, int] | None]:
    """The shape of the buffer an output accumulates in (a holder's block, or with `holder` None
    a padded output or the copy of one, which span the whole kernel), and (axis, chunk) when
    the CPU backend lays it out with each thread's part contiguous: the parallel loop `split`
    runs under it and splits one of its dims after the first of extent over 1, whose index v
    becomes (v // chunk, ..., v % chunk), the chunk one parallel iteration covers moved
    outermost. None: as it is.

    Split along its rows, the threads' parts of every row share its pages and its streams:
    gemm 127x251x509 with `nkm:7,32,1 / nmk:7,32,1 / nkm:7,128,2 / knm:127,251,16` (the whole
    padded C accumulated across the outer k loop, its 7x32 tiles reloaded every 2 k steps, n
    split in two 128-column halves) ran in 1.8-2.3 ms on two cores and 0.46 ms on one; with
    each half contiguous, 0.34 ms on two (AMD EPYC Zen 4, BENCHMARKS.md "Holder session")."""
    dims = workload.tensors[op.output].dims
    shape = holder_block(workload, orders, op, tiles, padded, holder) if holder else [padded[x] for x in dims]
    if split is None or split[0] not in dims[1:]:
        return shape, None
    positions = walk(workload, orders, op)
    if holder is not None and positions.index(split) <= positions.index(holder):
        return shape, None  # each parallel iteration has a holder block of its own
    axis, chunk = dims.index(split[0]), tiles[split[1]][split[0]]
    if shape[axis] % chunk or shape[axis] == chunk or math.prod(shape[:axis]) == 1:
        return shape, None  # uneven parts, one part, or the parts contiguous already (dims before it of extent 1)
    return shape, (axis, chunk)


def cache_records(workload: Workload, level_names: list[str], orders, tiles, padded, sites: list[CacheSite],
                  double_buffer: bool, cores: int = 1, padding: list[CacheSite] = ()) -> list[CacheRecord]:
    """Records for the inputs zero-padded by a pass of their own (`padding`:
    kernel_costs.padding_passes), the input cache `sites`, and each output's register tile
    (tiles effective). With `double_buffer`, each input cache says whether it is pipelined, or
    why not."""
    parallel = parallel_positions(workload, orders, tiles, cores)
    records = [CacheRecord(tensor=s.tensor, level=level_names[s.level], attach_loop="root", layout=PADDED_ONCE,
                           double_buffer=False, skipped_thrifty=False) for s in padding]
    for s in sites:
        why = double_buffer_reason(workload, s, parallel, len(tiles) - 1) if double_buffer else None
        records.append(CacheRecord(tensor=s.tensor, level=level_names[s.level], attach_loop=attach_name(s.key, level_names),
                                   layout=s.layout.name() if s.layout else WINDOW, double_buffer=double_buffer and why is None,
                                   skipped_thrifty=s.skipped, note=why))
    for op in workload.ops:
        key, _ = output_tile(workload, orders, op, tiles, padded)
        plan = output_plan(workload, orders, op, tiles, padded)
        if plan is None:
            layout = "register tile (local), stored once"
        elif plan.holder is not None:
            layout = (f"contiguous buffer of its block under {attach_name(plan.holder, level_names)}, zeroed at "
                      f"{attach_name(plan.start, level_names)}, accumulated by the register tile, written back once")
            if threads_apart(workload, orders, op, tiles, padded, plan.holder, parallel.get(op.name))[1]:
                layout += " (each thread's part contiguous)"
        else:
            layout = f"zeroed at {attach_name(plan.start, level_names)}, accumulated in place"
            if copied_out(workload, op, padded):
                layout += " in a buffer of the whole output (rows skewed), copied out once"
                if threads_apart(workload, orders, op, tiles, padded, None, parallel.get(op.name))[1]:
                    layout += " (each thread's part contiguous)"
        records.append(CacheRecord(tensor=op.output, level=level_names[0], attach_loop=attach_name(key, level_names),
                                   layout=layout, double_buffer=False, skipped_thrifty=False))
    return records


def output_tile(workload: Workload, orders, op: Op, tiles, padded, level: int = 0) -> tuple[Position | None, list[Position]]:
    """The output register tile's key-slice, and the reduction positions above it.

    With none above, the tile accumulates in registers and is stored once;
    otherwise it must resume from the running sum in the output. On GPUs pass
    level 1: a thread's tile moves only when the block walk leaves the block.
    """
    out = workload.tensors[op.output].dims
    positions = walk(workload, orders, op)
    key = key_slice(positions, out, tiles, padded, level)
    above = positions[: positions.index(key)] if key is not None else []
    return key, [p for p in above if p[0] not in out]


def gpu_shared_copy(workload: Workload, name: str, tiles) -> bool:
    """Whether the GPU backend copies an input's block (tiles effective) into shared memory: not
    a one-element block, which every thread reads straight from memory (a copy gains nothing,
    and TVM 0.27 fails to place a one-element dynamic shared buffer)."""
    return int(workload.block(name, tiles[1])) > 1


def outer_shared(workload: Workload, op: Op, pos: Position, top: int) -> bool:
    """Whether a position of a chain producer's walk is one of the consumer's outermost-level
    shared loops (the producer runs inside them)."""
    return is_producer(workload, op) and pos[1] == top and pos[0] in workload.shared_loops


@dataclass
class OutputPlan:
    """How an output that must resume from its running sum accumulates (output_plan)."""

    holder: Position | None  # its block under this position lives in a contiguous buffer; None: in place
    start: Position  # where it is zeroed: the first reduction position below the holder
    owned: list[Position]  # the op's own positions, in the order the kernel runs them


def output_plan(workload: Workload, orders, op: Op, tiles, padded) -> OutputPlan | None:
    """None when the output's register tile is stored once: no reduction loop with more than one
    trip runs above its key-slice. Otherwise the tile is reloaded and stored at each of those
    trips, and the kernel keeps the output's block in a contiguous buffer instead of the
    row-major array, whose strided rows conflict in the caches: the block under `holder` (the
    innermost position above the first such reduction indexing the output with more than one
    trip), zeroed at `start` and written back once. One-trip reduction loops above the holder
    change nothing, so they run just below it (TensorIR zeroes a reduction only above all its
    loops). With no such holder, a chain's shared loop above it, or a chain's intermediate
    (kernel-local already), the output accumulates in place, zeroed above its first reduction."""
    out = workload.tensors[op.output].dims
    _, above = output_tile(workload, orders, op, tiles, padded)
    multi = [p for p in above if trips(tiles, padded, p[0], p[1]) > 1]
    if not multi:
        return None
    top = len(tiles) - 1
    positions = walk(workload, orders, op)
    owned = [p for p in positions if not outer_shared(workload, op, p, top)]
    reductions = [p for p in positions if p[0] not in out]
    first = positions.index(multi[0])
    holders = [p for p in positions[:first] if p[0] in out and trips(tiles, padded, p[0], p[1]) > 1]
    # The outermost level's shared loops of a chain are where its producers run: they stay put.
    pinned = len(workload.ops) > 1 and any(p[1] == top and p[0] in workload.shared_loops for p in reductions)
    if not holders or pinned or workload.tensors[op.output].role != "output":
        return OutputPlan(None, reductions[0], owned)
    holder = holders[-1]
    idle = [p for p in owned[: owned.index(holder)] if p[0] not in out and trips(tiles, padded, p[0], p[1]) == 1]
    rest = [p for p in owned if p not in idle]
    at = rest.index(holder) + 1
    order = rest[:at] + idle + rest[at:]
    return OutputPlan(holder, next(p for p in order[at:] if p[0] not in out), order)


def holder_block(workload: Workload, orders, op: Op, tiles, padded, holder: Position,
                 inclusive: bool = False, dims=None) -> list[int]:
    """The shape of the output's block under `holder` (output_plan's contiguous buffer): per
    output dim, the tile of the level above the outermost position under the holder that walks
    it (the register tile when none does). `inclusive`: the block the holder's own loop walks
    too (what a zeroing pass decomposed at that loop covers). `dims`: those loops' extents
    instead of the output's dims (what one trip of the holder sweeps of an input)."""
    positions = walk(workload, orders, op)
    under = positions[positions.index(holder) + (0 if inclusive else 1):]
    shape = []
    for x in workload.tensors[op.output].dims if dims is None else dims:
        j = max((level for y, level in under if y == x), default=-1)
        shape.append(tiles[j + 1][x] if j + 1 < len(tiles) else padded[x])
    return shape


def gpu_cache_records(workload: Workload, level_names: list[str], orders, tiles, stages: int) -> list[CacheRecord]:
    """The caches of a GPU plan (orders and tiles innermost level first).

    Each input read from memory is copied cooperatively into shared memory at
    its level-1 key-slice (the k-tile loop of a GEMM), in `stages` rotating
    buffers; a chain's intermediate is a single shared block its producer's
    threads write and its consumer's threads read; outputs accumulate in each
    thread's registers and are stored when the block walk leaves their block.
    """
    padded, tiles = effective_tiles(workload, tiles)
    threads = int(gpu.threads(workload, workload.ops[-1], tiles))
    records = []
    for op in workload.ops:
        positions = walk(workload, orders, op)
        for name in op.inputs:
            tensor = workload.tensors[name]
            block = [int(ix.span(tiles[1])) for ix in tensor.index]
            elems = int(workload.block(name, tiles[1]))
            if tensor.role == "intermediate":
                records.append(CacheRecord(tensor=name, level=level_names[1], attach_loop="producer", stages=1,
                                           layout="row-major block, written by the producer's threads",
                                           double_buffer=False, skipped_thrifty=False))
                continue
            key = key_slice(positions, tensor.loops, tiles, padded, 1)
            if not gpu_shared_copy(workload, name, tiles):
                records.append(CacheRecord(tensor=name, level=level_names[1], attach_loop=attach_name(key, level_names),
                                           layout="one element, read from memory by every thread", double_buffer=False,
                                           skipped_thrifty=True))
                continue
            records.append(CacheRecord(
                tensor=name, level=level_names[1], attach_loop=attach_name(key, level_names),
                layout="row-major block " + "x".join(map(str, block)), double_buffer=stages > 1 and key is not None,
                skipped_thrifty=False, stages=stages if key is not None else 1,
                copy_mode=gpu.copy_policy(elems, threads, workload.elem_bytes),
            ))
    for op in workload.ops:
        key, outer_reduction = output_tile(workload, orders, op, tiles, padded, level=1)
        layout = ("thread tiles; zeroed above the first reduction loop, accumulated in place" if outer_reduction
                  else "thread tiles (local), stored once")
        records.append(CacheRecord(tensor=op.output, level=level_names[0], attach_loop=attach_name(key, level_names),
                                   layout=layout, double_buffer=False, skipped_thrifty=False))
    return records
