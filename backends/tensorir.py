"""A workload as an unscheduled TensorIR function.

Every op is a contraction: its output is the sum, over the op's loops that do
not index the output, of the product of its inputs. Loop extents are padded up
to `padded` (the schedule needs every tile to divide its parent): padded
inputs read zeros, so the padded sums equal the real ones, and only the
outputs' real elements are written back. An input with affine indices
(`2*oh+kh-1`) is read through the same kind of zero-padded copy, which starts
at its smallest index: a convolution's padding is this copy.
"""
from __future__ import annotations

from typing import Mapping

from tvm import te, tirx

from ..models.caches import crops, is_padded
from ..models.workload import Workload


def block_name(workload: Workload, op, padded: Mapping[str, int]) -> str:
    """The TensorIR block that computes an op: named after its output tensor when it writes
    the output array itself (so the kernel's arguments carry the workload's names), else
    after the op (it computes a padded or intermediate buffer)."""
    return op.output if workload.tensors[op.output].role == "output" and not crops(workload, op, padded) else op.name


def pad_name(tensor: str) -> str:
    return f"{tensor}_pad"


def padded_shape(workload: Workload, name: str, padded: Mapping[str, int]) -> list[int]:
    """The zero-padded copy's extents: each dim's indices over the padded loops."""
    return [ix.extent(padded) for ix in workload.index(name)]


def source_name(workload: Workload, name: str, padded: Mapping[str, int]) -> str:
    """The buffer an op reads for input `name`: its zero-padded copy when a loop is padded."""
    return pad_name(name) if is_padded(workload, name, padded) else name


def read_index(sch, block, buffer_name: str) -> int:
    """The position of `buffer_name` among the block's reads (what cache_read takes)."""
    return [r.source.name for r in sch.get(block).reads].index(buffer_name)


def inline_padding(sch, workload: Workload, padded: Mapping[str, int], apart=frozenset()) -> None:
    """Fold each input's zero-padding copy into the first cache that reads it, but those named in
    `apart`, which stay a pass of their own."""
    for name, t in workload.tensors.items():
        if t.role == "input" and name not in apart and is_padded(workload, name, padded):
            block = sch.get_sblock(pad_name(name))
            if sch.get_consumers(block):
                sch.compute_inline(block)


def primfunc(workload: Workload, padded: Mapping[str, int] | None = None) -> tirx.PrimFunc:
    """`main(*signature)`: arrays row-major, dims in `workload.tensors[..].dims` order."""
    dims = workload.dims
    padded = dict(dims) if padded is None else dict(padded)
    dtype = workload.dtype
    args = {n: te.placeholder(workload.shape(n), dtype=dtype, name=n)
            for n, t in workload.tensors.items() if t.role == "input"}
    values: dict[str, te.Tensor] = {}  # what ops read: padded views of inputs, padded intermediates
    for name, t in workload.tensors.items():
        if t.role != "input":
            continue
        if not is_padded(workload, name, padded):
            values[name] = args[name]
        else:
            reader = _zero_padded(args[name], [ix.offset for ix in t.index], workload.shape(name))
            values[name] = te.compute(padded_shape(workload, name, padded), reader, name=pad_name(name))
    outputs = {}
    for op in workload.ops:
        out = workload.tensors[op.output].dims
        result = te.compute([padded[x] for x in out], _contraction(workload, op, values, padded), name=block_name(workload, op, padded))
        if workload.tensors[op.output].role == "output":
            if any(padded[x] != dims[x] for x in out):
                result = te.compute([dims[x] for x in out], _copy(result), name=op.output)
            outputs[op.output] = result
        values[op.output] = result
    tensors = [args[n] if n in args else outputs[n] for n in workload.signature]
    return te.create_prim_func(tensors).with_attr("global_symbol", "main")


# te.compute reads the argument names of its body, so bodies are built by these factories.
def _zero_padded(src: te.Tensor, offsets, shape):
    """Element i of the padded copy is the array's i + offset, or zero outside the array."""
    def read(*idx):
        at = [i + off if off else i for i, off in zip(idx, offsets)]
        inside = tirx.all(*[c for i, off, n in zip(at, offsets, shape) for c in ([i >= 0] if off < 0 else []) + [i < n]])
        return tirx.if_then_else(inside, src(*at), tirx.const(0, src.dtype))

    return read


def _contraction(workload: Workload, op, values, padded):
    out = workload.tensors[op.output].dims
    axes = {x: te.reduce_axis((0, padded[x]), name=x) for x in op.loops if x not in out}

    def body(*idx):
        env = dict(zip(out, idx)) | axes
        prod = None
        for name in op.inputs:
            v = values[name](*[_index(ix, env) for ix in workload.index(name)])
            prod = v if prod is None else prod * v
        return te.sum(prod, axis=list(axes.values())) if axes else prod

    return body


def _index(ix, env):
    """sum c * loop: the index into the (padded) buffer, whose first element is the smallest index."""
    value = None
    for x, c in ix.terms:
        term = env[x] if c == 1 else env[x] * c
        value = term if value is None else value + term
    return value


def _copy(src: te.Tensor):
    return lambda *idx: src(*idx)
