"""Zero-padding copies split so that their inside moves whole vectors unconditionally.

A copy that reads an input through its zero padding (gemm 127x251x509 packs B into 512x256)
evaluates the padding's condition for every element it moves. Under that condition LLVM moves
a 32-float piece as 8, 4, 2, 1 and 1 floats plus two masked halves, with branches between:
the copy of B took 16% of the kernel's samples. Padding lies only in the last trip of the last
block along each padded dimension (llvm_emit._edges keeps the loops where it does), so each such
loop is split before its last trip: in the first part the condition is provably true and folds
away, and LLVM copies whole vectors. gemm 127x251x509's returned plan (8x32 tiles) ran 6% faster
(Intel Xeon, BENCHMARKS.md "Prefetch-burst session").

TensorIR's loop_partition renames the blocks it splits, so the split is made on the finished
module, as `build` and the exported schedule.py compile it, not on the schedule that tests and
reports read by block name.
"""
from __future__ import annotations

import tvm
from tvm import s_tir


def partition_edges(mod, edges: list[tuple[str, list[int]]]):
    """The module with each (copy block name, loop depths) of `edges` split before the last trip
    of each loop at those depths (outermost first), the later splits in the first part only."""
    if not edges:
        return mod
    sch = s_tir.Schedule(mod)
    for name, depths in edges:
        block, base = sch.get_sblock(name), 0
        for depth in depths:  # llvm_emit._edges keeps loops of two trips or more
            loop = sch.get_loops(block)[depth - base]
            inside = sch.loop_partition(loop, [sch.get(loop).extent.value - 1])[0]
            # The first part sits in a block of its own: its loops count from the split one.
            block, base = sch.get_child_blocks(inside)[0], depth
    return tvm.IRModule({"main": sch.mod["main"]})
