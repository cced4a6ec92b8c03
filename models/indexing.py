"""Affine tensor indices: a dimension indexed by `c1*x1 + c2*x2 + ... + offset`.

A plain loop is one term with coefficient 1 and no offset. Convolutions index
their input by `stride*oh + dilation*kh` (minus the padding, as a negative
offset: indices outside the stored array read zero).

What the cost model needs of such a dimension:

* its *extent*, the number of positions between its smallest and largest
  index, `sum c_i (E_i - 1) + 1` (the zero-padded input's extent);
* the *span* of a block whose loops have tiles T_i, `sum c_i (T_i - 1) + 1`:
  the window a buffer holding the block allocates (what MU counts);
* the *distinct* indices a block touches, which is what the walk moves. It
  equals the span unless a coefficient jumps past the window the others
  cover (a stride larger than the kernel window leaves rows untouched). It
  depends only on the tiles, not on where the block starts.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*]))")


class IndexSyntaxError(ValueError):
    """A malformed index; `column` is 1-based within the index text."""

    def __init__(self, text: str, column: int, what: str):
        self.text, self.column, self.what = text, column, what
        super().__init__(f"index {text!r}: {what} at column {column}")


@dataclass(frozen=True)
class Index:
    """One tensor dimension's index: (loop, coefficient) terms plus a constant offset."""

    terms: tuple[tuple[str, int], ...]
    offset: int = 0

    @property
    def loops(self) -> list[str]:
        return [x for x, _ in self.terms]

    @property
    def coefficients(self) -> list[int]:
        return [c for _, c in self.terms]

    @property
    def plain(self) -> bool:
        """A bare loop: `m`."""
        return len(self.terms) == 1 and self.terms[0][1] == 1 and self.offset == 0

    def extent(self, dims: Mapping[str, int]) -> int:
        """Positions between the smallest and the largest index: sum c (E - 1) + 1."""
        return sum(c * (dims[x] - 1) for x, c in self.terms) + 1

    def span(self, tile: Mapping[str, np.ndarray | int], within=None):
        """Elements of the window a block spans, sum c (T - 1) + 1, over only the loops in
        `within` when given (the others held at one index)."""
        total = 1.0
        for x, c in self.terms:
            if within is None or x in within:
                total = total + c * (np.asarray(tile[x], dtype=np.float64) - 1)
        return total

    def __str__(self) -> str:
        text = "+".join(x if c == 1 else f"{c}*{x}" for x, c in self.terms)
        return text + (f"+{self.offset}" if self.offset > 0 else f"{self.offset}" if self.offset < 0 else "")


def distinct(coefficients: Sequence[int], sizes: Sequence[np.ndarray | float]) -> np.ndarray:
    """How many distinct values sum c_i a_i takes for a_i in [0, sizes_i); vectorised over sizes.

    One term: its size. Two terms (every convolution): with c1, c2 divided by
    their gcd, (a, b) and (a - c2, b + c1) give the same value and nothing else
    collides, so the values are the pairs with no such partner:
    T1 T2 - max(0, T1 - c2) max(0, T2 - c1). More terms: counted per distinct
    tuple of sizes (rare: no built-in workload has them).
    """
    sizes = [np.asarray(s, dtype=np.float64) for s in sizes]
    if len(sizes) == 1:
        return sizes[0]
    if len(sizes) == 2:
        g = math.gcd(*coefficients)
        c1, c2 = coefficients[0] // g, coefficients[1] // g
        t1, t2 = sizes
        return t1 * t2 - np.maximum(0.0, t1 - c2) * np.maximum(0.0, t2 - c1)
    shape = np.broadcast_shapes(*[s.shape for s in sizes])
    flat = np.stack([np.broadcast_to(s, shape).ravel() for s in sizes], axis=1).astype(np.int64)
    unique, inverse = np.unique(flat, axis=0, return_inverse=True)
    counts = np.array([_count(tuple(coefficients), tuple(int(v) for v in row)) for row in unique], dtype=np.float64)
    return counts[inverse.ravel()].reshape(shape)


@functools.lru_cache(maxsize=4096)
def _count(coefficients: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    reach = np.zeros(1, dtype=bool)
    reach[0] = True
    for c, t in zip(coefficients, sizes):
        grown = np.zeros(len(reach) + c * (t - 1), dtype=bool)
        for a in range(t):
            grown[a * c : a * c + len(reach)] |= reach
        reach = grown
    return int(reach.sum())


@functools.lru_cache(maxsize=4096)
def parse_index(text: str) -> Index:
    """`2*oh + kh - 1` -> Index((('oh', 2), ('kh', 1)), -1). Coefficients are positive
    integers (written before or after the loop), each loop appears once, and integer
    constants may be added or subtracted."""
    if not isinstance(text, str):
        raise IndexSyntaxError(str(text), 1, "expected text")
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise IndexSyntaxError(text, col, f"unexpected {text[col - 1]!r}")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
    if not tokens:
        raise IndexSyntaxError(text, 1, "expected a loop name")
    terms: dict[str, int] = {}
    offset, i, sign, sign_col = 0, 0, 1, None
    if tokens[0][1] == "-":
        i, sign, sign_col = 1, -1, tokens[0][2]
    while True:
        i, loop, value, col = _term(text, tokens, i)
        if loop is None:
            offset += sign * value
        elif sign < 0:
            raise IndexSyntaxError(text, sign_col, f"loop {loop!r} is subtracted; coefficients must be positive")
        elif value < 1:
            raise IndexSyntaxError(text, col, f"loop {loop!r} has coefficient {value}; coefficients must be positive")
        elif loop in terms:
            raise IndexSyntaxError(text, col, f"loop {loop!r} appears twice")
        else:
            terms[loop] = value
        if i == len(tokens):
            break
        kind, tok, col = tokens[i]
        if tok not in "+-":
            raise IndexSyntaxError(text, col, f"expected '+' or '-' before {tok!r}")
        sign, sign_col, i = (1 if tok == "+" else -1), col, i + 1
    if not terms:
        raise IndexSyntaxError(text, 1, "expected at least one loop")
    return Index(tuple(terms.items()), offset)


def _term(text, tokens, i):
    """One product: INT, NAME, INT*NAME or NAME*INT. Returns (next i, loop or None, value, column)."""
    if i >= len(tokens):
        raise IndexSyntaxError(text, len(text.rstrip()) + 1, "expected a loop name or an integer")
    kind, tok, col = tokens[i]
    star = i + 1 < len(tokens) and tokens[i + 1][1] == "*"
    if star:
        if i + 2 >= len(tokens):
            raise IndexSyntaxError(text, len(text.rstrip()) + 1, "expected a factor after '*'")
        kind2, tok2, col2 = tokens[i + 2]
        if {kind, kind2} != {"int", "name"}:
            raise IndexSyntaxError(text, col2, "a product must be an integer times a loop")
        loop, value = (tok2, int(tok)) if kind == "int" else (tok, int(tok2))
        return i + 3, loop, value, col
    if kind == "int":
        return i + 1, None, int(tok), col
    if kind == "name":
        return i + 1, tok, 1, col
    raise IndexSyntaxError(text, col, f"expected a loop name or an integer, got {tok!r}")
