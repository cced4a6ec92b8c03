"""Workloads written as equations: `C[m,n] = A[m,k]*B[k,n]`, one per op, in run order.

    [name:] OUT[i, j, ...] = IN1[...] * IN2[...] * ...

Each index is a loop or an affine sum of loops (`2*oh+kh-1`, see
models/indexing.py); the output is indexed by plain loops and summed over the
op's other loops. A tensor one equation writes and a later one reads is an
intermediate. The classic einsum spec `bmk,bkn->bmn` is the same with one
letter per loop, inputs named A, B, ... and the output the next letter.

Loops are ordered by first appearance (the order the search lists them in);
each op runs those of its equation. Errors name the equation (1-based) and the
column.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass

from .errors import InvalidInput, one_line_errors
from .indexing import IndexSyntaxError, parse_index

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Ref:
    """A tensor reference: its name and the text of each index."""

    name: str
    index: list[str]


@dataclass
class Equation:
    name: str | None
    output: Ref
    inputs: list[Ref]


class _Cursor:
    def __init__(self, text: str, number: int):
        self.text, self.number, self.pos = text, number, 0

    def fail(self, what: str, pos: int | None = None) -> InvalidInput:
        col = (self.pos if pos is None else pos) + 1
        return InvalidInput(f"equation {self.number} {self.text!r}: {what} at column {col}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, char: str, what: str) -> None:
        if self.peek() != char:
            found = repr(self.peek()) if self.peek() else "the end"
            raise self.fail(f"expected {what}, found {found}")
        self.pos += 1

    def name(self, what: str) -> str:
        self.skip()
        m = _NAME.match(self.text, self.pos)
        if m is None:
            found = repr(self.peek()) if self.peek() else "the end"
            raise self.fail(f"expected {what}, found {found}")
        self.pos = m.end()
        return m.group()

    def ref(self) -> Ref:
        name = self.name("a tensor name")
        self.expect("[", f"'[' after {name}")
        index = []
        while True:
            self.skip()
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] not in ",]":
                self.pos += 1
            if self.pos == len(self.text):
                raise self.fail(f"expected ']' to close {name}[")
            text = self.text[start:self.pos].rstrip()
            try:
                parse_index(text)
            except IndexSyntaxError as exc:
                raise self.fail(f"{name} index {len(index)}: {exc.what}", start + exc.column - 1) from None
            index.append(text)
            sep = self.text[self.pos]
            self.pos += 1
            if sep == "]":
                return Ref(name, index)


def parse_equation(text: str, number: int = 1) -> Equation:
    """One equation; raises InvalidInput naming the equation and the column."""
    if not isinstance(text, str):
        raise InvalidInput(f"equation {number} must be text, got {type(text).__name__}")
    cur = _Cursor(text, number)
    label = None
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:", text)
    if m:
        label, cur.pos = m.group(1), m.end()
    output = cur.ref()
    cur.expect("=", "'=' after the output")
    inputs = [cur.ref()]
    while cur.peek() == "*":
        cur.pos += 1
        inputs.append(cur.ref())
    if cur.peek():
        raise cur.fail(f"expected '*' or the end, found {cur.peek()!r}")
    for i, ix in enumerate(output.index):
        if not parse_index(ix).plain:
            raise cur.fail(f"output {output.name} index {i} {ix!r} must be one loop", text.index(ix, text.index(output.name)))
    return Equation(label, output, inputs)


def parse_spec(spec: str) -> list[str]:
    """The classic einsum spec `bmk,bkn->bmn` as one equation `C[b,m,n] = A[b,m,k]*B[b,k,n]`;
    equations (anything with '=') pass through, ';' separating several."""
    if "=" in spec:
        return [e.strip() for e in spec.split(";") if e.strip()]
    if spec.count("->") != 1:
        raise InvalidInput(f"einsum {spec!r}: expected 'in,in->out' or equations such as 'C[m,n] = A[m,k]*B[k,n]'")
    left, out = (part.strip() for part in spec.split("->"))
    operands = [o.strip() for o in left.split(",")]
    for o in [*operands, out]:
        bad = [ch for ch in o if ch not in string.ascii_letters]
        if bad or not o:
            col = spec.index(o) + (o.index(bad[0]) if bad else 0) + 1
            raise InvalidInput(f"einsum {spec!r}: expected one letter per loop at column {col}")
    names = list(string.ascii_uppercase[: len(operands) + 1])
    ref = lambda name, letters: f"{name}[{','.join(letters)}]"  # noqa: E731
    return [f"{ref(names[-1], out)} = " + "*".join(ref(n, o) for n, o in zip(names, operands))]


def workload_from_equations(equations: list[str] | str, dims: dict, dtype: str = "float32",
                            shapes: dict[str, list[int]] | None = None, kind: str = "einsum",
                            signature: list[str] | None = None):
    """A Workload from equations (or one einsum spec) and loop extents. `shapes` gives the
    stored shape of inputs whose affine indices reach outside them (padding)."""
    from .workload import Workload

    if isinstance(equations, str):
        equations = parse_spec(equations)
    if not isinstance(equations, list) or not equations:
        raise InvalidInput("a workload needs at least one equation")
    if not isinstance(dims, dict):
        raise InvalidInput("dims must map each loop to its extent")
    parsed = [parse_equation(e, i + 1) for i, e in enumerate(equations)]
    tensors: dict[str, list[str]] = {}
    order: dict[str, None] = {}
    ops = []
    for number, eq in enumerate(parsed, 1):
        loops: dict[str, None] = {}
        for ref in [*eq.inputs, eq.output]:  # tensors listed as they are first read, then written
            if ref.name in tensors and [parse_index(i) for i in tensors[ref.name]] != [parse_index(i) for i in ref.index]:
                raise InvalidInput(f"equation {number}: tensor {ref.name} is indexed [{','.join(ref.index)}] "
                                   f"here but [{','.join(tensors[ref.name])}] before")
            tensors.setdefault(ref.name, ref.index)
        for ref in [eq.output, *eq.inputs]:  # loops as they first appear, the output's first
            for ix in ref.index:
                loops.update(dict.fromkeys(parse_index(ix).loops))
        missing = [x for x in loops if x not in dims]
        if missing:
            raise InvalidInput(f"equation {number}: no extent for loop(s) {missing} (give them in dims)")
        order.update(loops)
        ops.append((eq.name or f"op{number}", list(loops), [r.name for r in eq.inputs], eq.output.name))
    unused = [x for x in dims if x not in order]
    if unused:
        raise InvalidInput(f"dims name loop(s) {unused} that no equation uses")
    extents = {x: dims[x] for x in order}
    shapes = shapes or {}
    unknown = [t for t in shapes if t not in tensors]
    if unknown:
        raise InvalidInput(f"shapes name tensor(s) {unknown} that no equation uses")
    spec = {n: {"dims": ix} | ({"shape": shapes[n]} if n in shapes else {}) for n, ix in tensors.items()}
    with one_line_errors():  # extents out of range, bad shapes: one line, as everywhere
        return Workload(kind=kind, dims=extents, dtype=dtype, tensors=spec, signature=signature,
                        ops=[{"name": n, "loops": [x for x in order if x in lp], "inputs": i, "output": o}
                             for n, lp, i, o in ops])
