"""Kernel benchmark: planned TVM kernels against numpy, MetaSchedule and an unfused baseline.

    python bench/kernels.py [--workloads ../shared/workloads.json] [--trials 64 200] [--plans 24]
                            [--skip-metaschedule] [--skip-spearman]

Everything is measured in this one process, side by side: each kernel's
GFLOP/s beside numpy's (np.matmul per op; two calls for a chain), medians of
>= 10 runs (see cachetile.backends.llvm_measure); every kernel is built through the
backend registry (cachetile.backends.base). Tables:

1. kernels: gemm 512^3, 1024^3, 1000^3 and every gemm-chain of workloads.json;
   plan and build seconds, kernel and numpy GFLOP/s, their ratio, and for
   chains the GFLOP/s of two separately planned GEMM kernels (unfused);
2. MetaSchedule (evolutionary search, xgboost cost model) at each trial count
   for gemm 1024^3 and bert-base attention: tuning seconds and GFLOP/s,
   against cachetile's plan + build seconds and GFLOP/s;
3. model vs measurement: for one gemm and one chain, the top alternatives plus
   random feasible plans, each built and timed; Spearman's rank correlation
   between predicted_seconds and measured seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from solve_times import table  # noqa: E402


def llvm():
    """The CPU backend, through the registry the CLI and the service use."""
    from cachetile.backends.base import get_backend

    return get_backend("llvm")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def unfused_gflops(chain, hw, time_limit):
    """Two planned GEMM kernels, C = A B then E = C D, timed back to back."""
    from cachetile import builtin, tune
    from cachetile.backends.llvm_measure import kernel_args, time_kernel
    from cachetile.models.measurement import random_inputs

    d = chain.dims
    batch = {"b": d["b"]} if "b" in d else {}
    kind = "batch-gemm" if batch else "gemm"
    g1 = builtin(kind, {**batch, "m": d["m"], "n": d["l"], "k": d["k"]})
    g2 = builtin(kind, {**batch, "m": d["m"], "n": d["n"], "k": d["l"]})
    total, c = 0.0, None
    for g in (g1, g2):
        lib = llvm().build(g, hw, tune(g, hw, time_limit=time_limit, top=0).plan).lib.mod
        args = kernel_args(g, random_inputs(g))
        if c is not None:
            args[0] = c  # E = C D reads the first kernel's output
        total += time_kernel(lib, args)
        c = args[-1]
    return chain.flops / total / 1e9


def kernel_rows(workloads, hw, time_limit):
    from cachetile import tune

    rows = []
    for name, w in workloads:
        log(f"kernels: {name}")
        start = time.perf_counter()
        result = tune(w, hw, time_limit=time_limit, top=0)
        plan_s = time.perf_counter() - start
        m = llvm().measure(result)
        unfused = f"{unfused_gflops(w, hw, time_limit):.1f}" if w.kind == "gemm-chain" else "-"
        rows.append((name, f"{plan_s:.2f}", f"{m.build_seconds:.2f}", f"{m.kernel_gflops:.1f}", f"{m.reference_gflops:.1f}",
                     f"{m.ratio:.2f}", unfused))
    return table(("workload", "plan s", "build s", "kernel GFLOP/s", "numpy GFLOP/s", "kernel/numpy", "unfused GFLOP/s"),
                 rows)


def metaschedule_kernel(w, hw, trials):
    """MetaSchedule's kernel for `w` after `trials` trials, and the seconds to it (tuning + compiling)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from cachetile.backends.llvm_build import llvm_target
    from cachetile.backends.tensorir import primfunc

    target = tvm.target.Target(llvm_target(hw.cores))
    mod = tvm.IRModule({"main": primfunc(w)})
    with tempfile.TemporaryDirectory() as work, contextlib.redirect_stdout(sys.stderr):  # its logs
        start = time.perf_counter()
        db = ms.tune_tir(mod, target, work, max_trials_global=trials, num_trials_per_iter=64,
                         num_tuning_cores=hw.cores)
        sch = ms.tir_integration.compile_tir(db, mod, target)
        lib = tvm.compile(sch.mod, target=target)
        return time.perf_counter() - start, lib


def metaschedule_rows(workloads, hw, trials, time_limit):
    from cachetile import tune
    from cachetile.backends.llvm_measure import kernel_args, time_kernel
    from cachetile.models.measurement import random_inputs

    rows = []
    for name, w in workloads:
        start = time.perf_counter()
        result = tune(w, hw, time_limit=time_limit, top=0)
        built = llvm().build(w, hw, result.plan)
        ours_s = time.perf_counter() - start
        args = kernel_args(w, random_inputs(w))
        ours = w.flops / time_kernel(built.lib.mod, args) / 1e9
        rows.append((name, "cachetile", f"{ours_s:.2f}", f"{ours:.1f}", "1.00", "1.00"))
        for n in trials:
            log(f"metaschedule: {name}, {n} trials")
            secs, lib = metaschedule_kernel(w, hw, n)
            gflops = w.flops / time_kernel(lib.mod, args) / 1e9
            rows.append((name, f"MetaSchedule {n}", f"{secs:.1f}", f"{gflops:.1f}", f"{secs / ours_s:.0f}",
                         f"{ours / gflops:.2f}"))
    return table(("workload", "method", "seconds to a kernel", "GFLOP/s", "its seconds / ours", "our GFLOP/s / its"),
                 rows)


def random_plan(space, rng):
    """A random plan the backend can emit: nested legal tiles that fit, random orders, a plan the
    target admits."""
    w, n = space.workload, space.n_levels
    for _ in range(10_000):
        tiles, parent = [None] * n, dict(w.dims)
        for j in reversed(range(n)):
            t = {}
            for x in space.loops:
                c = space.candidates[x]
                ok = c[space.legal(x, c, parent[x], j)]
                t[x] = int(rng.choice(list(ok) or [space.smallest_tiles()[x]]))
            if space.usage(j, t) > space.hardware.levels[j].capacity_bytes:
                break
            if j == 0 and not bool(space.admits([t, *tiles[1:]])):
                break
            tiles[j], parent = t, t
        else:
            for _ in range(100):  # the target may admit the tiles under some orders only
                orders = [list(space.orders[rng.randrange(len(space.orders))]) for _ in range(n)]
                if bool(space.admits(tiles, orders)):
                    return orders, tiles
    raise RuntimeError("no random feasible plan found")


def _round_order(count: int, rng) -> list[int]:
    """The order one round times `count` kernels in: shuffled by `rng`, or as given (None)."""
    order = list(range(count))
    if rng is not None:
        rng.shuffle(order)
    return order


def time_in_rounds(libs, args, rounds: int, repeat: int = 10, rng=None) -> list[list[float]]:
    """Each kernel's time in each of `rounds` rounds (time_kernel: the median of `repeat` runs of
    >= 20 ms of calls). Every round times each kernel in turn, in an order `rng` shuffles (None:
    as given), so that drift in the machine's speed hits all kernels alike."""
    from cachetile.backends.llvm_measure import time_kernel

    times = [[] for _ in libs]
    for _ in range(rounds):
        for i in _round_order(len(libs), rng):
            times[i].append(time_kernel(libs[i], args, repeat))
    return times


def interleaved_schedule(sizes: list[int], rounds: int, rng=None) -> list[tuple[int, list[int]]]:
    """The (group, order of its kernels) each fresh process of time_interleaved runs, in turn:
    round r visits every group before round r+1 starts."""
    return [(g, _round_order(n, rng)) for _ in range(rounds) for g, n in enumerate(sizes)]


def time_interleaved(groups, rounds: int, repeat: int = 10, rng=None,
                     timeout: float = 600.0) -> list[list[list[float]]]:
    """Like time_in_rounds, for several (libs, workload) groups: per group, per kernel, its
    seconds in each round. Each round of a group runs in a fresh process (TVM's PopenWorker),
    which loads the group's kernels from exported files and times each in turn (order shuffled
    by `rng`), and round r of every group runs before round r+1 of any (interleaved_schedule).

    Where a kernel's packed buffers land decides up to 1.9x for some plans (gemm 1024^3
    `mkn:17,16,2 | kmn:17,16,2 | kmn:17,16,2 | kmn:34,32,22`: 25-27 ms in most processes, 45-50 in
    others), and one process keeps the same placement for all its rounds: its median is one
    draw. A process per round makes the median one over `rounds` placements.

    This host's cores hand data to each other at one of two speeds, and a state can outlast a
    group's rounds (half a minute): in one fidelity run (BENCHMARKS.md, "Interleaved session")
    the gemm 127x251x509 plans whose packed blocks one core writes for the other ran 1.7-2x
    their time in all 10 of their rounds, in another in none. Interleaved, every group's rounds
    spread over the whole run, so that each group's medians see the machine's states in about
    the same shares instead of one draw of them."""
    from tvm.support.popen_pool import PopenWorker

    from cachetile.backends.llvm_measure import time_exported

    times = [[[] for _ in libs] for libs, _ in groups]
    with tempfile.TemporaryDirectory(prefix="cachetile-rounds-") as tmp:
        paths = [[os.path.join(tmp, f"group{g}-kernel{i}.so") for i in range(len(libs))]
                 for g, (libs, _) in enumerate(groups)]
        for (libs, _), mine in zip(groups, paths):
            for lib, path in zip(libs, mine):
                lib.export_library(path)
        for k, (g, order) in enumerate(interleaved_schedule([len(libs) for libs, _ in groups], rounds, rng)):
            if g == 0:
                log(f"timing: round {k // len(groups) + 1}/{rounds}")
            worker = PopenWorker()
            try:
                worker.send(time_exported, ([paths[g][i] for i in order], groups[g][1], repeat), timeout=timeout)
                for i, t in zip(order, worker.recv()):
                    times[g][i].append(t)
            finally:
                worker.kill()
    return times


def spearman_rows(workloads, hw, n_plans, time_limit, seed=0):
    from scipy.stats import spearmanr

    from cachetile import make_plan, tune
    from cachetile.backends.llvm_measure import kernel_args, time_kernel
    from cachetile.models.measurement import random_inputs
    from cachetile.optimizer.space import Space

    rows = []
    rng = random.Random(seed)
    for name, w in workloads:
        result = tune(w, hw, time_limit=time_limit, top=n_plans // 2)
        plans = [result.plan, *result.alternatives]
        space = Space(w, hw)
        while len(plans) < n_plans:
            orders, tiles = random_plan(space, rng)
            plans.append(make_plan(w, hw, orders, tiles))
        args = kernel_args(w, random_inputs(w))
        predicted, measured = [], []
        for i, plan in enumerate(plans):
            log(f"model vs measurement: {name}, plan {i + 1}/{len(plans)}")
            predicted.append(plan.predicted_seconds)
            measured.append(time_kernel(llvm().build(w, hw, plan).lib.mod, args))
        rho = spearmanr(predicted, measured).statistic
        best = min(range(len(plans)), key=lambda i: measured[i])
        rows.append((name, str(len(plans)), f"{rho:.2f}", f"{measured[0] * 1e3:.2f}", f"{measured[best] * 1e3:.2f}",
                     f"{min(predicted) * 1e3:.2f}"))
    return table(("workload", "plans", "Spearman", "best plan ms", "fastest measured ms", "best predicted ms"), rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=str(ROOT.parent / "shared" / "workloads.json"))
    ap.add_argument("--hardware", default="host")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--trials", type=int, nargs="+", default=[64, 200])
    ap.add_argument("--plans", type=int, default=24)
    ap.add_argument("--skip-metaschedule", action="store_true")
    ap.add_argument("--skip-spearman", action="store_true")
    args = ap.parse_args()

    from cachetile import builtin, hardware_from
    from cachetile.backends.llvm_build import use_all_cores

    hw = hardware_from(args.hardware)
    use_all_cores(hw)
    shared = json.loads(Path(args.workloads).read_text())["workloads"]
    by_name = {d["name"]: builtin(d["kind"], d["dims"]) for d in shared}
    rows = [("gemm-512", builtin("gemm", {"m": 512, "n": 512, "k": 512})),
            ("gemm-1024", builtin("gemm", {"m": 1024, "n": 1024, "k": 1024})),
            ("gemm-1000", builtin("gemm", {"m": 1000, "n": 1000, "k": 1000}))]
    rows += [(name, w) for name, w in by_name.items() if w.kind == "gemm-chain"]
    print(f"# cachetile kernels on {hw.name} ({hw.cores} cores, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']})\n")
    print(kernel_rows(rows, hw, args.time_limit) + "\n", flush=True)
    if not args.skip_metaschedule:
        ms_rows = [("gemm-1024", rows[1][1]), ("bert-base-attention", by_name["bert-base-attention"])]
        print(metaschedule_rows(ms_rows, hw, args.trials, args.time_limit) + "\n", flush=True)
    if not args.skip_spearman:
        sp_rows = [("gemm-1024", rows[1][1]), ("bert-base-attention", by_name["bert-base-attention"])]
        print(spearman_rows(sp_rows, hw, args.plans, args.time_limit), flush=True)


if __name__ == "__main__":
    main()
