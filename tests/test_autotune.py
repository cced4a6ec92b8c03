"""`--autotune K`: K of the model's best distinct plans built, checked against numpy, timed; the fastest
returned, failures dropped with their reason, the result cached and the measurements stored."""
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from cachetile import builtin, make_plan, preset
from cachetile import tune
from cachetile.api.autotune import TIE, AutotuneResult, autotune, distinct, ranked, signature, spread
from cachetile.api.measurements import MeasurementStore
from cachetile.api.request import PlanRequest
from cachetile.backends import llvm
from cachetile.backends.base import Built
from cachetile.backends.llvm_measure import check
from cachetile.models.errors import BuildFailed, InvalidInput
from cachetile.models.measurement import TOLERANCE

HOST = preset("host")
W = builtin("gemm", {"m": 50, "n": 40, "k": 36})  # no power of two
TUNE = [sys.executable, "-m", "cachetile.api.cli"]
HOST_PLAN = make_plan(W, HOST, [["m", "n", "k"]] * 4, [W.dims] * 4)


def request(k, **kw):
    return PlanRequest(workload=W, hardware=HOST, time_limit=3, autotune=k, **kw)


def test_returns_the_measured_fastest_of_k_distinct_plans(tmp_path):
    store = MeasurementStore(tmp_path / "plans.sqlite")
    seen = []
    result = autotune(request(3), progress=lambda f, m: seen.append(f), store=store)
    a = result.autotune
    assert isinstance(result, AutotuneResult) and a.k == 3 and a.measured == 3 and a.rpc is None
    plans = [result.plan, *result.alternatives]
    # The candidates that ran line up with [plan, *alternatives]: the returned one (the model's best
    # of those within TIE of the fastest), then the others fastest first.
    measured = [c.measured_seconds for c in a.candidates]
    assert measured[1:] == sorted(measured[1:]) and len(plans) == 3
    ties = [c.rank for c in a.candidates if c.measured_seconds <= min(measured) * (1 + TIE)]
    assert a.chosen_rank == a.candidates[0].rank == min(ties)
    assert sorted(c.rank for c in a.candidates) == [0, 1, 2]
    assert len({signature(W, p) for p in plans}) == 3  # three different kernels
    for c, plan in zip(a.candidates, plans):
        assert c.predicted_seconds == plan.predicted_seconds
        assert c.measurement.kernel_seconds == c.measured_seconds > 0 and c.error is None
        assert c.measurement.max_abs_error < TOLERANCE["float32"] * 50
        assert c.measurement.reference == "numpy" and c.measurement.reference_seconds > 0
    assert a.speedup == pytest.approx(next(c for c in a.candidates if c.rank == 0).measured_seconds / measured[0])
    # The returned plan builds into a kernel that matches numpy on other inputs too.
    check(W, llvm.LlvmBackend().build(W, HOST, result.plan).lib, seed=7)
    assert seen == sorted(seen) and seen[-1] == 1.0
    records = store.records(like=HOST)
    assert len(records) == 3 and {r.measured_seconds for r in records} == set(measured)
    assert all(r.threads == HOST.cores and r.hardware.model_dump() == HOST.model_dump() for r in records)


def test_distinct_drops_plans_that_differ_only_in_loops_that_run_once():
    tiles = [{"m": 10, "n": 16, "k": 1}, {"m": 10, "n": 40, "k": 36}, W.dims, W.dims]
    a = make_plan(W, HOST, [["m", "n", "k"]] * 4, tiles)
    b = make_plan(W, HOST, [["n", "m", "k"], *[["m", "n", "k"]] * 3], tiles)  # m runs once at registers
    c = make_plan(W, HOST, [["m", "k", "n"], *[["m", "n", "k"]] * 3], tiles)  # k and n swap: another kernel
    assert distinct(W, [a, b, c]) == [a, c]


def test_spread_takes_one_plan_per_register_tile_first_and_keeps_the_model_order():
    upper = [{"m": 10, "n": 40, "k": 36}, W.dims, W.dims]
    a, b, c = ({"m": m, "n": n, "k": 1} for m, n in ((10, 16), (5, 32), (2, 40)))
    plans = [make_plan(W, HOST, [["m", "n", "k"]] * 4, [r, *upper]) for r in (a, a, b, a, c, b)]
    # a's best, b's best, c's best, then a's second: plans 0, 2, 4, 1, in the plans' order.
    assert spread(plans, 4) == [plans[0], plans[1], plans[2], plans[4]]
    assert spread(plans, 2) == [plans[0], plans[2]]
    assert spread(plans, 9) == plans and spread([], 3) == []


def test_ranked_returns_the_fastest_unless_the_model_prefers_one_within_the_noise():
    def trials(*seconds):  # None: a dropped candidate
        return [SimpleNamespace(measurement=s and SimpleNamespace(kernel_seconds=s)) for s in seconds]

    assert ranked(trials(1.0, 0.995, 1.2)) == [0, 1, 2]  # 0.5% apart: the model's rank 0 is returned
    assert ranked(trials(1.0, 1.2, 0.97)) == [2, 0, 1]  # 3% apart: the fastest
    assert ranked(trials(None, 1.01, 1.0, 1.3)) == [1, 2, 3]
    assert ranked(trials(1.0 + TIE + 1e-9, 1.0)) == [1, 0]  # just outside the tie
    assert ranked(trials(None, None)) == []


def test_tune_register_tiles_adds_the_best_plan_of_each_register_tile():
    w = builtin("gemm", {"m": 1024, "n": 1024, "k": 1024})
    plain, wide = tune(w, HOST, top=7), tune(w, HOST, top=7, register_tiles=6)
    tiles = {tuple(p.levels[0].tile.values()) for p in [wide.plan, *wide.alternatives]}
    assert len(tiles) >= 6
    # The extra searches add alternatives; where one finds a better plan than the main search,
    # that plan leads, otherwise the main search's plan does.
    assert wide.plan.predicted_seconds <= plain.plan.predicted_seconds
    assert wide.plan == plain.plan or wide.plan.predicted_seconds < plain.plan.predicted_seconds
    predicted = [p.predicted_seconds for p in [wide.plan, *wide.alternatives]]
    assert predicted == sorted(predicted)
    with pytest.raises(InvalidInput, match=r"^register_tiles must be an integer >= 0, got -1$"):
        tune(w, HOST, register_tiles=-1)


def test_a_failing_candidate_is_dropped_with_its_reason(monkeypatch):
    """The second build fails and the third kernel is 1% off: both are dropped, each with its
    reason, and the first is returned."""
    real, calls = llvm.LlvmBackend._build, []

    class Off:  # the real kernel, then its output scaled by 1.01
        def __init__(self, mod):
            self.real = mod

        def __getitem__(self, name):
            def call(*args):
                self.real[name](*args)
                args[-1].copyfrom(args[-1].numpy() * np.float32(1.01))
            return call

        def time_evaluator(self, *args, **kw):
            return self.real.time_evaluator(*args, **kw)

    def build(self, workload, hardware, plan, options):
        calls.append(plan)
        if len(calls) == 2:
            raise BuildFailed("build failed: injected")
        built = real(self, workload, hardware, plan, options)
        if len(calls) == 3:
            built = Built(type("Lib", (), {"mod": Off(built.lib.mod)})(), built.emitted, built.seconds)
        return built

    monkeypatch.setattr(llvm.LlvmBackend, "_build", build)
    result = autotune(request(3))
    a = result.autotune
    assert a.measured == 1 and result.alternatives == [] and a.chosen_rank == 0
    dropped = {c.rank: c for c in a.candidates[1:]}
    assert dropped[1].error == "build failed: injected" and dropped[1].error_kind == "build-failed"
    assert dropped[2].error_kind == "mismatch" and "the reference says" in dropped[2].error
    assert dropped[2].measured_seconds is None and dropped[2].measurement is None
    assert all("\n" not in c.error for c in dropped.values())


def cli(*args, env):
    start = time.perf_counter()
    proc = subprocess.run([*TUNE, *args], capture_output=True, text=True, timeout=300, env=env)
    return proc, time.perf_counter() - start


def test_cli_autotune_is_cached_across_processes(tmp_path):
    env = dict(os.environ, CACHETILE_CACHE=str(tmp_path / "plans.sqlite"))
    args = ["gemm", "--M", "50", "--N", "40", "--K", "36", "--time-limit", "3", "--autotune", "2", "--json"]
    first, cold = cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert [c["rank"] for c in doc["autotune"]["candidates"]] != [] and doc["autotune"]["k"] == 2
    assert all(c["predicted_seconds"] > 0 and c["measured_seconds"] > 0 for c in doc["autotune"]["candidates"])
    again, warm = cli(*args, env=env)  # a new process: the cache survived the first one
    assert again.returncode == 0 and again.stdout == first.stdout
    assert "from the plan cache" in again.stderr
    assert warm < cold  # no solve and no measurement; figures in BENCHMARKS.md
    assert len(MeasurementStore(tmp_path / "plans.sqlite").records()) == doc["autotune"]["measured"]


@pytest.mark.parametrize("args, match", [
    (["--autotune", "0"], "argument --autotune: 0 must be >= 1"),
    (["--autotune", "2", "--rpc", "localhost:9190"], "argument --rpc: expects HOST:PORT:KEY"),
    (["--autotune", "2", "--rpc", "localhost:99999:cpu"], "port 99999 is outside 1-65535"),
    (["--rpc", "localhost:9190:cpu"], "rpc measures autotune candidates: set autotune (--autotune K) too"),
    (["--autotune", "2", "--target-host", "llvm -mcpu=znver4"], "target_host (--target-host) compiles for RPC servers"),
    (["--autotune", "2", "--rpc", "127.0.0.1:9:cpu", "--target-host", "llvm -mcpu=nonsense"],
     "--target-host: this LLVM does not know CPU 'nonsense'"),
    (["--autotune", "2", "--hardware", "h100"], "--autotune times kernels on this machine, and cuda kernels need a GPU"),
])
def test_bad_autotune_flags_are_one_line(tmp_path, monkeypatch, capsys, args, match):
    from cachetile.api.cli import main
    from cachetile.backends.cuda_run import gpu_unavailable

    if "h100" in args and not gpu_unavailable():
        pytest.skip("this machine has a GPU, so GPU autotuning is not refused here")
    monkeypatch.setenv("CACHETILE_CACHE", str(tmp_path / "plans.sqlite"))
    status = main(["gemm", "--M", "16", "--N", "16", "--K", "16", *args])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("tune: error: ") and out == "", err
    assert match in lines[0], lines[0]


def test_the_default_measure_plans_goes_on_past_a_failure():
    """Backends without a batch runner (cuda) measure one plan after another through `measure`."""
    from cachetile.backends.base import Backend
    from cachetile.models.errors import InvalidInput, KernelMismatch
    from cachetile.models.measurement import measurement

    class OneByOne(Backend):
        name = "test"

        def measure(self, result, plan=None, repeat=10, progress=None, built=None, options=None):
            if plan.predicted_seconds == 2.0:
                raise KernelMismatch("C[0, 0] = 1, the reference says 2 (rtol 0.001)")
            return measurement(W, plan.predicted_seconds, 1.0, 0.0, device="test", reference="numpy")

    plans = [p.model_copy(update={"predicted_seconds": s}) for p, s in zip([HOST_PLAN] * 3, [1.0, 2.0, 3.0])]
    trials = OneByOne().measure_plans(None, plans)
    assert [t.measurement.kernel_seconds if t.measurement else t.kind for t in trials] == [1.0, "mismatch", 3.0]
    assert trials[1].error == "C[0, 0] = 1, the reference says 2 (rtol 0.001)"
    with pytest.raises(InvalidInput, match="the test backend cannot measure remotely"):
        OneByOne().measure_plans(None, plans, remote="127.0.0.1:9190:cpu")
