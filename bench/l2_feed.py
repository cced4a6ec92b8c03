"""An FMA loop fed from L2: what it costs beside the link time the model overlaps with compute.

    chrt -f 20 python bench/l2_feed.py [--rounds 5]

The model charges the link that fills L1 as a time that overlaps the FMAs
(the 3-norm of SimdCpu.overlap_norm). A micro-kernel whose vector input (B)
does not stay in L1 between register tiles reads it from L2 inside its FMA
loop, and there the two do not overlap that well. Two tables, on all cores:

1. the calibration's micro-kernel (backends/calibrate.micro_kernel:
   broadcast A, vector B, accumulators in registers) with B's panel held in
   L1, then streamed from L2, contiguous and with its rows 4 and 12 times the
   panel's width apart (an unpacked B whose panel is narrower than its rows,
   as gpt-2's projection reads a 64-float panel of 768-float rows). Per row:
   GFLOP/s, and the time it adds to the L1-fed kernel over the L1 link time
   the model charges for the bytes it streams (B's vectors and A's
   broadcasts, at the profile's L1 fill bandwidth): 0 where the link
   overlaps the FMAs for free, 1 where its time adds to theirs (the kernels
   timed in turn, medians of alternating rounds);
2. gpt-2's projection (gemm 1024x768x768): the plan `tune` returns, which
   streams B's panel unpacked from L2 through its FMA loop, and plans that
   pack a k-block of B into L1 instead, each predicted and measured
   (bench/fidelity.measure_plans, alternating rounds), beside numpy
   (models.measurement.reference: the median of 10 calls per round, timed
   after the plans). The packed plans need a four-level host (registers,
   L1, L2, L3); elsewhere the table has the returned plan alone.

BENCHMARKS.md ("L2-feed session") has the figures.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_times import all_cores_host, gemm_plan, plan_spec, table  # noqa: E402

TILES = ((4, 4), (6, 4))  # (rows, vectors) of the register tile: the calibration's, the gpt-2 plan's
SPREADS = (1, 4, 12)  # B's rows, in panel widths apart
GPT2 = {"m": 1024, "n": 768, "k": 768}
# Plans that pack a k-block of B into L1 (levels from the registers out: order, tile m, n, k).
BLOCKED = [[("mnk", (6, 64, 1)), ("nkm", (6, 64, kc)), ("kmn", (6, 64, kc)), ("nmk", (1024, 64, 768))]
           for kc in (32, 64, 128)]


def feed_rows(hw, threads: int, lanes: int, rounds: int):
    """Table 1's rows: per register tile, the kernel fed from L1, then from L2 at each spread;
    the kernels timed in turn in each of `rounds` rounds, medians."""
    from cachetile.backends.calibrate import micro_kernel, seconds_in_turn

    l1, l2 = hw.levels[1].capacity_bytes, hw.levels[2].capacity_bytes
    fill = hw.levels[1].bandwidth_bytes_per_s  # the link filling L1 (all cores)
    runs = []
    for rows, vectors in TILES:
        panel_row = vectors * lanes * 4  # bytes of B one k step reads
        deep = max(4 * l1, l2 // 16) // panel_row
        feeds = [("L1", max(16, l1 // 4 // panel_row), 1)] + [("L2", deep, spread) for spread in SPREADS]
        for where, k, spread in feeds:
            width = spread * vectors * lanes
            runs.append((rows, vectors, panel_row, where, k, width,
                         micro_kernel(threads, rows, vectors, lanes, k, width=width)))
    times = seconds_in_turn([run[-1] for run in runs], rounds)
    out, base = [], {}
    for t, (rows, vectors, panel_row, where, k, width, (_, _, flops, steps)) in zip(times, runs):
        base.setdefault((rows, vectors), t / flops)  # the L1-fed kernel comes first
        link = steps * (panel_row + rows * 4) / fill
        out.append([f"{rows}x{vectors}", where, str(k), str(width), f"{k * panel_row >> 10}",
                    f"{k * width * 4 >> 10}", f"{flops / t / 1e9:.0f}",
                    f"{(t - base[(rows, vectors)] * flops) / link:.2f}"])
    return out


def plan_rows(hw, rounds: int):
    """Table 2's rows: the returned plan and BLOCKED, predicted and measured, and numpy."""
    from fidelity import measure_plans

    from cachetile import builtin, tune
    from cachetile.backends.llvm_measure import _median_seconds
    from cachetile.models.measurement import random_inputs, reference

    w = builtin("gemm", GPT2)
    plans = [tune(w, hw, top=0).plan]
    for spec in BLOCKED if len(hw.levels) == len(BLOCKED[0]) else []:
        plans.append(gemm_plan(w, hw, spec))
    seconds, *_ = measure_plans(w, hw, plans, rounds=rounds)
    arrays, ref = random_inputs(w, seed=1), reference(w)
    numpy = _median_seconds(lambda: ref(arrays), 10 * rounds)
    out = []
    for i, (plan, measured) in enumerate(zip(plans, seconds)):
        out.append(["returned" if i == 0 else "B packed in L1", plan_spec(plan, " / "), f"{plan.levels[1].link_seconds * 1e3:.3f}",
                    f"{plan.serial_seconds * 1e3:.3f}", f"{plan.predicted_seconds * 1e3:.3f}",
                    f"{measured * 1e3:.3f}", f"{numpy / measured:.2f}"])
    return out, numpy


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of each table")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    hw, threads, lanes = all_cores_host()
    print("the micro-kernel with B in L1, then streamed from L2 (all cores)\n")
    print(table(["tile", "B from", "k", "B row floats", "B read KiB", "B span KiB", "GFLOP/s", "extra / L1 link"],
                feed_rows(hw, threads, lanes, args.rounds)))
    rows, reference = plan_rows(hw, args.rounds)
    print(f"\ngpt-2 projection 1024x768x768 (numpy {reference * 1e3:.3f} ms)\n")
    print(table(["plan", "levels", "L1 link ms", "serial ms", "predicted ms", "measured ms", "numpy / kernel"], rows))


if __name__ == "__main__":
    main()
