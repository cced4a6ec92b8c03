"""Measure this machine for the cost model: `tune hardware host --calibrate`.

Small TensorIR kernels, built with LLVM for this CPU and timed in this process
(medians), each on one core and on all cores:

- the micro-kernel: the register tile the LLVM backend emits (broadcast A,
  vector B, FMA into accumulators, the tile written once), with its data in
  L1, for two tiles with different loads per FMA (4 x 4 vectors: 8 loads per
  16 FMAs; 16 x 1 vector: 17 per 16). The SIMD model charges compute +
  register loads (models/targets/simd_cpu.py), so the two times give the peak
  and the register bandwidth;
- the same 4 x 4 tile with a loop over other tiles between its k steps, so
  its accumulators are stored and reloaded at every step (what a plan does
  when a spatial loop runs inside the reduction around the register tile):
  what that time adds to the first gives the accumulators' bandwidth. Stores
  and store-to-load forwarding do not overlap the FMAs the way input loads do
  (measured on Zen 5: 100 against 235 GFLOP/s per core). A tile of only
  FMA_CHAINS accumulators, one vector wide (one core): the share of the peak
  it reaches says how many chains the FMA pipes need in flight (fma_chains).
  Register-resident work on separate cores should scale with them; where the
  all-core kernels ran below SCALES of that, they are timed again at the end
  of the run, each keeping its fastest time, and the profile notes a scaling
  still short (as if another tenant shared a core's FMA pipes: on the Intel
  Xeon of BENCHMARKS.md, 254 against 2 x 177 GFLOP/s in the minutes after
  boot, 351 a minute later); above cores / SCALES, the one-core kernels are
  timed again (on the Skylake-SP Xeon, 54.5 GFLOP/s on one core against 201
  on two);
- first, the stream below over working sets doubling from twice the private
  caches' total to half the last cache (all cores): where the larger ones
  stream at memory's speed, the last cache holds less than sysfs says (a
  virtual machine's, or one shared with other tenants), and its largest
  working set still streaming at the cache's speed is taken for its size;
- streaming reads (8 accumulator vectors, so latency does not bind) over a
  working set sized to half of each cache level, and 4x the last level (as
  the sweep found it) for memory: the link filling level l is the stream
  from level l+1;
- a stream from memory (twice the last level as found, like a decode step's
  weights) read in 1 KiB runs, one per 16 KiB row, as the micro-kernel reads an
  unpacked input whose L1 block is 256 floats wide, and in 128-byte runs (32
  floats), each timed in turn with the same array read contiguously: what each
  run's start adds, in bytes of the contiguous stream;
- the same strided streams over smaller working sets, from the private caches'
  total up by factors of 4 (on all cores): what share of those run starts a
  stream that large pays, since TLB misses and untracked prefetch streams
  charge runs well before an array leaves the last cache;
- a GEMV's micro-kernel reading B from memory where it lies, its rows in
  bands of 8 to 256 that the tile walks along, each row in turn: past the
  rows the hardware prefetcher follows at once, the time climbs (1.08-1.27x
  from 8 to 16 rows on the AMD EPYC Zen 4 of BENCHMARKS.md, 1.9-2.2x at 32),
  and what each band takes beyond the narrowest, as a share of its time, is
  the profile's band_stall; and the same under a decode GEMM's register tile
  (tall_rows rows of A against two vectors of B), whose FMAs between B's
  loads leave fewer of them in flight: its tall_band_stall;
- the 4x4 micro-kernel reading B from L2 (a panel a quarter deeper than L1
  holds), its rows contiguous and then STRIDE_SPREADS panel widths apart,
  timed in turn on all cores: what each stride adds, as a share of the L1
  link's time for B's bytes (the profile's stride_stall);
- micro-kernels one, two and four vectors wide, their A packed (a k step's
  rows side by side), their panels streaming from L2, timed in turn on all
  cores: each width's rate over the fastest one's (the profile's fed_share);
- a packing copy on one core, of COPY_ROWS rows of COPY_WIDTH floats (in L2)
  into blocks COPY_SIDE columns wide, as the LLVM backend emits one: keeping
  the rows innermost, vectorised (seconds per vector), and storing them across
  the innermost dim, one element at a time (seconds per element): what a
  copy's loop issues beside its streams (kernel_costs.copy_ops);
- handing data between cores: each core writes its quarter of its private
  cache's size, then each reads its neighbour's (or, timed in turn, its own):
  the time more per byte is what a packed buffer costs a core that did not
  write it (kernel_costs.handed_off);
- rows of an output split between the cores inside cache lines, against the
  same rows split on bands of rows: the time per line that two cores write
  (models/sharing.py);
- entering a parallel loop, from a serial loop around it: what the fused
  chains pay per producer block;
- one kernel call that does almost nothing.

The result is a models.profile.Profile, saved under the user's cache
directory and applied by the `host` preset from then on.
"""
from __future__ import annotations

import datetime as dt
import functools
import os
import statistics
import time
from typing import Callable

import numpy as np

from ..models.hardware import _cpu_model, host, host_key
from ..models.targets.simd_cpu import FMA_CHAINS
from ..models.profile import RUN_BYTES, SHORT_RUN_BYTES, Figure, Profile

Progress = Callable[[float, str], None]
FLOPS_PER_CALL = 2e8  # about 1 ms of arithmetic per timed call at ~200 GFLOP/s
BYTES_PER_CALL = 64 * 2**20


def loads_per_step(rows: int, vectors: int) -> int:
    """Loads a register tile of `rows` x `vectors` issues per k step: B's vectors and one
    broadcast of A per row."""
    return rows + vectors


def _fits(rows: int, vectors: int, registers: int) -> bool:
    """Whether a rows x vectors tile's accumulators, B's vectors and A's broadcast fit `registers`
    vector registers (what SimdCpu.op_registers counts for a gemm tile)."""
    return rows * vectors + vectors + 1 <= registers


def tile_accumulators(registers: int) -> int:
    """Accumulator vectors of the calibration's register tiles: 16 where 32 registers hold them
    (AVX-512), fewer on 16 registers (AVX2), where a 16-accumulator tile spills: 4x4 and 16x1 ran
    30 and 29 GFLOP/s on one core of the AMD EPYC Zen 3 of BENCHMARKS.md, 6x2 72 and 4x2 82."""
    return min(16, registers - 4)


def peak_tiles(registers: int) -> dict[tuple[int, int], int]:
    """(rows, vectors) of the two register tiles fit_peak_and_registers solves from -> loads per k
    step: the widest tile of tile_accumulators that fits the registers (4 vectors, else 2), then
    the same accumulators one vector wide, about one load per FMA."""
    acc = tile_accumulators(registers)
    vectors = 4 if _fits(acc // 4, 4, registers) else 2
    return {tile: loads_per_step(*tile) for tile in ((acc // vectors, vectors), (acc, 1))}


def fed_tiles(registers: int) -> tuple[tuple[int, int], ...]:
    """(rows, vectors) of the packed micro-kernels fed_shares times: one, two and four vectors
    wide, tile_accumulators each where they fit (enough chains on every machine measured); the
    four-vector tile takes the rows that fit (two on 16 registers)."""
    acc = tile_accumulators(registers)
    rows4 = max(r for r in range(1, acc // 4 + 1) if _fits(r, 4, registers) or r == 1)
    return (acc, 1), (acc // 2, 2), (rows4, 4)


LOADS = peak_tiles(32)  # AVX-512's, the default of the fits below
SPILLS = 8  # tiles taking turns in the accumulator kernel: more than the registers hold
ACCUMULATORS = 8  # independent accumulator vectors in the streaming kernel
RUN_ROUNDS = 3  # strided and contiguous streams timed in turn, for the run start's median ratio
REACH_ROUNDS = 2  # the same for the smaller working sets of the run starts' reach
REACH_STEP = 4  # between the working sets of the reach
# Register-resident FMA loops on separate cores share nothing, so all cores should reach about
# cores x one core's rate (2.00x and 1.99x on the Zen 4 and the Xeon of BENCHMARKS.md); below this
# share of it, the all-core micro-kernels are timed again (PEAK_RETRIES times, at the end of the run),
# and above cores over it, the one-core ones.
SCALES, PEAK_RETRIES = 0.9, 2
HOLDS = 0.8  # a working set streaming at this share of the fastest smaller one is still in the last cache
ROW_BYTES = 16384  # the strided stream's rows
BANDS = (8, 16, 32, 64, 128, 256)  # rows the banded micro-kernel reads in turn (band_seconds)
BAND_ROUNDS = 3
REGION_ROUNDS = 7  # pairs of the region loop timed with and without its parallel annotation
# B's rows, in panel widths apart: 1, 2 and 3 KiB for a 64-float panel. Rows farther apart crowd
# fewer of L2's sets, and which ones depends on where the pages land: on the Intel Xeon of
# BENCHMARKS.md, 5 to 12 KiB gave 0.13 to 0.89 from one run to the next, 3 KiB 0.13 to 0.24.
STRIDE_SPREADS = (4, 8, 12)
STRIDE_ROUNDS = 5
FED_ROUNDS = 3
# Two micro-kernels whose rates are within this share of each other run at the same speed: on the
# Intel Xeon of BENCHMARKS.md, three runs gave the two- and four-vector tiles fed from L2 within 3% of
# each other (which one led changed), the one-vector tile 0.75-0.82 of them; and ten fits of the
# register bandwidth, from kernels 0-2% apart, gave 8.8 TB/s to free, which flipped gemm 1024^3's
# and 1000^3's plans from one calibration to the next.
NOISE = 0.97
# The wide tile of peak_tiles issues a load per 1.5-2 FMAs, well within what a core's load ports
# sustain: where the fit held the loads to a share of its time, it was 6% (the Zen 5) and 11% (the
# Xeon) of BENCHMARKS.md. A fit that gives them more has read the narrow tile's other limit as
# loads: on the AMD EPYC Zen 3, whose one-vector tile is bound by A's broadcasts at about half
# the wide tile's rate (0.34-0.78 over six timings), two cores fitted a peak of 1.11 TFLOP/s
# (2 cores of 2 FMA pipes can do about 0.2) and the model ran every plan's FMAs for free.
LOAD_SHARE = 1 / 3
# The packing copy's source: rows of an odd length (a 1024-float row puts a block's column in one
# L1 set: 2.8 ns per element on the Zen 4 against 0.3 at 1000), 250 KB in all.
COPY_ROWS, COPY_WIDTH, COPY_SIDE = 64, 1000, 64


def _target(threads: int):
    import tvm

    from .llvm_build import llvm_target

    return tvm.target.Target(llvm_target(threads))


def _median_seconds(lib, args, repeat: int = 7) -> float:
    import tvm

    timer = lib.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat + 1, min_repeat_ms=20)
    return statistics.median(timer(*args).results[1:])


def _tensors(*arrays):
    import tvm

    return [tvm.runtime.tensor(a) for a in arrays]


def _per_thread_accumulators(sch, block, t, repeat, unrolled: list, vector, threads: int, scope: str = "local"):
    """Compile a kernel whose output block stays in registers (scope local; global: an L1 buffer)
    for each thread `t` (parallel over the cores) while the `repeat` loop reruns the work:
    unrolled loops, one vectorised loop."""
    import tvm

    store = sch.cache_write(block, 0, scope)
    sch.reverse_compute_at(store, t)
    if threads > 1:
        sch.parallel(t)
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(vector)
    sch.decompose_reduction(block, repeat)
    return tvm.compile(sch.mod, target=_target(threads))


def micro_kernel_seconds(threads: int, rows: int, vectors: int, lanes: int, k: int,
                         spills: int = 0) -> tuple[float, float, int]:
    """Seconds per call of a register-tile kernel, its flops, and its register-tile k steps (all
    threads). With `spills` > 1, that many tiles take turns at every k step, so each stores and
    reloads its accumulators (in L1) at every step."""
    lib, args, flops, steps = micro_kernel(threads, rows, vectors, lanes, k, spills)
    # The best of two medians: the peak and register bandwidth are solved from two such times, and
    # one slowed by another tenant gave a register bandwidth a sixth of the usual on the Xeon.
    seconds = min(_median_seconds(lib, args) for _ in range(2))
    return seconds, flops, steps


def micro_kernel_runs(threads: int, lanes: int, k: int, loads: dict = LOADS) -> list[tuple[float, float, int]]:
    """micro_kernel_seconds for the two tiles of `loads` (peak_tiles) and the first with its
    accumulators spilled (SPILLS tiles taking turns): what fit_peak_and_registers and
    fit_accumulators solve from."""
    runs = [micro_kernel_seconds(threads, rows, vectors, lanes, k) for rows, vectors in loads]
    rows, vectors = next(iter(loads))
    return [*runs, micro_kernel_seconds(threads, rows, vectors, lanes, max(1, k // SPILLS), SPILLS)]


def scaling(kernels: dict, cores: int, vector_bytes: int, loads: dict = LOADS) -> float:
    """How many times the one-core peak the micro-kernels reached on all `cores` (micro_kernel_runs
    per thread count, fitted as fit_peak_and_registers fits them)."""
    lanes = vector_bytes // 4
    one, every = (fit_peak_and_registers(*kernels[t][:2], lanes, vector_bytes, loads)[0] for t in (1, cores))
    return every / one


def settle_all_cores(kernels: dict, cores: int, vector_bytes: int, retime: Callable[[int], list],
                     step: Callable[[str], None] = lambda message: None, loads: dict = LOADS) -> list[str]:
    """Time the micro-kernels again (`retime(threads)`: micro_kernel_runs on that many cores) while
    all cores scale below SCALES x cores over one core (the all-core ones again) or above cores /
    SCALES (the one-core ones: no core runs FMAs faster beside the others), up to PEAK_RETRIES
    times, each kernel keeping its fastest time in `kernels`; the profile's notes: a sentence when
    the scaling stays out of that range. (One core scales 1x: nothing to time again.) On the
    Skylake-SP Xeon of BENCHMARKS.md one core's kernels once ran at a quarter of both cores' rate,
    and at 86-91 GFLOP/s against 122-178 minutes later."""
    scaled = scaling(kernels, cores, vector_bytes, loads)
    for _ in range(PEAK_RETRIES):
        if SCALES * cores <= scaled <= cores / SCALES:
            break
        threads = cores if scaled < SCALES * cores else 1
        step(f"micro-kernels on {threads} core(s) again: {cores} cores at {scaled:.2f}x one core's rate")
        kernels[threads] = [min(a, b) for a, b in zip(kernels[threads], retime(threads))]  # (seconds, ...): the faster
        scaled = scaling(kernels, cores, vector_bytes, loads)
    if scaled < SCALES * cores:
        return [f"the micro-kernel on {cores} cores reached {scaled:.2f}x its one-core rate: another tenant may "
                "have shared a core while calibrating (calibrate again when the machine is quiet)"]
    if scaled > cores / SCALES:
        return [f"the micro-kernel on {cores} cores reached {scaled:.2f}x its one-core rate, more than {cores} "
                "cores can: the one-core timing was slowed (calibrate again when the machine is quiet)"]
    return []


def micro_kernel(threads: int, rows: int, vectors: int, lanes: int, k: int, spills: int = 0, width: int = 0,
                 packed: bool = False):
    """micro_kernel_seconds' kernel, compiled, with its arguments, flops and k steps. With `width`
    wider than the tiles' columns, B's rows are that many floats apart and the kernel reads the
    first columns of each (an unpacked B whose panel is narrower than its rows). `packed`: A's
    rows side by side at each k step, as a packed panel holds them (one stream), instead of A's
    rows one after the other (a stream per row)."""
    import tvm
    from tvm import te

    tiles = max(spills, 1)
    cols = vectors * lanes * tiles
    reps = max(1, int(FLOPS_PER_CALL / (threads * 2 * rows * cols * k)))
    width = max(width, cols)
    A = te.placeholder((threads, k, rows) if packed else (threads, rows, k), "float32", name="A")
    B = te.placeholder((threads, k, width), "float32", name="B")
    r, kk = te.reduce_axis((0, reps), name="r"), te.reduce_axis((0, k), name="k")
    a = (lambda t, i: A[t, kk, i]) if packed else (lambda t, i: A[t, i, kk])
    C = te.compute((threads, rows, cols), lambda t, i, j: te.sum(a(t, i) * B[t, kk, j], axis=[r, kk]), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, C]))
    block = sch.get_sblock("C")
    t, i, j, rr, k_ = sch.get_loops(block)
    jt, jo, ji = sch.split(j, factors=[tiles, vectors, lanes])
    sch.reorder(t, rr, k_, jt, i, jo, ji)
    lib = _per_thread_accumulators(sch, block, t, rr, [i, jo], ji, threads, "global" if spills > 1 else "local")
    rng = np.random.default_rng(0)
    args = _tensors(rng.random([int(d) for d in A.shape], "float32"), rng.random((threads, k, width), "float32"),
                    np.zeros((threads, rows, cols), "float32"))
    return lib, args, threads * reps * 2.0 * rows * cols * k, threads * reps * k * tiles


def seconds_in_turn(kernels, rounds: int) -> list[float]:
    """Seconds per call of each of `kernels` (micro_kernel's tuples: library and arguments first),
    timed one after the other in each of `rounds` rounds, the median over the rounds: a change in
    the machine's speed then falls on all of them alike."""
    times = [[] for _ in kernels]
    for _ in range(rounds):
        for seconds, (lib, args, *_) in zip(times, kernels):
            seconds.append(_median_seconds(lib, args, repeat=3))
    return [statistics.median(t) for t in times]


def fed_shares(threads: int, lanes: int, l2_bytes: int, rounds: int = FED_ROUNDS,
               tiles: tuple = fed_tiles(32)) -> list[tuple[float, float]]:
    """(vectors across the tile, share) for the packed micro-kernels `tiles` (fed_tiles), their panels a
    third of L2 deep, so that they stream from L2: each one's rate over the fastest one's (in L1
    they all reach the peak, as the micro-kernels of fit_peak_and_registers show); a share within
    NOISE of 1 is 1. The kernels are timed in turn in each of `rounds` rounds."""
    runs = [micro_kernel(threads, rows, vectors, lanes, l2_bytes // 3 // ((rows + vectors * lanes) * 4), packed=True)
            for rows, vectors in tiles]
    rates = [run[2] / t for run, t in zip(runs, seconds_in_turn(runs, rounds))]
    shares = [rate / max(rates) for rate in rates]
    return [(float(vectors), 1.0 if share >= NOISE else share) for (_, vectors), share in zip(tiles, shares)]


def stride_stalls(threads: int, lanes: int, l1_bytes: int, fill: float, spreads=STRIDE_SPREADS,
                  rounds: int = STRIDE_ROUNDS, tile: tuple[int, int] = next(iter(LOADS))) -> list[tuple[float, float]]:
    """(B's row stride in bytes, share) for the micro-kernel `tile` (4x4 on AVX-512) reading B from L2 with its rows
    contiguous (share 0), then `spreads` panel widths apart: the time each adds to the contiguous
    kernel's, over the time the link filling L1 (`fill`, bytes/s) takes for B's bytes. B is a
    quarter deeper than L1 holds, so it streams from L2, but no deeper: rows far apart use a few of
    L2's sets, and a deep B would overflow those as well (12 KiB rows 256, 384 and 768 deep: 0.32,
    1.95 and 4.75 on the Intel Xeon of BENCHMARKS.md). The kernels are timed in turn in each round."""
    rows, vectors = tile
    panel = vectors * lanes * 4
    k = -(-5 * l1_bytes // 4 // panel)
    kernels = [micro_kernel(threads, rows, vectors, lanes, k, width=s * vectors * lanes) for s in (1, *spreads)]
    medians = seconds_in_turn(kernels, rounds)
    link = kernels[0][3] * panel / fill
    return [(float(panel), 0.0)] + [(float(s * panel), max((t - medians[0]) / link, 0.0))
                                    for s, t in zip(spreads, medians[1:])]


def stream_bandwidth(threads: int, bytes_per_thread: int, lanes: int) -> float:
    """Bytes/s of reading `bytes_per_thread` per thread over and over, on `threads` cores: the
    strided stream whose runs and rows are one step of its accumulators, a contiguous read."""
    step = ACCUMULATORS * lanes * 4
    timer, nbytes = strided_stream(threads, bytes_per_thread, lanes, step, step)
    return nbytes / timer()


def strided_stream(threads: int, bytes_per_thread: int, lanes: int, run_bytes: int = RUN_BYTES,
                   row_bytes: int = ROW_BYTES) -> tuple[Callable[[], float], int]:
    """A timer (median seconds per call) and the bytes read per call (all threads) of a strided
    stream: each thread reads its array in `run_bytes` runs, one per `row_bytes` row, column
    of runs after column, as a micro-kernel reads an unpacked input whose L1 block is narrower
    than its rows (run_bytes = row_bytes: the contiguous stream). Each run is summed into
    ACCUMULATORS vectors, or one per vector of a shorter run, so a run of any length (a
    multiple of that many vectors) stays in registers."""
    import tvm
    from tvm import te

    run = run_bytes // 4
    accumulators = max(1, min(ACCUMULATORS, run // lanes))
    chunks, pieces = row_bytes // run_bytes, max(1, run // (accumulators * lanes))
    rows = max(1, bytes_per_thread // row_bytes)
    reps = max(1, BYTES_PER_CALL // (threads * rows * row_bytes))
    shape = (threads, rows, chunks, pieces, accumulators, lanes)
    A = te.placeholder(shape, "float32", name="A")
    r, c = te.reduce_axis((0, reps), name="r"), te.reduce_axis((0, chunks), name="c")
    i, p = te.reduce_axis((0, rows), name="i"), te.reduce_axis((0, pieces), name="p")
    out = te.compute((threads, accumulators, lanes), lambda t, u, v: te.sum(A[t, i, c, p, u, v], axis=[r, c, i, p]),
                     name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, out]))
    block = sch.get_sblock("out")
    t, u, v, rr, cc, ii, pp = sch.get_loops(block)
    sch.reorder(t, rr, cc, ii, pp, u, v)
    lib = _per_thread_accumulators(sch, block, t, rr, [u], v, threads)
    # Zeros: calloc maps them without writing, so only the tensor copy touches the pages (seconds at
    # several GiB), and the sum is never read.
    args = _tensors(np.zeros(shape, "float32"), np.zeros((threads, accumulators, lanes), "float32"))
    return (lambda: _median_seconds(lib, args)), threads * reps * rows * row_bytes


def run_start_ratios(threads: int, bytes_per_thread: int, lanes: int, runs=(SHORT_RUN_BYTES, RUN_BYTES),
                     rounds: int = RUN_ROUNDS) -> dict[int, list[float]]:
    """Per run length of `runs`, per round, the strided stream's time over the contiguous
    stream's, the two timed one after the other: memory shared with other tenants changes
    speed between seconds (the contiguous stream of BENCHMARKS.md's EPYC ran at 57 and at
    117 GB/s in one session), and a ratio of neighbours cancels that where two separate
    figures would not."""
    strided = {run: strided_stream(threads, bytes_per_thread, lanes, run)[0] for run in runs}
    contiguous, _ = strided_stream(threads, bytes_per_thread, lanes, ROW_BYTES)
    ratios: dict[int, list[float]] = {run: [] for run in runs}
    for _ in range(rounds):
        for run, timer in strided.items():
            ratios[run].append(timer() / contiguous())
    return ratios


def band_seconds(threads: int, bytes_per_thread: int, lanes: int, bands=BANDS, rounds: int = BAND_ROUNDS,
                 rows: int = 1, vectors: int = 4) -> dict[int, list[float]]:
    """Per band, per round, seconds per call of a decode GEMM's micro-kernel (`rows` rows of A
    broadcast against `vectors` vectors of B) over a B of ROW_BYTES rows, `bytes_per_thread` per
    thread, read where it lies in bands: the tile walks along a band's rows, each row in turn,
    before the next band. The bands are timed in turn in each round."""
    import tvm
    from tvm import te

    n, k = ROW_BYTES // 4, max(max(bands), bytes_per_thread // ROW_BYTES)
    A = te.placeholder((threads, rows, k), "float32", name="A")
    B = te.placeholder((threads, k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((threads, rows, n), lambda t, i, j: te.sum(A[t, i, r] * B[t, r, j], axis=[r]), name="C")
    libs = {}
    for band in bands:
        sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, C]))
        block = sch.get_sblock("C")
        t, i, j, kk = sch.get_loops(block)
        ko, ki = sch.split(kk, factors=[None, band])
        jo, jv, jl = sch.split(j, factors=[None, vectors, lanes])
        sch.reorder(t, ko, jo, ki, i, jv, jl)
        if threads > 1:
            sch.parallel(t)
        sch.unroll(i)
        sch.unroll(jv)
        sch.vectorize(jl)
        sch.decompose_reduction(block, ko)
        libs[band] = tvm.compile(sch.mod, target=_target(threads))
    rng = np.random.default_rng(0)
    args = _tensors(rng.random((threads, rows, k), "float32"), rng.random((threads, k, n), "float32"),
                    np.zeros((threads, rows, n), "float32"))
    seconds: dict[int, list[float]] = {band: [] for band in bands}
    for _ in range(rounds):
        for band, lib in libs.items():
            seconds[band].append(_median_seconds(lib, args))
    return seconds


def tall_rows(registers: int) -> int:
    """Rows of A the second band calibration broadcasts against two vectors of B: a decode GEMM's
    register tile (8x2 on AVX-512's 32 registers, 6x2 on AVX2's 16), leaving a register for A and
    two for B."""
    return max(2, min(8, (registers - 3) // 2))


def fit_band_stall(seconds: dict[int, list[float]]) -> list[tuple[float, float]]:
    """Per band (increasing), the median time beyond the narrowest band's, as a share of it,
    never less than a narrower band's: more rows read in turn leave the prefetcher no more
    streams, so a dip is noise.

    A share, not a cliff at the band where the time steps up: on the AMD EPYC Zen 4 of
    BENCHMARKS.md, 16-row bands took 1.08, 1.21 and 1.27x the 8-row band's time in three
    calibrations (32 rows: 1.94-2.19x), so a threshold at 1.15x put the prefetcher's limit at 8
    or 16 rows by chance. And what the band adds is the same time whatever the micro-kernel
    does beside it: 0.4-0.7 ms over the 8-row band at 16 rows, 1.5-2.9 ms at 32, for register
    tiles of 1x4, 1x8, 2x4, 4x2, 4x4 and 8x2 vectors alike (B 64 MiB, 2.6-4.3 ms at 8 rows), so
    kernel_costs adds it to the plan's time as it adds run starts."""
    medians = {band: statistics.median(times) for band, times in sorted(seconds.items())}
    base, share, points = next(iter(medians.values())), 0.0, []
    for band, median in medians.items():
        share = max(share, median / base - 1.0)
        points.append((float(band), share))
    return points


def copy_seconds(lanes: int, vector: bool) -> float:
    """Seconds one core spends per vector (`vector`: the pack keeps the source's rows innermost,
    its inner loop split into vectors of `lanes`) or per element (the pack stores a block's
    columns innermost, reading down the rows one element at a time) of a packing copy of
    COPY_ROWS x COPY_WIDTH floats into blocks COPY_SIDE columns wide."""
    import tvm
    from tvm import te

    blocks = COPY_WIDTH // COPY_SIDE
    S = te.placeholder((COPY_ROWS, COPY_WIDTH), "float32", name="S")
    if vector:
        shape, read = (blocks, COPY_ROWS, COPY_SIDE), lambda b, r, c: S[r, b * COPY_SIDE + c]
    else:
        shape, read = (blocks, COPY_SIDE, COPY_ROWS), lambda b, c, r: S[r, b * COPY_SIDE + c]
    sch = tvm.s_tir.Schedule(te.create_prim_func([S, te.compute(shape, read, name="P")]))
    if vector:
        sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("P"))[-1], factors=[None, lanes])[1])
    lib = tvm.compile(sch.mod, target=_target(1))
    rng = np.random.default_rng(0)
    args = _tensors(rng.random((COPY_ROWS, COPY_WIDTH), "float32"), np.zeros(shape, "float32"))
    moved = blocks * COPY_ROWS * COPY_SIDE // (lanes if vector else 1)
    return min(_median_seconds(lib, args) for _ in range(2)) / moved  # the best of two, as the micro-kernel's


def handoff_seconds(threads: int, private_bytes: int, lanes: int) -> float:
    """Seconds more per byte a core spends reading what another core has just written than
    what it wrote itself: one call writes each thread's chunk (a quarter of `private_bytes`)
    in parallel, then sums a chunk per thread, its neighbour's or its own, timed in turn."""
    import tvm
    from tvm import te

    n = max(private_bytes // 4 // 4 // lanes, 1) * lanes
    X = te.placeholder((threads, n), "float32", name="X")
    Y = te.compute((threads, n), lambda t, i: X[t, i] * 2.0, name="Y")
    r = te.reduce_axis((0, n // lanes), name="r")
    libs = []
    for shift in (0, 1):
        Z = te.compute((threads, lanes), lambda t, v: te.sum(Y[(t + shift) % threads, r * lanes + v], axis=r), name="Z")
        sch = tvm.s_tir.Schedule(te.create_prim_func([X, Z]))
        t, i = sch.get_loops(sch.get_sblock("Y"))
        sch.parallel(t)
        sch.vectorize(sch.split(i, factors=[None, lanes])[1])
        t, v, r_ = sch.get_loops(sch.get_sblock("Z"))
        sch.reorder(t, r_, v)
        sch.parallel(t)
        sch.vectorize(v)
        libs.append(tvm.compile(sch.mod, target=_target(threads)))
    args = _tensors(np.ones((threads, n), "float32"), np.zeros((threads, lanes), "float32"))
    # The best of three medians each: on the Zen 4 virtual machine of BENCHMARKS.md the neighbour's
    # chunk came at one of two speeds (36 or 131-166 us for 256 KiB, its own 9.5-12 us), switching
    # within a process; the faster is what the fidelity benchmark's plans ranked best against.
    own, other = (min(_median_seconds(lib, args) for _ in range(3)) for lib in libs)
    return max(other - own, 0.0) / (n * 4)


SHARED_ROWS, SHARED_CHUNK = 256, 128  # rows of the arrays shared_line_seconds writes, columns per core


def shared_line_seconds(threads: int, lanes: int) -> float:
    """Seconds per cache line that two cores write in one call: SHARED_ROWS rows of `threads`
    chunks of SHARED_CHUNK columns (the last five columns short, so that neither the chunks'
    borders nor the rows' ends fall on a line) written a chunk per core, which shares a line at
    each (models/sharing.shared_lines counts them), against the same chunks written a band of
    rows per core, which shares none: the same runs of the same rows in the same order."""
    import tvm
    from tvm import te

    from ..models.sharing import owner_changes, shared_lines

    padded = threads * SHARED_CHUNK
    width = padded - 5
    X = te.placeholder((SHARED_ROWS, width), "float32", name="X")
    Y = te.compute((SHARED_ROWS, width), lambda r, c: X[r, c] * 2.0, name="Y")
    libs = []
    for by_rows in (False, True):
        sch = tvm.s_tir.Schedule(te.create_prim_func([X, Y]))
        r, c = sch.get_loops(sch.get_sblock("Y"))
        chunk, inside = sch.split(c, factors=[threads, SHARED_CHUNK])
        if by_rows:
            band, r = sch.split(r, factors=[threads, None])
            sch.reorder(band, chunk, r, inside)
            sch.parallel(band)
        else:
            sch.reorder(chunk, r, inside)
            sch.parallel(chunk)
        sch.vectorize(sch.split(inside, factors=[None, lanes])[1])
        libs.append(tvm.compile(sch.mod, target=_target(threads)))
    args = _tensors(np.ones((SHARED_ROWS, width), "float32"), np.zeros((SHARED_ROWS, width), "float32"))
    shared, banded = (min(_median_seconds(lib, args) for _ in range(2)) for lib in libs)
    lines = shared_lines([SHARED_ROWS, width], 1, owner_changes(width, SHARED_CHUNK, padded, threads), 4)
    return max(shared - banded, 0.0) / lines


def region_and_call_seconds(threads: int, outer: int = 2000, rounds: int = REGION_ROUNDS) -> tuple[float, float]:
    """Seconds per parallel loop entered from a serial loop around it, and per near-empty call.

    The loop with and without its parallel annotation, timed in turn, `rounds` times: the
    median difference. One pair at a time drew 0.7-0.8 or 1.4-1.7 us per region on the AMD EPYC
    Zen 4 of BENCHMARKS.md, from one process to the next; the fused chains and the decode
    GEMMs that enter a region per k block ranked by which one calibration drew."""
    import tvm
    from tvm import te

    A = te.placeholder((outer, threads, 16), "float32", name="A")
    B = te.compute((outer, threads, 16), lambda o, t, v: A[o, t, v] + 1.0, name="B")
    libs = []
    for parallel in (True, False):
        sch = tvm.s_tir.Schedule(te.create_prim_func([A, B]))
        o, t, v = sch.get_loops(sch.get_sblock("B"))
        if parallel:
            sch.parallel(t)
        sch.vectorize(v)
        libs.append(tvm.compile(sch.mod, target=_target(threads)))
    args = _tensors(*[np.zeros((outer, threads, 16), "float32")] * 2)
    region = statistics.median(max(_median_seconds(libs[0], args) - _median_seconds(libs[1], args), 0.0)
                               for _ in range(rounds)) / outer
    one = te.placeholder((1,), "float32", name="A")
    sch = tvm.s_tir.Schedule(te.create_prim_func([one, te.compute((1,), lambda i: one[i] + 1.0, name="B")]))
    lib = tvm.compile(sch.mod, target=_target(1))
    timer = lib.mod.time_evaluator("main", tvm.cpu(), number=1000, repeat=5)
    call = statistics.median(timer(*_tensors(np.zeros(1, "float32"), np.zeros(1, "float32"))).results)
    return region, call


def fit_peak_and_registers(a: tuple[float, float, int], b: tuple[float, float, int], lanes: int,
                           vector_bytes: int, loads: dict = LOADS, unexplained: float = 1e18) -> tuple[float, float]:
    """Peak FLOP/s and register bytes/s from two micro-kernels (seconds, flops, k steps) with the
    loads per step of `loads` (peak_tiles), solving seconds = flops / peak + load bytes / bandwidth. Kernels
    within NOISE of each other's rate say the loads cost nothing measurable: the faster one's
    rate is the peak, and the registers are free.

    `unexplained`: the register bandwidth where no positive peak explains the two, or only one
    that leaves the loads over LOAD_SHARE of the faster kernel's time (its rate is then the
    peak): the calibration passes the stream from L1, which fills the registers the same way.
    On the AMD EPYC Zen 3 of BENCHMARKS.md the one-vector tile (12x1) ran at half the peak,
    bound by A's broadcasts, where 6x2 ran at the peak; with free registers the shapes
    benchmark ran at 0.88x numpy in geomean, with the L1 stream 1.02x."""
    (s1, f1, k1), (s2, f2, k2) = a, b
    rates = (f1 / s1, f2 / s2)
    if min(rates) >= NOISE * max(rates):
        return max(rates), 1e18
    l1, l2 = [loads[t] * vector_bytes * k for t, k in zip(loads, (k1, k2))]
    matrix = np.array([[f1, l1], [f2, l2]], dtype=float)
    inv_peak, inv_bw = np.linalg.solve(matrix, np.array([s1, s2]))
    # Finite stand-ins for "too fast to measure": the profile is JSON, where inf has no spelling.
    # Noise inverted the two kernels, or something other than loads binds the narrow one, which
    # the sum cannot show: it then explains the wide tile by its loads (LOAD_SHARE).
    if inv_peak <= (1 - LOAD_SHARE) / max(rates):
        return max(rates), unexplained
    if inv_bw <= 1e-15:  # loads fully overlapped with the FMAs here: they cost nothing measurable
        return 1 / inv_peak, 1e18
    return 1 / inv_peak, 1 / inv_bw


def fit_fma_chains(chained: tuple[float, float, int], vectors: int, peak: float, registers: float,
                   vector_bytes: int, narrow: tuple[float, float, int] | None = None) -> float:
    """The accumulator vectors the FMA pipes need in flight, from a register tile of `vectors`
    accumulators, one vector wide (seconds, flops, k steps as micro_kernel_seconds returns them),
    and the peak and register bandwidth fitted on the same cores: `vectors` over the share of the
    time those two predict that it took. A tile that reaches the peak only says the pipes need
    no more than `vectors`: FMA_CHAINS, the least a plan holds, stands.

    `narrow`: the fit's one-vector tile of more accumulators (peak_tiles), timed on the same core.
    Where it ran slower than the peak and registers explain, what slows a one-vector tile is not
    its chains (on the AMD EPYC Zen 3 of BENCHMARKS.md, A's broadcasts: 12x1 and 8x1 ran 44 and 42
    GFLOP/s, 4x2 82, at the peak), so the chained tile is held to the narrow one's rate instead."""
    seconds, flops, steps = chained
    expected = flops / peak + loads_per_step(vectors, 1) * vector_bytes * steps / registers
    if narrow is not None:
        expected = max(expected, flops * narrow[0] / narrow[1])
    return max(float(FMA_CHAINS), vectors * seconds / expected)


def fit_accumulators(spilled: tuple[float, float, int], peak: float, registers: float, vector_bytes: int,
                     loads: dict = LOADS) -> float:
    """Bytes/s of accumulators stored and reloaded (both ways), from the wide tile of `loads` whose
    accumulators spill at every k step: its time less what the peak and the register loads
    explain (seconds, flops, k steps as micro_kernel_seconds returns them)."""
    seconds, flops, steps = spilled
    rows, vectors = next(iter(loads))
    rest = seconds - flops / peak - loads[(rows, vectors)] * vector_bytes * steps / registers
    moved = 2.0 * rows * vectors * vector_bytes * steps
    return moved / rest if rest > moved / 1e18 else 1e18  # finite "free" (JSON has no inf)


def fit_run_start(ratios: list[float], run_bytes: int = RUN_BYTES) -> float:
    """Bytes of the contiguous stream each run's start costs, from run_start_ratios: a strided
    stream taking q times the contiguous one spends (q - 1) x run_bytes more per run (median
    over the rounds); 0 when noise makes the strided stream the faster."""
    return max((statistics.median(ratios) - 1.0) * run_bytes, 0.0)


def _ladder(first: int, below: int, factor: int) -> list[int]:
    """first, first * factor, ... while below `below`."""
    sizes = []
    while first < below:
        sizes.append(first)
        first *= factor
    return sizes


def last_level_sizes(private_bytes: int, capacity_bytes: int) -> list[int]:
    """The working sets (bytes over all cores) of the last cache's sweep: doubling from twice the
    private caches' total, up to half of the cache as sysfs gives it."""
    return [*_ladder(2 * private_bytes, capacity_bytes // 2, 2), capacity_bytes // 2]


def fit_last_level(bandwidths: dict[int, float]) -> int | None:
    """The last cache's size from its sweep (working set -> bytes/s): the largest working set
    streaming at HOLDS of the fastest one no larger, where a larger one does not; None when the
    largest holds (the cache is as large as sysfs says)."""
    sizes = sorted(bandwidths)
    best, holding = 0.0, []
    for size in sizes:
        best = max(best, bandwidths[size])
        holding.append(bandwidths[size] >= HOLDS * best)
    if holding[-1]:
        return None
    held = [size for size, ok in zip(sizes, holding) if ok]
    return held[-1] if held else None


def reach_sizes(private_bytes: int, memory_bytes: int) -> list[int]:
    """The working sets (bytes over all cores) between the private caches' total and the
    memory stream's at which the run starts' reach is measured, REACH_STEP times apart."""
    return _ladder(private_bytes * REACH_STEP, memory_bytes, REACH_STEP)


def fit_reach(private_bytes: int, memory_bytes: int, sweep: dict[int, dict[int, list[float]]],
              memory: dict[int, list[float]], runs=None) -> list[tuple[float, float]]:
    """Hardware.run_start_reach from run_start_ratios over the working sets of `sweep` and from
    memory: per size, the mean over the run lengths `runs` (all those timed from memory when
    None) of what its runs add to the stream over what they add from memory; none within the
    private caches, all of it from memory. Never less than at a smaller size: noise aside, a
    larger array strides over more pages."""
    far = {run: statistics.median(ratios) - 1.0 for run, ratios in memory.items() if runs is None or run in runs}
    points, share = [(float(private_bytes), 0.0)], 0.0
    for size in sorted(sweep):
        shares = [(statistics.median(sweep[size][run]) - 1.0) / far[run] for run in far if far[run] > 0]
        share = min(1.0, max(share, statistics.mean(shares) if shares else 1.0))
        points.append((float(size), share))
    return [*points, (float(memory_bytes), 1.0)] if memory_bytes > points[-1][0] else points[:1]


def calibrate(progress: Progress | None = None) -> Profile:
    """Measure this machine and return its profile (not yet saved)."""
    report = progress or (lambda fraction, message: None)
    os.environ["TVM_NUM_THREADS"] = str(os.cpu_count() or 1)  # the pool must have a thread per core
    start = time.perf_counter()
    hw = host(calibrated=False)
    vector_bytes, cores = hw.vector_bytes, hw.cores
    lanes = vector_bytes // 4
    l1 = hw.levels[1].capacity_bytes if len(hw.levels) > 1 else 32768
    registers = hw.levels[0].capacity_bytes // vector_bytes
    loads = peak_tiles(registers)
    wide = next(iter(loads))
    k = max(8, min(256, l1 // 2 // (wide[1] * 4 * lanes)))  # the wide tile's B panel fills half of L1
    counts = sorted({1, cores})
    private = hw.levels[-2].capacity_bytes * cores if len(hw.levels) > 2 else hw.levels[-1].capacity_bytes
    sweep_sizes = last_level_sizes(private, hw.levels[-1].capacity_bytes)
    steps = len(counts) * (2 + len(hw.levels)) + len(sweep_sizes) + 9  # and the reach's, once the sweep is done
    done = 0

    def step(message: str) -> None:
        nonlocal done
        report(min(done / steps, 1.0), message)  # the peak's second looks are not in `steps`
        done += 1

    # Each stream once: the sweep's working set at half the last cache is the all-core L3 stream's.
    bandwidth = functools.cache(lambda threads, size: stream_bandwidth(threads, size, lanes))
    last_sweep = {}
    for size in sweep_sizes:
        step(f"streaming {size >> 20} MiB on {cores} core(s)")
        last_sweep[size] = bandwidth(cores, size // cores)
    last_level = fit_last_level(last_sweep)
    # Memory is what lies beyond the last cache as measured: working sets past sysfs's size would
    # only cost time (a 480 MiB L3 that holds 128 MiB streamed 1.9 GB per call on one core).
    last = last_level or hw.levels[-1].capacity_bytes
    far = 2 * last  # the working set of the runs from memory
    sizes = reach_sizes(private, far)
    steps += len(sizes)
    run_start, short_run_start = {}, {}
    kernels = {}  # per thread count: micro_kernel_runs
    stream: dict[str, dict] = {name: {} for name in [lv.name for lv in hw.levels[1:]] + ["memory"]}
    for threads in counts:
        step(f"micro-kernels on {threads} core(s)")
        kernels[threads] = micro_kernel_runs(threads, lanes, k, loads)
        for name in stream:
            step(f"streaming from {name} on {threads} core(s)")
            if name == "memory":
                size = 4 * last // threads
            elif name == hw.levels[-1].name:
                size = last // 2 // threads  # shared
            else:
                size = next(lv.capacity_bytes for lv in hw.levels if lv.name == name) // 2
            stream[name][threads] = bandwidth(threads, size)
        step(f"runs from memory on {threads} core(s)")
        ratios = run_start_ratios(threads, far // threads, lanes)
        if threads == cores:
            memory_ratios = ratios  # what the reach's shares are taken of: all cores, like the sweep
        run_start[threads] = fit_run_start(ratios[RUN_BYTES])
        short_run_start[threads] = fit_run_start(ratios[SHORT_RUN_BYTES], SHORT_RUN_BYTES)
    sweep = {}
    for size in sizes:
        step(f"runs over {size >> 20} MiB on {cores} core(s)")
        sweep[size] = run_start_ratios(cores, size // cores, lanes, rounds=REACH_ROUNDS)
    step(f"bands of rows on {cores} core(s)")
    # A GEMV from memory, where the band's time shows clearest: little else runs beside it (over
    # half the last cache on the Zen 4, 16 rows ran 1.01-1.18x the 8-row band's time, from
    # memory 1.08-1.38x).
    bands = fit_band_stall(band_seconds(cores, far // cores, lanes))
    tall = tall_rows(registers)
    step(f"bands of rows under {tall} rows of A on {cores} core(s)")
    tall_bands = fit_band_stall(band_seconds(cores, far // cores, lanes, rows=tall, vectors=2))
    strides = fed = None
    if len(hw.levels) > 2:
        step(f"rows read apart from L2 on {cores} core(s)")
        strides = stride_stalls(cores, lanes, hw.levels[1].capacity_bytes, stream[hw.levels[2].name][cores], tile=wide)
        step(f"register tiles fed from L2 on {cores} core(s)")
        fed = fed_shares(cores, lanes, hw.levels[2].capacity_bytes, tiles=fed_tiles(registers))
    step("packing copies on 1 core")
    copy_vector, copy_element = copy_seconds(lanes, vector=True), copy_seconds(lanes, vector=False)
    handoff = sharing = None
    if cores > 1 and len(hw.levels) > 2:
        step(f"data handed between cores on {cores} cores")
        handoff = handoff_seconds(cores, hw.levels[-2].capacity_bytes, lanes) or None
        step(f"output lines two cores write on {cores} cores")
        sharing = shared_line_seconds(cores, lanes) or None
    step("parallel regions and calls")
    region, call = region_and_call_seconds(cores)
    notes = settle_all_cores(kernels, cores, vector_bytes, lambda threads: micro_kernel_runs(threads, lanes, k, loads),
                             step, loads)
    peak, register_bw, accumulators = {}, {}, {}
    for threads, (a, b, spilled) in kernels.items():
        # The stream from the level next to the registers (L1), where the fit explains nothing.
        peak[threads], register_bw[threads] = fit_peak_and_registers(a, b, lanes, vector_bytes, loads,
                                                                     stream[hw.levels[1].name][threads])
        accumulators[threads] = fit_accumulators(spilled, peak[threads], register_bw[threads], vector_bytes, loads)
    step("a register tile of few accumulators on 1 core")
    chained = micro_kernel_seconds(1, FMA_CHAINS, 1, lanes, k)
    chains = fit_fma_chains(chained, FMA_CHAINS, peak[1], register_bw[1], vector_bytes, kernels[1][1])
    report(1.0, "done")

    def figure(values: dict) -> Figure:
        return Figure(one_core=values[1], all_cores=values[cores])

    streams = {name: figure(v) for name, v in stream.items()}
    names = [lv.name for lv in hw.levels]
    fill = {names[0]: figure(register_bw)}
    fill |= {name: streams[outer] for name, outer in zip(names[1:], [*names[2:], "memory"])}
    return Profile(
        key=host_key(hw), cpu=_cpu_model(), created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        seconds=time.perf_counter() - start, cores=cores, peak_flops=figure(peak), register_bandwidth=figure(register_bw),
        accumulator_bandwidth=figure(accumulators),
        stream_bandwidth=streams, fill_bandwidth=fill, parallel_region_seconds=region, call_seconds=call,
        run_start_bytes=figure(run_start), short_run_start_bytes=figure(short_run_start),
        run_start_reach=fit_reach(private, far, sweep, memory_ratios, (RUN_BYTES,)),
        short_run_start_reach=fit_reach(private, far, sweep, memory_ratios, (SHORT_RUN_BYTES,)), last_level_bytes=last_level,
        band_stall=bands, tall_band_stall=tall_bands, tall_rows=tall, stride_stall=strides, fed_share=fed,
        copy_vector_seconds=copy_vector,
        copy_element_seconds=copy_element, handoff_seconds=handoff, shared_line_seconds=sharing, fma_chains=chains, notes=notes,
    )
