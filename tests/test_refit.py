"""Refitting the model's peak and bandwidths to measured plans (models/refit.py), and the store
and command that feed it."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from cachetile import builtin, make_plan, tune
from cachetile.api.measurements import MeasurementStore
from cachetile.models.errors import InvalidInput
from cachetile.models.hardware import Hardware, hardware_from
from cachetile.models.refit import MeasuredPlan, fingerprint, refit, scaled
from cachetile.optimizer.space import Space

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from kernels import random_plan  # noqa: E402

# A fixed SIMD CPU, so the test does not depend on this machine's caches.
BASE = Hardware(name="cpu", cores=2, vector_bytes=64, peak_flops=1.6e11, levels=[
    {"name": "registers", "capacity_bytes": 2048, "bandwidth_bytes_per_s": 6.4e11},
    {"name": "L1", "capacity_bytes": 48 * 1024, "bandwidth_bytes_per_s": 3.2e11},
    {"name": "L2", "capacity_bytes": 1 << 20, "bandwidth_bytes_per_s": 1.6e11},
    {"name": "L3", "capacity_bytes": 32 << 20, "bandwidth_bytes_per_s": 4e10},
])
TRUE = scaled(BASE, 0.7, [1.25, 0.5, 1.0, 0.4])  # what the "machine" really does


def measured_on(hardware: Hardware, n_random: int = 12, seed: int = 3) -> list[MeasuredPlan]:
    """Plans of a few workloads (the model's top ones and random feasible ones), 'measured' as
    the cost model predicts them on `hardware`: the fit must find its way back to it."""
    rng, records = random.Random(seed), []
    for w in [builtin("gemm", {"m": 96, "n": 80, "k": 200}), builtin("gemm", {"m": 256, "n": 64, "k": 512}),
              builtin("gemm-chain", {"m": 64, "k": 32, "l": 128, "n": 48})]:
        plans = [tune(w, BASE, solver="enumerate", time_limit=0.5, top=4).plan]
        space = Space(w, BASE)
        for _ in range(n_random):
            orders, tiles = random_plan(space, rng)
            plans.append(make_plan(w, BASE, orders, tiles))
        for p in plans:
            truth = make_plan(w, hardware, [lp.order for lp in p.levels], [lp.tile for lp in p.levels])
            records.append(MeasuredPlan(workload=w, hardware=BASE, plan=p, measured_seconds=truth.predicted_seconds,
                                        device="test", threads=2))
    return records


@pytest.fixture(scope="module")
def records():
    return measured_on(TRUE)


def test_refit_recovers_the_machine_behind_the_measurements(records):
    fit = refit(BASE, records)
    assert fit.records == len(records)
    assert fit.rms_log_error_before > 0.3 and fit.rms_log_error_after < 0.02, fit
    assert abs(np.log(fit.median_ratio_after)) < 0.02 and fit.spearman_after > 0.99
    # The fitted hardware predicts each plan as the true one does (independently recomputed).
    for r in records:
        orders, tiles = [lp.order for lp in r.plan.levels], [lp.tile for lp in r.plan.levels]
        assert make_plan(r.workload, fit.hardware, orders, tiles).predicted_seconds == pytest.approx(
            r.measured_seconds, rel=0.05)
    # Capacities, cores and vector width are the machine; only its figures move.
    assert fingerprint(fit.hardware) == fingerprint(BASE)
    assert fit.peak_multiplier == pytest.approx(0.7, rel=0.1)


def test_refit_leaves_a_right_model_alone():
    fit = refit(BASE, measured_on(BASE, n_random=3))
    assert fit.rms_log_error_after < 1e-3
    assert all(m == pytest.approx(1.0, abs=0.02) for m in [fit.peak_multiplier, *fit.bandwidth_multipliers.values()])


def test_refit_needs_measurements_of_this_machine(records):
    other = BASE.model_copy(update={"cores": 4})  # another machine: not its measurements
    with pytest.raises(InvalidInput, match=r"^refitting 'cpu' needs at least 3 measured plans on a machine like it; "
                                           r"found 0 \(autotune some workloads first"):
        refit(other, records)
    one_thread = [r.model_copy(update={"threads": 1}) for r in records]  # ran on fewer cores than planned
    with pytest.raises(InvalidInput, match="found 0"):
        refit(BASE, one_thread)


def test_store_and_command_refit_the_hardware_file(records, tmp_path, monkeypatch, capsys):
    from cachetile.api.cli import main

    path = tmp_path / "plans.sqlite"
    MeasurementStore(path).add(records)
    assert len(MeasurementStore(path).records(like=BASE)) == len(records)
    assert MeasurementStore(path).records(like=BASE.model_copy(update={"cores": 1})) == []
    hw_file = tmp_path / "cpu.json"
    hw_file.write_text(BASE.model_dump_json())
    monkeypatch.setenv("CACHETILE_CACHE", str(path))
    assert main(["hardware", str(hw_file), "--from-measurements", "--json"]) == 0
    out, err = capsys.readouterr()
    fitted = hardware_from(json.loads(out))
    assert fitted.peak_flops == pytest.approx(0.7 * BASE.peak_flops, rel=0.1)
    assert err.startswith(f"refitted 'cpu' to {len(records)} measured plans:") and "Spearman" in err
    assert main(["hardware", str(hw_file), "--from-measurements"]) == 0
    assert "peak x0.7" in capsys.readouterr().out
