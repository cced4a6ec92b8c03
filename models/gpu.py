"""How a plan runs on a GPU: threads, blocks, registers, shared memory, occupancy, waves.

On GPU hardware level 0 is the *thread tile* (a thread's registers) and level 1
the *block tile* (a block's shared memory); outer levels are caches the grid
walks through (L2). The block loops, those spatial for every op, tile the grid:
one block per level-1 block of them. Inside a block each op's output tile is
shared out among the threads, one thread tile each, the output's last dim
fastest; every other loop (the reductions, and in a chain the loops private to
one op) runs serially inside the block, so at levels >= 2 those loops take the
whole extent.

Vectorised like the cost model: tiles may be numpy arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, Field, model_serializer

from .hardware import Hardware
from .workload import Workload

RESERVED_REGISTERS = 32  # addresses, indices and loop counters next to the tiles
# Warps an SM needs resident to keep its four schedulers issuing through shared-memory and
# FMA latencies (two each); fewer run the arithmetic at that fraction of peak.
MIN_WARPS_PER_SM = 8
REGISTER_BYTES = 4
VECTOR_BYTES = 16  # one 128-bit load


def block_loops(workload: Workload) -> list[str]:
    """Loops spatial for every op: the grid's loops."""
    return [x for x in workload.dims if all(x in workload.tensors[op.output].dims for op in workload.ops)]


def _f(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float64)


def thread_grid(workload: Workload, op, tiles) -> dict[str, np.ndarray]:
    """Threads along each of the op's output dims: block tile / thread tile."""
    return {x: np.ceil(_f(tiles[1][x]) / _f(tiles[0][x])) for x in workload.tensors[op.output].dims}


def threads(workload: Workload, op, tiles) -> np.ndarray:
    # math.prod broadcasts the arrays as it multiplies: whole numbers, exact in any order.
    return math.prod(thread_grid(workload, op, tiles).values())


def registers(workload: Workload, tile: Mapping[str, np.ndarray | int]) -> np.ndarray:
    """Registers one thread needs: every op's accumulators (a chain's consumer keeps its
    own while the producer runs), one reduction step's fragments of the busiest op, and
    RESERVED_REGISTERS."""
    accumulators, fragments = 0.0, 0.0
    for op in workload.ops:
        out = workload.tensors[op.output].dims
        acc = workload.block(op.output, tile)
        frag = 0.0
        for name in op.inputs:
            frag = frag + workload.block(name, tile, within=out)
        accumulators, fragments = accumulators + acc, np.maximum(fragments, frag)
    words = np.ceil((accumulators + fragments) * workload.elem_bytes / REGISTER_BYTES)
    return words + RESERVED_REGISTERS


def shared_bytes(workload: Workload, tile: Mapping[str, np.ndarray | int], stages: int = 1) -> np.ndarray:
    """Shared memory one block allocates: `stages` buffers of each input read from memory,
    one of each intermediate (a chain's producer writes it, its consumer reads it).
    Outputs accumulate in registers."""
    total = 0.0
    for op in workload.ops:
        for name in op.inputs:
            block = workload.block(name, tile)
            total = total + block * (1 if workload.tensors[name].role == "intermediate" else stages)
    return np.asarray(total) * workload.elem_bytes


class Simt:
    """The CUDA-core model: one thread per level-0 (thread) tile, tiles in the workload's dtype.
    models/targets/cuda_gpu.TensorCores is the other: one warp per level-0 tile."""

    tile_threads = 1  # threads per level-0 tile
    tensor_cores = None

    def registers(self, workload: Workload, tile) -> np.ndarray:
        return registers(workload, tile)

    def shared_bytes(self, workload: Workload, tile, stages: int = 1, warp_tile=None) -> np.ndarray:
        return shared_bytes(workload, tile, stages)

    def launch_fields(self, workload: Workload, tiles) -> dict:
        """What the plan's launch adds for this model (nothing on CUDA cores)."""
        return {}


SIMT = Simt()


@dataclass
class Launch:
    """The launch a plan implies (arrays when the tiles are)."""

    threads: np.ndarray
    blocks: np.ndarray
    registers: np.ndarray  # per thread, estimated
    shared_bytes: np.ndarray  # per block
    blocks_per_sm: np.ndarray  # resident at once (0: does not fit an SM)
    waves: np.ndarray
    feasible: np.ndarray  # thread count and per-SM limits hold

    def slowdown(self, hardware: Hardware) -> np.ndarray:
        """Time of the grid's arithmetic over that at peak: wave quantisation (the last
        wave's idle slots, blocks vs SMs x resident blocks) times too few resident warps."""
        per_sm = np.maximum(self.blocks_per_sm, 1)
        waves = self.waves * hardware.gpu.sms * per_sm / np.maximum(self.blocks, 1)
        warps = per_sm * np.ceil(self.threads / hardware.gpu.warp)
        return waves / np.minimum(1.0, warps / MIN_WARPS_PER_SM)


def launch(workload: Workload, hardware: Hardware, tiles: Sequence[Mapping], stages: int = 1, model=SIMT) -> Launch:
    """Threads, blocks, occupancy and waves of a plan (tiles innermost level first) under
    `model` (SIMT, or the tensor-core model of models/targets/cuda_gpu)."""
    g = hardware.gpu
    per_op = [threads(workload, op, tiles) * model.tile_threads for op in workload.ops]
    count = per_op[-1]
    same = np.ones(np.shape(count), dtype=bool)
    for t in per_op[:-1]:
        same = same & (t == count)
    points = float(math.prod(workload.dims[x] for x in workload.tensors[workload.ops[-1].output].dims))
    # Whole warps, unless the problem has fewer output points than a warp has threads.
    warps = (count % g.warp == 0) | (count == points)
    blocks = grid_blocks(workload, tiles[1])
    regs = model.registers(workload, tiles[0])
    smem = model.shared_bytes(workload, tiles[1], stages, tiles[0])
    per_sm = np.minimum(np.minimum(np.minimum(
        float(g.max_blocks_per_sm),
        np.floor(g.max_threads_per_sm / count)),
        np.floor(g.registers_per_sm / (count * regs))),
        np.floor(g.shared_per_sm_bytes / np.maximum(smem, 1.0)))
    blocks = np.asarray(blocks)
    waves = np.ceil(blocks / (g.sms * np.maximum(per_sm, 1)))
    fits = smem <= hardware.levels[1].capacity_bytes  # the per-block limit (level usage counts it too)
    feasible = same & warps & (count <= g.max_threads_per_block) & (per_sm >= 1) & fits
    return Launch(count, blocks, regs, smem, per_sm, waves, feasible)


class LaunchPlan(BaseModel):
    """How a GPU plan launches (estimates from this module), as the plan document shows it."""

    grid_blocks: int
    threads_per_block: int
    registers_per_thread: int = Field(description="estimated: tiles plus a reserve, before the compiler's choices")
    shared_bytes: int = Field(description="per block, all stages included")
    blocks_per_sm: int
    waves: int
    stages: int = Field(description="buffers per shared-memory input cache")
    tensor_cores: str | None = Field(None, description="tensor-core plans only: the instructions the level-0 "
                                     "(warp) tile runs on, e.g. 'mma.sync.m16n8k16 float16 -> float32'")
    intermediate: Literal["registers", "shared"] | None = Field(
        None, description="tensor-core chains only: where the intermediate lives between the two products")

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler):
        # Only tensor-core plans carry these fields: CUDA-core plans read exactly as before.
        data = handler(self)
        for name in ("tensor_cores", "intermediate"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


def launch_plan(workload: Workload, hardware: Hardware, tiles: Sequence[Mapping], stages: int, model=SIMT) -> LaunchPlan:
    """The launch of one (scalar) plan, for the plan document."""
    g = launch(workload, hardware, tiles, stages, model)
    return LaunchPlan(grid_blocks=int(g.blocks), threads_per_block=int(g.threads), registers_per_thread=int(g.registers),
                      shared_bytes=int(g.shared_bytes), blocks_per_sm=int(g.blocks_per_sm), waves=int(g.waves),
                      stages=stages, **model.launch_fields(workload, tiles))


def block_has_warps(workload: Workload, hardware: Hardware, tile) -> np.ndarray:
    """Whether a block tile leaves room for a valid thread count: every op's output block
    holds at least a warp's worth of points (or the op's whole output, when smaller)."""
    ok = np.ones((), dtype=bool)
    for op in workload.ops:
        dims = workload.tensors[op.output].dims
        points = math.prod(_f(tile[x]) for x in dims)
        whole = float(math.prod(workload.dims[x] for x in dims))
        ok = ok & ((points >= hardware.gpu.warp) | (points == whole))
    return ok


def grid_blocks(workload: Workload, tile) -> np.ndarray:
    """Blocks in the grid for (arrays of) block tiles."""
    blocks = 1.0
    for x in block_loops(workload):
        blocks = blocks * np.ceil(workload.dims[x] / _f(tile[x]))
    return np.asarray(blocks)


def slowdown_floor(workload: Workload, hardware: Hardware, tile, stages: int = 1, model=SIMT) -> np.ndarray:
    """The least Launch.slowdown any thread tile allows under (arrays of) block tiles: over
    every count of resident blocks that shared memory permits, with as many threads as
    the block's output points and the per-SM limits allow."""
    g = hardware.gpu
    blocks = grid_blocks(workload, tile)
    most = np.minimum(g.max_blocks_per_sm, np.floor(g.shared_per_sm_bytes / np.maximum(model.shared_bytes(workload, tile, stages), 1.0)))
    points = np.inf
    for op in workload.ops:
        dims = workload.tensors[op.output].dims
        points = np.minimum(points, math.prod(_f(tile[x]) for x in dims))
    best = np.full(np.broadcast_shapes(np.shape(blocks), np.shape(most), np.shape(points)), np.inf)
    # Counts past the most any tile allows change nothing (an A100 allows 32 blocks per SM).
    for s in range(1, int(min(g.max_blocks_per_sm, np.max(most, initial=0))) + 1):
        slots = g.sms * s
        waves = np.ceil(blocks / slots) * slots / np.maximum(blocks, 1)
        threads = np.minimum(points, min(float(g.max_threads_per_block), g.max_threads_per_sm / s,
                                         g.registers_per_sm / (s * (RESERVED_REGISTERS + 3))))
        warps = s * np.ceil(threads / g.warp)
        best = np.where(s <= most, np.minimum(best, waves / np.minimum(1.0, warps / MIN_WARPS_PER_SM)), best)
    return best


Copy = Literal["blocked", "striped"]


def copy_policy(block_elems: int, threads_per_block: int, elem_bytes: int) -> Copy:
    """How a block's threads share a cooperative copy into shared memory.

    BLOCKED (each thread one contiguous chunk) is coalesced only while a chunk
    is at most one 128-bit load, so it is used when one pass of the threads
    covers the block; otherwise STRIPED (each pass, thread t takes the t-th
    vector), whose every pass is coalesced.
    """
    chunk = -(-block_elems // max(threads_per_block, 1))
    return "blocked" if chunk * elem_bytes <= VECTOR_BYTES else "striped"
