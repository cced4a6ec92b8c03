"""Counting what a built TensorIR schedule runs: blocks and parallel loops, by walking the IR."""
import math
from collections import Counter

from tvm import s_tir, tirx
from tvm.sym import Analyzer


def block_loops(stmt, loops=(), realizes=False):
    """(block name, the loops around it, outermost first) for every block, in program order;
    with `realizes`, the block's realize (its bindings) as a third item."""
    if isinstance(stmt, tirx.For):
        yield from block_loops(stmt.body, (*loops, stmt), realizes)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from block_loops(s, loops, realizes)
    elif isinstance(stmt, s_tir.SBlockRealize):
        yield (stmt.block.name_hint, loops, stmt) if realizes else (stmt.block.name_hint, loops)
        yield from block_loops(stmt.block.body, loops, realizes)
    elif hasattr(stmt, "body"):
        yield from block_loops(stmt.body, loops, realizes)


def parallel_axes(stmt) -> dict[str, list[int]]:
    """Per block under a parallel loop, the block axes (by position) its parallel loop's
    variable binds: which of the block's dims the cores split."""
    split = {}
    for name, loops, realize in block_loops(stmt, realizes=True):
        par = {lp.loop_var for lp in loops if lp.kind == tirx.ForKind.PARALLEL}
        if par:
            split[name] = [i for i, value in enumerate(realize.iter_values)
                           if par & set(tirx.analysis.undefined_vars(value))]
    return split


def block_runs(stmt) -> Counter:
    """How many times each block runs: the product of the loop extents around it, less the
    iterations its predicate masks off when that predicate reads only the two innermost loops
    (a row split into whole vectors, the last one masked: llvm_emit._copy_loops)."""
    acc = Counter()
    for name, loops, realize in block_loops(stmt, realizes=True):
        acc[name] += _kept_runs(loops, realize)
    return acc


def _kept_runs(loops, realize) -> int:
    """Runs of a block under `loops`, less those its predicate masks off when it reads only the
    two innermost loops."""
    runs = math.prod(int(lp.extent) for lp in loops)
    inner = loops[-2:]
    free = set(tirx.analysis.undefined_vars(realize.predicate))
    if free and len(inner) == 2 and free <= {lp.loop_var for lp in inner}:
        kept = sum(_holds(realize.predicate, {inner[0].loop_var: i, inner[1].loop_var: j})
                   for i in range(int(inner[0].extent)) for j in range(int(inner[1].extent)))
        runs = runs // (int(inner[0].extent) * int(inner[1].extent)) * kept
    return runs


def _holds(predicate, values: dict) -> bool:
    """Whether `predicate` holds with its loop variables bound to `values`."""
    analyzer = Analyzer()
    for var, value in values.items():
        analyzer.bind(var, tirx.const(value, var.expr_ty().dtype))
    return bool(analyzer.simplify(predicate))


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


def copy_moves(stmt, lanes: int) -> dict[str, tuple[float, float]]:
    """Per block: (vectors, single elements) its innermost loop moves, the loop's trips times its
    runs: a vectorised innermost loop of extent e moves e // lanes whole vectors and the rest in
    power-of-two parts per trip of the loops around it (what LLVM issues, checked against its
    assembly in test_kernel_costs), any other loop one element per run. A zero-padding copy's
    row split into whole vectors, the last one masked, moves the lanes it keeps one at a time
    (_lane_guarded)."""
    acc = {}
    for name, loops, realize in block_loops(stmt, realizes=True):
        runs = math.prod(int(lp.extent) for lp in loops)
        vectors, elements = acc.get(name, (0.0, 0.0))
        if loops and loops[-1].kind == tirx.ForKind.VECTORIZED and _lane_guarded(realize, loops[-1].loop_var):
            elements += _kept_runs(loops, realize)
        elif loops and loops[-1].kind == tirx.ForKind.VECTORIZED:
            extent = int(loops[-1].extent)
            vectors += runs / extent * (extent // lanes + bin(extent % lanes).count("1"))
        else:
            elements += runs
        acc[name] = (vectors, elements)
    return acc


def _lane_guarded(realize, lane) -> bool:
    """Whether the block's predicate masks lanes of the vector loop `lane` and its value is read
    under a condition (a zero-padding copy's masked last vector: llvm_emit._copy_loops). TVM
    then moves each lane on its own, a test each (test_backend checks the assembly)."""
    if lane not in set(tirx.analysis.undefined_vars(realize.predicate)):
        return False
    value = getattr(realize.block.body, "value", None)
    return hasattr(value, "op") and getattr(value.op, "name", "") == "prim.if_then_else"
