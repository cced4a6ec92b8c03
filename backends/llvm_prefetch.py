"""Software prefetch of the next packed block an LLVM micro-kernel reads.

A micro-kernel that sweeps a packed input (gemm 1000^3: a 4x59 panel of A per
step of the m loop above it) meets each panel cold when the panel's block is
not reused in L2: the hardware prefetcher starts over at each panel, and the
FMA loop ran at 74% of the calibrated peak there against 84% with its data in
L2 (BENCHMARKS, "Profile session"). Prefetching the next step's panel while
this one is multiplied took gemm 1000^3 from 5.66-5.90 to 5.40-5.53 ms
("Prefetch session").

TensorIR has no schedule primitive for this, so `insert_prefetches` rewrites
the scheduled module; `build` and the exported schedule.py both call it, with
the sites `emit` chose (llvm_emit._prefetch_sites: only inputs the plan
re-streams from L3). A site is (block, depth, buffers): the loop at that depth
(outermost 0) around the block gets, first in its body, one prefetch per cache
line of the block each of those packed copies holds for the next iteration. A
copy is prefetched only when that block is one dense run of the buffer: a
strided block would fetch lines the kernel never reads.
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad
from tvm.sym import Analyzer

from ..models.caches import LINE_BYTES

DENSE = 2  # a block may span at most this many times its elements
# A block of more lines is left to the hardware prefetcher, whose streams ramp up within a
# dense run that long. The rule came from a 15-line panel (gemm 1000^3, 4-5% faster); on the
# Intel Xeon (Emerald Rapids) of BENCHMARKS.md, the plans tune returned with 24-, 48- and
# 64-line blocks ran 2-6% faster without their prefetches ("Prefetch-burst session"), a
# 16-line one within noise of it.
MAX_LINES = 16


def insert_prefetches(mod, sites: list[tuple[str, int, tuple[str, ...]]]):
    """The module with prefetches inserted at `sites`: (block name, loop depth, the packed
    buffers to prefetch). A site whose block is missing, or whose buffers hold no dense block
    that changes, is skipped."""
    func = mod["main"]
    for name, depth, buffers in sites:
        found = _find(func.body, name, [])
        if found is None or depth >= len(found[1]):
            continue
        realize, loops = found
        calls = [_prefetch(buffer, ix) for buffer, ix in _next_lines(realize, loops[depth], loops[depth + 1:], buffers)]
        if calls:
            body = tirx.SeqStmt([tirx.Evaluate(c) for c in calls] + [loops[depth].body])
            func = func.with_body(_replace(func.body, loops[depth], body))
    return tvm.IRModule({"main": func})


def _find(stmt, name: str, loops: list):
    """The realize of block `name` and the loops around it."""
    if isinstance(stmt, s_tir.SBlockRealize):
        if stmt.block.name_hint == name:
            return stmt, loops
        return _find(stmt.block.body, name, loops)
    if isinstance(stmt, tirx.For):
        return _find(stmt.body, name, loops + [stmt])
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            hit = _find(s, name, loops)
            if hit is not None:
                return hit
    return None


def _replace(stmt, loop, body):
    """`stmt` with `loop`'s body replaced by `body` (copy-on-write)."""
    def swap(node):
        if node.same_as(loop):
            return tirx.For(node.loop_var, node.min, node.extent, node.kind, body, node.thread_binding,
                            node.annotations)
        return node
    return tvm_ffi.structural_map(stmt, [(tirx.For, swap)], order="pre")


def _collect(node, kind) -> list:
    acc = []
    tvm_ffi.structural_map(node, [(kind, lambda x: acc.append(x) or x)])
    return acc


def _const(var, value: int):
    """`value` in the type of loop variable `var`."""
    return tirx.IntImm(var.ty.dtype, value)


def _substitute(expr, values: dict):
    return tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: next((x for k, x in values.items() if k.same_as(v)), v))])


def _next_lines(realize, step, inner: list, buffers):
    """(buffer, indices) of each cache line that the packed `buffers` hold at `step`'s next
    iteration, for each whose block moves with `step` and is one dense run."""
    block = realize.block
    binding = {iv.var: value for iv, value in zip(block.iter_vars, realize.iter_values)}
    out = []
    for load in {load.source.name: load for load in _collect(block.body, TensorLoad)}.values():
        if load.source.name in buffers:
            index = [_substitute(i, binding) for i in load.indices]
            out += [(load.source, ix) for ix in _line_indices(index, load.source, step.loop_var, inner)]
    return out


def _flat(index, shape, values: dict) -> int | None:
    """The row-major offset of `index` with its loops at `values`, every other loop at 0."""
    zeros = {v: _const(v, 0) for v in _collect(index, tirx.Var)}
    analyzer, offset = Analyzer(), 0
    for i, extent in zip(index, shape):
        value = analyzer.simplify(_substitute(i, {**zeros, **values}))
        if not isinstance(value, tirx.IntImm):
            return None
        offset = offset * extent + int(value)
    return offset


def _line_indices(index, buffer, step, inner: list) -> list:
    """The indices of each cache line of the block at `step`'s next iteration (its first
    element, then a line further each), or none when that block is the same as this one,
    strided (more than DENSE times its elements), or over MAX_LINES."""
    shape = [int(s) for s in buffer.shape]
    base, later = _flat(index, shape, {}), _flat(index, shape, {step: _const(step, 1)})
    if base is None or later is None or later == base:
        return []
    elements, last = 1, {}
    for loop in inner:
        top = {loop.loop_var: _const(loop.loop_var, int(loop.extent) - 1)}
        if _flat(index, shape, top) != base:
            elements *= int(loop.extent)
        last.update(top)
    span = _flat(index, shape, last) - base + 1
    per_line = LINE_BYTES // (buffer.dtype.bits // 8)
    lines = math.ceil(span / per_line)
    if span > DENSE * elements or lines > MAX_LINES or abs(later - base) < span:
        return []
    analyzer = Analyzer()
    first = [analyzer.simplify(_substitute(i, {**{loop.loop_var: _const(loop.loop_var, 0) for loop in inner},
                                                 step: step + 1})) for i in index]
    out = []
    for line in range(lines):
        carry, ix = line * per_line, list(first)
        for d in range(len(shape) - 1, -1, -1):
            if carry == 0:
                break
            if not (isinstance(ix[d], tirx.IntImm) and int(ix[d]) == 0):
                return []  # the block starts inside a dimension it would carry out of
            ix[d], carry = tirx.IntImm(ix[d].ty.dtype, carry % shape[d]), carry // shape[d]
        if carry:
            return []
        out.append(ix)
    return out


def _prefetch(buffer, indices):
    """llvm.prefetch of one element's line: a read, kept in every cache level."""
    return tirx.call_llvm_intrin("void", "llvm.prefetch.p0", tirx.address_of(tirx.BufferLoad(buffer, indices)),
                                 0, 3, 1)
