"""Loop-nest workloads: named loops with extents, tensors indexed by loops, and ops.

A workload is plain data (pydantic). Built-in kinds are made by `builtin()`; a
user-defined one is validated from the same JSON shape the plan's `workload`
object has, so `tune --json` output can be fed back in.
"""
from __future__ import annotations

import math
import numbers
import string
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import InvalidInput, one_line_errors

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "int32": 4}
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int8", "int32"]
Role = Literal["input", "output", "intermediate"]
# Kernels index with 32-bit integers; larger extents would also make the tile
# candidate sets (which grow with sqrt(extent)) too large to search.
MAX_EXTENT = 2**31 - 1


class Tensor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dims: list[str] = Field(min_length=1, description="loops indexing each dimension, outermost (row-major) first")
    role: Role | None = Field(None, description="derived from the ops when omitted")


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
            unknown = [d for d in t.dims if d not in self.dims]
            if unknown:
                raise ValueError(f"tensor {name!r} is indexed by unknown loop(s) {unknown}")
            if len(set(t.dims)) != len(t.dims):
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
                stray = [d for d in self.tensors[t].dims if d not in op.loops]
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
        io = [n for n, t in self.tensors.items() if t.role != "intermediate"]
        if self.signature is None:
            first_use = [t for op in self.ops for t in op.inputs if self.tensors[t].role == "input"]
            ins = list(dict.fromkeys(first_use))
            self.signature = ins + [op.output for op in self.ops if self.tensors[op.output].role == "output"]
        elif sorted(self.signature) != sorted(io):
            raise ValueError(f"signature must list each input and output tensor once: {sorted(io)}")
        return self

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

    def shape(self, name: str) -> list[int]:
        """The tensor's array shape: its loops' extents, in its dims order."""
        return [self.dims[x] for x in self.tensors[name].dims]

    def size(self, name: str) -> float:
        """Elements of the whole tensor."""
        return float(math.prod(self.shape(name)))

    def block(self, name: str, tile: Mapping[str, np.ndarray | int], within=None) -> np.ndarray | float:
        """Elements of the tensor's block under `tile` (loop -> extent, arrays allowed): the
        product of its loops' tiles, over only the loops in `within` when given."""
        block = 1.0
        for x in self.tensors[name].dims:
            if within is None or x in within:
                block = block * np.asarray(tile[x], dtype=np.float64)
        return block

    def einsum(self, op: Op) -> str:
        """The op as an einsum spec over letters, e.g. 'ab,bc->ac' (inputs, then output)."""
        letters = dict(zip(op.loops, string.ascii_letters))
        spell = lambda t: "".join(letters[x] for x in self.tensors[t].dims)  # noqa: E731
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
class Kind:
    """A built-in workload kind. The CLI's subcommands and flags, the service's short forms
    and their schema are all generated from KINDS, so a new kind is one entry here."""

    name: str
    summary: str  # the kind's equations, shown as CLI help and schema description
    loops: tuple[str, ...]  # the extents it takes (the batch loop b aside), in dims order
    tensors: dict[str, tuple[str, ...]]  # name -> loops indexing it (b is prepended when batched)
    ops: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str], ...]  # (name, loops, inputs, output)
    batch: Literal["optional", "required"] = "optional"  # a batch loop b indexing every tensor
    defaults: dict[str, str] = field(default_factory=dict)  # loop -> loop whose extent it takes when omitted
    batched_name: str | None = None  # the kind reported when a batch is given


_GEMM = dict(loops=("m", "n", "k"), tensors={"A": ("m", "k"), "B": ("k", "n"), "C": ("m", "n")},
             ops=(("gemm", ("m", "n", "k"), ("A", "B"), "C"),))
KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("gemm", "C[m,n] = A[m,k] B[k,n]", batched_name="batch-gemm", **_GEMM),
    Kind("batch-gemm", "C[b,m,n] = A[b,m,k] B[b,k,n]", batch="required", **_GEMM),
    Kind("gemm-chain", "C[m,l] = A[m,k] B[k,l]; E[m,n] = C[m,l] D[l,n]",
         loops=("m", "l", "k", "n"),
         tensors={"A": ("m", "k"), "B": ("k", "l"), "C": ("m", "l"), "D": ("l", "n"), "E": ("m", "n")},
         ops=(("gemm1", ("m", "l", "k"), ("A", "B"), "C"), ("gemm2", ("m", "l", "n"), ("C", "D"), "E")),
         defaults={"n": "m", "k": "m", "l": "m"}),
]}


def builtin(kind: str, dims: dict[str, int], dtype: str = "float32") -> Workload:
    """Build a kind of KINDS (gemm, batch-gemm, gemm-chain); a `b` entry in dims adds a batch
    loop indexing every tensor, and a loop with a default may be left out."""
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise InvalidInput(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    if not isinstance(dims, Mapping):
        raise InvalidInput(f"dims must map loop names to extents, got {type(dims).__name__}")
    spec = KINDS.get(kind)
    if spec is None:
        raise InvalidInput(f"unknown workload kind {kind!r}; expected {', '.join(KINDS)}")
    batch = ["b"] if "b" in dims else []
    if spec.batch == "required" and not batch:
        raise InvalidInput(f"{kind} needs a batch extent b")
    dims = {**{x: dims[d] for x, d in spec.defaults.items() if x not in dims and d in dims}, **dims}
    missing = [x for x in spec.loops if x not in dims]
    if missing:
        raise InvalidInput(f"{kind} needs extents for {missing}")
    extra = [x for x in dims if x not in [*spec.loops, *batch]]
    if extra:
        raise InvalidInput(f"{kind} has no loop(s) {extra}")
    with one_line_errors():
        return Workload(
            kind=spec.batched_name if batch and spec.batched_name else kind,
            dims={x: dims[x] for x in batch + list(spec.loops)},
            dtype=dtype,
            tensors={t: {"dims": batch + list(d)} for t, d in spec.tensors.items()},
            ops=[{"name": n, "loops": batch + list(loops), "inputs": list(ins), "output": out} for n, loops, ins, out in spec.ops],
        )


def workload_from_dict(data: dict) -> Workload:
    """A full workload object, the short form {"kind", "dims", "dtype"} of a built-in, or a `tune --json` document."""
    if not isinstance(data, dict):
        raise InvalidInput("a workload must be a JSON object")
    if "workload" in data and isinstance(data["workload"], dict):
        data = data["workload"]
    if "tensors" not in data and "ops" not in data:
        unknown = set(data) - {"kind", "dims", "dtype"}
        if unknown:
            raise InvalidInput(f"unknown workload field(s) {sorted(unknown)}")
        if not isinstance(data.get("dims"), dict):
            raise InvalidInput("a workload needs 'dims', an object of loop extents")
        return builtin(str(data.get("kind", "")), data["dims"], data.get("dtype", "float32"))
    with one_line_errors():
        return Workload.model_validate(data, strict=True)  # as the service: "32" is not an extent
