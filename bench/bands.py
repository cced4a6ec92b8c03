"""Unpacked inputs read in bands: how many rows the micro-kernel may read in turn.

    chrt -f 20 python bench/bands.py [--sizes 16 256] [--rounds 3]

A micro-kernel that reads an input where it lies (a decode GEMM's weights)
reads its L1 block's rows in turn, a slice of each, then the next slice of
the same rows. The model counts such a row as one run as long as the blocks
that follow continue it (models/kernel_costs.contiguous_run), and charges
the band what calibration measured for its rows (kernel_costs.band_stall).
Two tables test that:

1. the banded micro-kernel calibration times (backends/calibrate.band_seconds:
   one row of A broadcast against four vectors of B, a GEMV's register tile, or
   the tiles `--tiles` names, such as 8,2 for a decode GEMM's 8x32 on AVX-512,
   over a B of 16 KiB rows read in bands the tile walks along); per
   working-set size (MiB, all threads), each band's time against the fastest,
   and the band_stall calibration would fit from it;
2. the same through the planner and the LLVM backend: decode GEMMs (m 8 and 1)
   whose L1 block is m x 32 (64 for the GEMV) x `band` and whose L2 block
   spans 2048 columns, so B's
   rows continue across L1 blocks, each predicted and timed side by side
   (bench/fidelity.measure_plans), beside the plan `tune` returns.

When the bands grow past what the hardware prefetcher follows at once, each
row's next slice starts late instead of streaming. BENCHMARKS.md ("Band session")
has the figures and what the model would need to see it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_times import all_cores_host, plan_spec, table  # noqa: E402


def stream_rows(sizes_mib, threads: int, lanes: int, rounds: int, tiles=((1, 4),)):
    from cachetile.backends.calibrate import BANDS, band_seconds, fit_band_stall

    rows = []
    for tile_rows, vectors in tiles:
        for size in sizes_mib:
            seconds = band_seconds(threads, (size << 20) // threads, lanes, rounds=rounds, rows=tile_rows, vectors=vectors)
            medians = {band: statistics.median(v) for band, v in seconds.items()}
            best = min(medians.values())
            rows.append([f"{tile_rows}x{vectors}", f"{size}",
                         *(f"{medians[b] * 1e3:.3f} ({medians[b] / best:.2f}x)" for b in BANDS),
                         ", ".join(f"{share:.2f}" for _, share in fit_band_stall(seconds))])
    return rows


def plan_rows(hw, rounds: int):
    from fidelity import measure_plans

    from cachetile import builtin, make_plan, tune

    bands = (8, 16, 32, 64, 128)
    rows = []
    for m, k, width in ((8, 1024, 32), (8, 4096, 32), (1, 4096, 64)):
        w = builtin("gemm", {"m": m, "n": 4096, "k": k})
        orders = [list("mnk")] * 4
        plans = [make_plan(w, hw, orders, [{"m": m, "n": width, "k": 1}, {"m": m, "n": width, "k": band},
                                           {"m": m, "n": 2048, "k": band}, {"m": m, "n": 2048, "k": 128}])
                 for band in bands]
        plans.append(tune(w, hw, top=0).plan)
        seconds, *_ = measure_plans(w, hw, plans, rounds=rounds)
        for name, plan, s in zip([f"band {b}" for b in bands] + ["tune's plan"], plans, seconds):
            rows.append([f"{m}x4096x{k}", name, plan_spec(plan, " / "), f"{plan.predicted_seconds * 1e3:.3f}", f"{s * 1e3:.3f}"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 256], help="working sets of B, MiB over all threads")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiles", nargs="+", default=["1,4"],
                    help="micro-kernels as ROWS,VECTORS: rows of A against vectors of B (1,4: calibration's)")
    args = ap.parse_args()
    tiles = [tuple(map(int, t.split(","))) for t in args.tiles]
    hw, threads, lanes = all_cores_host()
    print("banded stream, ms per call (x the fastest band)\n")
    from cachetile.backends.calibrate import BANDS

    print(table(["tile", "MiB", *(f"band {b}" for b in BANDS), "band_stall"],
                stream_rows(args.sizes, threads, lanes, args.rounds, tiles)))
    print("\nplanned decode GEMMs reading B unpacked, B's rows continued across L1 blocks\n")
    print(table(["gemm", "L1 rows", "plan", "predicted ms", "measured ms"], plan_rows(hw, args.rounds)))


if __name__ == "__main__":
    main()
