"""The GPU table of BENCHMARKS.md: export the kernels here, run them on a GPU machine.

    python bench/cuda_table.py export OUT [--arch sm_90] [--hardware h100]   # needs TVM (and nvcc to check)
    python bench/cuda_table.py run OUT [--repeat 50]                          # needs CuPy and a GPU, not TVM

`export` plans every row of the table on the hardware preset and writes one
export folder per row under OUT (plan.json, schedule.py, kernel.cu,
launch.json), plus OUT/spearman/plan-NN: the plans `tune` ranks for fp16 gemm
4096^3 and random launchable ones, at least 12 in all. `run` runs every folder
in one process with backends/cuda_run.py (checked against a float64 reference,
timed beside cuBLAS with CUDA events, median of >= 20 after warm-up) and prints
the table: ours, cuBLAS's, the ratio with its target, the model's prediction,
and the Spearman rank correlation of predicted against measured time over the
`spearman` plans (target >= 0.8).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

# (id, kind, dims, dtype, stages, target ratio against cuBLAS)
ROWS = [
    ("gemm4096-f32", "gemm", {"m": 4096, "n": 4096, "k": 4096}, "float32", 2, 0.8),
    ("gemm4096-f16", "gemm", {"m": 4096, "n": 4096, "k": 4096}, "float16", 3, 0.7),
    ("gemm4096-bf16", "gemm", {"m": 4096, "n": 4096, "k": 4096}, "bfloat16", 3, 0.7),
    ("gemm8192x8192x1024-f16", "gemm", {"m": 8192, "n": 8192, "k": 1024}, "float16", 3, 0.7),
    ("gemm8192x8192x1024-bf16", "gemm", {"m": 8192, "n": 8192, "k": 1024}, "bfloat16", 3, 0.7),
    ("attn-12x512-d64-f16", "gemm-chain", {"b": 12, "m": 512, "k": 64, "l": 512, "n": 64}, "float16", 3, 1.0),
    ("attn-12x512-d128-f16", "gemm-chain", {"b": 12, "m": 512, "k": 128, "l": 512, "n": 128}, "float16", 3, 1.0),
    ("attn-16x2048-d64-f16", "gemm-chain", {"b": 16, "m": 2048, "k": 64, "l": 2048, "n": 64}, "float16", 3, 1.0),
    ("attn-16x2048-d128-f16", "gemm-chain", {"b": 16, "m": 2048, "k": 128, "l": 2048, "n": 128}, "float16", 3, 1.0),
] + [(f"gemm4096-f16-stages{s}", "gemm", {"m": 4096, "n": 4096, "k": 4096}, "float16", s, 0.7) for s in (1, 2, 3, 4)]
SPEARMAN = ("gemm", {"m": 4096, "n": 4096, "k": 4096}, "float16", 3)
SPEARMAN_PLANS = 16


def _random_plans(workload, hardware, stages: int, count: int, seed: int = 0) -> list:
    """Launchable tensor-core plans with random warp and block tiles (the tuned plan's L2 tiles)."""
    from cachetile import make_plan
    from cachetile.models.costmodel import level_usage

    rng = random.Random(seed)
    order = ["m", "n", "k"]
    plans, tries = [], 0
    while len(plans) < count and tries < 10000:
        tries += 1
        warp = {"m": rng.choice([16, 32, 64]), "n": rng.choice([16, 32, 64]), "k": 16}
        block = {"m": warp["m"] * rng.choice([1, 2, 4]), "n": warp["n"] * rng.choice([1, 2, 4]), "k": rng.choice([16, 32, 64])}
        tiles = [warp, block, {"m": block["m"], "n": workload.dims["n"], "k": workload.dims["k"]}]
        fits = all(float(level_usage(workload, hardware, j, tiles[j], stages)) <= lv.capacity_bytes
                   for j, lv in enumerate(hardware.levels))
        if fits and bool(hardware.target.launchable(workload, tiles, stages)):
            plan = make_plan(workload, hardware, [order] * 3, tiles, stages)
            if all(p.levels != plan.levels for p in plans):
                plans.append(plan)
    return plans


def export(out: Path, arch: str, hardware_name: str) -> None:
    from cachetile import builtin, preset, tune
    from cachetile.backends.base import BuildOptions, get_backend

    hw, backend, options = preset(hardware_name), get_backend("cuda"), BuildOptions(arch=arch)
    print("| export | tiles (warp or thread / block) | stages | tensor cores | predicted TFLOP/s | shared bytes | checks |")
    print("|---|---|---|---|---|---|---|")

    def write(name, result):
        start = time.perf_counter()
        done = backend.export(result, out / name, options)
        plan, launch = result.plan, result.plan.launch
        tiles = " / ".join(",".join(f"{x}{t}" for x, t in lv.tile.items()) for lv in plan.levels[:2])
        smem = json.loads((out / name / "launch.json").read_text())["kernels"][0]["dynamic_shared_bytes"]
        print(f"| {name} | {tiles} | {launch.stages} | {'yes' if launch.tensor_cores else 'no'} | "
              f"{result.workload.flops / plan.predicted_seconds / 1e12:.1f} | {smem} | "
              f"{'; '.join(done.checks)} ({time.perf_counter() - start:.1f} s) |", flush=True)

    for name, kind, dims, dtype, stages, _ in ROWS:
        write(name, tune(builtin(kind, dims, dtype), hw, time_limit=10, stages=stages))
    kind, dims, dtype, stages = SPEARMAN
    result = tune(builtin(kind, dims, dtype), hw, solver="enumerate", time_limit=10, top=7, stages=stages)
    plans = [result.plan, *result.alternatives]
    plans += _random_plans(result.workload, hw, stages, SPEARMAN_PLANS - len(plans))
    for i, plan in enumerate(plans):
        write(f"spearman/plan-{i:02d}", result.model_copy(update={"plan": plan, "alternatives": []}))


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    import numpy as np

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):
            r[v == value] = r[v == value].mean()
        return r

    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def run(out: Path, repeat: int) -> int:
    from cachetile.backends.cuda_run import run_all

    targets = {name: target for name, *_, target in ROWS}
    rows = run_all([out], repeat)
    print("| row | ours TFLOP/s | cuBLAS TFLOP/s | ratio | target | predicted TFLOP/s | status |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = str(Path(r["dir"]).relative_to(out))
        ok = r["status"] == "ok"
        target = targets.get(name)
        meets = "" if target is None or not ok else (" (met)" if r["ratio"] >= target else " (missed)")
        print(f"| {name} | {r['kernel_tflops']:.1f} | {r['cublas_tflops']:.1f} | {r['ratio']:.2f}{meets} | "
              f"{'>= ' + format(target, 'g') if target else '-'} | {r['predicted_tflops']:.1f} | {r['status']} |"
              if ok else f"| {name} | - | - | - | - | {r['predicted_tflops']:.1f} | {r['status']} |")
    ranked = [r for r in rows if "spearman" in Path(r["dir"]).parts and r["status"] == "ok"]
    if len(ranked) >= 2:
        rho = spearman([1 / r["predicted_tflops"] for r in ranked], [1 / r["kernel_tflops"] for r in ranked])
        print(f"\nSpearman (predicted vs measured time) over {len(ranked)} plans of fp16 gemm 4096^3: {rho:.2f} (target >= 0.8)")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="plan and export every row (needs TVM)")
    e.add_argument("out", type=Path)
    e.add_argument("--arch", default="sm_90")
    e.add_argument("--hardware", default="h100")
    r = sub.add_parser("run", help="run the exports on this machine's GPU and print the table (needs CuPy)")
    r.add_argument("out", type=Path)
    r.add_argument("--repeat", type=int, default=50)
    args = p.parse_args()
    if args.command == "export":
        export(args.out, args.arch, args.hardware)
        return 0
    from cachetile.models.errors import CachetileError

    try:
        return run(args.out, args.repeat)
    except CachetileError as exc:  # no GPU or CuPy, no exports: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
