"""Kernels on shapes nobody tuned for, against numpy in the same process.

    chrt -f 20 python bench/shapes.py [--hardware host] [--only NAME ...]

Real-model shapes (BERT, GPT/LLaMA, ViT projections and FFNs, decode steps
with m <= 16, attention chains at 197/384/1024/2048 tokens with head sizes
64/128), primes and 1000^3. For each: the plan time (`tune`, in this
process), the kernel's and numpy's GFLOP/s (medians of >= 10 runs, numpy's
np.matmul per op, so two calls for a chain) and their ratio; then the
geometric mean and the worst ratio. Run it with real-time priority on a
shared machine (chrt), or on a quiet one.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import log  # noqa: E402
from solve_times import table  # noqa: E402

SHAPES = [  # name, kind, dims
    ("bert-base qkv 512x2304x768", "gemm", {"m": 512, "n": 2304, "k": 768}),
    ("bert-base ffn1 512x3072x768", "gemm", {"m": 512, "n": 3072, "k": 768}),
    ("bert-base ffn2 512x768x3072", "gemm", {"m": 512, "n": 768, "k": 3072}),
    ("vit-b/16 qkv 197x2304x768", "gemm", {"m": 197, "n": 2304, "k": 768}),
    ("vit-b/16 mlp 197x3072x768", "gemm", {"m": 197, "n": 3072, "k": 768}),
    ("gpt-2 proj 1024x768x768", "gemm", {"m": 1024, "n": 768, "k": 768}),
    ("llama-7b prefill 128x4096x4096", "gemm", {"m": 128, "n": 4096, "k": 4096}),
    ("llama-7b decode 1x4096x4096", "gemm", {"m": 1, "n": 4096, "k": 4096}),
    ("llama-7b decode 8x4096x4096", "gemm", {"m": 8, "n": 4096, "k": 4096}),
    ("gpt-2 decode 16x3072x768", "gemm", {"m": 16, "n": 3072, "k": 768}),
    ("primes 127x251x509", "gemm", {"m": 127, "n": 251, "k": 509}),
    ("primes 97x211x131", "gemm", {"m": 97, "n": 211, "k": 131}),
    ("gemm 1000^3", "gemm", {"m": 1000, "n": 1000, "k": 1000}),
    ("vit attention 197, 12 heads x 64", "gemm-chain", {"b": 12, "m": 197, "l": 197, "k": 64, "n": 64}),
    ("bert attention 384, 12 heads x 64", "gemm-chain", {"b": 12, "m": 384, "l": 384, "k": 64, "n": 64}),
    ("attention 1024, 16 heads x 64", "gemm-chain", {"b": 16, "m": 1024, "l": 1024, "k": 64, "n": 64}),
    ("attention 2048, 16 heads x 128", "gemm-chain", {"b": 16, "m": 2048, "l": 2048, "k": 128, "n": 128}),
]


def rows(hw, names=None):
    from cachetile import builtin, tune
    from cachetile.backends.base import get_backend

    llvm = get_backend("llvm")
    out = []
    for name, kind, dims in SHAPES:
        if names and name not in names:
            continue
        log(f"shapes: {name}")
        w = builtin(kind, dims)
        start = time.perf_counter()
        result = tune(w, hw, top=0)
        plan_s = time.perf_counter() - start
        m = llvm.measure(result)
        out.append((name, f"{plan_s:.2f}", result.solver.status, f"{m.kernel_gflops:.1f}", f"{m.reference_gflops:.1f}",
                    f"{m.ratio:.2f}", f"{result.plan.predicted_seconds * 1e3:.3f}", f"{m.kernel_seconds * 1e3:.3f}"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="host")
    ap.add_argument("--only", nargs="+", help="shape names to run")
    args = ap.parse_args()

    from cachetile import hardware_from
    from cachetile.backends.llvm_build import use_all_cores
    from cachetile.backends.llvm_measure import cpu_name

    hw = hardware_from(args.hardware)
    use_all_cores(hw)
    state = f"calibrated {hw.calibrated}" if hw.calibrated else "assumed figures (no calibration profile)"
    print(f"# kernels vs numpy on {cpu_name()} ({hw.cores} cores, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}); "
          f"hardware {hw.name}: {state}\n")
    table_rows = rows(hw, args.only)
    print(table(("shape", "plan s", "status", "kernel GFLOP/s", "numpy GFLOP/s", "kernel/numpy", "predicted ms",
                 "measured ms"), table_rows))
    ratios = [float(r[5]) for r in table_rows]
    plans = [float(r[1]) for r in table_rows]
    print(f"\ngeomean kernel/numpy {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}; worst {min(ratios):.2f} "
          f"({table_rows[ratios.index(min(ratios))][0]}); slowest plan {max(plans):.2f} s")


if __name__ == "__main__":
    main()
