"""Output lines two cores write: models/sharing.py against a per-element count."""
import numpy as np
import pytest
from test_kernel_costs import TWO_CORES
from tir_walk import parallel_axes

from cachetile import builtin, make_plan
from cachetile.backends.llvm_build import build
from cachetile.models.caches import LINE_BYTES, effective_tiles, output_plan
from cachetile.models.kernel_costs import kernel_costs, parallel_ops
from cachetile.models.sharing import output_shared_lines, owner_changes, shared_lines


def owners_along(extent: int, tile: int, parent: int, cores: int) -> np.ndarray:
    """Each index's core, the thread pool's way: per block of `parent`, trips of `tile` handed
    out in contiguous chunks of ceil(trips / cores), iteration by iteration."""
    owner = np.full(extent, -1)
    trips = parent // tile
    chunk = -(-trips // cores)
    for block in range(0, extent, parent):
        for trip in range(trips):
            start = block + trip * tile
            owner[start:min(start + tile, extent)] = trip // chunk
    return owner


def lines_written_twice(extents, axis: int, owner: np.ndarray, elem: int) -> int:
    """Every element's core laid out row-major; the lines holding elements of two cores."""
    shape = [1] * len(extents)
    shape[axis] = extents[axis]
    cores = np.broadcast_to(owner.reshape(shape), extents).ravel()
    line = np.arange(cores.size) * elem // LINE_BYTES
    first = np.full(line[-1] + 1, -1)
    first[line[::-1]] = cores[::-1]  # each line's first element's core
    return int(np.unique(line[cores != first[line]]).size)


GEOMETRIES = [
    # extents, axis, tile, parent, cores, elem
    ([127, 251], 1, 128, 256, 2, 4),  # gemm 127x251's n halves: a border and a row end per row
    ([127, 256], 1, 128, 256, 2, 4),  # rows of 1 KiB: every border on a line
    ([127, 251], 0, 64, 128, 2, 4),  # m halves: one border, row 64 starts on a line
    ([97, 251], 0, 8, 104, 2, 4),  # 13 trips: 7 and 6, row 56 off a line
    ([12, 197, 64], 1, 16, 208, 2, 4),  # a batched output split along its middle dim
    ([3, 10, 7], 2, 1, 7, 4, 4),  # chunks of 2 floats: several borders in one line
    ([50, 1000], 1, 16, 64, 2, 4),  # the loop split inside 64-wide blocks: 32 borders a row
    ([33, 250], 1, 32, 256, 3, 2),  # three cores, 2-byte elements
]


@pytest.mark.parametrize("extents,axis,tile,parent,cores,elem", GEOMETRIES)
def test_shared_lines_are_the_lines_holding_two_cores_elements(extents, axis, tile, parent, cores, elem):
    owner = owners_along(extents[axis], tile, parent, cores)
    changes = owner_changes(extents[axis], tile, parent, cores)
    assert changes == [i for i in range(1, extents[axis]) if owner[i] != owner[i - 1]]
    assert shared_lines(extents, axis, changes, elem) == lines_written_twice(extents, axis, owner, elem)


def test_a_plan_split_along_the_rows_width_charges_its_lines_and_one_split_on_rows_none():
    """gemm 127x251x509 with 127x128 L3 tiles runs its n halves on the two cores: C's 1004-byte
    rows put each half's border and each row's end inside a line (238 of the 254 are, the rest
    fall on one), which the calibrated figure charges per line; with 64x128 tiles the m halves
    split the rows, and row 64 starts on a line."""
    w = builtin("gemm", {"m": 127, "n": 251, "k": 509})
    orders = [list("mnk")] * 4
    hw = TWO_CORES.model_copy(update={"shared_line_seconds": 3e-8})
    by_n = [{"m": 8, "n": 32, "k": 1}] * 3 + [{"m": 127, "n": 128, "k": 256}]
    by_m = [{"m": 8, "n": 32, "k": 1}] * 2 + [{"m": 8, "n": 32, "k": 4}, {"m": 64, "n": 128, "k": 509}]
    owner = owners_along(251, 128, 256, 2)
    assert lines_written_twice([127, 251], 1, owner, 4) == 238
    costs = kernel_costs(w, hw, orders, by_n)
    assert costs.shared_lines == [("C", 238)]
    free = kernel_costs(w, TWO_CORES, orders, by_n)
    assert free.shared_lines == [] and costs.copy_seconds - free.copy_seconds == pytest.approx(238 * 3e-8)
    assert kernel_costs(w, hw, orders, by_m).shared_lines == []
    # The split the model counts is the one the kernel runs: C's write-back under the n loop.
    body = build(w, hw, make_plan(w, hw, orders, by_n)).emitted.schedule.mod["main"].body
    assert parallel_axes(body)["gemm_update"] == [1]


def test_an_output_accumulated_in_place_counts_a_store_per_reduction_trip():
    """gemm 16x104x64 with k outermost at the top level (two trips) and n split in 52-float halves:
    no output loop runs above k, so C accumulates in place (its 416-byte rows need no padding) and
    its register tiles are stored at each of k's trips: the 24 lines two cores write count twice."""
    w = builtin("gemm", {"m": 16, "n": 104, "k": 64})
    tiles = [{"m": 4, "n": 4, "k": 1}] * 2 + [{"m": 16, "n": 52, "k": 32}] * 2
    orders = [list("mnk")] * 3 + [list("kmn")]
    padded, eff = effective_tiles(w, tiles)
    parallel = parallel_ops(w, orders, tiles, 2)
    plans = {"gemm": output_plan(w, orders, w.ops[0], eff, padded)}
    assert parallel == {"gemm": (("n", 3), True)} and plans["gemm"].holder is None
    once = lines_written_twice([16, 104], 1, owners_along(104, 52, 104, 2), 4)
    assert once == 24
    assert output_shared_lines(w, orders, eff, padded, parallel, 2, plans) == [("C", 2 * once)]
