"""The closed-form DV/MU against the brute-force simulator and Chimera's formula."""
import math
import random

import numpy as np
import pytest
from conftest import random_affine_case, random_case
from simulator import simulate_dv, simulate_mu

from cachetile.models.costmodel import (check_order, check_tiles, data_volume, memory_usage, overlapped,
                                        predicted_seconds, single_level_bound)
from cachetile.models.workload import builtin


def test_closed_form_equals_simulator_on_random_cases():
    rng = random.Random(7)
    kinds, depths, checked = set(), set(), 0
    for _ in range(240):
        w, orders, tiles = random_case(rng)
        dv = data_volume(w, orders, tiles)
        for level in range(len(orders)):
            assert float(dv[level]) == simulate_dv(w, orders, tiles, level), (w.dims, orders, tiles, level)
            assert float(memory_usage(w, tiles[level])) == simulate_mu(w, tiles[level])
            checked += 1
        kinds.add(w.kind)
        depths.add(len(orders))
    assert kinds == {"gemm", "batch-gemm", "gemm-chain"} and depths == {1, 2, 3}
    assert checked >= 400


def test_vectorised_evaluation_matches_scalar():
    rng = random.Random(3)
    w, orders, tiles = random_case(rng, max_levels=2)
    while len(orders) != 2:
        w, orders, tiles = random_case(rng, max_levels=2)
    # Vary the inner level's tiles as arrays; every entry must equal its scalar evaluation.
    inner = {x: np.array([1, max(1, t // 2), t]) for x, t in tiles[0].items()}
    dv = data_volume(w, orders, [inner, tiles[1]])
    for i in range(3):
        scalar = [{x: int(v[i]) for x, v in inner.items()}, tiles[1]]
        assert dv[0][i] == simulate_dv(w, orders, scalar, 0)
        assert np.broadcast_to(dv[1], (3,))[i] == simulate_dv(w, orders, scalar, 1)  # outer level: scalar


def test_one_plan_in_plain_numbers_costs_what_its_one_element_arrays_do():
    """A plan of plain numbers takes _plain_tensor_dv (Python); as one-element arrays the same plan
    takes the vectorised path. Bit for bit, on large non-divisible extents, up to four levels."""
    rng = random.Random(11)
    for _ in range(150):
        w, orders, tiles = random_case(rng, max_extent=1000, max_levels=4)
        arrays = [{x: np.array([v]) for x, v in t.items()} for t in tiles]
        for plain, vectorised in zip(data_volume(w, orders, tiles), data_volume(w, orders, arrays)):
            assert np.ndim(plain) == 0 and float(plain) == float(vectorised[0]), (w.dims, orders, tiles)


@pytest.mark.parametrize("tm,tn,tk", [(2, 4, 8), (16, 2, 4), (4, 4, 4)])
def test_gemm_matches_chimera_closed_form(tm, tn, tk):
    M, N, K = 16, 32, 64
    w = builtin("gemm", {"m": M, "n": N, "k": K})
    dv = float(data_volume(w, [["m", "n", "k"]], [{"m": tm, "n": tn, "k": tk}])[0])
    assert dv == 4 * (M * K * math.ceil(N / tn) + K * N * math.ceil(M / tm) + M * N)


def test_single_trip_loop_never_reloads():
    # k runs once (tile = K): A's block only changes with m, so A moves once, not N/Tn times.
    w = builtin("gemm", {"m": 8, "n": 8, "k": 4})
    dv = float(data_volume(w, [["m", "n", "k"]], [{"m": 2, "n": 2, "k": 4}])[0])
    assert dv == 4 * (8 * 4 + 4 * 8 * 4 + 8 * 8)
    assert dv == simulate_dv(w, [["m", "n", "k"]], [{"m": 2, "n": 2, "k": 4}], 0)


def test_intermediate_moves_nothing_at_the_outermost_level_only():
    w = builtin("gemm-chain", {"m": 4, "k": 4, "l": 4, "n": 4})
    whole = {x: 4 for x in w.dims}
    # One block of everything: each input/output moves once, C never.
    assert float(data_volume(w, [["m", "l", "k", "n"]], [whole])[0]) == 4 * 16 * 4
    # Below the outermost level C moves too: written by gemm1 once, read by gemm2 once.
    two = data_volume(w, [["m", "l", "k", "n"]] * 2, [whole, whole])
    assert [float(d) for d in two] == [4 * 16 * 6, 4 * 16 * 4]


def test_single_level_bound_is_below_every_multi_level_plan():
    rng = random.Random(11)
    for _ in range(300):
        w, orders, tiles = random_case(rng, max_extent=10)
        dv = data_volume(w, orders, tiles)
        for level in range(len(orders)):
            assert float(single_level_bound(w, tiles[level])) <= float(dv[level])


def test_orders_must_put_shared_loops_first():
    w = builtin("gemm-chain", {"m": 4, "k": 4, "l": 4, "n": 4})
    check_order(w, ["l", "m", "n", "k"])
    with pytest.raises(ValueError, match="shared loop 'l' comes after a loop private to one op"):
        check_order(w, ["m", "k", "l", "n"])
    with pytest.raises(ValueError, match="must list each loop"):
        check_order(w, ["m", "l", "k"])


def test_tiles_must_nest():
    w = builtin("gemm", {"m": 8, "n": 8, "k": 8})
    with pytest.raises(ValueError, match="level 0 tile of 'm' is 8; it must be between 1 and 4"):
        check_tiles(w, [{"m": 8, "n": 2, "k": 2}, {"m": 4, "n": 8, "k": 8}])


def test_affine_closed_form_equals_simulator_on_random_convolutions():
    rng = random.Random(15)
    seen, checked = set(), 0
    for _ in range(220):
        w, orders, tiles, (stride, dilation) = random_affine_case(rng)
        dv = data_volume(w, orders, tiles)
        for level in range(len(orders)):
            assert float(dv[level]) == simulate_dv(w, orders, tiles, level), (w.kind, w.dims, orders, tiles, level)
            assert float(memory_usage(w, tiles[level])) == simulate_mu(w, tiles[level])
            checked += 1
        ragged = any(w.dims[x] % t[x] for t in tiles for x in w.dims)
        seen |= {("stride", stride), ("dilation", dilation), ("levels", len(orders)), ("form", w.kind),
                 ("ragged", ragged)}
    assert seen >= {("stride", 1), ("stride", 2), ("stride", 3), ("dilation", 1), ("dilation", 2),
                    ("levels", 1), ("levels", 2), ("levels", 3), ("form", "chain"), ("form", "depthwise"),
                    ("form", "conv2d"), ("form", "three"), ("ragged", True)}
    assert checked >= 400


def test_affine_vectorised_evaluation_matches_scalar():
    rng = random.Random(5)
    for _ in range(6):
        w, orders, tiles, _ = random_affine_case(rng, max_levels=2)
        inner = {x: np.array([1, max(1, t // 2), t]) for x, t in tiles[0].items()}
        dv = data_volume(w, orders, [inner, *tiles[1:]])
        mu = memory_usage(w, inner)
        for i in range(3):
            scalar = [{x: int(v[i]) for x, v in inner.items()}, *tiles[1:]]
            assert np.broadcast_to(dv[0], (3,))[i] == simulate_dv(w, orders, scalar, 0)
            assert np.broadcast_to(mu, (3,))[i] == simulate_mu(w, scalar[0])


def test_a_stride_two_window_touches_every_other_row():
    # I[2*oh + kh] with Tkh = 1: a block of 4 output rows touches rows {0, 2, 4, 6}, 4 of the 7 it spans.
    from cachetile.models.workload import Workload
    w = Workload(dims={"oh": 8, "kh": 3}, tensors={"I": {"dims": ["2*oh+kh"]}, "W": {"dims": ["kh"]}, "O": {"dims": ["oh"]}},
                 ops=[{"name": "conv", "loops": ["oh", "kh"], "inputs": ["I", "W"], "output": "O"}])
    tile = {"oh": 4, "kh": 1}
    dv = float(data_volume(w, [["oh", "kh"]], [tile])[0]) / 4
    assert dv == 2 * 3 * 4 + 2 * 3 * 1 + 8  # I: 6 blocks of 4 rows; W: 6 of 1; O: 8
    assert float(memory_usage(w, tile)) / 4 == 7 + 1 + 4  # the window I's buffer holds is 7 rows
    assert w.extents("I") == [17] and w.shape("I") == [17] and w.size("I") == 17


def test_overlapped_times_combine_as_their_norm():
    assert overlapped([3.0, 4.0], 2) == pytest.approx(5.0)
    assert overlapped([3.0, 4.0, 1.0]) == 4.0  # norm inf: the slowest alone
    assert overlapped([1e-9, 1e-9], 4) == pytest.approx(2 ** 0.25 * 1e-9)  # no underflow
    assert overlapped([np.inf, 1.0], 4) == np.inf and overlapped([0.0, 0.0], 4) == 0.0
    combined = overlapped([np.array([1.0, 2.0]), 2.0], 4)  # broadcasts
    assert combined == pytest.approx([(1 + 16) ** 0.25, 32 ** 0.25])
    # Associative: a search may combine the links it knows first.
    assert overlapped([overlapped([1.0, 2.0], 4), 3.0], 4) == pytest.approx(overlapped([1.0, 2.0, 3.0], 4))


def test_predicted_seconds_adds_the_register_link_to_compute_and_overlaps_the_rest():
    best, index = predicted_seconds(1.0, [0.5, 2.0, 0.25], shares_issue=True, norm=4)
    assert best == pytest.approx((1.5 ** 4 + 2.0 ** 4 + 0.25 ** 4) ** 0.25) and index == 1
    best, index = predicted_seconds(1.0, [0.5, 0.75], shares_issue=True)
    assert best == 1.5 and index == -1


@pytest.mark.parametrize("kind,dims,choices", [
    ("gemm-chain", {"b": 2, "m": 12, "l": 16, "k": 8, "n": 6}, {"b": [1, 2], "m": [1, 4, 12], "l": [2, 16], "k": [1, 8], "n": [3, 6]}),
    ("batch-gemm", {"b": 3, "m": 10, "n": 8, "k": 6}, {"b": [1, 3], "m": [2, 5, 10], "n": [8], "k": [1, 3, 6]}),
])
@pytest.mark.parametrize("registers", [False, True])
def test_single_level_bound_over_each_loops_own_axis_is_that_of_each_combination(kind, dims, choices, registers):
    """The search's floor tables give each loop's candidates an axis of their own, so that each op
    is costed over the grid of its own loops (a chain's two GEMMs share only some): every cell
    must be the bound of its combination, costed alone with plain numbers."""
    from cachetile.models.hardware import preset

    w = builtin(kind, dims)
    _assert_bound_per_cell(w, choices, preset("host").target.register_weights(w) if registers else None)


def _assert_bound_per_cell(w, choices, weights=None):
    """single_level_bound with each loop's `choices` on an axis of its own, cell by cell against
    the bound of that cell's tile alone."""
    loops = list(w.dims)
    axes = {x: np.array(choices[x]).reshape([-1 if i == j else 1 for j in range(len(loops))]) for i, x in enumerate(loops)}
    table = np.broadcast_to(single_level_bound(w, axes, weights), tuple(len(choices[x]) for x in loops))
    for cell in np.ndindex(table.shape):
        tile = {x: choices[x][i] for x, i in zip(loops, cell)}
        assert table[cell] == float(single_level_bound(w, tile, weights)), (w.dims, tile)


def test_single_level_bound_over_each_loops_own_axis_holds_for_windows_and_chains_of_convolutions():
    """As above, for random convolution-like workloads (strides, dilations, padding; conv,
    depthwise, conv -> 1x1 and three-op chains), whose affine dims combine several loops."""
    rng, forms = random.Random(5), set()
    for _ in range(8):
        w = random_affine_case(rng)[0]
        forms.add(w.kind)
        # Two candidates on alternate loops keep the cells (each costed alone) few.
        _assert_bound_per_cell(w, {x: sorted({1, w.dims[x]}) if i % 2 else [max(1, w.dims[x] // 2)]
                                   for i, x in enumerate(w.dims)})
    assert len(forms) >= 3


def test_padded_extents_of_numbers_and_arrays_are_those_of_each_plan():
    """Levels of plain numbers beside levels of candidate arrays (a search's call): each entry is
    the extent rounded up to a multiple of its largest tile below the extent, as for one plan."""
    from cachetile.models.costmodel import padded_extents

    w = builtin("gemm", {"m": 97, "n": 64, "k": 30})
    tiles = [{"m": np.array([5, 6, 97]), "n": 16, "k": np.array([1, 30, 4])},
             {"m": np.int64(12), "n": 32, "k": np.array([[7], [30]])},
             {"m": 97, "n": 64, "k": 30}]
    padded = padded_extents(w, tiles)
    shape = np.broadcast_shapes(*[np.shape(t[x]) for t in tiles for x in w.dims])
    for cell in np.ndindex(shape):
        for x, extent in w.dims.items():
            below = [int(np.broadcast_to(t[x], shape)[cell]) for t in tiles]
            below = max((v for v in below if v < extent), default=0)
            expected = -(-extent // below) * below if below else extent
            assert np.broadcast_to(padded[x], shape)[cell] == expected, (x, cell)
    # Remembered by the tiles' values, not the arrays: the same tiles give the same extents, read-only
    # (a caller cannot change what the next one gets), and tiles changed in place give new ones.
    again = padded_extents(w, [{x: np.copy(v) for x, v in t.items()} for t in tiles])
    assert all(np.array_equal(again[x], padded[x]) for x in w.dims)
    with pytest.raises(ValueError):
        again["m"][...] = 0
    tiles[0]["m"][:] = [3, 3, 3]  # m: every row's largest tile below 97 is 12 now
    assert np.array_equal(np.broadcast_to(padded_extents(w, tiles)["m"], shape), np.full(shape, 108.0))


def test_one_of_is_numpys_isin():
    """costmodel.one_of, the comparisons the parallel pick and the private floor use in place of
    np.isin: the same answer for numbers and arrays of indices, -1 (no parallel loop) included."""
    from cachetile.models.costmodel import one_of

    rng = np.random.default_rng(0)
    for shape in [(), (7,), (3, 4), (2, 1, 5)]:
        for values in [[], [0], [1, 3], [-1, 0, 2]]:
            pick = rng.integers(-1, 4, shape) if shape else np.int64(rng.integers(-1, 4))
            assert np.array_equal(np.asarray(one_of(pick, values)), np.isin(pick, values)), (shape, values)
