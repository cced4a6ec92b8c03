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


def copy_moves(stmt, lanes: int, mult=1, inner=None, acc=None):
    """Per block: (vectors, single elements) its innermost loop moves, the loop's trips times its
    runs: a vectorised innermost loop of extent e moves ceil(e / lanes) vectors per trip of the
    loops around it, any other loop one element per run."""
    acc = {} if acc is None else acc
    if isinstance(stmt, tirx.For):
        copy_moves(stmt.body, lanes, mult * int(stmt.extent), stmt, acc)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            copy_moves(s, lanes, mult, inner, acc)
    elif isinstance(stmt, s_tir.SBlockRealize):
        vectors, elements = acc.get(stmt.block.name_hint, (0.0, 0.0))
        if inner is not None and inner.kind == tirx.ForKind.VECTORIZED:
            extent = int(inner.extent)
            vectors += mult / extent * -(-extent // lanes)
        else:
            elements += mult
        acc[stmt.block.name_hint] = (vectors, elements)
        copy_moves(stmt.block.body, lanes, mult, None, acc)
    elif hasattr(stmt, "body"):
        copy_moves(stmt.body, lanes, mult, inner, acc)
    return acc
