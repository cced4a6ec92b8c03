"""Packed blocks written by one core and read by all: what the model does not yet charge.

    chrt -f 20 python bench/cross_core.py [--slab-kib 508] [--slabs 34] [--reads 6] [--rounds 3]

A plan whose outermost loop is serial (a reduction, say) packs an input's
block at each of its steps on one core, outside the parallel loop, and then
every core reads that block, often several times (once per row of its
register tiles). Two tables:

1. a streaming kernel over `--slabs` slabs of `--slab-kib` each (sized like
   such a block, so each fits a private cache): per slab, the slab is written
   by one core, by each core a half, by each core a copy of its own, or not
   at all, and then every core sums it `reads` times into 8 accumulator
   vectors. From the times with 0 and 1 read: the write's time, and per core
   the bandwidth of the first read. TVM keeps this kernel's accumulators in a
   workspace LLVM cannot tell apart from the slabs, so they are stored at
   every step, which caps any read near 120 GB/s per core on the Xeon of
   BENCHMARKS.md: the first reads that matter here run far below that;
2. the decode GEMM plan of the fidelity sample that ran furthest over its
   prediction, which packs 508 KiB of B at each of 34 serial k steps on one
   core and reads it 6 times on each core: predicted and measured
   (bench/fidelity.measure_plans).

BENCHMARKS.md ("Cross-core session") has the figures and what they say the
model misses.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_times import all_cores_host, gemm_plan, plan_spec, table  # noqa: E402

WRITERS = ("one core", "each a half", "each its own", "not written")
ACCUMULATORS = 8
# The fidelity sample's plan (gemm 8x4096x1024), levels from the registers out: order, tile (m, n, k).
DECODE_PLAN = [("nkm", (1, 128, 1)), ("nmk", (1, 128, 1)), ("mkn", (1, 2048, 31)), ("kmn", (6, 4096, 31))]


def slab_kernel(writer: int, slabs: int, rows: int, reads: int, width: int, threads: int):
    """The compiled kernel of table 1: X holds `slabs` slabs (a second copy per thread for
    'each its own'), each `rows` x `width` floats; out, each thread's accumulators."""
    import tvm
    from tvm.script import tirx as T

    from cachetile.backends.calibrate import _target

    half = rows // threads

    @T.prim_func(s_tir=True)
    def kernel(x: T.handle, o: T.handle):
        X = T.match_buffer(x, (slabs, threads, rows, width), "float32")
        out = T.match_buffer(o, (threads, width), "float32")
        for s in range(slabs):
            if writer == 0:
                for i in range(rows):
                    for j in T.vectorized(width):
                        X[s, 0, i, j] = T.Cast("float32", s)
            for t in T.parallel(threads):
                if writer == 1:
                    for i in range(half):
                        for j in T.vectorized(width):
                            X[s, 0, t * half + i, j] = T.Cast("float32", s)
                if writer == 2:
                    for i in range(rows):
                        for j in T.vectorized(width):
                            X[s, t, i, j] = T.Cast("float32", s)
                acc = T.alloc_buffer((width,), "float32", scope="local")
                for j in T.vectorized(width):
                    acc[j] = T.float32(0)
                for r in range(reads):
                    for i in range(rows):
                        for j in T.vectorized(width):
                            acc[j] = acc[j] + X[s, t if writer == 2 else 0, i, j]
                for j in T.vectorized(width):
                    out[t, j] = acc[j]

    return tvm.compile(tvm.IRModule({"main": kernel}), target=_target(threads))


def slab_rows(slab_bytes: int, slabs: int, reads: int, threads: int, lanes: int, rounds: int):
    """Table 1's rows: per writer, the best of `rounds` median times with 0, 1 and `reads` reads."""
    import numpy as np

    from cachetile.backends.calibrate import _median_seconds, _tensors

    width = ACCUMULATORS * lanes
    rows = max(threads, slab_bytes // (width * 4) // threads * threads)
    nbytes = slabs * rows * width * 4  # read by each core per pass
    out = []
    for w, name in enumerate(WRITERS):
        args = _tensors(np.zeros((slabs, threads, rows, width), "float32"), np.zeros((threads, width), "float32"))
        libs = {r: slab_kernel(w, slabs, rows, r, width, threads) for r in (0, 1, reads)}
        t = {r: min(_median_seconds(lib, args) for _ in range(rounds)) for r, lib in libs.items()}
        first = nbytes / max(t[1] - t[0], 1e-9) / 1e9
        out.append([name, f"{t[0] * 1e3:.3f}", f"{t[1] * 1e3:.3f}", f"{t[reads] * 1e3:.3f}", f"{first:.0f}"])
    return out


def plan_rows(hw, rounds: int):
    """Table 2's row: DECODE_PLAN's serial and link seconds, predicted and measured."""
    from fidelity import measure_plans

    from cachetile import builtin

    w = builtin("gemm", {"m": 8, "n": 4096, "k": 1024})
    plan = gemm_plan(w, hw, DECODE_PLAN)
    seconds, *_ = measure_plans(w, hw, [plan], rounds=rounds)
    links = ", ".join(f"{lv.name} {lv.link_seconds * 1e3:.3f}" for lv in plan.levels)
    return [["gemm 8x4096x1024", plan_spec(plan, " / "), f"{plan.serial_seconds * 1e3:.3f}", links,
             f"{plan.predicted_seconds * 1e3:.3f}", f"{seconds[0] * 1e3:.3f}"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slab-kib", type=int, default=508, help="bytes of a packed block (the plan's: 31 x 4096 floats)")
    ap.add_argument("--slabs", type=int, default=34, help="blocks per call (the plan's serial k steps)")
    ap.add_argument("--reads", type=int, default=6, help="passes each core makes over a block (the plan's 6 rows per core)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if min(args.slab_kib, args.slabs, args.reads, args.rounds) < 1:
        ap.error("--slab-kib, --slabs, --reads and --rounds must be at least 1")
    hw, threads, lanes = all_cores_host()
    print(f"{args.slabs} blocks of {args.slab_kib} KiB, each written then read by every core; ms per call, "
          "GB/s per core\n")
    print(table(["written by", "write only ms", "1 read ms", f"{args.reads} reads ms", "first read GB/s"],
                slab_rows(args.slab_kib << 10, args.slabs, args.reads, threads, lanes, args.rounds)))
    print("\nthe decode plan that packs such blocks on one core\n")
    print(table(["gemm", "plan", "serial ms", "link ms", "predicted ms", "measured ms"], plan_rows(hw, args.rounds)))


if __name__ == "__main__":
    main()
