"""A plan as a TensorIR schedule: tiling, caches, fusion, then CPU rules.

The loop nest is the cost model's walk (models/costmodel.py): level-l loops
walk level-l tiles inside the level-(l+1) tile, outermost level first, and
each op walks its own loops. In a chain, every op but the last is computed at
the last shared loop of the outermost level, so its output block (the
intermediate) lives in a kernel-local buffer and never reaches memory.

Caches (`CacheRecord`): tensor T's block at level l changes at the key-slice,
the innermost loop of levels >= l that indexes T and runs more than once; a
cache of T at level l is filled there. Inputs are cached at every level >= 1
in one packed layout: level-1 tiles contiguous, and inside a tile the dims in
the order the micro-kernel walks them (reduction dims, then the others, the
vector dim last). Accera's thrifty rule skips a cache whose block is already
contiguous, in the same layout, in the buffer it would copy from; in the
packed layout that holds at level 1 and often above. Outputs accumulate in a
register tile (`local`), read and written back at their level-0 key-slice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel
from tvm import s_tir, tirx

from ..models.hardware import Hardware
from ..models.plan import Plan
from ..models.workload import Op, Workload
from .tensorir import block_name, pad_name, primfunc


class CacheRecord(BaseModel):
    """One cache the plan implies: emitted, or skipped by the thrifty rule."""

    tensor: str
    level: str
    attach_loop: str
    layout: str
    double_buffer: bool
    skipped_thrifty: bool


@dataclass
class Emitted:
    schedule: s_tir.Schedule
    caches: list[CacheRecord]
    padded: dict[str, int]
    parallel_loop: str | None = None


@dataclass
class _Nest:
    """Loop handles of one op: loops[(x, level)] and the point loops of the register tile."""

    loops: dict[tuple[str, int], s_tir.schedule.LoopRV] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)  # outermost first, point loops as level -1


def effective_tiles(workload: Workload, plan: Plan) -> tuple[dict[str, int], list[dict[str, int]]]:
    """Padded extents and per-level tiles in the padded space (innermost level first).

    A tile equal to the whole extent becomes the padded extent, which is the
    extent rounded up to the largest smaller tile beneath it.
    """
    padded, tiles = {}, [dict(lv.tile) for lv in plan.levels]
    for x, extent in workload.dims.items():
        below = [t[x] for t in tiles if t[x] < extent]
        padded[x] = math.ceil(extent / max(below)) * max(below) if below else extent
        for t in tiles:
            if t[x] >= extent:
                t[x] = padded[x]
    for j in range(len(tiles)):
        parent = tiles[j + 1] if j + 1 < len(tiles) else padded
        bad = [x for x in workload.dims if parent[x] % tiles[j][x]]
        if bad:
            raise ValueError(f"plan tiles of {bad} at level {plan.levels[j].name!r} do not divide the tiles above;"
                             " plans from `tune` always nest")
    return padded, tiles


def _micro_order(workload: Workload, op: Op, lanes_loop: str) -> list[str]:
    """The register tile's loops: reductions outermost, the vector loop innermost."""
    out = workload.tensors[op.output].dims
    red = [x for x in op.loops if x not in out]
    spatial = [x for x in out if x != lanes_loop]
    return red + spatial + [lanes_loop]


def _is_producer(workload: Workload, op: Op) -> bool:
    return op is not workload.ops[-1]


def _walk(workload: Workload, plan: Plan, op: Op) -> list[tuple[str, int]]:
    """(loop, level) positions of the op's walk, outermost first; a producer's walk omits
    the shared loops of the outermost level, which belong to the consumer's nest."""
    top = len(plan.levels) - 1
    shared = set(workload.shared_loops)
    walk = []
    for j in reversed(range(len(plan.levels))):
        for x in plan.levels[j].order:
            if x in op.loops and not (_is_producer(workload, op) and j == top and x in shared):
                walk.append((x, j))
    return walk


def _tile(sch, block, workload, plan, op, tiles, padded) -> _Nest:
    """Split every loop of `block` by the plan's tiles and reorder into the walk."""
    top = len(plan.levels) - 1
    shared = set(workload.shared_loops)
    nest = _Nest()
    loops = sch.get_loops(block)
    block_loops = loops[-len(op.loops):]
    out = workload.tensors[op.output].dims
    iter_order = out + [x for x in op.loops if x not in out]  # te.compute's loop order
    for x, loop in zip(iter_order, block_loops):
        first = top - 1 if _is_producer(workload, op) and x in shared else top
        levels = list(range(first, -1, -1))
        parent = [tiles[j + 1][x] if j + 1 <= top else padded[x] for j in levels]
        factors = [p // tiles[j][x] for p, j in zip(parent, levels)] + [tiles[0][x]]
        parts = sch.split(loop, factors=factors) if len(factors) > 1 else [loop]
        for j, part in zip(levels, parts):
            nest.loops[(x, j)] = part
        nest.loops[(x, -1)] = parts[-1]
    lanes_loop = out[-1]
    nest.order = _walk(workload, plan, op) + [(x, -1) for x in _micro_order(workload, op, lanes_loop)]
    sch.reorder(*[nest.loops[p] for p in nest.order])
    return nest


def _trips(tiles, padded, x, j) -> int:
    parent = tiles[j + 1][x] if j + 1 < len(tiles) else padded[x]
    return parent // tiles[j][x]


def _key_slice(walk_above: list[tuple[str, int]], tdims, tiles, padded, level) -> tuple[str, int] | None:
    """The innermost position at levels >= level indexing the tensor with more than one trip."""
    for x, j in reversed(walk_above):
        if j >= level and x in tdims and _trips(tiles, padded, x, j) > 1:
            return (x, j)
    return None


@dataclass
class Layout:
    """The packed layout of an input: tiles of every level inside tiles of the level above,
    then, inside a level-1 tile, the dims in the micro-kernel's order. Every aligned block of
    any level is then one contiguous run, so caches below the first are skipped as thrifty."""

    dims: list[str]
    bounds: list[list[int]]  # per dim: padded extent, then the tiles of levels top-1 .. 1
    inner_order: list[int]  # dim positions, in the order the micro-kernel walks them

    def digits(self, idx):
        """(index, size) pairs, most significant first, for per-dim indices `idx`."""
        out = []
        for b in range(len(self.bounds[0]) - 1):
            out += [((idx[i] % self.bounds[i][b]) // self.bounds[i][b + 1], self.bounds[i][b] // self.bounds[i][b + 1])
                    for i in range(len(self.dims))]
        out += [(idx[i] % self.bounds[i][-1], self.bounds[i][-1]) for i in self.inner_order]
        return [(d, s) for d, s in out if s > 1] or out[-1:]  # TensorIR rejects constant (size-1) digits

    def index_map(self):
        return lambda *idx: [d for d, _ in self.digits(idx)]

    def offsets(self, block: list[int]) -> np.ndarray:
        """Offsets of the block at the origin of the whole padded tensor."""
        offset = np.zeros(1, dtype=np.int64)
        for d, s in self.digits(np.indices(block).reshape(len(block), -1)):
            offset = offset * s + d
        return offset

    def name(self) -> str:
        levels = " / ".join(",".join(f"{x}{b[k]}" for x, b in zip(self.dims, self.bounds)) for k in range(1, len(self.bounds[0])))
        inner = ",".join(self.dims[i] for i in self.inner_order)
        return f"tiled [{levels or 'whole'}] then [{inner}] in each level-1 tile"


def _row_major_offsets(block, shape) -> np.ndarray:
    offset = np.zeros(1, dtype=np.int64)
    for d, s in zip(np.indices(block).reshape(len(block), -1), shape):
        offset = offset * s + d
    return offset


_CHECK_LIMIT = 1 << 22  # elements; larger blocks are assumed to need their copy


def _thrifty(layout: Layout, block, parent_shape, parent_packed: bool) -> bool:
    """Accera's thrifty rule: the block (at its parent's origin) is already one contiguous run
    in the parent's buffer, in the order the cache would store it, so copying changes nothing."""
    if math.prod(block) > _CHECK_LIMIT:
        return False
    theirs = layout.offsets(block) if parent_packed else _row_major_offsets(block, parent_shape)
    mine = np.argsort(layout.offsets(block), kind="stable")
    return int(theirs.max() - theirs.min() + 1) == theirs.size and np.array_equal(np.argsort(theirs, kind="stable"), mine)


def emit(workload: Workload, hardware: Hardware, plan: Plan, double_buffer: bool = False) -> Emitted:
    """Schedule the workload's TensorIR by the plan; see the module docstring."""
    if len(plan.levels) != len(hardware.levels):
        raise ValueError("the plan's levels do not match the hardware's")
    padded, tiles = effective_tiles(workload, plan)
    sch = s_tir.Schedule(primfunc(workload, padded))
    names = [lv.name for lv in plan.levels]
    top = len(plan.levels) - 1
    consumer = workload.ops[-1]
    nests: dict[str, _Nest] = {}
    blocks = {op.name: sch.get_sblock(block_name(op.name)) for op in workload.ops}
    nests[consumer.name] = _tile(sch, blocks[consumer.name], workload, plan, consumer, tiles, padded)
    # Producers: computed where the consumer's shared loops of the outermost level end.
    consumer_walk = nests[consumer.name].order
    shared_top = [p for p in consumer_walk if p[1] == top and p[0] in workload.shared_loops]
    for op in workload.ops[:-1]:
        if shared_top:
            sch.compute_at(blocks[op.name], nests[consumer.name].loops[shared_top[-1]], preserve_unit_loops=True)
        nests[op.name] = _tile(sch, blocks[op.name], workload, plan, op, tiles, padded)
    # Before caches and the split reduction: TensorIR checks the blocks under a parallel loop.
    parallel = _parallelize(sch, workload, nests[consumer.name], tiles, padded, hardware)
    parallel = None if parallel is None else f"{parallel[0]}.{names[parallel[1]]}"
    records: list[CacheRecord] = []
    lanes = hardware.vector_bytes // workload.elem_bytes if hardware.vector_bytes else 1
    for op in workload.ops:
        nest = nests[op.name]
        walk = (shared_top if _is_producer(workload, op) else []) + nest.order
        loop_of = lambda p: nests[consumer.name].loops[p] if p in shared_top and _is_producer(workload, op) else nest.loops[p]  # noqa: E731
        micro = _micro_order(workload, op, workload.tensors[op.output].dims[-1])
        for name in op.inputs:
            if workload.tensors[name].role == "intermediate":
                continue  # the producer's buffer, already the block the model counts
            records += _cache_input(sch, blocks[op.name], workload, op, name, walk, loop_of, tiles, padded, names, micro,
                                    double_buffer, lanes)
        _micro_kernel(sch, nest, micro)
        records += _accumulate(sch, blocks[op.name], workload, op, walk, loop_of, nest.loops[(micro[0], -1)],
                               tiles, padded, names, lanes)
    for name, t in workload.tensors.items():
        if t.role == "input" and any(padded[x] != workload.dims[x] for x in t.dims):
            try:  # the pad copy folds into the outermost cache that reads it
                sch.compute_inline(sch.get_sblock(pad_name(name)))
            except Exception:  # noqa: BLE001 (no cache reads it: it stays a padding copy)
                pass
    return Emitted(sch, records, padded, parallel)


def _cache_input(sch, block, workload, op, name, walk, loop_of, tiles, padded, names, micro, double_buffer, lanes):
    tdims = workload.tensors[name].dims
    source = pad_name(name) if any(padded[x] != workload.dims[x] for x in tdims) else name
    layout = Layout(
        dims=list(tdims),
        bounds=[[padded[x]] + [tiles[j][x] for j in range(len(names) - 1, 0, -1)] for x in tdims],
        inner_order=sorted(range(len(tdims)), key=lambda i: micro.index(tdims[i])),
    )
    records, made = [], []
    parent_shape, parent_packed, parent_key = [padded[x] for x in tdims], False, None
    for level in range(len(names) - 1, 0, -1):
        key = _key_slice(walk, tdims, tiles, padded, level)
        attach = "root" if key is None else f"{key[0]}.{names[key[1]]}"
        shape = [tiles[level][x] for x in tdims]
        skip = attach == parent_key or _thrifty(layout, shape, parent_shape, parent_packed)
        records.append(CacheRecord(tensor=name, level=names[level], attach_loop=attach, layout=layout.name(),
                                   double_buffer=double_buffer and not skip and key is not None, skipped_thrifty=skip))
        if not skip:
            made.append((sch.cache_read(block, _read_index(sch, block, source), "global"), key, level))
            source = sch.get(made[-1][0]).writes[0].source.name
            parent_shape, parent_packed, parent_key = shape, True, attach
    for cache, key, level in reversed(made):  # innermost first: a cache's readers must sit below it
        if key is not None:
            sch.compute_at(cache, loop_of(key), preserve_unit_loops=True)
        sch.transform_layout(cache, ("write", 0), layout.index_map())
        _copy_loops(sch, cache, layout, level, lanes, parallel=key is None)
        if double_buffer and key is not None:
            _double_buffer(sch, cache, loop_of(key))
    records.append(CacheRecord(tensor=name, level=names[0], attach_loop="micro-kernel", layout="vector registers",
                               double_buffer=False, skipped_thrifty=False))
    return records


def _copy_loops(sch, cache, layout: Layout, level: int, lanes: int, parallel: bool) -> None:
    """Walk the copy in the packed order, so the writes are sequential; vectorise where
    the reads are too, and share a copy done outside every parallel loop among the cores."""
    rank = len(layout.dims)
    loops = sch.get_loops(cache)[-rank:]
    first = len(layout.bounds[0]) - level  # the bound at this cache's own level
    parts = []
    for i, loop in enumerate(loops):
        b = layout.bounds[i][first:]
        factors = [b[k] // b[k + 1] for k in range(len(b) - 1)] + [b[-1]]
        parts.append(sch.split(loop, factors=factors) if len(factors) > 1 else [loop])
    order = [parts[i][k] for k in range(len(parts[0]) - 1) for i in range(rank)]
    order += [parts[i][-1] for i in layout.inner_order]
    sch.reorder(*order)
    if layout.inner_order[-1] == rank - 1:
        extent = sch.get(order[-1]).extent.value
        if extent > 1 and extent % min(lanes, extent) == 0:
            sch.vectorize(sch.split(order[-1], factors=[None, min(lanes, extent)])[1] if extent > lanes else order[-1])
    if parallel:
        sch.parallel(order[0])


def _read_index(sch, block, buffer_name: str) -> int:
    names = [r.source.name for r in sch.get(block).reads]
    return names.index(buffer_name)


UNROLL_LIMIT = 64  # register-tile points unrolled beyond the vector loop


def _micro_kernel(sch, nest: _Nest, micro: list[str]) -> None:
    """Vectorise the register tile's last loop, unroll the others while the body stays small."""
    sch.vectorize(nest.loops[(micro[-1], -1)])
    budget = UNROLL_LIMIT
    for x in reversed(micro[:-1]):
        extent = sch.get(nest.loops[(x, -1)]).extent.value
        if extent > budget:
            break
        budget //= max(extent, 1)
        sch.unroll(nest.loops[(x, -1)])


def _accumulate(sch, block, workload, op, walk, loop_of, first_point, tiles, padded, names, lanes):
    """The output's register tile: read (when a reduction loop runs above it), accumulate, write back."""
    out = workload.tensors[op.output].dims
    key = _key_slice(walk, out, tiles, padded, 0)
    reduction = [p for p in walk if p[0] not in out and p[1] >= 0]
    outer_red = [p for p in reduction if key is not None and walk.index(p) < walk.index(key)]
    record = CacheRecord(tensor=op.output, level=names[0], attach_loop="root" if key is None else f"{key[0]}.{names[key[1]]}",
                         layout="vector registers", double_buffer=False, skipped_thrifty=False)
    if outer_red:
        # A reduction loop above the register tile: zero the output first, then read-add-write.
        # A reduction loop runs above the register tile, so the tile must start from the
        # output's running sum: zero the output there, and let the micro-kernel accumulate
        # into it. (TensorIR has no read-modify-write cache of a reduction's own output.)
        copies = [sch.decompose_reduction(block, loop_of(outer_red[0]))]
    else:
        write = sch.cache_write(block, 0, "local")
        if key is not None:
            sch.reverse_compute_at(write, loop_of(key), preserve_unit_loops=True)
        copies = [write]
    for b in copies:  # zeroing, loading and storing the tile: vector moves along its last dim
        _vectorize_innermost(sch, b, lanes)
    return [record]


def _vectorize_innermost(sch, block, lanes: int) -> None:
    loop = sch.get_loops(block)[-1]
    extent = sch.get(loop).extent
    if isinstance(extent, tirx.IntImm) and extent.value > 1:
        if extent.value > lanes and extent.value % lanes == 0:
            loop = sch.split(loop, factors=[None, lanes])[1]
        sch.vectorize(loop)


def _double_buffer(sch, cache, loop) -> None:
    """Software-pipeline the attach loop: the copy of the next block runs one stage ahead."""
    body = sch.get(loop).body
    n = len(body.seq) if isinstance(body, tirx.SeqStmt) else 1
    if n < 2:
        return
    copy_at = [i for i, s in enumerate(body.seq) if _contains_block(s, sch.get(cache).name_hint)]
    stages = [0 if i in copy_at else 1 for i in range(n)]
    sch.annotate(loop, "software_pipeline_stage", stages)
    sch.annotate(loop, "software_pipeline_order", list(range(n)))


def _contains_block(stmt, name: str) -> bool:
    found = []
    tirx.stmt_functor.post_order_visit(stmt, lambda s: found.append(True) if isinstance(s, tirx.SBlock) and s.name_hint == name else None)
    return bool(found)


def _parallelize(sch, workload, nest: _Nest, tiles, padded, hardware) -> str | None:
    """Run the outermost loop that is spatial for every op under it in parallel.

    Preference: the first such loop with at least `cores` trips; else the one with most trips.
    """
    if hardware.cores < 2:
        return None
    out = set(workload.tensors[workload.ops[-1].output].dims)
    spatial_everywhere = out & set.intersection(*[set(workload.tensors[op.output].dims) for op in workload.ops])
    candidates = []
    for x, j in nest.order:
        if j < 1:
            break
        if x not in out:
            continue  # a reduction loop: stays serial, loops below it may still run in parallel
        producers_below = any(p[0] in workload.shared_loops for p in nest.order[nest.order.index((x, j)):] if p[1] == len(tiles) - 1)
        if producers_below and x not in spatial_everywhere:
            continue
        candidates.append(((x, j), _trips(tiles, padded, x, j)))
    if not candidates:
        return None
    pick = next((c for c in candidates if c[1] >= hardware.cores), max(candidates, key=lambda c: c[1]))
    if pick[1] < 2:
        return None
    sch.parallel(nest.loops[pick[0]])
    return pick[0]
