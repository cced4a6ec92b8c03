"""`pareto` against a brute-force sweep of every tile and order with data_volume/memory_usage."""
import numpy as np
import pytest
from conftest import memory_bound

from cachetile import InfeasibleError, builtin, capacity_sweep, data_volume, memory_usage, pareto, preset
from cachetile.optimizer.space import Space, order_classes


def brute_force_curve(w):
    """Every (MU, least DV) a single level can reach: all integer tiles, every valid order."""
    grids = np.meshgrid(*[np.arange(1, e + 1) for e in w.dims.values()], indexing="ij")
    tile = {x: g.ravel() for x, g in zip(w.dims, grids)}
    mu = memory_usage(w, tile)
    dv = np.min([data_volume(w, [order], [tile])[0] for order in order_classes(w, key=lambda _, o: o)], axis=0)
    return mu, dv


def brute_force_front(mu, dv):
    """Non-dominated (MU, DV) pairs, by definition: nothing else is <= in both and < in one."""
    pairs = set(zip(mu.tolist(), dv.tolist()))
    return sorted(p for p in pairs if not any(q != p and q[0] <= p[0] and q[1] <= p[1] for q in pairs))


CASES = [
    ("gemm", {"m": 6, "n": 5, "k": 7}),
    ("gemm-chain", {"m": 4, "k": 3, "l": 5, "n": 3}),
]


@pytest.mark.parametrize("kind,dims", CASES)
def test_front_matches_brute_force_on_one_level(kind, dims):
    w = builtin(kind, dims)
    mu, dv = brute_force_curve(w)
    front = brute_force_front(mu, dv)
    # Sweep exactly the front's MUs plus capacities between them, where the answer must not move.
    between = [int(a + b) // 2 for (a, _), (b, _) in zip(front, front[1:]) if b - a > 8]
    caps = sorted({int(m) for m, _ in front} | set(between))
    result = pareto(w, memory_bound([("L1", 10**6, 1e9)]), "L1", capacities=caps, solver="enumerate", time_limit=30)
    assert [p.capacity_bytes for p in result.points] == caps
    for p in result.points:
        assert p.status == "optimal"
        assert p.dv_bytes == float(dv[mu <= p.capacity_bytes].min())
        assert p.mu_bytes <= p.capacity_bytes
        # The reported plan is costed independently: its own level-0 tiles give the same MU.
        assert p.mu_bytes == float(memory_usage(w, p.plan.levels[0].tile))
    assert [(p.mu_bytes, p.dv_bytes) for p in result.front] == front


def test_outer_level_of_two_matches_brute_force():
    """DV of the outermost level depends on its own order and tile only, so one-level brute force applies."""
    w = builtin("gemm", {"m": 5, "n": 6, "k": 4})
    mu, dv = brute_force_curve(w)
    hw = memory_bound([("R", 64, 4e11), ("L1", 4096, 1e11)])
    caps = [48, 100, 200, 400]
    result = pareto(w, hw, 1, capacities=caps, solver="enumerate", time_limit=30)
    assert result.level == "L1"
    assert [p.dv_bytes for p in result.points] == [float(dv[mu <= c].min()) for c in caps]
    # predicted_seconds is the plan on the real hardware with that capacity, not the DV-only copy.
    for p in result.points:
        slowest = max(lp.dv_bytes / bw for lp, bw in zip(p.plan.levels, (4e11, 1e11)))
        assert p.predicted_seconds == pytest.approx(max(slowest, w.flops / 1e30), rel=1e-12)
        assert p.plan.levels[1].capacity_bytes == p.capacity_bytes


def test_default_sweep_and_progress():
    w = builtin("gemm", {"m": 8, "n": 8, "k": 8})
    hw = memory_bound([("R", 64, 4e11), ("L1", 1024, 1e11)])
    caps = capacity_sweep(w, hw, "R", points=4)
    # From every tile 1 (3 elements) to the whole problem (3 * 64 elements, below L1's 1024 B),
    # with R's own 64 B included.
    assert caps[0] == 12 and caps[-1] == 768 and 64 in caps and len(caps) == 5
    assert capacity_sweep(w, memory_bound([("R", 64, 4e11), ("L1", 256, 1e11)]), 0, points=3)[-1] == 256
    seen = []
    result = pareto(w, hw, "R", points=4, time_limit=10, progress=lambda f, msg: seen.append(f))
    assert [p.capacity_bytes for p in result.points] == caps
    assert seen == [i / len(caps) for i in range(len(caps))] + [1.0]
    dvs = [p.dv_bytes for p in result.points]
    assert dvs == sorted(dvs, reverse=True)  # more room never moves more data


@pytest.mark.parametrize("level", ["registers", "shared"])
def test_gpu_presets_sweep_the_levels_own_usage(level):
    """The README's example: on GPUs a level's usage is the target's (registers per thread,
    shared memory with its stages), so the sweep starts from that smallest tiling, not from the
    plain MU tune would reject; capacities no launch fits (a block needs whole warps) are left out."""
    w = builtin("gemm-chain", {"m": 64, "k": 16, "l": 64, "n": 16})
    hw = preset("h100")
    caps = capacity_sweep(w, hw, level, points=4)
    i = [lv.name for lv in hw.levels].index(level)
    assert caps[0] == Space(w, hw, stages=2).level_footprint(i) > float(memory_usage(w, {x: 1 for x in w.dims}))
    # Each point's solve stops at its work cap (budget.GPU_WORK, about 1.5 s on the AMD EPYC), not
    # at the limit: at 2 s the Skylake-SP Xeon of BENCHMARKS.md, beside the suite's other worker,
    # stopped a point on the clock with a plan that moved more than the next smaller capacity's.
    front = pareto(w, hw, level, points=4, time_limit=10)
    assert front.points and set(p.capacity_bytes for p in front.points) <= set(caps)
    assert all(p.mu_bytes <= p.capacity_bytes for p in front.points)
    dvs = [p.dv_bytes for p in front.points]
    assert dvs == sorted(dvs, reverse=True) and front.front


def test_bad_level_and_capacity():
    w = builtin("gemm", {"m": 8, "n": 8, "k": 8})
    hw = memory_bound([("R", 64, 4e11)])
    with pytest.raises(ValueError, match=r"unknown level 'L9'; expected one of R or an index below 1"):
        pareto(w, hw, "L9")
    with pytest.raises(InfeasibleError, match="holds 8 bytes but the smallest tiling"):
        pareto(w, hw, "R", capacities=[8, 64])


def test_tune_pareto_command_prints_the_same_front(tmp_path):
    import json
    import subprocess
    import sys

    hw = {"name": "two", "peak_flops": 1e30, "levels": [
        {"name": "R", "capacity_bytes": 64, "bandwidth_bytes_per_s": 4e11},
        {"name": "L1", "capacity_bytes": 1024, "bandwidth_bytes_per_s": 1e11}]}
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(hw))
    tune = [sys.executable, "-m", "cachetile.api.cli", "pareto", "gemm", "--M", "8", "--N", "8", "--K", "8",
            "--hardware", str(path), "--solver", "enumerate", "--time-limit", "2"]
    proc = subprocess.run([*tune, "--level", "R", "--capacities", "12,40,64", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    (doc,) = json.loads(proc.stdout)  # one document: a list with one front per level asked for
    w = builtin("gemm", {"m": 8, "n": 8, "k": 8})
    mu, dv = brute_force_curve(w)  # R is innermost, but with L1 free to reorder above it DV_R can only drop
    expected = pareto(w, memory_bound([(lv["name"], lv["capacity_bytes"], lv["bandwidth_bytes_per_s"]) for lv in hw["levels"]]),
                      "R", capacities=[12, 40, 64], solver="enumerate")
    assert doc["level"] == "R"
    assert [p["dv_bytes"] for p in doc["points"]] == [p.dv_bytes for p in expected.points]
    assert all(p["dv_bytes"] <= float(dv[mu <= p["capacity_bytes"]].min()) for p in doc["points"])
    table = subprocess.run([*tune, "--points", "3"], capture_output=True, text=True, timeout=120).stdout
    assert table.count("least DV for each capacity") == 2 and "* " in table
    bad = subprocess.run([*tune, "--level", "L9"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "tune: error: unknown level 'L9'; expected one of R, L1 or an index below 2"


def test_progress_bar_draws_fraction_and_message():
    import io

    from cachetile.api.progress import progress_bar, scaled

    out = io.StringIO()
    with progress_bar("pareto", file=out, enabled=True) as bar:
        half = scaled(bar, 0.5, 1.0)
        half(0.5, "L1 capacity 64 B")
    assert "75%" in out.getvalue() and "L1 capacity 64 B" in out.getvalue()
    quiet = io.StringIO()  # not a terminal: nothing drawn unless asked
    with progress_bar("pareto", file=quiet) as bar:
        bar(0.5, "x")
    assert quiet.getvalue() == ""


def test_a_swept_capacity_without_a_plan_in_time_is_left_out(monkeypatch):
    """The default sweep skips a capacity whose solve timed out (the tightest search longest);
    a capacity the caller asked for raises, and so does a sweep where every solve timed out."""
    import cachetile.optimizer.pareto as module
    from cachetile.models.errors import NoPlanInTime

    w = builtin("gemm", {"m": 6, "n": 5, "k": 7})
    hw = memory_bound([("L1", 10**6, 1e9)])
    caps = capacity_sweep(w, hw, "L1", points=4)
    real_tune = module.tune

    def tune_timing_out_at(smallest):
        def tune(workload, hardware, *args, **kwargs):
            if hardware.levels[0].capacity_bytes <= smallest:
                raise NoPlanInTime("solver 'auto' found no feasible plan within 1 s (timeout)")
            return real_tune(workload, hardware, *args, **kwargs)
        return tune

    monkeypatch.setattr(module, "tune", tune_timing_out_at(caps[0]))
    front = pareto(w, hw, "L1", points=4, time_limit=5)
    assert [p.capacity_bytes for p in front.points] == caps[1:]
    with pytest.raises(NoPlanInTime, match="within 1 s"):
        pareto(w, hw, "L1", capacities=caps[:2], time_limit=5)
    monkeypatch.setattr(module, "tune", tune_timing_out_at(caps[-1]))
    with pytest.raises(NoPlanInTime, match="within 1 s"):
        pareto(w, hw, "L1", points=4, time_limit=5)
