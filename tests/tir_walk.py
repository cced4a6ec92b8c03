"""Counting what a built TensorIR schedule runs: blocks and parallel loops, by walking the IR."""
from collections import Counter

from tvm import s_tir, tirx


def block_runs(stmt, mult=1, acc=None):
    """How many times each block runs: the product of the loop extents around it."""
    acc = Counter() if acc is None else acc
    if isinstance(stmt, tirx.For):
        block_runs(stmt.body, mult * int(stmt.extent), acc)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            block_runs(s, mult, acc)
    elif isinstance(stmt, s_tir.SBlockRealize):
        acc[stmt.block.name_hint] += mult
        block_runs(stmt.block.body, mult, acc)
    elif hasattr(stmt, "body"):
        block_runs(stmt.body, mult, acc)
    return acc


def parallel_entries(stmt, mult=1) -> int:
    """How many times a parallel loop is entered: per parallel loop, the iterations around it
    (a parallel loop inside another counts as none: it runs within it)."""
    if isinstance(stmt, tirx.For):
        if stmt.kind == tirx.ForKind.PARALLEL:
            return mult
        return parallel_entries(stmt.body, mult * int(stmt.extent))
    if isinstance(stmt, tirx.SeqStmt):
        return sum(parallel_entries(s, mult) for s in stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return parallel_entries(stmt.block.body, mult)
    if hasattr(stmt, "body"):
        return parallel_entries(stmt.body, mult)
    return 0
