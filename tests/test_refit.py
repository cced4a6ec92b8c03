"""Refitting the model's peak, bandwidths and serial costs to measured plans (models/refit.py), the
store and commands that feed it, and the host's refit kept in its calibration profile."""
import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from cachetile import builtin, make_plan, tune
from cachetile.api.measurements import MeasurementStore
from cachetile.models.errors import InvalidInput
from cachetile.models.hardware import Hardware, apply_profile, hardware_from, host, host_key
from cachetile.models.profile import load_profile, save_profile
from cachetile.models.refit import MeasuredPlan, fingerprint, refit, scaled
from cachetile.optimizer.space import Space

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from kernels import random_plan  # noqa: E402
from test_calibrate import _profile  # noqa: E402

# A fixed SIMD CPU, so the test does not depend on this machine's caches; its serial costs
# (packing copies, parallel regions, the call) are part of every prediction.
BASE = Hardware(name="cpu", cores=2, vector_bytes=64, peak_flops=1.6e11, call_seconds=2e-6,
                parallel_region_seconds=3e-6, levels=[
    {"name": "registers", "capacity_bytes": 2048, "bandwidth_bytes_per_s": 6.4e11},
    {"name": "L1", "capacity_bytes": 48 * 1024, "bandwidth_bytes_per_s": 3.2e11},
    {"name": "L2", "capacity_bytes": 1 << 20, "bandwidth_bytes_per_s": 1.6e11},
    {"name": "L3", "capacity_bytes": 32 << 20, "bandwidth_bytes_per_s": 4e10},
])
TRUE = scaled(BASE, 0.7, [1.25, 0.5, 1.0, 0.4], region=3.0)  # what the "machine" really does


def measured_on(hardware: Hardware, n_random: int = 12, seed: int = 3, base: Hardware = BASE) -> list[MeasuredPlan]:
    """Plans of a few workloads (the model's top ones on `base` and random feasible ones),
    'measured' as the cost model predicts them on `hardware`: the fit must find its way back to it."""
    rng, records = random.Random(seed), []
    for w in [builtin("gemm", {"m": 96, "n": 80, "k": 200}), builtin("gemm", {"m": 256, "n": 64, "k": 512}),
              builtin("gemm-chain", {"m": 64, "k": 32, "l": 128, "n": 48})]:
        # `auto` is bounded by work, not time: the exhaustive search over four levels runs out of any
        # time limit, and what it returns then depends on how loaded the machine is.
        plans = [tune(w, base, solver="auto", time_limit=10).plan]
        space = Space(w, base)
        for _ in range(n_random):
            orders, tiles = random_plan(space, rng)
            plans.append(make_plan(w, base, orders, tiles))
        for p in plans:
            truth = make_plan(w, hardware, [lp.order for lp in p.levels], [lp.tile for lp in p.levels])
            records.append(MeasuredPlan(workload=w, hardware=base, plan=p, measured_seconds=truth.predicted_seconds,
                                        device="test", threads=base.cores))
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
    assert fit.parallel_region_multiplier == pytest.approx(3.0, rel=0.1)  # serial costs are fitted too
    assert sum(r.plan.serial_seconds for r in records) > 0.05 * sum(r.measured_seconds for r in records)


def test_refit_leaves_a_right_model_alone():
    fit = refit(BASE, measured_on(BASE, n_random=3))
    assert fit.rms_log_error_after < 1e-3
    multipliers = [fit.peak_multiplier, *fit.bandwidth_multipliers.values(), fit.parallel_region_multiplier,
                   fit.call_multiplier]
    assert all(m == pytest.approx(1.0, abs=0.02) for m in multipliers), fit


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
    printed = re.search(r"peak x([0-9.]+);", capsys.readouterr().out)
    assert printed and float(printed.group(1)) == pytest.approx(0.7, rel=0.1)


def test_host_refit_is_kept_in_its_calibration_profile(tmp_path, monkeypatch, capsys):
    from cachetile.api.cli import main

    monkeypatch.setenv("CACHETILE_PROFILES", str(tmp_path / "profiles"))
    monkeypatch.setenv("CACHETILE_CACHE", str(tmp_path / "plans.sqlite"))
    assert main(["hardware", "host", "--from-measurements"]) == 2
    assert capsys.readouterr().err.startswith("tune: error: refitting 'host' needs at least 3 measured plans")
    assumed = host(calibrated=False)
    profile = _profile(host_key(assumed))
    calibrated = apply_profile(assumed, profile)
    truth = scaled(calibrated, 0.5, [0.8] * len(calibrated.levels))
    MeasurementStore(tmp_path / "plans.sqlite").add(measured_on(truth, n_random=4, base=calibrated))
    assert main(["hardware", "host", "--from-measurements"]) == 2
    assert capsys.readouterr().err == ("tune: error: the refit adjusts this machine's calibration profile, and it has "
                                       "none: run `tune hardware host --calibrate --from-measurements`\n")
    save_profile(profile)
    for _ in range(2):  # a second refit starts again from the measured figures: nothing compounds
        assert main(["hardware", "host", "--from-measurements", "--json"]) == 0
        out, err = capsys.readouterr()
        assert err.startswith("refitted 'host' to ") and "peak x0.5" in err
        stored = load_profile(host_key(assumed))
        assert json.loads(out) == stored.model_dump(mode="json")
        assert stored.peak_flops == profile.peak_flops and stored.fill_bandwidth == profile.fill_bandwidth
        hw = host()  # the preset now applies the measured figures times the refit's multipliers
        assert hw.peak_flops == pytest.approx(0.5 * profile.peak_flops.all_cores, rel=0.05)
        assert hw.peak_flops == stored.peak_flops.all_cores * stored.refit.peak_multiplier
        assert "refitted on" in hw.source and hw.calibrated == profile.created
