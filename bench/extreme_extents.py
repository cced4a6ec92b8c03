"""Every solver on extreme extents: each solve must return within its time limit plus MARGIN.

    python bench/extreme_extents.py [--time-limit 1] [--hardware host,h100,v100]

Prints one row per (hardware, workload, solver): the wall time of `tune` in this process, the
status (or the one-line error), and the overrun beyond the limit; exits 1 if any solve took
longer than the limit plus MARGIN. tests/test_limits.py runs the same cases with a 0.5 s limit.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cachetile import builtin, preset, tune  # noqa: E402
from cachetile.models.errors import CachetileError  # noqa: E402
from cachetile.models.workload import MAX_EXTENT  # noqa: E402
from cachetile.optimizer.registry import SOLVERS  # noqa: E402

# What a solve may take beyond its limit (README, "Optimizer"): the solver step in flight when
# the limit passes, and costing the returned plans.
MARGIN = 1.0
E = MAX_EXTENT
# Every extent at the cap, one huge loop among small ones, 10^9 cubed (~63,000 tile candidates
# per loop), the chain with n at the cap, a batch at the cap, a chain at the cap.
EXTREMES = [
    ("gemm", {"m": E, "n": E, "k": E}),
    ("gemm", {"m": 1, "n": E, "k": 1}),
    ("gemm", {"m": 10**9, "n": 10**9, "k": 10**9}),
    ("gemm-chain", {"m": 127, "l": 127, "k": 64, "n": E}),
    ("batch-gemm", {"b": E, "m": 3, "n": E, "k": 7}),
    ("gemm-chain", {"b": E, "m": E, "l": E, "k": E, "n": E}),
]


def solve(kind: str, dims: dict, hardware: str, solver: str, limit: float) -> tuple[float, str]:
    """Wall seconds of one `tune` call and its status (or the kind of error and its message)."""
    start = time.perf_counter()
    try:
        status = tune(builtin(kind, dims), preset(hardware), solver, time_limit=limit, top=3).solver.status
    except CachetileError as exc:
        status = f"{exc.kind}: {str(exc)[:70]}"
    return time.perf_counter() - start, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=1.0)
    ap.add_argument("--hardware", default="host,h100,v100")
    args = ap.parse_args()
    rows, worst = [], 0.0
    for hardware in args.hardware.split(","):
        for kind, dims in EXTREMES:
            for solver in sorted(SOLVERS):
                took, status = solve(kind, dims, hardware, solver, args.time_limit)
                worst = max(worst, took - args.time_limit)
                shape = "x".join("MAX" if v == E else str(v) for v in dims.values())
                rows.append((hardware, f"{kind} {shape}", solver, f"{took:.2f}", f"{took - args.time_limit:+.2f}", status))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ("hardware", "workload", "solver", "seconds", "over limit", "status")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print("\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]))
    print(f"\n{len(rows)} solves with a {args.time_limit:g} s limit; the slowest took {worst:+.2f} s beyond it "
          f"(allowed: {MARGIN:g} s)")
    return 0 if worst <= MARGIN else 1


if __name__ == "__main__":
    sys.exit(main())
