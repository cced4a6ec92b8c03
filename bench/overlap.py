"""What the SIMD CPU target's overlap norm changes: each shape of bench/shapes.py planned
with compute and links combined by the maximum (norm inf) and by the target's norm, and
the two plans timed side by side in this process.

    chrt -f 20 python bench/overlap.py [--hardware host] [--norm P] [--rounds 3] [--only NAME ...]

Shapes whose two plans are the same kernel are listed as such. The others are timed in
`--rounds` rounds, alternating which goes first; each keeps its fastest round (another
tenant only ever slows a timing down). The last line is the geometric mean of new/old
over the shapes whose plan changed.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import measure_plans  # noqa: E402
from shapes import SHAPES  # noqa: E402
from solve_times import table  # noqa: E402


def plan_with(norm: float, workload, hardware):
    """The plan `tune` returns when the SIMD CPU target combines times with `norm`."""
    from cachetile import tune
    from cachetile.models.targets.simd_cpu import SimdCpu

    saved = SimdCpu.overlap_norm
    SimdCpu.overlap_norm = norm
    try:
        return tune(workload, hardware).plan
    finally:
        SimdCpu.overlap_norm = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="host")
    ap.add_argument("--norm", type=float, help="the norm to compare with the maximum (default: the target's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="+", help="substrings of shape names")
    args = ap.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count()))

    from cachetile import builtin, hardware_from
    from cachetile.api.autotune import signature
    from cachetile.models.targets.simd_cpu import SimdCpu

    hw = hardware_from(args.hardware)
    norm = args.norm or SimdCpu.overlap_norm
    rows, ratios = [], []
    for name, kind, dims in SHAPES:
        if args.only and not any(s in name for s in args.only):
            continue
        print(f"overlap: {name}", file=sys.stderr, flush=True)
        w = builtin(kind, dims)
        old, new = plan_with(math.inf, w, hw), plan_with(norm, w, hw)
        if signature(w, old) == signature(w, new):
            rows.append((name, "same kernel", "", "", ""))
            continue
        times = {0: [], 1: []}
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i, t in zip(order, measure_plans(w, hw, [(old, new)[i] for i in order])[0]):
                times[i].append(t)
        a, b = min(times[0]), min(times[1])
        ratios.append(b / a)
        rows.append((name, f"{a * 1e3:.3f}", f"{b * 1e3:.3f}", f"{b / a:.3f}",
                     " / ".join(",".join(map(str, lv.tile.values())) for lv in new.levels)))
    print(table(("shape", "max: ms", f"{norm:g}-norm: ms", "new/old", "new plan's tiles"), rows))
    if ratios:
        print(f"\ngeomean new/old over {len(ratios)} changed plans: "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
