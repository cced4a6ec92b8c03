"""Chosen plans of one GEMM or GEMM chain built and timed side by side, against their predictions and numpy.

    chrt -f 20 python bench/plans.py M,N,K PLAN [PLAN ...] [--rounds 15] [--hardware host]
    chrt -f 20 python bench/plans.py B,M,L,K,N PLAN [PLAN ...]      # an attention-like chain

PLAN is `returned` (the plan `tune` returns) or an order and a tile per level,
innermost level first, tiles in the shape's order (m,n,k; b,m,l,k,n for a chain, as
`tune` prints them), levels apart by `/` or `|`:
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


def parse_plan(text: str, loops: str = "mnk") -> tuple[list[list[str]], list[dict[str, int]]]:
    """(orders, tiles) of `order:sizes` per level, innermost first, the sizes in `loops` order."""
    orders, tiles = [], []
    for level in text.replace("|", "/").split("/"):
        order, sizes = level.strip().split(":")
        orders.append(list(order))
        tiles.append(dict(zip(loops, map(int, sizes.split(",")))))
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

    sizes = list(map(int, args.shape.split(",")))
    loops = {3: "mnk", 5: "bmlkn"}.get(len(sizes))
    if loops is None:
        ap.error(f"shape: M,N,K or B,M,L,K,N, got {args.shape!r}")
    dims = dict(zip(loops, sizes))
    hw = hardware_from(args.hardware)
    use_all_cores(hw)
    w = builtin("gemm" if len(sizes) == 3 else "gemm-chain", dims)
    plans = [tune(w, hw).plan if text == "returned" else make_plan(w, hw, *parse_plan(text, loops))
             for text in args.plans]
    times = median_seconds(w, hw, plans, args.rounds)
    rand = lambda *shape: np.random.rand(*shape).astype("float32")  # noqa: E731
    if len(sizes) == 3:
        ops = [rand(dims["m"], dims["k"]), rand(dims["k"], dims["n"])]
    else:  # numpy's two matmuls, as bench/shapes.py times a chain
        ops = [rand(dims["b"], dims["m"], dims["k"]), rand(dims["b"], dims["k"], dims["l"]),
               rand(dims["b"], dims["l"], dims["n"])]
    runs = []
    for _ in range(30):
        start = time.perf_counter()
        out = ops[0] @ ops[1]
        for more in ops[2:]:
            out = out @ more
        runs.append(time.perf_counter() - start)
    numpy = statistics.median(runs)
    rows = [(plan_spec(p, " / "), f"{p.predicted_seconds * 1e3:.3f}", f"{t * 1e3:.3f}", f"{numpy / t:.2f}")
            for p, t in zip(plans, times)]
    print(f"{w.kind} {'x'.join(map(str, sizes))} ({','.join(loops)}), {args.rounds} rounds; numpy {numpy * 1e3:.3f} ms; hardware {hw.name}: {hw.source or ''}\n")
    print(table(("plan", "predicted ms", "measured ms", "kernel / numpy"), rows))


if __name__ == "__main__":
    main()
