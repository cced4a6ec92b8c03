"""`pareto` against a brute-force sweep of every tile and order with data_volume/memory_usage."""
import numpy as np
import pytest
from conftest import memory_bound

from cachetile import InfeasibleError, builtin, capacity_sweep, data_volume, memory_usage, pareto
from cachetile.optimizer.space import order_classes


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


def test_bad_level_and_capacity():
    w = builtin("gemm", {"m": 8, "n": 8, "k": 8})
    hw = memory_bound([("R", 64, 4e11)])
    with pytest.raises(ValueError, match=r"unknown level 'L9'; expected one of R or an index below 1"):
        pareto(w, hw, "L9")
    with pytest.raises(InfeasibleError, match="holds 8 bytes but the smallest tiling"):
        pareto(w, hw, "R", capacities=[8, 64])
