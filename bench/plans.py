"""Chosen plans of one GEMM built and timed side by side, against their predictions and numpy.

    chrt -f 20 python bench/plans.py M,N,K PLAN [PLAN ...] [--rounds 15] [--hardware host]

PLAN is `returned` (the plan `tune` returns) or an order and a tile per level,
innermost level first, tiles in m,n,k order, levels apart by `/` or `|`:
`mnk:6,64,1/mnk:6,64,16/nkm:6,256,1024/mnk:1024,256,1024`. Each round is a
fresh process that times every kernel once, in a shuffled order
(kernels.time_interleaved); a kernel's figure is its median over the rounds.
numpy's matmul is timed in this process (median of 30). For the A/B figures of
BENCHMARKS.md: two plans the model ranks close, measured under the same
conditions. Run it with real-time priority on a shared machine (chrt).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import llvm, time_interleaved  # noqa: E402
from solve_times import plan_spec, table  # noqa: E402


def parse_plan(text: str) -> tuple[list[list[str]], list[dict[str, int]]]:
    """(orders, tiles) of `order:m,n,k` per level, innermost first."""
    orders, tiles = [], []
    for level in text.replace("|", "/").split("/"):
        order, sizes = level.strip().split(":")
        orders.append(list(order))
        tiles.append(dict(zip("mnk", map(int, sizes.split(",")))))
    return orders, tiles


def median_seconds(workload, hw, plans, rounds: int) -> list[float]:
    """Each plan built by the LLVM backend and timed in turn over `rounds` fresh rounds
    (kernels.time_interleaved): its median seconds."""
    libs = [llvm().build(workload, hw, p).lib.mod for p in plans]
    return [statistics.median(t)
            for t in time_interleaved([(libs, workload)], rounds, repeat=1, rng=random.Random(0))[0]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", help="M,N,K")
    ap.add_argument("plans", nargs="+", help="`returned` or order:m,n,k per level, innermost first")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--hardware", default="host")
    args = ap.parse_args()

    import numpy as np

    from cachetile import builtin, hardware_from, make_plan, tune
    from cachetile.backends.llvm_build import use_all_cores

    m, n, k = map(int, args.shape.split(","))
    hw = hardware_from(args.hardware)
    use_all_cores(hw)
    w = builtin("gemm", {"m": m, "n": n, "k": k})
    plans = [tune(w, hw).plan if text == "returned" else make_plan(w, hw, *parse_plan(text)) for text in args.plans]
    times = median_seconds(w, hw, plans, args.rounds)
    a, b = np.random.rand(m, k).astype("float32"), np.random.rand(k, n).astype("float32")
    runs = []
    for _ in range(30):
        start = time.perf_counter()
        a @ b
        runs.append(time.perf_counter() - start)
    numpy = statistics.median(runs)
    rows = [(plan_spec(p, " / "), f"{p.predicted_seconds * 1e3:.3f}", f"{t * 1e3:.3f}", f"{numpy / t:.2f}")
            for p, t in zip(plans, times)]
    print(f"gemm {m}x{n}x{k}, {args.rounds} rounds; numpy {numpy * 1e3:.3f} ms; hardware {hw.name}: {hw.source or ''}\n")
    print(table(("plan", "predicted ms", "measured ms", "kernel / numpy"), rows))


if __name__ == "__main__":
    main()
