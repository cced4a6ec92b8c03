"""Accumulator reloads measured in place: sweeps of the k steps between two visits of a register tile.

    chrt -f 20 python bench/reloads.py [--rounds 7] [--hardware host] [--only A B C]

Each sweep fixes a GEMM and a plan but for `K`, the k extent of the tile whose
loop takes the register tile away from its accumulators: every K steps a tile
is left, its accumulators stored, and later loaded again. Per K: the model's
prediction and the measured time (all of a sweep's kernels timed in turn over
`rounds` fresh rounds, kernels.time_interleaved; the median per kernel), and,
against the sweep's largest K, the extra time per extra visit of a tile on one
core, measured and predicted. The model charges a visit its accumulators' bytes
both ways at the calibrated accumulator bandwidth; BENCHMARKS.md ("Reload
session") has what these sweeps showed and why a term for the reloads alone
misranks sweep C, whose FMA loop runs faster as K shrinks.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import median_seconds, parse_plan  # noqa: E402
from solve_times import table  # noqa: E402

# name: (m, n, k), the plan with {K} for the swept k tile, the K values (largest last)
SWEEPS = {
    "A": ((197, 2304, 768), "mnk:9,32,1/kmn:9,32,{K}/mnk:72,96,768/mnk:197,2304,768", (3, 6, 12, 48, 768)),
    "B": ((197, 2304, 768), "mnk:4,64,1/kmn:4,64,{K}/mnk:72,192,768/mnk:197,2304,768", (6, 48, 768)),
    "C": ((512, 768, 3072), "mnk:4,64,1/nkm:4,64,{K}/mnk:512,64,{K}/mnk:512,384,{K}", (48, 96, 192, 384)),
}


def visits(workload, tiles, k_tile: int, cores: int) -> float:
    """Visits of a register tile per core: each register tile of the padded output once per K steps."""
    from cachetile.models.costmodel import padded_extents

    padded = padded_extents(workload, tiles)
    tile = tiles[0]
    return padded["m"] / tile["m"] * padded["n"] / tile["n"] * math.ceil(workload.dims["k"] / k_tile) / cores


def sweep_rows(name: str, hw, rounds: int) -> list[tuple]:
    """The table rows of one sweep (SWEEPS[name])."""
    from cachetile import builtin, make_plan

    (m, n, k), text, ks = SWEEPS[name]
    w = builtin("gemm", {"m": m, "n": n, "k": k})
    plans = [make_plan(w, hw, *parse_plan(text.format(K=K))) for K in ks]
    times = median_seconds(w, hw, plans, rounds)
    counts = [visits(w, [lv.tile for lv in p.levels], K, hw.cores) for p, K in zip(plans, ks)]
    rows = []
    for K, p, t, v in zip(ks, plans, times, counts):
        extra = v - counts[-1]  # against the largest K, the last: its own row is left blank
        measured = f"{(t - times[-1]) / extra * 1e9:.1f}" if extra > 0 else ""
        predicted = f"{(p.predicted_seconds - plans[-1].predicted_seconds) / extra * 1e9:.1f}" if extra > 0 else ""
        rows.append((name, f"{m}x{n}x{k}", text.format(K=K).replace("/", " / "), K, f"{p.predicted_seconds * 1e3:.3f}",
                     f"{t * 1e3:.3f}", measured, predicted))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hardware", default="host")
    ap.add_argument("--only", nargs="+", choices=sorted(SWEEPS), help="sweeps to run")
    args = ap.parse_args()

    from cachetile import hardware_from
    from cachetile.backends.llvm_build import use_all_cores
    from cachetile.backends.llvm_measure import cpu_name

    hw = hardware_from(args.hardware)
    use_all_cores(hw)
    rows = [row for name in (args.only or sorted(SWEEPS)) for row in sweep_rows(name, hw, args.rounds)]
    print(f"# accumulator reloads on {cpu_name()} ({hw.cores} cores), {args.rounds} rounds; hardware {hw.name}: "
          f"{hw.source or ''}\n")
    print(table(("sweep", "gemm", "plan", "K", "predicted ms", "measured ms", "measured ns / extra visit",
                 "predicted ns / extra visit"), rows))


if __name__ == "__main__":
    main()
