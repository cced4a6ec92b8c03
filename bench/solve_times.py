"""Solve-time benchmark: prints a table (see BENCHMARKS.md for recorded runs).

    python bench/solve_times.py [--workloads ../shared/workloads.json] [--time-limit 10]

Part 1 times the two `tune` commands the core issue sets targets for, as a user
runs them (a fresh process, wall clock, best of 3). Part 2 solves every
workload in workloads.json with each solver on each hardware preset in one
process and reports solve seconds, status and predicted time relative to
`enumerate`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CLI_TARGETS = [
    (["gemm", "--M", "1024", "--N", "1024", "--K", "1024"], 1.0),
    (["gemm-chain", "--M", "512", "--N", "64", "--K", "64", "--L", "512", "--batch", "12", "--hardware", "host"], 2.0),
    (["gemm-chain", "--M", "197", "--N", "64", "--K", "64", "--L", "197", "--batch", "12"], 2.0),
    (["gemm", "--M", "1000", "--N", "1000", "--K", "1000"], 2.0),
]


def cli_walls(repeats: int = 3):
    tune = Path(sys.executable).with_name("tune")
    rows = []
    for args, target in CLI_TARGETS:
        walls, status = [], ""
        for _ in range(repeats):
            start = time.perf_counter()
            out = subprocess.run([str(tune), *args, "--json"], capture_output=True, text=True, check=True).stdout
            walls.append(time.perf_counter() - start)
            doc = json.loads(out)
            status = doc["solver"]["status"]
        rows.append(("tune " + " ".join(args), f"{min(walls):.2f}", f"{target:.1f}", status, str(len(doc["hardware"]["levels"]))))
    return rows


def all_cores_host():
    """The `host` hardware with TVM on every core, after printing the CPU and where its figures
    come from: (hardware, threads, float32 lanes of a vector)."""
    threads = os.cpu_count() or 1
    os.environ["TVM_NUM_THREADS"] = str(threads)
    from cachetile import hardware_from
    from cachetile.backends.llvm_build import use_all_cores
    from cachetile.models.hardware import _cpu_model

    hw = hardware_from("host")
    use_all_cores(hw)
    print(f"# {_cpu_model()}, {threads} threads; hardware host: {hw.source}\n")
    return hw, threads, (hw.vector_bytes or 16) // 4


def plan_spec(plan, sep: str = " | ") -> str:
    """A plan's levels, registers first, each as its loop order and tile: `mnk:4,64,1`."""
    return sep.join(f"{''.join(lv.order)}:{','.join(map(str, lv.tile.values()))}" for lv in plan.levels)


def gemm_plan(w, hw, levels):
    """The plan of GEMM `w` whose `levels` (registers first) are (order, (m, n, k) tile) pairs."""
    from cachetile import make_plan

    return make_plan(w, hw, [list(order) for order, _ in levels], [dict(zip("mnk", tile)) for _, tile in levels])


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=str(ROOT.parent / "shared" / "workloads.json"))
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument(
        "--hardware", nargs="+", default=["host", "h100", "host:mem", "h100:mem"],
        help="presets; NAME:mem drops the compute term (peak_flops -> 1e30) so data movement decides",
    )
    ap.add_argument("--solvers", nargs="+", default=["enumerate", "auto", "pyomo-ipopt", "pyomo-scip"])
    args = ap.parse_args()

    from cachetile import builtin, preset, tune

    print("## CLI wall time (fresh process, best of 3)\n")
    print(table(("command", "wall s", "target s", "status", "levels"), cli_walls()))

    workloads = json.loads(Path(args.workloads).read_text())["workloads"]
    rows = []
    for hw_name in args.hardware:
        base, _, variant = hw_name.partition(":")
        hw = preset(base)
        if variant == "mem":
            hw = hw.model_copy(update={"peak_flops": 1e30})
        for entry in workloads:
            w = builtin(entry["kind"], entry["dims"])
            exact = None
            for solver in args.solvers:
                start = time.perf_counter()
                result = tune(w, hw, solver, args.time_limit, top=3)
                wall = time.perf_counter() - start
                exact = exact or result.plan.predicted_seconds
                rows.append((
                    hw_name, entry["name"], solver, f"{wall:.2f}", result.solver.status,
                    f"{result.plan.predicted_seconds * 1e3:.4f}", result.plan.bottleneck,
                    f"{result.plan.predicted_seconds / exact:.4f}",
                ))
    print(f"\n## Solve time per workload (time limit {args.time_limit:g} s)\n")
    print(table(("hardware", "workload", "solver", "solve s", "status", "predicted ms", "bottleneck", "vs enumerate"), rows))


if __name__ == "__main__":
    main()
