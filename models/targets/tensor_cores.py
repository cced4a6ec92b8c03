"""Tensor cores: the GPU model for 16-bit matrix products on sm_80 and newer.

An op that is a (batched) matrix product, out[.., i, j] = sum_r a[.., i, r] b[.., r, j],
in a dtype the hardware lists in `gpu.tensor_flops` runs on `mma.sync.m16n8k16` with
fp32 accumulation (TVM's intrinsic is a 16x16x16 step: two m16n8k16 instructions).
The plan's levels then mean:

- level 0 is a *warp tile*: WM x WN of the output as fp32 fragments in one warp's
  registers (32 threads); the warp steps through the reduction 16 at a time, its A
  and B fragments loaded from shared memory with ldmatrix (double-buffered);
- level 1 is the block tile BM x BN x BK: A's and B's tiles are copied into shared
  memory with cp.async in `stages` rotating buffers, each row padded (8 elements for
  rows of 32k halves, 24 for rows of 16 or 48) so the 8 rows one ldmatrix phase reads
  start in distinct banks (unpadded rows of 32k halves would put all 8 in the same
  bank: an 8-way conflict). The padding is shared memory the model charges, so it
  changes which tiles fit;
- the output leaves through a padded fp32 staging tile in shared memory (cast to the
  16-bit dtype on the way out, coalesced), which reuses the copies' buffers.

Every tile of i, j and r at levels 0 and 1 is a multiple of 16 (the fragment); a warp
steps r by exactly 16; batch loops take one batch per block.

A chain, C = A·B then E = C·D (attention without the softmax), runs as one kernel:
the block walks l in tiles of BL; warps split m only, so each warp holds whole rows
of both products (WM x BL of C, WM x n of E) and k and n stay whole in the block.
The intermediate stays in registers (the fp32 accumulators of C cast in place to the
16-bit A-operand fragments of the second mma: m16n8k16's C and A fragments have the
same lane layout) when that fits a thread's registers, else it goes through shared
memory (BM x BL, padded rows). A's block tile is loaded once per block; B's and D's
rotate through `stages` buffers along l.

Stages beyond trips + 1 of the pipelined loop cannot be emitted (TVM's async pipeline
needs a constant wait count), so the model clamps them as the backend does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import gpu
from ..hardware import MAX_REGISTERS_PER_THREAD

FRAGMENT = 16  # the mma intrinsic's m, n and k
# Shared rows are padded to a stride of ROW_PAD modulo ROW_ALIGN elements (TVM's storage_align):
# for 16-bit rows a stride of 16 bytes modulo 64 puts the 8 rows one ldmatrix phase reads
# in distinct banks; for the fp32 staging rows STAGING_PAD spreads the lanes' stores.
ROW_ALIGN = 32
ROW_PAD = 8
STAGING_PAD = 4
ACCUMULATOR_BYTES = 4  # fp32 accumulation
INPUT_BYTES = 2  # float16 and bfloat16
FRAGMENT_REGISTERS = FRAGMENT * FRAGMENT * INPUT_BYTES // (32 * gpu.REGISTER_BYTES)  # one 16x16 operand per lane
COPY_ELEMENTS = gpu.VECTOR_BYTES // INPUT_BYTES  # one 16-byte cp.async per thread and pass
MIN_ARCH = 80  # mma.sync.m16n8k16 and cp.async


@dataclass(frozen=True)
class Product:
    """One op as a (batched) matrix product out[.., i, j] = sum_r a[.., i, r] b[.., r, j]."""

    a: str
    b: str
    out: str
    i: str
    j: str
    r: str
    batch: tuple[str, ...]


def product(workload, op) -> Product | None:
    """The op as a row-major matrix product, or None when it is not one."""
    if len(op.inputs) != 2:
        return None
    a, b = op.inputs
    da, db, do = (workload.tensors[t].dims for t in (a, b, op.output))
    if len(da) < 2 or not len(da) == len(db) == len(do):
        return None
    *ba, i, r = da
    *bb, r2, j = db
    *bo, i2, j2 = do
    if ba != bb or ba != bo or (r, i, j) != (r2, i2, j2) or len({i, j, r}) < 3 or set(op.loops) != {*ba, i, j, r}:
        return None
    return Product(a, b, op.output, i, j, r, tuple(ba))


def products(workload) -> list[Product] | None:
    """A GEMM (one product) or a chain whose second product reads the first's output as its
    left operand; None for anything else."""
    ps = [product(workload, op) for op in workload.ops]
    if any(p is None for p in ps) or len(ps) > 2:
        return None
    if len(ps) == 2:
        first, second = ps
        if not (second.a == first.out and second.i == first.i and second.r == first.j and first.batch == second.batch):
            return None
    return ps


def arch_number(arch: str | None) -> int:
    return int(arch[3:]) if arch else 0


def effective_stages(stages: int, trips) -> np.ndarray:
    """Buffers a pipelined loop of `trips` iterations can rotate: one for a single trip, at
    most trips + 1 (what the backend emits)."""
    trips = np.asarray(trips, dtype=np.float64)
    return np.where(trips < 2, 1.0, np.minimum(float(stages), trips + 1))


def row_stride(cols, offset: int = ROW_PAD):
    """Elements per padded shared row of `cols` elements: the least stride >= cols that is
    `offset` modulo ROW_ALIGN (cols + 8 for rows of 32k halves)."""
    return cols + np.mod(offset - np.asarray(cols, dtype=np.float64), ROW_ALIGN)


def tensor_core_model(workload, hardware) -> TensorCores | None:
    """The tensor-core model when the workload's kernel runs on tensor cores on this GPU:
    a 16-bit dtype with a tensor-core peak, sm_80 or newer, one product or a chain of two,
    every fragment loop at least 16 long (a chain's all multiples of 16), and a smallest
    tiling that fits. None: CUDA cores (models/gpu.SIMT)."""
    g = hardware.gpu if hardware is not None else None
    if g is None or workload.dtype not in g.tensor_flops or arch_number(g.arch) < MIN_ARCH:
        return None
    ps = products(workload)
    if ps is None:
        return None
    model = TensorCores(ps, workload.dtype)
    return model if model.applies(workload, hardware) else None


class TensorCores:
    """The model of models/gpu.Launch on tensor cores (see the module docstring)."""

    tile_threads = 32  # threads per level-0 (warp) tile

    def __init__(self, ps: list[Product], dtype: str):
        self.products = ps
        self.dtype = dtype
        self.chain = len(ps) == 2
        self.fragment_loops = {x for p in ps for x in (p.i, p.j, p.r)}

    @property
    def tensor_cores(self) -> str:
        return f"mma.sync.m16n8k16 {self.dtype} -> float32 (ldmatrix, cp.async)"

    def applies(self, workload, hardware) -> bool:
        dims = workload.dims
        if any(dims[x] < FRAGMENT for x in self.fragment_loops):
            return False
        if self.chain and any(dims[x] % FRAGMENT for x in self.fragment_loops):
            return False
        warp, block = self._smallest(workload)
        regs = float(self.registers(workload, warp))
        smem = float(self.shared_bytes(workload, block, 1, warp))
        return regs * gpu.REGISTER_BYTES <= hardware.levels[0].capacity_bytes and smem <= hardware.levels[1].capacity_bytes

    def _smallest(self, workload):
        """The smallest warp and block tiles the rules allow."""
        tile = {x: FRAGMENT if x in self.fragment_loops else 1 for x in workload.dims}
        if self.chain:
            first, second = self.products
            tile[second.j] = workload.dims[second.j]
            block = dict(tile, **{first.r: workload.dims[first.r]})
            return tile, block
        return tile, dict(tile)

    # --- tiles ------------------------------------------------------------------------------
    def multiples(self, workload) -> dict[str, int]:
        """Per loop, the multiple its tiles take: the fragment for fragment loops."""
        return {x: FRAGMENT if x in self.fragment_loops else 1 for x in workload.dims}

    def tile_rule(self, workload, x, tiles, level, step: bool):
        """Fragment loops take multiples of 16 at levels 0 and 1 (a warp steps its reduction by
        exactly 16); batch loops one per block; a chain keeps k and n whole in the block, n in
        each warp, and its m and l blocks divide the extents (it is not padded)."""
        if level is None or level > 1:
            return True
        if x not in self.fragment_loops:
            return tiles == 1
        ok = tiles % FRAGMENT == 0
        if level == 0 and step:
            ok = ok & (tiles == FRAGMENT)
        if self.chain:
            first, second = self.products
            if x == second.j or (x == first.r and level == 1):
                ok = ok & (tiles == workload.dims[x])
            elif x != first.r:
                ok = ok & (workload.dims[x] % tiles == 0)
        return ok

    def warps(self, workload, tiles) -> np.ndarray:
        out = workload.tensors[workload.ops[-1].output].dims
        return np.prod(np.stack(np.broadcast_arrays(*[np.asarray(tiles[1][x], dtype=np.float64) / tiles[0][x]
                                                      for x in out])), axis=0)

    def schedulable(self, workload, tiles) -> np.ndarray:
        """Every shared-memory copy splits into whole 16-byte vectors per thread (cp.async), and
        in a chain each warp holds whole l tiles (its rows of C feed its own second mma)."""
        per_pass = self.warps(workload, tiles) * self.tile_threads * COPY_ELEMENTS
        t1 = tiles[1]
        ok = np.ones(np.shape(per_pass), dtype=bool)
        for p in self.products:
            for rows, cols in ((p.i, p.r), (p.r, p.j)):
                if self.chain and p is self.products[1] and rows == p.i:
                    continue  # the second product's left operand is the intermediate: no copy
                ok = ok & (np.asarray(t1[rows], dtype=np.float64) * t1[cols] % per_pass == 0)
        if self.chain:
            ok = ok & (np.asarray(tiles[0][self.products[0].j]) == tiles[1][self.products[0].j])
        return ok

    # --- registers and shared memory ---------------------------------------------------------
    def _chain_registers(self, tile):
        first, second = self.products
        wm, bl, n = (np.asarray(tile[x], dtype=np.float64) for x in (first.i, first.j, second.j))
        accumulators = (wm * bl + wm * n) * ACCUMULATOR_BYTES / gpu.REGISTER_BYTES / self.tile_threads
        fragments = np.maximum(wm + bl, wm + n) / FRAGMENT * FRAGMENT_REGISTERS
        shared = accumulators + fragments + gpu.RESERVED_REGISTERS
        # The registers variant adds C's 16-bit A-operand fragments (two elements per register).
        in_registers = shared + wm * bl * INPUT_BYTES / gpu.REGISTER_BYTES / self.tile_threads
        return shared, in_registers

    def intermediate_in_registers(self, tile) -> np.ndarray:
        """Chains: whether the intermediate stays in registers (it fits a thread's registers)."""
        _, in_registers = self._chain_registers(tile)
        return in_registers <= MAX_REGISTERS_PER_THREAD

    def registers(self, workload, tile) -> np.ndarray:
        """Per thread: the warp tile's fp32 accumulators shared out over 32 lanes, the A and B
        fragments of one 16-deep step (double-buffered), and RESERVED_REGISTERS."""
        if self.chain:
            shared, in_registers = self._chain_registers(tile)
            return np.ceil(np.where(in_registers <= MAX_REGISTERS_PER_THREAD, in_registers, shared))
        p = self.products[0]
        wm, wn = (np.asarray(tile[x], dtype=np.float64) for x in (p.i, p.j))
        accumulators = wm * wn * ACCUMULATOR_BYTES / gpu.REGISTER_BYTES / self.tile_threads
        fragments = 2 * (wm + wn) / FRAGMENT * FRAGMENT_REGISTERS
        return np.ceil(accumulators + fragments) + gpu.RESERVED_REGISTERS

    def shared_bytes(self, workload, tile, stages: int = 1, warp_tile=None) -> np.ndarray:
        """Dynamic shared memory of a block: the padded input tiles (`stages` buffers of those
        that rotate) or the padded fp32 staging tile of the output, whichever is larger (TVM
        overlaps them). A chain's intermediate counts when it goes through shared memory;
        without `warp_tile` (which decides that) it does not: the least any warp tile needs."""
        t = {x: np.asarray(v, dtype=np.float64) for x, v in tile.items()}
        if not self.chain:
            p = self.products[0]
            s = effective_stages(stages, np.ceil(workload.dims[p.r] / t[p.r]))
            ring = s * (t[p.i] * row_stride(t[p.r]) + t[p.r] * row_stride(t[p.j])) * INPUT_BYTES
            staging = t[p.i] * row_stride(t[p.j], STAGING_PAD) * ACCUMULATOR_BYTES
            return np.maximum(ring, staging)
        first, second = self.products
        bm, bl, k, n = (t[x] for x in (first.i, first.j, first.r, second.j))
        s = effective_stages(stages, np.ceil(workload.dims[first.j] / bl))
        b_tile, d_tile = k * row_stride(bl), bl * row_stride(n)
        # One buffer each: D's tile reuses B's, whose last reader has run (TVM's merged layout).
        rotating = np.where(s > 1, s * (b_tile + d_tile), np.maximum(b_tile, d_tile))
        inputs = (bm * row_stride(k) + rotating) * INPUT_BYTES
        if warp_tile is not None:
            inputs = inputs + np.where(self.intermediate_in_registers(warp_tile), 0.0, bm * row_stride(bl) * INPUT_BYTES)
        return np.maximum(inputs, bm * row_stride(n, STAGING_PAD) * ACCUMULATOR_BYTES)

    # --- the plan document -------------------------------------------------------------------
    def launch_fields(self, workload, tiles) -> dict:
        fields = {"tensor_cores": self.tensor_cores}
        if self.chain:
            fields["intermediate"] = "registers" if bool(self.intermediate_in_registers(tiles[0])) else "shared"
        return fields

    def cache_records(self, workload, records, tiles, stages, level_names):
        """The CUDA-core records (models/caches.gpu_cache_records) as tensor cores emit them:
        striped 16-byte cp.async copies into padded rows, rotating only along the serial loop,
        and the intermediate where launch_fields puts it."""
        pipelined = self.products[0].r if not self.chain else self.products[0].j
        trips = -(-workload.dims[pipelined] // int(tiles[1][pipelined]))
        rotating = int(effective_stages(stages, trips))
        in_registers = self.chain and bool(self.intermediate_in_registers(tiles[0]))
        out = []
        for r in records:
            role = workload.tensors[r.tensor].role
            if role == "input":
                serial = r.attach_loop.split(".")[0] == pipelined
                r = r.model_copy(update={
                    "copy_mode": "striped", "stages": rotating if serial else 1,
                    "double_buffer": serial and rotating > 1,
                    "layout": f"{r.layout}, rows padded (ldmatrix without bank conflicts)"})
            elif role == "intermediate":
                r = r.model_copy(update={"level": level_names[0], "layout": "the producer's fp32 fragments cast in "
                                         "place to 16-bit A-operand fragments"} if in_registers else {
                    "layout": "row-major block, rows padded, written from the producer's fragments, read with "
                              "ldmatrix"})
            else:
                r = r.model_copy(update={"layout": "warp tiles of fp32 mma fragments, stored through a padded "
                                                   "shared staging tile"})
            out.append(r)
        return out
