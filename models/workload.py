"""Loop-nest workloads: named loops with extents, tensors indexed by loops, and ops.

A workload is plain data (pydantic). Built-in kinds are made by `builtin()`; a
user-defined one is validated from the same JSON shape the plan's `workload`
object has, so `tune --json` output can be fed back in.
"""
from __future__ import annotations

import functools
import math
import numbers
import string
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Literal, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import conv
from .einsum import workload_from_equations
from .errors import InvalidInput, one_line_errors
from .indexing import Index, IndexSyntaxError, distinct, parse_index

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "int32": 4}
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int8", "int32"]
Role = Literal["input", "output", "intermediate"]
# Kernels index with 32-bit integers; larger extents would also make the tile
# candidate sets (which grow with sqrt(extent)) too large to search.
MAX_EXTENT = 2**31 - 1


class Tensor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dims: list[str] = Field(min_length=1,
                            description="the index of each dimension, outermost (row-major) first: a loop, or "
                            "(inputs only) an affine sum such as '2*oh+kh-1' (see models/indexing.py)")
    role: Role | None = Field(None, description="derived from the ops when omitted")
    shape: list[int] | None = Field(
        None, exclude_if=lambda v: v is None,
        description="inputs only: the stored array's extents, when an affine index reaches outside it "
                    "(a convolution's padding: those elements read zero); default: up to the largest index")

    # Parsed views, cached: the cost model asks for them in its inner loops (dims are not
    # changed after validation).
    @functools.cached_property
    def index(self) -> list[Index]:
        """Each dimension's parsed index."""
        return [parse_index(d) for d in self.dims]

    @functools.cached_property
    def loops(self) -> list[str]:
        """The loops indexing the tensor, in dims order."""
        return [x for ix in self.index for x in ix.loops]

    @functools.cached_property
    def plain(self) -> bool:
        """Every dimension is one loop: the tensor is a block of its loops' iteration space."""
        return all(ix.plain for ix in self.index)


class Op(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    loops: list[str]
    inputs: list[str] = Field(min_length=1)
    output: str


class Workload(BaseModel):
    """A loop nest: `dims` maps loop name to extent; ops run in list order."""

    model_config = ConfigDict(extra="forbid")
    kind: str = "custom"
    dims: dict[str, int]
    dtype: Dtype = "float32"
    tensors: dict[str, Tensor]
    ops: list[Op] = Field(min_length=1)
    signature: list[str] | None = Field(None, description="kernel argument order; derived when omitted")

    @field_validator("dims", mode="before")
    @classmethod
    def _extents_are_integers(cls, dims):
        # Strict everywhere (files, the service, Python): "32" or true is not an extent.
        if isinstance(dims, dict):
            for loop, extent in dims.items():
                if isinstance(extent, bool) or not isinstance(extent, numbers.Integral):
                    raise ValueError(f"loop {loop!r} has extent {extent!r}; extents must be integers")
        return dims

    @field_validator("dims")
    @classmethod
    def _extents_positive(cls, dims: dict[str, int]) -> dict[str, int]:
        if not dims:
            raise ValueError("a workload needs at least one loop")
        for loop, extent in dims.items():
            if extent < 1:
                raise ValueError(f"loop {loop!r} has extent {extent}; extents must be >= 1")
            if extent > MAX_EXTENT:
                raise ValueError(f"loop {loop!r} has extent {extent}; extents must be <= {MAX_EXTENT}")
        return dims

    @model_validator(mode="after")
    def _check_and_derive(self) -> Workload:
        for name, t in self.tensors.items():
            for i, d in enumerate(t.dims):
                try:
                    parse_index(d)
                except IndexSyntaxError as exc:
                    raise ValueError(f"tensor {name!r} dim {i}: {exc}") from None
            unknown = [d for d in t.loops if d not in self.dims]
            if unknown:
                raise ValueError(f"tensor {name!r} is indexed by unknown loop(s) {unknown}")
            if len(set(t.loops)) != len(t.loops):
                raise ValueError(f"tensor {name!r} repeats a loop in its dims {t.dims}")
        outputs = [op.output for op in self.ops]
        if len(set(outputs)) != len(outputs):
            raise ValueError(f"op outputs must be unique, got {outputs}")
        if len({op.name for op in self.ops}) != len(self.ops):
            raise ValueError("op names must be unique")
        produced: set[str] = set()
        for op in self.ops:
            unknown = [x for x in op.loops if x not in self.dims]
            if unknown:
                raise ValueError(f"op {op.name!r} uses unknown loop(s) {unknown}")
            for t in [*op.inputs, op.output]:
                if t not in self.tensors:
                    raise ValueError(f"op {op.name!r} names unknown tensor {t!r}")
                stray = [d for d in self.tensors[t].loops if d not in op.loops]
                if stray:
                    raise ValueError(f"tensor {t!r} in op {op.name!r} is indexed by loop(s) {stray} the op does not run")
            if op.output in op.inputs:
                raise ValueError(f"op {op.name!r} reads its own output {op.output!r}")
            if op.output in self.tensors and any(op.output in o.inputs for o in self.ops[: self.ops.index(op)]):
                raise ValueError(f"tensor {op.output!r} is read before op {op.name!r} produces it")
            produced.add(op.output)
        consumed = {t for op in self.ops for t in op.inputs}
        used = consumed | produced
        unused = [t for t in self.tensors if t not in used]
        if unused:
            raise ValueError(f"tensor(s) {unused} are used by no op")
        unused_loops = [x for x in self.dims if not any(x in op.loops for op in self.ops)]
        if unused_loops:
            raise ValueError(f"loop(s) {unused_loops} are run by no op")
        for name, t in self.tensors.items():
            role = "intermediate" if name in produced and name in consumed else "output" if name in produced else "input"
            if t.role is not None and t.role != role:
                raise ValueError(f"tensor {name!r} is declared {t.role!r} but the ops make it {role!r}")
            t.role = role
            self._check_index(name, t)
        io = [n for n, t in self.tensors.items() if t.role != "intermediate"]
        if self.signature is None:
            first_use = [t for op in self.ops for t in op.inputs if self.tensors[t].role == "input"]
            ins = list(dict.fromkeys(first_use))
            self.signature = ins + [op.output for op in self.ops if self.tensors[op.output].role == "output"]
        elif sorted(self.signature) != sorted(io):
            raise ValueError(f"signature must list each input and output tensor once: {sorted(io)}")
        return self

    def _check_index(self, name: str, t: Tensor) -> None:
        """Affine indices and stored shapes belong to inputs; a stored shape fits the index."""
        if t.role != "input":
            bad = [d for d, ix in zip(t.dims, t.index) if not ix.plain]
            if bad:
                raise ValueError(f"tensor {name!r} is written by an op, so each dim must be one loop; got {bad[0]!r}")
            if t.shape is not None:
                raise ValueError(f"tensor {name!r}: only inputs take a stored shape")
            return
        if t.shape is None:
            low = [ix.offset + ix.extent(self.dims) for ix in t.index]
            if min(low) < 1:
                d = low.index(min(low))
                raise ValueError(f"tensor {name!r} dim {d} {t.dims[d]!r} never reaches index 0; give its shape")
            return
        if len(t.shape) != len(t.dims):
            raise ValueError(f"tensor {name!r} has {len(t.dims)} dims but a shape of {len(t.shape)}")
        for d, (ix, s) in enumerate(zip(t.index, t.shape)):
            if s < 1:
                raise ValueError(f"tensor {name!r} dim {d} has stored extent {s}; extents must be >= 1")
            if ix.plain and s != self.dims[ix.loops[0]]:
                raise ValueError(f"tensor {name!r} dim {d} is loop {ix.loops[0]!r} of extent "
                                 f"{self.dims[ix.loops[0]]}, but its shape says {s}")

    # Derived views used throughout the cost model and optimizer.
    @property
    def loops(self) -> list[str]:
        return list(self.dims)

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @cached_property
    def shared_loops(self) -> list[str]:
        """Loops run by every op; in any valid order they come before the others."""
        return [x for x in self.dims if all(x in op.loops for op in self.ops)]

    @property
    def flops(self) -> float:
        """Two flops (multiply and add) per point of each op's iteration space."""
        return sum(self.op_flops(op) for op in self.ops)

    def op_flops(self, op: Op) -> float:
        """Two flops (multiply and add) per point of the op's iteration space."""
        points = 1.0
        for x in op.loops:
            points *= self.dims[x]
        return 2.0 * points

    def index(self, name: str) -> list[Index]:
        """The tensor's parsed index per dimension."""
        return self.tensors[name].index

    def extents(self, name: str) -> list[int]:
        """Per dimension, the positions between its smallest and largest index: the loop's
        extent for a plain dim, sum c (E - 1) + 1 for an affine one (the zero-padded input)."""
        return [ix.extent(self.dims) for ix in self.index(name)]

    def shape(self, name: str) -> list[int]:
        """The tensor's stored array shape (the kernel argument): its loops' extents, in its dims
        order; an affine dim's declared extent, else its largest index plus one."""
        t = self.tensors[name]
        if t.shape is not None:
            return list(t.shape)
        return [ix.offset + ix.extent(self.dims) for ix in t.index]

    def size(self, name: str) -> float:
        """Elements the ops touch (each once): the whole tensor, for plain dims."""
        if self.tensors[name].plain:
            return float(math.prod(self.shape(name)))
        return float(math.prod(float(distinct(ix.coefficients, [self.dims[x] for x in ix.loops]))
                               for ix in self.index(name)))

    def bytes_of(self, *roles: str) -> float:
        """Bytes of every tensor with one of these roles ("input", "output", "intermediate"),
        each once: what moving them through a link at least once costs."""
        return sum(self.size(n) for n, t in self.tensors.items() if t.role in roles) * self.elem_bytes

    def block(self, name: str, tile: Mapping[str, np.ndarray | int], within=None) -> np.ndarray | float:
        """Elements of the tensor's block under `tile` (loop -> extent, arrays allowed): the
        product of its loops' tiles, over only the loops in `within` when given. An affine
        dim holds the window its loops span, sum c (T - 1) + 1."""
        block = 1.0
        for ix in self.index(name):
            if ix.plain:
                x = ix.loops[0]
                if within is None or x in within:
                    block = block * np.asarray(tile[x], dtype=np.float64)
            else:
                block = block * ix.span(tile, within)
        return block

    def einsum(self, op: Op) -> str:
        """The op as an einsum spec over letters, e.g. 'ab,bc->ac' (inputs, then output); an
        affine input is spelled by its loops (a view with one axis per loop: measurement.py)."""
        letters = dict(zip(op.loops, string.ascii_letters))
        spell = lambda t: "".join(letters[x] for x in self.tensors[t].loops)  # noqa: E731
        return ",".join(spell(t) for t in op.inputs) + "->" + spell(op.output)

    def io_tensors(self, op: Op) -> list[str]:
        """The op's inputs and outputs that are arrays of the kernel (not intermediates)."""
        return [t for t in [*op.inputs, op.output] if self.tensors[t].role != "intermediate"]

    def moved_tensors(self, op: Op, level: int, local_level: int) -> list[str]:
        """The op's tensors whose blocks move into `level` (0 = innermost).

        All of them, except intermediates from `local_level` out: the fused kernel
        keeps an intermediate's block there in a local buffer (the outermost level
        on CPUs, shared memory on GPUs), so it never travels further out, but below
        that it moves like any other tensor.
        """
        return [t for t in [*op.inputs, op.output]
                if level < local_level or self.tensors[t].role != "intermediate"]

@dataclass(frozen=True)
class Param:
    """A kind's option beside its sizes (a conv's stride): flag --NAME, field NAME of the short form."""

    name: str
    default: int | str | None
    help: str
    choices: tuple[str, ...] | None = None  # text options; otherwise an integer >= minimum
    minimum: int = 1


@dataclass(frozen=True)
class Kind:
    """A built-in workload kind. The CLI's subcommands and flags, the service's short forms
    and their schema are all generated from KINDS, so a new kind is one entry here.

    A kind is a preset of equations (models/einsum.py) over its sizes, or, when its loops
    are derived from its sizes (a conv's output height), a `build` function that writes them."""

    name: str
    summary: str  # the kind's equations, shown as CLI help and schema description
    loops: tuple[str, ...]  # the sizes it takes (flag --X each; the batch loop b aside)
    equations: tuple[str, ...] = ()  # "op: OUT[..] = IN[..]*IN[..]"; b is prepended to every index when batched
    batch: Literal["optional", "required", "none"] = "optional"  # a batch loop b indexing every tensor
    defaults: dict[str, str] = field(default_factory=dict)  # size -> size whose value it takes when omitted
    batched_name: str | None = None  # the kind reported when a batch is given
    params: tuple[Param, ...] = ()
    # sizes, **params -> (equations, loop extents, stored input shapes)
    build: Callable[..., tuple[list[str], dict[str, int], dict[str, list[int]]]] | None = None


_GEMM = dict(loops=("m", "n", "k"), equations=("gemm: C[m,n] = A[m,k]*B[k,n]",))
_CONV_PARAMS = (
    Param("stride", 1, "stride of the window (both axes)"),
    Param("pad", 0, "zeros added on each side of the input (both axes)", minimum=0),
    Param("dilation", 1, "spacing of the window's taps (both axes)"),
    Param("layout", "nchw", "array layout (weights K,C/G,R,S or R,S,C/G,K)", choices=conv.LAYOUTS),
    Param("groups", 1, "channel groups (C: depthwise)"),
    Param("pointwise", None, "fuse a 1x1 conv from the K output channels to this many"),
)
KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("gemm", "C[m,n] = A[m,k] B[k,n]", batched_name="batch-gemm", **_GEMM),
    Kind("batch-gemm", "C[b,m,n] = A[b,m,k] B[b,k,n]", batch="required", **_GEMM),
    Kind("gemm-chain", "C[m,l] = A[m,k] B[k,l]; E[m,n] = C[m,l] D[l,n]",
         loops=("m", "l", "k", "n"),
         equations=("gemm1: C[m,l] = A[m,k]*B[k,l]", "gemm2: E[m,n] = C[m,l]*D[l,n]"),
         defaults={"n": "m", "k": "m", "l": "m"}),
    Kind("conv2d", "O[n,k,oh,ow] = I[n,c,S*oh+D*kh-P,S*ow+D*kw-P] W[k,c,kh,kw] (optionally then a 1x1 conv)",
         loops=("n", "c", "h", "w", "k", "r", "s"), batch="none", defaults={"k": "c"}, params=_CONV_PARAMS,
         build=conv.conv2d),
]}


def builtin(kind: str, dims: dict[str, int], dtype: str = "float32", params: dict | None = None) -> Workload:
    """Build a kind of KINDS (gemm, batch-gemm, gemm-chain, conv2d) from its sizes and options;
    a `b` entry in dims adds a batch loop indexing every tensor, and a size with a default may
    be left out."""
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise InvalidInput(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    if not isinstance(dims, Mapping):
        raise InvalidInput(f"dims must map loop names to extents, got {type(dims).__name__}")
    spec = KINDS.get(kind)
    if spec is None:
        raise InvalidInput(f"unknown workload kind {kind!r}; expected {', '.join(KINDS)}")
    batch = ["b"] if "b" in dims and spec.batch != "none" else []
    if spec.batch == "required" and not batch:
        raise InvalidInput(f"{kind} needs a batch extent b")
    dims = {**{x: dims[d] for x, d in spec.defaults.items() if x not in dims and d in dims}, **dims}
    missing = [x for x in spec.loops if x not in dims]
    if missing:
        raise InvalidInput(f"{kind} needs extents for {missing}")
    extra = [x for x in dims if x not in [*spec.loops, *batch]]
    if extra:
        raise InvalidInput(f"{kind} has no loop(s) {extra}")
    params = dict(params or {})
    unknown = [p for p in params if p not in {q.name for q in spec.params}]
    if unknown:
        raise InvalidInput(f"{kind} has no option(s) {unknown}")
    name = spec.batched_name if batch and spec.batched_name else kind
    if spec.build is not None:
        options = {p.name: params.get(p.name, p.default) for p in spec.params}
        equations, extents, shapes = spec.build({x: dims[x] for x in spec.loops}, **options)
        return workload_from_equations(equations, extents, dtype, shapes, kind=name)
    equations = [_batched(e) for e in spec.equations] if batch else list(spec.equations)
    return workload_from_equations(equations, {x: dims[x] for x in batch + list(spec.loops)}, dtype, kind=name)


def _batched(equation: str) -> str:
    """Every tensor of the equation indexed by the batch loop b first."""
    return equation.replace("[", "[b,")


def workload_from_dict(data: dict) -> Workload:
    """A full workload object, the short form {"kind", "dims", "dtype", options} of a built-in,
    the equations form {"equations", "dims", "dtype", "shapes"}, or a `tune --json` document."""
    if not isinstance(data, dict):
        raise InvalidInput("a workload must be a JSON object")
    if "workload" in data and isinstance(data["workload"], dict):
        data = data["workload"]
    if "equations" in data:
        unknown = set(data) - {"kind", "equations", "dims", "dtype", "shapes"}
        if unknown:
            raise InvalidInput(f"unknown workload field(s) {sorted(unknown)}")
        return workload_from_equations(data["equations"], data.get("dims"), data.get("dtype", "float32"),
                                       data.get("shapes"), kind=str(data.get("kind", "einsum")))
    if "tensors" not in data and "ops" not in data:
        spec = KINDS.get(str(data.get("kind", "")))
        options = {p.name for p in spec.params} if spec else set()
        unknown = set(data) - {"kind", "dims", "dtype"} - options
        if unknown:
            raise InvalidInput(f"unknown workload field(s) {sorted(unknown)}")
        if not isinstance(data.get("dims"), dict):
            raise InvalidInput("a workload needs 'dims', an object of loop extents")
        return builtin(str(data.get("kind", "")), data["dims"], data.get("dtype", "float32"),
                       {k: v for k, v in data.items() if k in options})
    with one_line_errors():
        return Workload.model_validate(data, strict=True)  # as the service: "32" is not an extent
