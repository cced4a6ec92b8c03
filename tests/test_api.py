"""The Python API's entry points: a bad argument is one line, a ValueError (models.errors.
InvalidInput), never nan, a silent 0, a KeyError or an AttributeError."""
import numpy as np
import pytest

from cachetile import (
    InvalidInput, builtin, capacity_sweep, data_volume, hardware_from, make_plan, memory_usage, pareto, preset, tune,
    workload_from_dict,
)

W = builtin("gemm", {"m": 8, "n": 8, "k": 8})
ORDER = [["m", "n", "k"]]
H100 = preset("h100")

CASES = [
    (lambda: data_volume(W, ORDER, [{"m": 0, "n": 2, "k": 8}]), "level 0 tile of 'm' is 0; it must be between 1 and 8"),
    (lambda: memory_usage(W, {"m": -4, "n": 2, "k": 8}), "level 0 tile of 'm' is -4; it must be between 1 and 8"),
    (lambda: data_volume(W, ORDER, [{"m": 4, "n": 2}]), "level 0 tile has no entry for loop 'k'"),
    (lambda: memory_usage(W, {"m": 4, "n": 2}), "level 0 tile has no entry for loop 'k'"),
    (lambda: memory_usage(W, {"m": 4, "n": 2, "k": 8, "q": 1}), "level 0 tile names unknown loop(s) ['q']"),
    (lambda: memory_usage(W, {"m": 4.5, "n": 2, "k": 8}), "level 0 tile of 'm' is 4.5; tiles must be integers"),
    (lambda: memory_usage(W, {"m": np.array([1, 0]), "n": 2, "k": 8}), "level 0 tile of 'm' is an array; it must be"),
    (lambda: data_volume(W, [["m", "n"]], [{"m": 4, "n": 2, "k": 8}]), "order ['m', 'n'] must list each loop"),
    # Found by tests/test_properties.py: an odd value at an outer level, arrays that do not broadcast.
    (lambda: data_volume(W, ORDER * 2, [{"m": 4, "n": 2, "k": 8}, {"m": None, "n": 8, "k": 8}]),
     "level 1 tile of 'm' is None; tiles must be integers"),
    (lambda: data_volume(W, ORDER * 2, [{"m": 4, "n": 2, "k": 8}, {"m": "8", "n": 8, "k": 8}]),
     "level 1 tile of 'm' is '8'; tiles must be integers"),
    (lambda: data_volume(W, ORDER, [{"m": np.array([1, 2]), "n": np.array([1, 2, 4]), "k": 8}]),
     "tile arrays must all have one length (or be scalars), got shapes [(), (2,), (3,)]"),
    (lambda: memory_usage(W, {"m": np.ones((2, 2), dtype=int), "n": 2, "k": 8}), "tile arrays must be one-dimensional"),
    (lambda: data_volume(W, "mnk", [{"m": 4, "n": 2, "k": 8}]), "orders must be a list with one order per level"),
    (lambda: data_volume(W, ORDER, {"m": 4, "n": 2, "k": 8}), "tiles must be a list with one {loop: tile} mapping"),
    (lambda: data_volume(W, ORDER * 2, [{"m": 4, "n": 2, "k": 8}]), "a plan needs one order and one tile per level (1)"),
    (lambda: data_volume("gemm", ORDER, [{"m": 4, "n": 2, "k": 8}]), "workload must be a Workload"),
    (lambda: make_plan(W, H100, ORDER, [{"m": 4, "n": 2, "k": 8}]), "a plan needs one order and one tile per level (3)"),
    (lambda: make_plan(W, "h100", ORDER * 3, [{"m": 1, "n": 1, "k": 1}] * 3), "hardware must be a Hardware"),
    (lambda: tune(W, "host"), "hardware must be a Hardware (from preset or hardware_from), got str"),
    (lambda: tune({"kind": "gemm"}, H100), "workload must be a Workload"),
    (lambda: tune(W, H100, time_limit=float("nan")), "time limit must be a finite number of seconds > 0, got nan"),
    (lambda: tune(W, H100, top=1.5), "top must be an integer >= 0, got 1.5"),
    (lambda: tune(W, H100, solver=None), "unknown solver None"),
    (lambda: tune(W, H100, stages="2"), "stages must be between 1 and 8, got '2'"),
    (lambda: builtin("gemm", {"m": "8", "n": 8, "k": 8}), "dims: loop 'm' has extent '8'; extents must be integers"),
    (lambda: builtin("gemm", {"m": True, "n": 8, "k": 8}), "dims: loop 'm' has extent True; extents must be integers"),
    (lambda: builtin("gemm", [8, 8, 8]), "dims must map loop names to extents, got list"),
    (lambda: workload_from_dict({"dims": {"m": 4}, "tensors": {"A": {"dims": []}, "C": {"dims": ["m"]}},
                                 "ops": [{"name": "o", "loops": ["m"], "inputs": ["A"], "output": "C"}]}),
     "tensors.A.dims: List should have at least 1 item"),
    (lambda: hardware_from({"name": "x", "peak_flops": 1, "levels": [{"name": "a", "capacity_bytes": "64",
                                                                       "bandwidth_bytes_per_s": 1}]}),
     "levels.0.capacity_bytes: Input should be a valid integer"),
    (lambda: pareto(W, "host"), "hardware must be a Hardware"),
    (lambda: pareto(W, H100, points=1.5), "a sweep needs an integer number of points >= 2, got 1.5"),
    (lambda: pareto(W, H100, capacities=[0.5]), "capacities must be whole numbers of bytes >= 1, got 0.5"),
    (lambda: capacity_sweep(W, H100, "shared", points=True), "a sweep needs an integer number of points >= 2, got True"),
]


@pytest.mark.parametrize("call,message", CASES, ids=[m[:40] for _, m in CASES])
def test_bad_python_arguments_are_one_line_value_errors(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, InvalidInput)
    text = str(info.value)
    assert "\n" not in text and text.startswith(message), text


def test_good_arguments_still_cost_arrays_of_tiles():
    """The checks accept what the cost model accepts: integer arrays of candidate tiles."""
    mu = memory_usage(W, {"m": np.array([1, 2, 4]), "n": 2, "k": 8})
    assert mu.tolist() == [(8 + 16 + 2) * 4, (16 + 16 + 4) * 4, (32 + 16 + 8) * 4]
    assert data_volume(W, ORDER, [{"m": 4, "n": 2, "k": 8}]) == [1024.0]  # the README's worked example
    # Arrays at any level cost each candidate as its own plan.
    both = data_volume(W, ORDER * 2, [{"m": np.array([2, 4]), "n": 2, "k": 8}, {"m": 8, "n": np.array([4, 8]), "k": 8}])
    one = [data_volume(W, ORDER * 2, [{"m": m, "n": 2, "k": 8}, {"m": 8, "n": n, "k": 8}]) for m, n in [(2, 4), (4, 8)]]
    assert [list(level) for level in both] == [[float(o[j]) for o in one] for j in range(2)]
