"""Autotuning benchmark: how close `--autotune K` gets to the fastest plan, what it costs next to
MetaSchedule, what measuring through TVM RPC costs, and what refitting the model to the
measurements changes.

    python bench/autotune.py [--k 8] [--pool 24] [--rounds 3] [--trials 64 200]
                             [--skip-metaschedule] [--skip-rpc] [--store PATH]
    python bench/autotune.py --shapes [--k 8] [--store PATH]     (tables 5 and 4 alone)

Tables (every time a median of >= 10 runs, see cachetile.backends.llvm_measure; where a kernel
is timed in several rounds, its fastest round counts):

1. quality: per workload, `autotune()` with K candidates, then a pool of >= `--pool` plans (the
   autotuned one, the model's next distinct plans, random feasible ones to fill up) timed in
   `--rounds` interleaved rounds (each plan's fastest round counts); the autotuned plan's time
   over the pool's fastest, the model's own choice's too, the autotuned kernel against numpy,
   and the noise: the median over the pool of (slowest round / fastest round - 1);
2. time to a kernel on gemm 1024^3 and bert-base attention: plan + autotune-K + build against
   MetaSchedule with each trial count, both kernels then timed side by side;
3. RPC on loopback: the same K plans measured here and through a tracker with two one-thread
   servers (plans made for one core): the wall time of measuring (less the builds, which are
   the same sequential work in both), the plan each picks (index in the model's order), and the
   median gap between the fastest and the runner-up; two rounds each;
4. refit: the model's peak, bandwidths and serial costs refitted to table 1's (or 5's)
   measurements (models/refit.py), in all and leaving each workload out in turn;
5. `--shapes`: bench/shapes.py's shapes (the calibration issue's benchmark), each autotuned with
   K candidates: the chosen kernel and the model's own first plan against numpy (timed once per
   shape, before the kernels, as `--autotune` does), and their geometric means.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from kernels import llvm, log, metaschedule_kernel, random_plan, time_in_rounds  # noqa: E402
from solve_times import table  # noqa: E402

WORKLOADS = [  # (name, kind, dims): non-powers of two in five of eight
    ("gemm-1024", "gemm", {"m": 1024, "n": 1024, "k": 1024}),
    ("gemm-1000", "gemm", {"m": 1000, "n": 1000, "k": 1000}),
    ("gemm-555x777x333", "gemm", {"m": 555, "n": 777, "k": 333}),
    ("gemm-tall", "gemm", {"m": 4096, "n": 64, "k": 1024}),
    ("batch-gemm-8x200x300x100", "batch-gemm", {"b": 8, "m": 200, "n": 300, "k": 100}),
    ("bert-base-attention", "gemm-chain", {"b": 12, "m": 512, "k": 64, "l": 512, "n": 64}),
    ("chain-4x300x96x500x80", "gemm-chain", {"b": 4, "m": 300, "k": 96, "l": 500, "n": 80}),
    ("mlp-chain", "gemm-chain", {"m": 256, "k": 768, "l": 3072, "n": 768}),
]


def request(w, hw, k, time_limit=10.0, **kw):
    from cachetile.api.request import PlanRequest

    return PlanRequest(workload=w, hardware=hw, time_limit=time_limit, autotune=k, **kw)


def pool_for(w, hw, first, size, rng):
    """`first` (plans that must be in it), the model's next distinct plans, then random feasible
    plans: at least `size` distinct plans."""
    from cachetile import make_plan, tune
    from cachetile.api.autotune import SOLVER_PLANS_PER_CANDIDATE, distinct
    from cachetile.optimizer.space import Space

    result = tune(w, hw, time_limit=10, top=SOLVER_PLANS_PER_CANDIDATE * size - 1)
    plans = distinct(w, [*first, result.plan, *result.alternatives])[:max(size, len(first))]
    space = Space(w, hw)
    while len(plans) < size:
        orders, tiles = random_plan(space, rng)
        plans = distinct(w, plans + [make_plan(w, hw, orders, tiles)])
    return plans


def time_side_by_side(w, libs, rounds, rng):
    """Each kernel's median time in each of `rounds` interleaved rounds in shuffled order."""
    from cachetile.backends.llvm_measure import kernel_args
    from cachetile.models.measurement import random_inputs

    return time_in_rounds(libs, kernel_args(w, random_inputs(w, seed=1)), rounds, rng=rng)


def numpy_seconds(w):
    from cachetile.backends.llvm_measure import _median_seconds, settle
    from cachetile.models.measurement import random_inputs, reference

    arrays, ref = random_inputs(w, seed=1), reference(w)
    settle()
    return _median_seconds(lambda: ref(arrays), 10)


def quality_rows(workloads, hw, k, pool_size, rounds, store, seed=0):
    from cachetile.api.autotune import autotune, signature
    from cachetile.models.refit import MeasuredPlan

    rng, rows, ratios, vs_numpy = random.Random(seed), [], [], []
    for name, w in workloads:
        log(f"quality: {name}: autotune {k}")
        result = autotune(request(w, hw, k))
        a = result.autotune
        ran = [result.plan, *result.alternatives]  # in the order of a.candidates
        model = next((p for c, p in zip(a.candidates, ran) if c.rank == 0), None)  # None: it was dropped
        plans = pool_for(w, hw, [result.plan] + ([model] if model else []), pool_size, rng)
        log(f"quality: {name}: timing a pool of {len(plans)} plans, {rounds} rounds")
        numpy_s = numpy_seconds(w)
        runs = time_side_by_side(w, [llvm().build(w, hw, p).lib.mod for p in plans], rounds, rng)
        times = [min(r) for r in runs]  # on a shared machine other tenants only slow a timing down
        fastest, spread = min(times), float(np.median([max(r) / min(r) - 1 for r in runs]))
        model_t = times[[signature(w, p) for p in plans].index(signature(w, model))] if model else None
        ratios.append(times[0] / fastest)
        vs_numpy.append(numpy_s / times[0])
        rows.append((name, f"{a.seconds:.1f}", f"{a.measured}/{len(a.candidates)}", str(a.chosen_rank), str(len(plans)),
                     f"{times[0] * 1e3:.3f}", f"{fastest * 1e3:.3f}", f"{times[0] / fastest:.3f}",
                     "-" if model_t is None else f"{model_t / fastest:.3f}", f"{numpy_s / times[0]:.2f}",
                     f"{100 * spread:.0f}%"))
        store.add([MeasuredPlan(workload=w, hardware=hw, plan=p, measured_seconds=t, device=a.device,
                                threads=hw.cores, source="bench/autotune.py") for p, t in zip(plans, times)])
    geomean = [float(np.exp(np.mean(np.log(v)))) for v in (ratios, vs_numpy)]
    rows.append(("geomean", "", "", "", "", "", "", f"{geomean[0]:.3f}", "", f"{geomean[1]:.2f}", ""))
    return table(("workload", "plan+autotune s", "measured/distinct", "chosen rank", "pool", "chosen ms", "fastest ms",
                  "chosen/fastest", "model's/fastest", "chosen vs numpy", "round spread"), rows)


def metaschedule_rows(workloads, hw, k, trials, rounds):
    """MetaSchedule first (its builder processes start before this process has run a kernel),
    then cachetile; then every kernel timed side by side."""
    from cachetile.api.autotune import autotune

    rng, rows = random.Random(1), []
    for name, w in workloads:
        libs, seconds = [], []
        for n in trials:
            log(f"time to a kernel: {name}: MetaSchedule {n} trials")
            secs, lib = metaschedule_kernel(w, hw, n)
            libs.append(lib.mod)
            seconds.append(secs)
        log(f"time to a kernel: {name}: cachetile autotune {k}")
        start = time.perf_counter()
        result = autotune(request(w, hw, k))
        libs.insert(0, llvm().build(w, hw, result.plan).lib.mod)
        seconds.insert(0, time.perf_counter() - start)
        gflops = [w.flops / min(t) / 1e9 for t in time_side_by_side(w, libs, rounds, rng)]
        for label, secs, g in zip([f"cachetile autotune {k}", *[f"MetaSchedule {n}" for n in trials]], seconds, gflops):
            rows.append((name, label, f"{secs:.1f}", f"{g:.1f}", f"{secs / seconds[0]:.1f}", f"{gflops[0] / g:.2f}"))
    return table(("workload", "method", "seconds to a kernel", "GFLOP/s", "its seconds / ours", "our GFLOP/s / its"),
                 rows)


def rpc_rows(workloads, hw, k, rounds=2):
    """Wall time of measure_plans here and through the fleet, builds included (here LLVM's code
    generation runs for every candidate at once on every core; for the fleet each kernel is
    exported in turn), and the plan each run picks. The builds' own seconds cannot be taken
    out: summed per kernel they overstate the parallel code generation's wall time."""
    from cachetile.api.autotune import choose_candidates, ranked
    from cachetile.backends.rpc_fleet import Fleet

    one = hw.model_copy(update={"cores": 1})  # serial kernels: the servers and this process run them alike
    rows = []
    with Fleet(servers=2, key="bench", threads=1) as fleet:
        for name, w in workloads:
            result, plans = choose_candidates(w, one, k)
            walls, picks, gaps = {"local": [], "rpc": []}, {"local": [], "rpc": []}, []
            for r in range(rounds):
                for where, remote in (("local", None), ("rpc", fleet.rpc)):
                    log(f"rpc: {name}: round {r + 1}, {where}")
                    start = time.perf_counter()
                    trials = llvm().measure_plans(result, plans, remote=remote)
                    walls[where].append(time.perf_counter() - start)
                    picks[where].append(ranked(trials)[0])
                    seconds = sorted(t.measurement.kernel_seconds for t in trials if t.measurement)
                    gaps.append(seconds[1] / seconds[0] - 1)
            same = len(set(picks["local"] + picks["rpc"])) == 1
            rows.append((name, str(len(plans)), " ".join(f"{s:.2f}" for s in walls["local"]),
                         " ".join(f"{s:.2f}" for s in walls["rpc"]),
                         f"{np.median(walls['local']) / np.median(walls['rpc']):.2f}",
                         " ".join(map(str, picks["local"])), " ".join(map(str, picks["rpc"])),
                         "yes" if same else "no", f"{100 * np.median(gaps):.1f}%"))
    return table(("workload", "plans", "local build+measure s", "rpc build+measure s", "local/rpc", "local picks", "rpc picks",
                  "same plan", "runner-up gap"), rows)


def shapes_rows(hw, k, store):
    """Table 5: each shape of bench/shapes.py autotuned with K candidates (kept in `store`)."""
    from shapes import SHAPES

    from cachetile import builtin
    from cachetile.api.autotune import autotune

    rows, chosen, first = [], [], []
    for name, kind, dims in SHAPES:
        log(f"shapes: {name}: autotune {k}")
        w = builtin(kind, dims)
        a = autotune(request(w, hw, k), store=store).autotune
        model = next((c.measurement for c in a.candidates if c.rank == 0 and c.measurement), None)
        best = a.candidates[0].measurement
        chosen.append(best.ratio)
        first.append(model.ratio if model else None)
        rows.append((name, f"{a.seconds:.1f}", f"{a.measured}/{len(a.candidates)}", str(a.chosen_rank),
                     f"{best.kernel_gflops:.1f}", f"{best.reference_gflops:.1f}", f"{best.ratio:.2f}",
                     "-" if model is None else f"{model.ratio:.2f}"))

    def geomean(values):
        values = [v for v in values if v]
        return f"{float(np.exp(np.mean(np.log(values)))):.2f}"

    rows.append(("geomean", "", "", "", "", "", geomean(chosen), geomean(first)))
    return table(("shape", "plan+autotune s", "measured/distinct", "chosen rank", "chosen GFLOP/s", "numpy GFLOP/s",
                  "chosen/numpy", "model's first/numpy"), rows)


def refit_rows(hw, store, workloads):
    """The refit on every measurement, then on all but one workload, judged on that workload: how
    well it predicts the held-out plans, and how fast the plan it ranks first among them is."""
    from cachetile.api.measurements import format_fit
    from cachetile.models.refit import agreement, predictions, refit

    def number(value):
        return "-" if value is None else f"{value:.2f}"

    def pick(hardware, test):  # measured time of the plan the model ranks first, over the fastest
        seconds = np.array([r.measured_seconds for r in test])
        return seconds[int(np.argmin(predictions(hardware, test)))] / seconds.min()

    records = store.records(like=hw)
    fit = refit(hw, records)
    rows = [("all (judged on all)", str(fit.records), f"{fit.rms_log_error_before:.3f}", f"{fit.rms_log_error_after:.3f}",
             number(fit.spearman_before), number(fit.spearman_after), "", "")]
    for name, w in workloads:
        held = refit(hw, [r for r in records if r.workload != w])
        test = [r for r in records if r.workload == w]
        (rms0, _, rho0), (rms1, _, rho1) = agreement(hw, test), agreement(held.hardware, test)
        rows.append((f"all but {name} (judged on it)", str(held.records), f"{rms0:.3f}", f"{rms1:.3f}", number(rho0),
                     number(rho1), f"{pick(hw, test):.3f}", f"{pick(held.hardware, test):.3f}"))
    return (format_fit(fit, hw.name) + "\n\n" +
            table(("fitted on", "plans", "rms ln before", "rms ln after", "Spearman before", "Spearman after",
                   "first-ranked/fastest before", "after"), rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="host")
    ap.add_argument("--cores", type=int, help="plan for (and run on) this many cores instead of the hardware's")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--pool", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, nargs="+", default=[64, 200])
    ap.add_argument("--only", nargs="+", help="workload names from WORKLOADS")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-metaschedule", action="store_true")
    ap.add_argument("--skip-rpc", action="store_true")
    ap.add_argument("--rpc-only", action="store_true",
                    help="table 3 alone, this process on one thread like the servers (the full run starts it so)")
    ap.add_argument("--store", help="SQLite file to keep table 1's measurements in (default: a temporary one)")
    ap.add_argument("--refit-only", action="store_true", help="table 4 alone, from the measurements in --store")
    ap.add_argument("--shapes", action="store_true", help="table 5 (bench/shapes.py's shapes), then table 4 on them")
    args = ap.parse_args()

    from cachetile import builtin, hardware_from
    from cachetile.api.measurements import MeasurementStore
    from cachetile.backends.llvm_build import use_all_cores
    from cachetile.backends.llvm_measure import cpu_name

    if args.rpc_only:
        # One thread here too: a one-core plan still shares its packing copies among TVM's threads.
        os.environ["TVM_NUM_THREADS"] = "1"
    hw = hardware_from(args.hardware)
    if args.cores:
        hw = hw.model_copy(update={"cores": args.cores})
        os.environ["TVM_NUM_THREADS"] = str(args.cores)
    use_all_cores(hw)
    workloads = [(n, builtin(kind, dims)) for n, kind, dims in WORKLOADS if not args.only or n in args.only]
    store = MeasurementStore(args.store or os.path.join(tempfile.mkdtemp(), "measurements.sqlite"))
    if args.shapes:
        from shapes import SHAPES

        state = f"calibrated {hw.calibrated}" if hw.calibrated else "assumed figures (no calibration profile)"
        print(f"# autotuning the shapes on {cpu_name()} ({hw.cores} cores); hardware {hw.name}: {state}\n")
        print(shapes_rows(hw, args.k, store) + "\n", flush=True)
        workloads = [(n, builtin(kind, dims)) for n, kind, dims in SHAPES]
    if args.refit_only or args.shapes:
        print(refit_rows(hw, store, workloads))
        return
    if args.rpc_only:
        small = [("gemm-512", "gemm", {"m": 512, "n": 512, "k": 512}), WORKLOADS[1], WORKLOADS[6]]
        print(rpc_rows([(n, builtin(kind, dims)) for n, kind, dims in small], hw, args.k), flush=True)
        return
    print(f"# autotuning on {cpu_name()} ({hw.cores} cores, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']})\n")
    if not args.skip_quality:
        print(quality_rows(workloads, hw, args.k, args.pool, args.rounds, store) + "\n", flush=True)
        print(refit_rows(hw, store, workloads) + "\n", flush=True)
    if not args.skip_metaschedule:
        ms = [(n, w) for n, w in workloads if n in ("gemm-1024", "bert-base-attention")]
        print(metaschedule_rows(ms, hw, args.k, args.trials, args.rounds) + "\n", flush=True)
    if not args.skip_rpc:
        import subprocess

        subprocess.run([sys.executable, __file__, "--rpc-only", "--k", str(args.k), "--hardware", args.hardware],
                       check=True)


if __name__ == "__main__":
    main()
