"""SIMD CPUs (`vector_bytes` set): the register model of the micro-kernel the LLVM backend emits.

Only the output's register tile (the accumulators) stays in registers; the
micro-kernel streams its inputs from L1 at every step. An input whose last
dim is the output's last (the vectorised loop) is loaded as whole vectors;
any other is broadcast one element per load, each taking a full vector load
slot. The loads issue from the same core as the FMAs, so the registers' link
time adds to the compute time instead of overlapping it (measured: 4x64
register tiles, 8 loads per 16 FMAs, ran 1.33x faster than 16x16 tiles, 17
loads per 16 FMAs).

The target is also what the machine's kernels really do: their packing copies,
parallel regions and calls (kernel_costs), and tiles that leave room in
set-associative caches (usable_bytes). Scalar CPUs keep the plain model: they
stand for abstract hierarchies, and these terms were measured on the SIMD
micro-kernel.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Target

# Independent accumulator vectors a core needs to hide FMA latency: about 4 cycles
# on current x86 cores, times 2 FMA pipes. Fewer leave the pipes idle. The least a plan's register
# tile holds (admits); what the pipes really need is calibrated (Hardware.fma_chains): a tile of
# exactly 8 reaches the peak on the AMD EPYC Zen 4 of BENCHMARKS.md, whose 512-bit FMAs take both
# 256-bit pipes, and 0.85 of it on the Intel Xeon (Emerald Rapids), which has two 512-bit pipes.
FMA_CHAINS = 8

# FMAs of later register tiles the out-of-order window holds (reorder buffers of 224-512 micro-ops
# on x86 cores since Skylake and Zen 2, about 3 micro-ops per FMA step of a small tile). When a
# spatial loop runs right around the tile, consecutive tiles have other accumulators, and the
# core overlaps their dependency chains: gemm 1024^3 plans with 1x16 register tiles (one chain)
# whose k loop ran inside 2 trips ran in 6.5 ms, not the 36 ms that one chain per tile implies.
OOO_FMAS = 128
# Reduction steps an accumulator takes per load, at least (SimdCpu.admits): gemm and attention plans
# that reload every step ran 1.2-5x slower than predicted and were never the fastest measured.
MIN_CHAIN = 2
# Rows a register tile spans (the output's dims other than the vectorised one), at least, where
# the output has that many: a one-row tile reuses no loaded vector across rows, so every FMA
# waits on a load of its own. Over 17 fidelity runs (BENCHMARKS.md, "Hoist session") the
# admitted one-row gemm plans missed their prediction by 0.17-0.43 in mean |log error| against
# 0.08-0.15 for the others (0.23 against 0.31 on an 8-row decode GEMM), and none was the fastest.
MIN_ROWS = 2
# What the LLVM backend unrolls (backends/llvm_emit.py), which decides the loop LLVM hoists the
# micro-kernel's invariant operands out of (hoisted_vectors): the register tile's loops up to
# UNROLL_LIMIT points, and a reduction loop of at most SHORT_REDUCTION trips right around the
# tile, or of a one-row tile of whole vectors (a GEMV's band of B rows) at most MAX_BAND.
SHORT_REDUCTION = 4
MAX_BAND = 16
UNROLL_LIMIT = 64  # register-tile points unrolled beyond the vector loop
# A spatial loop of a few trips right around the register tile's unrolled body, LLVM unrolls whole
# when the copies hold at most MERGE_FMAS FMAs, and it keeps their accumulators in registers across
# the reduction loops outside when they are at most MERGE_ACCUMULATORS vectors: the kernel runs the
# wider tile (SimdCpu.emitted_tiles). Counted in the FMA loops' assembly of gemm 127x251x509 plans
# (BENCHMARKS.md, "Resident session"): 4x32 tiles (8 accumulators) of 2 k steps in 2 trips, 8x16
# ones in 2 trips along m or n, and 4x32 or 8x16 tiles of 1 step in 3 trips ran as one tile with no
# store of C in the loop; 3 trips of 2 steps (48 FMAs) and 2 of 4 steps (64) stayed separate tiles
# storing C; 4 and 5 trips of one step (32 and 40 FMAs) were unrolled but spilled 6 and 13 stores
# of their 32 and 40 accumulators.
MERGE_FMAS = 40
MERGE_ACCUMULATORS = 24


# Besides the block a level keeps for reuse, the kernel streams lines of the other arrays through
# it between two uses (the micro-kernel's A, B and C, and the stack). Under LRU a W-way cache keeps
# the block only if every set has that many ways left over, so a tile may fill at most 1 - 4/W of
# it (never less than half). Measured with valgrind's cache simulator on a 12-way 48 KiB L1d:
# tiles at 37-67% of L1 missed 1.0-1.1x the model's bytes, at 74-79% 1.0-1.7x, at 88-99%
# 1.5-2.3x (BENCHMARKS.md, bench/cachegrind.py).
STREAMS = 4


# A working set that cycles through a cache whole (an outer level's tile, a sweep of the tiles
# inside: models/objective.py's stand-ins) streams only its own lines between two uses, so the
# cache keeps it with fewer ways left over than a plan's own tile, beside which the next tiles'
# blocks stream: one, for the stack and what the loops keep besides. Measured with valgrind
# (bench/cachegrind.py's workloads, each plan and 3 alternatives simulated once, then costed
# with 2, 3 and 4 ways left over): on a 32 KiB 8-way L1d, 41, 38 and 35 of 44 kernels within 25%
# of the expected bytes (Spearman 0.96, 0.91, 0.82); on a 48 KiB 12-way one, 48, 42 and 40 of 50
# (0.99, 0.97, 0.88). With 1, the plan and 6 alternatives of each workload: 30 of 30 on the 48 KiB
# L1d (2 ways: 29; the chain whose producer's sweep, 41 024 B, is 64 bytes over 10 ways missed
# 0.61x the expected bytes) and 21 of 21 on the 32 KiB one (the same with 2 ways; BENCHMARKS.md,
# "Op-sweep session"). The time objective keeps
# the planner's share (STREAMS): with this one, its work-capped search returned plans predicted
# up to 13% slower (gemm 1000^3: 9.85 ms against 8.74, found again with 6x the polish's work),
# and the fidelity dumps re-ranked with it moved by +0.002 in mean Spearman (BENCHMARKS.md).
KEPT_STREAMS = 1


def _usable_share(level, streams: int = STREAMS) -> float:
    return max(1 - streams / level.ways, 0.5) if level.ways else 1.0


def least_accumulators(registers: float) -> float:
    """The accumulator vectors a register tile must hold (admits): FMA_CHAINS, or on a register
    file too small to hold that many beside a tile's inputs, half of what four input vectors
    leave. A depthwise tile holds a window of inputs about as wide as its accumulators: on AVX2's
    16 registers no tile of 8 fits beside its window, and MobileNet's dw+pw had no plan at all
    (AMD EPYC Zen 3, BENCHMARKS.md); 6 fit. AVX-512's 32 registers keep FMA_CHAINS."""
    return min(float(FMA_CHAINS), (registers - 4) // 2)


class SimdCpu(Target):
    name = "simd-cpu"
    registers_share_issue = True
    auto_strategy = "seeded"
    # A core's loads, stores and prefetches overlap with its arithmetic and with each other, but
    # not perfectly: each link that comes near the slowest one adds to the time. Measured on
    # llama decode 8x4096x4096: a plan whose DRAM, L2->L1 and register links each predict about
    # 1.5 ms ran in 6.7 ms. Over 140 measured plans of 7 workloads (BENCHMARKS.md, "Night session")
    # the 4-norm ranks them better than the maximum (mean Spearman 0.675 -> 0.710), and picks
    # the same plans. The 3-norm charges a link below compute a little more: reranked, four
    # fidelity dumps of the Intel Xeon's "Reach session" (36 workloads of 20 plans) kept their
    # Spearman (mean 0.918 -> 0.921) and the plans ranked first came to 1.010x the fastest
    # (geomean) against 1.018: ResNet-50's 3x3 conv under the 4-norm ranked first a plan whose L1
    # link took 0.31 ms beside 0.89 of compute, level with one whose links were light, and it ran
    # 1.09-1.10x slower in two dumps. On the Zen 4's two dumps of the "Night session" the two norms
    # ranked alike (mean Spearman 0.836 and 0.834).
    overlap_norm = 3.0

    def usable_bytes(self, level) -> int:
        return int(level.capacity_bytes * _usable_share(level))

    def cache_bytes(self, index: int) -> int | None:
        """L1, L2 and L3 are hardware caches (the registers are the kernel's): models/objective.py's
        effective_dv lets them keep more than the plan's own tile."""
        return None if index == 0 else self.usable_bytes(self.hardware.levels[index])

    def kept_bytes(self, index: int) -> int | None:
        level = self.hardware.levels[index]
        return None if index == 0 else int(level.capacity_bytes * _usable_share(level, KEPT_STREAMS))

    def capacity_for(self, level, need: float) -> int:
        capacity = int(math.ceil(need / _usable_share(level)))
        while self.usable_bytes(level.model_copy(update={"capacity_bytes": capacity})) < need:
            capacity += 1  # int() rounding of the share
        return capacity

    def kernel_costs(self, workload, orders, tiles, stages=1):
        """What the LLVM micro-kernel spends outside the streaming the DV model describes (packing
        copies, zeroing, parallel regions, the call): models/kernel_costs.py."""
        from ..kernel_costs import kernel_costs

        return kernel_costs(workload, self.hardware, orders, tiles)

    def vector_lanes(self, workload) -> int:
        lanes = self.hardware.vector_bytes // workload.elem_bytes
        if lanes < 1:
            from ..errors import InvalidInput

            raise InvalidInput(f"vector_bytes {self.hardware.vector_bytes} of {self.hardware.name!r} holds no "
                               f"{workload.dtype} element ({workload.elem_bytes} bytes)")
        return lanes

    def register_weights(self, workload):
        """Per (op, input): 1 for vector loads, `lanes` for broadcasts. The output tile is stored
        back whenever it is reloaded: 2, times how much slower than the input loads the hardware
        moves accumulators (accumulator_bytes_per_s; calibrated: stores and store-to-load
        forwarding do not overlap the FMAs as input loads do, backends/calibrate.py)."""
        lanes = self.vector_lanes(workload)
        spill = self.hardware.accumulator_bytes_per_s
        output = 2.0 * (self.hardware.levels[0].bandwidth_bytes_per_s / spill if spill else 1.0)
        weights = {}
        for op in workload.ops:
            vector = workload.tensors[op.output].dims[-1]
            for name in op.inputs:
                # A vector load needs the vector loop to step the last dim by one element.
                vectored = (vector, 1) in workload.index(name)[-1].terms
                weights[(op.name, name)] = 1 if vectored else lanes
            weights[(op.name, op.output)] = output
        return weights

    def level_usage(self, workload, level, tile, stages=1):
        """In registers: per op the accumulator tile, plus the vectors of one reduction step of
        each vector-loaded input, plus one register per broadcast input; a broadcast input with
        an affine index (a convolution's window) takes one register per element of its step's
        window, which neighbouring output points share and LLVM keeps (conv 3x3 tiles of 28
        accumulators and 14 window elements spilled 60-85 moves in their FMA loop; those within
        32 registers by this count spilled none). A vector-loaded input with such a window (a
        depthwise conv's) holds its block the same way: depthwise tiles of 28 accumulators spilled
        63 moves, 16 accumulators and 16 window vectors up to 6 per block, 8 and 8 none.
        Elsewhere plain MU."""
        if level != 0:
            return super().level_usage(workload, level, tile, stages)
        worst = 0.0
        for op in workload.ops:
            worst = np.maximum(worst, self.op_registers(workload, op, tile))
        return np.asarray(worst) * workload.elem_bytes

    def op_registers(self, workload, op, tile) -> np.ndarray:
        """Elements of registers the op's register tile `tile` holds (level_usage)."""
        weights = self.register_weights(workload)
        lanes = self.vector_lanes(workload)
        out = workload.tensors[op.output].dims
        total = workload.block(op.output, tile)
        for name in op.inputs:
            if weights[(op.name, name)] > 1:
                total = total + lanes * _window_registers(workload, name, out, tile)
            else:
                # A vector that no other row of the tile reuses goes straight into its FMA;
                # a sliding window's (a depthwise input) is reused by the neighbouring points
                # of the next reduction steps, and LLVM keeps it.
                reused = math.prod(tile[x] for x in out if x not in workload.tensors[name].loops) > 1
                reused = reused | (_window_registers(workload, name, out, tile) > 1)
                total = total + np.where(reused, workload.block(name, tile, within=out), lanes)
        return np.asarray(total, dtype=np.float64)

    def accumulators(self, workload, op, tile) -> np.ndarray:
        """Accumulator vectors the op's register tile `tile` keeps (tiles may be arrays)."""
        lanes = self.vector_lanes(workload)
        dims = workload.tensors[op.output].dims
        vectors = np.ceil(np.asarray(tile[dims[-1]], dtype=np.float64) / lanes)
        for x in dims[:-1]:
            vectors = vectors * np.asarray(tile[x], dtype=np.float64)
        return vectors

    def emitted_tiles(self, workload, orders, tiles):
        """The plan's tiles with its register tile widened to its L1 tile where LLVM merges them
        (MERGE_FMAS, MERGE_ACCUMULATORS): a one-op kernel without a window whose L1 tile is the
        register tile repeated along one spatial dim, a few times. Costed as written, such a plan
        reloads its accumulators at every pass of the reduction loop around the L1 tile, which
        the kernel does not: gemm 127x251x509 in 4x32x2 tiles, two to an 8x32x2 L1 tile, ran in
        0.20 ms, predicted 0.28 (the 60 plans of its fidelity dump ranked 0.67; as merged, 0.87)."""
        tiles = [dict(t) for t in tiles]
        if len(tiles) < 2 or len(workload.ops) != 1 or windowed_loops(workload, workload.ops[0]):
            return tiles
        op = workload.ops[0]
        out = workload.tensors[op.output].dims
        inner, l1 = tiles[0], tiles[1]
        wider = [x for x in workload.dims if l1[x] != inner[x]]
        if len(wider) != 1 or wider[0] not in out or l1[wider[0]] % inner[wider[0]]:
            return tiles
        copies = l1[wider[0]] // inner[wider[0]]
        accumulators = float(self.accumulators(workload, op, inner))
        steps = math.prod(inner[x] for x in op.loops if x not in out)
        if copies * accumulators * steps <= MERGE_FMAS and copies * accumulators <= MERGE_ACCUMULATORS:
            tiles[0] = dict(l1)
        return tiles

    def admits(self, workload, tiles, stages, orders=None):
        """Register tiles of at least FMA_CHAINS accumulator vectors per op, fewer where the registers
        cannot hold that many (least_accumulators), or all of its output when smaller, as BLIS sizes
        its micro-kernel from the FMA latency and pipes. With fewer,
        the speed rests on what LLVM makes of the loops around the tile, which no DV term sees.
        72 of the 100 gemm plans bench/fidelity.py measured had 1-4 (BENCHMARKS.md, "Accumulator
        session"): those whose outer loops LLVM unrolled into a larger tile ran up to 2.7x faster
        than predicted, those it unrolled into long chains on two accumulators up to 2.6x slower.
        The plans returned for the 29 workloads of bench/shapes.py and bench/conv.py (8-28) did
        not change.

        Given the `orders`, also a reduction chain (reduction_chain) of at least MIN_CHAIN steps
        per op, as BLIS's micro-kernel runs its k loop around the register tile: accumulators
        loaded and stored again at every step wait on store forwarding and on what LLVM spills
        when it unrolls the loops around the tile, which no DV term sees (BENCHMARKS.md, "Chain
        session"). And registers for what LLVM hoists out of the loop around the tile
        (hoisted_vectors) beside the tile's own (op_registers): more than the registers hold
        spill, and every FMA takes its operand as a whole vector from the stack. And register
        tiles of at least MIN_ROWS rows, or all the output's when fewer (a GEMV's one): only a
        whole plan is held to it, since one-row tiles rank among the best register tiles, whose
        multiples seed the outer levels' tiles (enumeration.seeded; without them the plans
        returned for 6 of the 19 shapes of bench/shapes.py were predicted 1-13% slower)."""
        registers = self.hardware.levels[0].capacity_bytes / self.hardware.vector_bytes
        ok = True
        for op in workload.ops:
            whole = self.accumulators(workload, op, workload.dims)
            ok = ok & (self.accumulators(workload, op, tiles[0]) >= np.minimum(least_accumulators(registers), whole))
        return ok if orders is None else ok & self.admits_filtered(workload, tiles, stages, orders)

    def admits_filtered(self, workload, tiles, stages, orders=None):
        """`admits` beyond the accumulators of the register tile, which level_filter checked: given
        the `orders`, the rows, the reduction chain and the registers of the whole plan."""
        if orders is None:
            return True
        ok = True
        registers = self.hardware.levels[0].capacity_bytes / self.hardware.vector_bytes
        lanes = self.vector_lanes(workload)
        weights = self.register_weights(workload)
        for op in workload.ops:
            rows = workload.tensors[op.output].dims[:-1]
            whole_rows = math.prod(workload.dims[x] for x in rows)
            ok = ok & (math.prod(tiles[0][x] for x in rows) >= min(MIN_ROWS, whole_rows))
            steps = math.prod(workload.dims[x] for x in op.loops if x not in workload.tensors[op.output].dims)
            ok = ok & (reduction_chain(workload, op, orders, tiles) >= min(MIN_CHAIN, steps))
            if not np.any(ok):  # half a search's calls refuse every plan by here; the registers cost most
                return ok
            hoisted = hoisted_vectors(workload, op, orders, tiles, lanes, weights)
            ok = ok & (self.op_registers(workload, op, tiles[0]) / lanes + hoisted <= registers)
        return ok

    def reduction_room(self, workload, tile, inner):
        """Outer tiles that hold more than SHORT_REDUCTION steps of each op's (unwindowed) reductions
        per step of the register tile `inner`: with fewer, the backend unrolls the
        steps into the tile's body, and the spatial loop around it hoists the inputs' blocks
        (hoisted_vectors), which 16 registers cannot hold beside a tile of 12 accumulators. gemm
        1000^3's first dive took an L2 tile 250x256x3 and MobileNet's dw+pw one of 8 channels, under
        which the AMD EPYC Zen 3 of BENCHMARKS.md admitted no plan."""
        ok = np.ones((), dtype=bool)
        for op in workload.ops:
            out = workload.tensors[op.output].dims
            reductions = [x for x in op.loops if x not in out and x not in windowed_loops(workload, op)]
            if not reductions:
                continue
            steps = math.prod(np.asarray(tile[x], dtype=np.float64) / inner[x] for x in reductions)
            ok = ok & (steps > SHORT_REDUCTION)
        return ok

    def level_filter(self, workload, level, tiles, stages):
        return self.admits(workload, tiles, stages) if level == 0 else None

    def issue_efficiency(self, workload, op, tiles, orders=None):
        """The op's register tile keeps its accumulator vectors in flight; below the chains the pipes
        need (Hardware.fma_chains, else FMA_CHAINS) the FMA latency, not the pipes, sets the pace:
        on the Xeon of BENCHMARKS.md, one-vector-wide tiles of 6, 8 and 10 rows reached 0.63, 0.85
        and 0.95 of the peak (one core), where its calibrated 9.3 chains give 0.65, 0.86 and 1.
        With `orders`, each chain runs `reduction_chain` FMAs before a spatial loop moves to
        independent accumulators, and the out-of-order window (OOO_FMAS) overlaps that many FMAs
        of the next tiles' chains."""
        vectors = self.accumulators(workload, op, tiles[0])
        if orders is not None:
            # max: rows whose tiles do not nest have 0 trips (the searches score them infeasible)
            vectors = vectors + OOO_FMAS / np.maximum(reduction_chain(workload, op, orders, tiles), 1)
        chains = self.hardware.fma_chains if self.hardware is not None else None
        return np.minimum(1.0, vectors / (chains or FMA_CHAINS)) * self.fed_share(workload, op, tiles[0])

    def fed_share(self, workload, op, tile):
        """The share of peak the register tile `tile` keeps once its packed panels stream from L2
        (Hardware.fed_share by its width in vectors, linear in the log of the width between the
        widths calibrated, the nearer one's outside them), where the panels it reads over the
        op's whole reduction outgrow half of L1; 1 elsewhere, or uncalibrated.

        One-vector-wide tiles issue a broadcast per FMA: in L1 they reach peak, from L2 they do
        not. On the Intel Xeon of BENCHMARKS.md, the calibration's packed micro-kernels fed from L2
        kept 0.76-0.82 (16x1) of the best width's share, 0.98-1 (8x2 and 4x4); gemm 1000^3's plans with
        20x16 and 25x16 tiles ran 8.2-8.6 ms where the model ranked them ahead of 5x64's (7.07 ms).
        The whole reduction, not the plan's loops: a panel that fits L1 whole may still be read
        from L2 once per tile, but one that does not cannot stay."""
        from ..kernel_costs import log_interp

        points = self.hardware.fed_share if self.hardware is not None else None
        if not points:
            return 1.0
        out = workload.tensors[op.output].dims
        width = np.ceil(np.asarray(tile[out[-1]], dtype=np.float64) / self.vector_lanes(workload))
        share = log_interp(points, width)
        reductions = [x for x in op.loops if x not in out]
        depth = math.prod(workload.dims[x] for x in reductions)
        step = sum(math.prod(np.asarray(tile[x], dtype=np.float64) for x in workload.tensors[name].loops
                             if x not in reductions) for name in op.inputs)
        fed = step * depth * workload.elem_bytes > self.hardware.levels[1].capacity_bytes / 2
        return np.where(fed, share, 1.0)

    def lanes(self, workload):
        """Loops indexing some output's last dimension are vectorised: tiles take whole vectors."""
        lanes = self.vector_lanes(workload)
        vector = {workload.tensors[op.output].dims[-1] for op in workload.ops}
        return {x: lanes if x in vector else 1 for x in workload.dims}

    def tile_rule(self, workload, x, tiles, level, lanes):
        """Vector loops take multiples of the lanes (or the whole extent); in the register tile a
        power of two of vectors, since TVM scalarises the packed-layout loads of other widths
        (48 lanes: ~1000 element inserts)."""
        extent = workload.dims[x]
        if level == 0 and lanes > 1:
            vectors = tiles // lanes
            return ((tiles % lanes == 0) & (vectors & (vectors - 1) == 0)) | ((tiles == extent) & (tiles < lanes))
        return (tiles % lanes == 0) | (tiles == extent)


def _window_registers(workload, name, out, tile):
    """Registers a broadcast input holds in a register tile: one, or where a dim slides a window
    (two or more loops, as oh + kh) one per output point of a reduction step, the elements that
    the next steps' neighbouring points reuse."""
    if all(len(ix.loops) < 2 for ix in workload.index(name)):
        return 1
    points = 1
    for x in dict.fromkeys(x for ix in workload.index(name) for x in ix.loops if x in out):
        points = points * np.asarray(tile[x], dtype=np.float64)
    return points


def reduction_chain(workload, op, orders, tiles) -> np.ndarray:
    """FMAs each accumulator takes in a row before the kernel moves to other accumulators: the
    register tile's reduction extent times the trips of the reduction loops around it, from the
    innermost out, up to the first spatial loop that runs more than once."""
    from ..caches import trips, walk
    from ..costmodel import padded_extents

    padded = padded_extents(workload, tiles)
    reductions = [x for x in op.loops if x not in workload.tensors[op.output].dims]
    chain = np.ones(())
    for x in reductions:
        chain = chain * np.asarray(tiles[0][x], dtype=np.float64)
    open_ = np.ones((), dtype=bool)  # no spatial loop with several trips met yet
    for x, j in reversed(walk(workload, orders, op)):
        n = np.asarray(trips(tiles, padded, x, j), dtype=np.float64)
        if x in reductions:
            chain = np.where(open_, chain * n, chain)
        else:
            open_ = open_ & (n <= 1)
    return chain


def windowed_loops(workload, op) -> set[str]:
    """The op's reduction loops that slide a window over an input with a spatial loop (kh and kw
    of a convolution: `oh + kh`)."""
    out = set(workload.tensors[op.output].dims)
    return {x for name in op.inputs for ix in workload.index(name) if len(ix.loops) > 1
            for x in ix.loops if x not in out}


def banded(workload, op, tile, lanes: int | None):
    """Whether the backend may interleave a band of reduction steps inside the register tile's
    vectors (llvm_emit._row_band): a one-row tile spanning two or more whole vectors, one
    reduction loop, no window. Tiles may be arrays."""
    out = workload.tensors[op.output].dims
    reductions = [x for x in op.loops if x not in out]
    if lanes is None or windowed_loops(workload, op) or len(reductions) != 1:
        return np.zeros((), dtype=bool)
    row = np.asarray(tile[out[-1]])
    ok = (row % lanes == 0) & (row >= 2 * lanes)
    for x in op.loops:
        if x != out[-1]:
            ok = ok & (np.asarray(tile[x]) == 1)
    return ok


def hoisted_vectors(workload, op, orders, tiles, lanes: int, weights) -> np.ndarray:
    """Vector registers LLVM fills before the loop right around the micro-kernel's unrolled body:
    the operands that loop leaves unchanged, each input's block over the body (a broadcast
    element takes a whole vector), which LLVM's loop-invariant code motion loads once outside
    it, whatever the registers hold. gemm 1000^3 with an 11x16 tile whose 12 unrolled k steps
    ran inside an 8-trip loop along n: 132 A broadcasts hoisted, 113 of them read back from the
    stack by the FMAs, 22.1 ms against 11.4 predicted; a 19x16 tile in a 2-trip n loop, 38
    hoisted, 29.0 against 17.8 (AMD EPYC Zen 4, bench/loop_profile.py). 0 when a reduction loop
    runs around the body: every operand changes with it.

    The body is what the backend unrolls (backends/llvm_emit.py): the register tile's loops from
    the vector row out while UNROLL_LIMIT points allow, up to a window's loop; when all are, also
    a reduction loop right around the tile of at most SHORT_REDUCTION trips (a one-row tile's
    band: MAX_BAND). Tiles may be arrays."""
    from ..caches import micro_order, trips, walk
    from ..costmodel import padded_extents

    windowed = windowed_loops(workload, op)
    reductions = set(op.loops) - set(workload.tensors[op.output].dims) - windowed
    micro = micro_order(workload, op)
    body = {x: np.ones(()) for x in op.loops}
    body[micro[-1]] = np.asarray(tiles[0][micro[-1]], dtype=np.float64)
    done = np.zeros((), dtype=bool)
    hoisted = np.zeros(())

    def around(x, at):  # the loop along x runs around the body where `at`
        nonlocal done, hoisted
        at = at & ~done
        if np.any(at):
            count = sum(workload.block(name, body) * weights[(op.name, name)] / lanes
                        for name in op.inputs if x not in workload.tensors[name].loops)
            hoisted = np.where(at, count, hoisted)
        done = done | at

    budget = np.full((), float(UNROLL_LIMIT))
    for x in reversed(micro[:-1]):
        n = np.asarray(tiles[0][x], dtype=np.float64)
        stop = (n > budget) | ((n > 1) & (x in windowed))
        around(x, stop)
        body[x] = np.where(done, body[x], n)
        budget = np.where(done, budget, budget // np.maximum(n, 1))
    padded = padded_extents(workload, tiles)
    band = banded(workload, op, tiles[0], lanes)
    unrolled = np.zeros((), dtype=bool)  # a short reduction loop unrolled around the tile
    for x, j in reversed(walk(workload, orders, op)):
        if np.all(done):
            break
        n = np.asarray(trips(tiles, padded, x, j), dtype=np.float64)
        limit = np.where(band & (j == 0), MAX_BAND, SHORT_REDUCTION) if x in reductions else 0
        unroll = (n > 1) & ~done & ~unrolled & (n <= limit)
        body[x] = np.where(unroll, body[x] * n, body[x])
        around(x, (n > 1) & ~unroll)
        unrolled = unrolled | unroll
    return hoisted
