"""bench/fidelity.py's rerank: how far timing noise alone moves a dump's Spearman; and the order its
rounds run in."""
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from fidelity import resampled_spearman  # noqa: E402
from kernels import interleaved_schedule  # noqa: E402


def test_rounds_without_noise_resample_to_the_dumps_own_spearman():
    predicted = [1.0, 2.0, 3.0, 4.0, 5.0]
    times = [0.9, 2.5, 2.1, 4.2, 5.5]  # plans 2 and 3 swapped: Spearman 0.9
    rounds = [[t] * 10 for t in times]
    assert resampled_spearman(predicted, rounds) == pytest.approx((spearmanr(predicted, times).statistic,) * 2)
    assert spearmanr(predicted, times).statistic == pytest.approx(0.9)


def test_two_plans_that_swap_from_round_to_round_widen_the_band_around_the_median_ranking():
    predicted = [1.0, 2.0, 3.0, 4.0]
    rng = np.random.default_rng(1)
    # plans 1 and 2 take turns being faster; plans 0 and 3 are steady
    rounds = [[1.0] * 10, list(2.0 + rng.choice([-0.2, 0.2], 10)), list(2.0 + rng.choice([-0.2, 0.2], 10)), [4.0] * 10]
    low, high = resampled_spearman(predicted, rounds)
    medians = np.median(np.asarray(rounds), axis=1)
    assert (low, high) == pytest.approx((0.8, 1.0))  # the two orders of the middle pair; a tie gives 0.9 between them
    assert low <= spearmanr(predicted, medians).statistic <= high


def test_each_round_times_every_group_before_the_next_round_starts():
    sizes = [3, 2, 4]
    schedule = interleaved_schedule(sizes, rounds=3, rng=random.Random(0))
    assert [g for g, _ in schedule] == [0, 1, 2] * 3
    assert all(sorted(order) == list(range(sizes[g])) for g, order in schedule)
    assert len({tuple(order) for g, order in schedule if g == 2}) > 1  # each round shuffles anew
    assert interleaved_schedule([2], rounds=2) == [(0, [0, 1]), (0, [0, 1])]  # no rng: as given


def test_a_plan_spelled_by_bench_plans_reads_back_as_the_same_plan():
    """bench/plans.py: the spelling it prints for a plan (solve_times.plan_spec) (innermost level first, m,n,k) parses back
    to that plan's orders and tiles, with `|` as well as `/` between levels; a chain's too."""
    from conftest import XEON
    from plans import parse_plan
    from solve_times import plan_spec

    from cachetile import builtin, make_plan

    w = builtin("gemm", {"m": 1024, "n": 1024, "k": 1024})
    text = "mnk:6,64,1/mnk:6,64,16/nkm:6,256,1024/mnk:1024,256,1024"
    plan = make_plan(w, XEON, *parse_plan(text))
    assert plan_spec(plan, " / ") == text.replace("/", " / ")
    assert parse_plan(text.replace("/", " | ")) == parse_plan(plan_spec(plan, " / "))
    assert parse_plan(text)[1][1] == {"m": 6, "n": 64, "k": 16}
    # A chain's tiles in its own loops' order (b,m,l,k,n), as tune prints them.
    chain = builtin("gemm-chain", {"b": 16, "m": 1024, "l": 1024, "k": 64, "n": 64})
    text = "bmlkn:1,14,32,1,32/blmkn:1,14,32,1,32/bmlkn:1,14,1024,64,32/bmlkn:1,1024,1024,64,64"
    orders, tiles = parse_plan(text, "bmlkn")
    assert tiles[2] == {"b": 1, "m": 14, "l": 1024, "k": 64, "n": 32} and orders[1] == list("blmkn")
    assert plan_spec(make_plan(chain, XEON, orders, tiles), "/") == text


def test_the_reload_sweeps_count_each_visit_of_a_register_tile_as_the_simulator_refills_it():
    """bench/reloads.py's visits per core: every register tile of the padded output once per K
    steps. Where the tiles divide the output, that is how often the brute-force simulator
    refills the register tile's block of C; where they do not, the padded tiles count (the
    kernel computes them: 20 rows under 18-row L2 blocks run as 36, as sweep A's 197 run as 216)."""
    from plans import parse_plan
    from reloads import visits
    from simulator import simulate_dv

    from cachetile import builtin

    for rows in (36, 20):
        w = builtin("gemm", {"m": rows, "n": 64, "k": 24})
        for k_tile in (3, 6, 24):
            orders, tiles = parse_plan(f"mnk:9,32,1/kmn:9,32,{k_tile}/mnk:18,64,24/mnk:{rows},64,24")
            every = 4 * 2 * (24 // k_tile)  # 36 rows (20 padded) of 9, 64 columns of 32, once per K steps
            assert visits(w, tiles, k_tile, 2) * 2 == every
            if rows % 18 == 0:
                assert simulate_dv(w, orders, tiles, 0, {"C"}) == every * 9 * 32 * w.elem_bytes
