"""Software prefetch of the next packed block a CPU micro-kernel reads (backends/llvm_prefetch.py)."""
import math

import pytest
from tvm import tirx
from tvm.sym import Analyzer
from conftest import gemm_plan

from cachetile import preset
from cachetile.backends.llvm_build import build
from cachetile.backends.llvm_measure import check
from cachetile.backends.llvm_prefetch import _line_indices, insert_prefetches

HOST = preset("host")


def _loop(name: str, extent: int):
    var = tirx.Var(name, "int32")
    return tirx.For(var, tirx.IntImm("int32", 0), tirx.IntImm("int32", extent), tirx.ForKind.SERIAL, tirx.Evaluate(0))


def _offsets(lines, shape, step, at: int) -> list[int]:
    """Row-major element offsets of the prefetched lines with the stepping loop at `at`."""
    analyzer, out = Analyzer(), []
    for ix in lines:
        flat = 0
        for i, extent in zip(ix, shape):
            flat = flat * extent + int(analyzer.simplify(tirx.Let(step, tirx.IntImm("int32", at), i)))
        out.append(flat)
    return out


def test_a_dense_block_is_prefetched_line_by_line_at_the_next_step():
    step, rows, cols = _loop("i", 10), _loop("r", 4), _loop("c", 16)
    i, r, c = step.loop_var, rows.loop_var, cols.loop_var
    buffer = tirx.decl_buffer((10, 4, 16), "float32", "P_global")
    lines = _line_indices([i, r, c], buffer, i, [rows, cols])
    # The block at i + 1 is elements 64(i+1) .. 64(i+1)+63: four 16-float lines.
    assert _offsets(lines, (10, 4, 16), i, 2) == [192, 208, 224, 240]



@pytest.mark.parametrize("rows, prefetched", [(16, True), (17, False), (64, False)])
def test_a_block_of_more_than_16_lines_is_left_to_the_hardware_prefetcher(rows, prefetched):
    # 24- to 64-line blocks ran 2-6% slower with their prefetches than without (BENCHMARKS.md,
    # "Prefetch-burst session"): a dense run that long is the hardware prefetcher's.
    step, block_rows, cols = _loop("i", 10), _loop("r", rows), _loop("c", 16)
    i, r, c = step.loop_var, block_rows.loop_var, cols.loop_var
    buffer = tirx.decl_buffer((10, rows, 16), "float32", "P_global")
    lines = _line_indices([i, r, c], buffer, i, [block_rows, cols])
    assert _offsets(lines, (10, rows, 16), i, 0) == ([16 * (rows + j) for j in range(rows)] if prefetched else [])

@pytest.mark.parametrize("index, shape, why", [
    (lambda i, r, c: [i * 4 + r, c], (1000, 1000), "rows 1000 floats apart: 64 elements over 3016"),
    (lambda i, r, c: [r, c], (4, 16), "the same block at every step"),
    (lambda i, r, c: [i * 2 + r, c], (100, 16), "the next block overlaps this one"),
])
def test_a_strided_repeated_or_overlapping_block_is_not_prefetched(index, shape, why):
    step, rows, cols = _loop("i", 10), _loop("r", 4), _loop("c", 16)
    buffer = tirx.decl_buffer(shape, "float32", "P_global")
    assert _line_indices(index(step.loop_var, rows.loop_var, cols.loop_var), buffer, step.loop_var,
                         [rows, cols]) == [], why


def test_a_restreamed_input_gets_its_next_panel_prefetched_and_the_kernel_stays_right():
    # A's L2 block (the whole m by one k block) is used once per n block, so A streams back from L3
    # four times; B's panel stays put while m steps. Only A's next 4x30 panel is prefetched: 480
    # bytes, 8 lines.
    w, plan = gemm_plan({"m": 200, "n": 256, "k": 120}, "mnk:4,64,1|nkm:4,64,30|mnk:200,64,30|mnk:200,256,120", HOST)
    built = build(w, HOST, plan)
    check(w, built.lib)
    [(block, depth, buffers)] = built.emitted.prefetches
    assert buffers == ("A_global",)
    script = insert_prefetches(built.emitted.schedule.mod, built.emitted.prefetches).script()
    calls = [line for line in script.splitlines() if "llvm.prefetch" in line]
    assert len(calls) == math.ceil(4 * 30 * 4 / 64) and all("A_global[" in line for line in calls)


def test_an_input_read_once_is_not_prefetched():
    # The same walk on one n block: A moves into L2 once, so nothing is prefetched.
    w, plan = gemm_plan({"m": 200, "n": 64, "k": 120}, "mnk:4,64,1|nkm:4,64,30|mnk:200,64,30|mnk:200,64,120", HOST)
    built = build(w, HOST, plan)
    check(w, built.lib)
    assert built.emitted.prefetches == []
