"""A GPU plan as a TensorIR schedule for CUDA.

The decisions come from models/gpu.py and models/caches.gpu_cache_records;
this module turns them into schedule primitives, one small rule each:

1. split every loop by the plan's tiles (grid, block, thread, point);
2. fuse the grid loops (levels >= 1, outermost level first, so neighbouring
   blocks share the level-2 tile in L2) and bind them to blockIdx.x;
3. in a chain, run the loops the ops share (but that are not grid loops)
   serially in the block and compute each producer inside the innermost of
   them, its output block in shared memory;
4. per op, fuse the thread loops (output dims, last dim fastest) and bind
   them to threadIdx.x; the point loops inside are unrolled;
5. copy each input read from memory into shared memory at its level-1
   key-slice, cooperatively (BLOCKED or STRIPED, as the plan says), 128-bit
   vectorised where the rows allow;
6. accumulate outputs in registers (cache_write local), stored once, or in
   place when a reduction loop runs above the output's block;
7. multi-buffer every serial loop that caches attach to:
   software_pipeline_stage puts the copies `stages - 1` iterations ahead, so
   TVM keeps `stages` rotating buffers (index i % stages, Croktile's rotate).
"""
from __future__ import annotations

from tvm import s_tir, tirx

from ..models.caches import (
    crops, effective_tiles, gpu_cache_records, gpu_shared_copy, is_producer, key_slice, output_tile, trips, walk,
)
from ..models.gpu import VECTOR_BYTES, block_loops, copy_policy, grid_blocks, threads
from ..models.errors import InvalidInput
from ..models.hardware import Hardware
from ..models.plan import Plan
from ..models.workload import Workload
from .base import Emitted
from .tensorir import block_name, inline_padding, is_padded, primfunc, read_index, source_name

SHARED = "shared.dyn"  # dynamic shared memory: blocks may use more than the 48 KB static limit
UNROLL_LIMIT = 256  # thread-tile points unrolled


def emit_cuda(workload: Workload, hardware: Hardware, plan: Plan) -> Emitted:
    """Schedule the workload's TensorIR by a GPU plan (see the module docstring)."""
    if plan.launch is None:
        raise InvalidInput("the plan has no launch: plans for the cuda backend come from GPU hardware")
    if len(plan.levels) != len(hardware.levels):
        raise InvalidInput(f"the plan has {len(plan.levels)} levels but the hardware {len(hardware.levels)}")
    orders = [lv.order for lv in plan.levels]
    padded, tiles = effective_tiles(workload, [lv.tile for lv in plan.levels])
    n_threads = int(threads(workload, workload.ops[-1], tiles))
    stages = plan.launch.stages
    sch = s_tir.Schedule(primfunc(workload, padded))
    blocks = {op.name: sch.get_sblock(block_name(workload, op, padded)) for op in workload.ops}
    loops: dict = {}  # (op name, (loop, level)) -> loop handle; level -1 is the thread tile's points
    consumer = workload.ops[-1]
    grid, serial = _consumer_nest(sch, blocks[consumer.name], workload, orders, tiles, padded, loops)
    anchor = serial[-1] if serial else None  # where producers run
    for op in workload.ops[:-1]:
        sch.compute_at(blocks[op.name], anchor, preserve_unit_loops=True)
        _producer_nest(sch, blocks[op.name], workload, op, orders, tiles, padded, loops)
        sch.set_scope(blocks[op.name], 0, SHARED)
    pipelined: dict = {}
    for op in workload.ops:
        for name in op.inputs:
            if workload.tensors[name].role == "input":
                _cache_input(sch, blocks[op.name], workload, op, name, orders, tiles, padded, loops, grid, n_threads,
                             pipelined)
    for op in workload.ops:
        store = _accumulate(sch, blocks[op.name], workload, op, orders, tiles, padded, loops, grid)
        _unroll_points(sch, loops, workload, op)
        if crops(workload, op, padded):
            _crop(sch, sch.get_sblock(op.output), store, n_threads)
    inline_padding(sch, workload, padded)
    buffered = _multi_buffer(sch, pipelined, stages) if stages > 1 else set()  # last: it lists the blocks as they are now
    records = gpu_cache_records(workload, [lv.name for lv in plan.levels], orders, [lv.tile for lv in plan.levels], stages)
    # Record what was emitted: a cache whose loop could not be pipelined has one buffer.
    names = {name.split("_")[0] for name in buffered}
    records = [r if r.stages == 1 or r.tensor in names else r.model_copy(update={"stages": 1, "double_buffer": False})
               for r in records]
    return Emitted(sch, records, padded, {"threads": n_threads, "blocks": int(grid_blocks(workload, tiles[1]))})


def _split(sch, loop, x, tiles, padded, first: int) -> list:
    """Split loop x into its trips at levels first..0, then the thread tile's points."""
    levels = list(range(first, -1, -1))
    factors = [trips(tiles, padded, x, j) for j in levels] + [tiles[0][x]]
    return list(zip(levels + [-1], sch.split(loop, factors=factors)))


def _consumer_nest(sch, block, workload, orders, tiles, padded, loops: dict):
    """Tile the last op; returns the blockIdx loop and the serial shared loops producers run in."""
    op = workload.ops[-1]
    top = len(tiles) - 1
    out = workload.tensors[op.output].dims
    te_order = list(out) + [x for x in op.loops if x not in out]
    for x, loop in zip(te_order, sch.get_loops(block)[-len(op.loops):]):
        for pos, part in _split(sch, loop, x, tiles, padded, top):
            loops[(op.name, (x, pos))] = part
    grid_loops = block_loops(workload)
    positions = walk(workload, orders, op)
    grid = [p for p in positions if p[0] in grid_loops and p[1] >= 1]
    chain = len(workload.ops) > 1
    shared = [p for p in positions if p[1] >= 1 and p[0] not in grid_loops and chain and p[0] in workload.shared_loops]
    rest = [p for p in positions if p[1] >= 1 and p not in grid and p not in shared]
    thread, steps, points = _inner_positions(workload, op)
    if shared:
        # Producers run inside the shared loops, so the consumer's threads start below them.
        order = grid + shared + thread + rest + steps + points
    else:
        order = grid + thread + rest + steps + points
    sch.reorder(*[loops[(op.name, p)] for p in order])
    bx = sch.fuse(*[loops[(op.name, p)] for p in grid])
    sch.bind(bx, "blockIdx.x")
    tx = sch.fuse(*[loops[(op.name, p)] for p in thread])
    sch.bind(tx, "threadIdx.x")
    for p in grid:
        loops[(op.name, p)] = bx
    for p in thread:
        loops[(op.name, p)] = tx
    return bx, [loops[(op.name, p)] for p in shared]


def _inner_positions(workload, op):
    """Per op: the thread positions (output dims at level 0), the thread's reduction steps,
    and the thread tile's points (reductions outermost)."""
    out = workload.tensors[op.output].dims
    steps = [(x, 0) for x in op.loops if x not in out]
    points = [(x, -1) for x in op.loops if x not in out] + [(x, -1) for x in out]
    return [(x, 0) for x in out], steps, points


def _producer_nest(sch, block, workload, op, orders, tiles, padded, loops: dict) -> None:
    """Tile a chain producer computed inside the consumer's shared loops: threads over its
    output block, its own reductions serial inside."""
    out = workload.tensors[op.output].dims
    te_order = list(out) + [x for x in op.loops if x not in out]
    for x, loop in zip(te_order, sch.get_loops(block)[-len(op.loops):]):
        inner = x in workload.shared_loops  # the shared loops' outer levels belong to the consumer
        for pos, part in _split(sch, loop, x, tiles, padded, 0 if inner else len(tiles) - 1):
            loops[(op.name, (x, pos))] = part
    positions = walk(workload, orders, op)
    rest = [p for p in positions if p[1] >= 1 and p[0] not in workload.shared_loops]
    thread, steps, points = _inner_positions(workload, op)
    sch.reorder(*[loops[(op.name, p)] for p in thread + rest + steps + points])
    tx = sch.fuse(*[loops[(op.name, p)] for p in thread])
    sch.bind(tx, "threadIdx.x")
    for p in thread:
        loops[(op.name, p)] = tx
    # The consumer's grid and shared positions stand for the producer's outer ones.
    for p in positions:
        if (op.name, p) not in loops:
            loops[(op.name, p)] = loops[(workload.ops[-1].name, p)]


def _cache_input(sch, block, workload, op, name, orders, tiles, padded, loops, grid, n_threads, pipelined) -> None:
    """Copy the input's level-1 block into shared memory at its key-slice, cooperatively."""
    if not gpu_shared_copy(workload, name, tiles):
        return
    tensor = workload.tensors[name]
    padded_input = is_padded(workload, name, padded)
    cache = sch.cache_read(block, read_index(sch, block, source_name(workload, name, padded)), SHARED)
    key = key_slice(walk(workload, orders, op), tensor.loops, tiles, padded, 1)
    at = grid if key is None else loops[(op.name, key)]
    sch.compute_at(cache, at, preserve_unit_loops=True)
    elems = int(workload.block(name, tiles[1]))
    lanes = VECTOR_BYTES // workload.elem_bytes
    last = tensor.dims[-1]  # an affine input (no single loop) always reads through its padded copy
    vector = (not padded_input and tiles[1][last] % lanes == 0 and workload.dims[last] % lanes == 0
              and elems % (n_threads * lanes) == 0)
    vec = lanes if vector else 1
    fused = sch.fuse(*sch.get_loops(cache)[-len(tensor.dims):])
    if copy_policy(elems, n_threads, workload.elem_bytes) == "blocked":
        t, inner, v = sch.split(fused, factors=[n_threads, None, vec])
    else:
        inner, t, v = sch.split(fused, factors=[None, n_threads, vec])
    sch.bind(t, "threadIdx.x")
    if vec > 1:
        sch.vectorize(v)
    if key is not None and key[0] not in block_loops(workload):
        pipelined.setdefault(key, (at, []))[1].append(cache)


def _accumulate(sch, block, workload, op, orders, tiles, padded, loops, grid):
    """Registers for the output's thread tile, stored once per block move (returns the
    store block); or, with a reduction loop above the output's block, zero the output and
    accumulate in place (returns None)."""
    key, outer = output_tile(workload, orders, op, tiles, padded, level=1)
    if any(trips(tiles, padded, x, j) > 1 for x, j in outer):
        sch.decompose_reduction(block, loops[(op.name, outer[0])])
        return None
    tx = loops[(op.name, (workload.tensors[op.output].dims[0], 0))]
    store = sch.cache_write(block, 0, "local")
    under_serial = not is_producer(workload, op) and _threads_under_serial(workload)
    if not under_serial:
        sch.reverse_compute_at(store, tx, preserve_unit_loops=True)
    else:
        # The consumer's threads sit inside the chain's serial loops, but its registers
        # live across them: store after the serial loops, with the same thread mapping.
        sch.reverse_compute_at(store, grid, preserve_unit_loops=True)
        out = workload.tensors[op.output].dims
        parts = [sch.split(lp, factors=[None, tiles[0][x]]) for x, lp in zip(out, sch.get_loops(store)[-len(out):])]
        sch.reorder(*[p[0] for p in parts], *[p[1] for p in parts])
        sch.bind(sch.fuse(*[p[0] for p in parts]), "threadIdx.x")
    # Zero the registers once, right below the loop they live under.
    sch.decompose_reduction(block, _below(sch, block, grid if under_serial else tx))
    return store


def _crop(sch, crop, store, n_threads: int) -> None:
    """The padded output's real part: written by the register store itself, or, when the
    output accumulates in place, copied by a kernel of its own."""
    if store is not None:
        sch.reverse_compute_inline(crop)
        return
    blocks, threads = sch.split(sch.fuse(*sch.get_loops(crop)), factors=[None, n_threads])
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")


def _threads_under_serial(workload) -> bool:
    return len(workload.ops) > 1 and any(x not in block_loops(workload) for x in workload.shared_loops)


def _below(sch, block, loop):
    """The loop of the block's nest right inside `loop`."""
    nest = sch.get_loops(block)
    index = [sch.get(lp).same_as(sch.get(loop)) for lp in nest].index(True)
    return nest[index + 1]


def _unroll_points(sch, loops, workload, op) -> None:
    budget = UNROLL_LIMIT
    for x in reversed(op.loops):
        loop = loops[(op.name, (x, -1))]
        extent = sch.get(loop).extent
        if not isinstance(extent, tirx.IntImm) or extent.value > budget:
            break
        budget //= max(extent.value, 1)
        sch.unroll(loop)


def _multi_buffer(sch, pipelined: dict, stages: int) -> set[str]:
    """Software-pipeline the serial loops that input caches attach to: copies run at stage 0,
    everything else at stage `stages - 1`, so TVM allocates `stages` buffers of each cache.
    The annotation lists every block under the loop; a loop holding another such loop is
    left alone (TVM pipelines one level of a nest). Returns the buffers multi-buffered."""
    nodes = {key: sch.get(loop) for key, (loop, _) in pipelined.items()}
    done = set()
    for key, (loop, caches) in pipelined.items():
        node = nodes[key]
        if node.extent.value < 2:
            continue
        children = sch.get_child_blocks(loop)
        if any(_encloses(sch, loop, nodes[k]) for k in nodes if k != key):
            continue
        copies = [sch.get(c) for c in caches]
        stage = [0 if any(sch.get(b).same_as(c) for c in copies) else stages - 1 for b in children]
        sch.annotate(loop, "software_pipeline_stage", stage)
        sch.annotate(loop, "software_pipeline_order", list(range(len(stage))))
        done |= {sch.get(c).writes[0].source.name for c in caches}
    return done


def _encloses(sch, loop, node) -> bool:
    """Whether `node` (a loop) lies inside `loop`."""
    for block in sch.get_child_blocks(loop):
        if any(sch.get(lp).same_as(node) for lp in sch.get_loops(block)):
            return True
    return False
