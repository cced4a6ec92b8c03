"""The discrete search space: tile candidates per loop and loop orders per level.

Tile candidates for a loop of extent E: every divisor of E, every power of two
below E, E itself, ceil(E/q) for every block count q, and every integer 1..E
when E <= 64 (the *fine* set). The *coarse* set drops the last two rules; solvers search it first because a plan that
reaches the lower bound there is optimal over the fine set too.

Emittable tiles: each level's tile of a loop divides the tile of the level
above, unless that one is the whole extent (the backend then pads the loop to a
multiple of the largest tile below it). On hardware with SIMD registers
(`Hardware.vector_bytes`), the loops that index an output's last dimension, the
ones the backend vectorises, also take tiles that are multiples of the vector
lanes (or the whole extent). Solvers only return plans that obey both rules.

Orders: permutations of all loops with the loops shared by every op first.
Two orders of one level are equivalent when, for every op and tensor, the walk
alternates between the same sets of tensor loops and other loops (the order
inside each run and the trailing non-tensor loops never change DV); only one
order per class is searched.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..models.costmodel import check_order, memory_usage
from ..models.hardware import Hardware
from ..models.workload import Workload


def tile_candidates(extent: int, fine: bool = True) -> np.ndarray:
    """Sorted candidate tile extents for one loop."""
    values = {d for d in range(1, int(extent**0.5) + 1) if extent % d == 0}
    values |= {extent // d for d in values}
    values |= {1 << i for i in range(extent.bit_length()) if 1 << i < extent}
    values.add(extent)
    if fine:
        # The smallest tile giving each block count q; past sqrt(E) those are all small
        # integers, so every integer up to sqrt(E) + 1 stands in for them.
        root = math.isqrt(extent)
        values |= {-(-extent // q) for q in range(1, root + 1)} | set(range(1, min(extent, root + 1) + 1))
        if extent <= 64:
            values |= set(range(1, extent + 1))
    return np.array(sorted(values), dtype=np.int64)


def _tensor_walks(workload: Workload, order):
    """For each op's input/output tensor: the op's loops in `order` and the tensor's loops."""
    for op in workload.ops:
        walk = [x for x in order if x in op.loops]
        for name in [*op.inputs, op.output]:
            yield walk, set(workload.tensors[name].dims)


def order_signature(workload: Workload, order) -> tuple:
    """What of a level's order the cost model can see (see module docstring)."""
    sig = []
    for walk, tdims in _tensor_walks(workload, order):
        runs: list[tuple[bool, frozenset]] = []
        for x in walk:
            is_t = x in tdims
            if runs and runs[-1][0] == is_t:
                runs[-1] = (is_t, runs[-1][1] | {x})
            else:
                runs.append((is_t, frozenset({x})))
        while runs and not runs[-1][0]:
            runs.pop()
        sig.append(tuple(runs))
    return tuple(sig)


def relaxed_signature(workload: Workload, order) -> tuple:
    """The signature when every loop runs more than once: per tensor, the other loops before its last loop."""
    sig = []
    for walk, tdims in _tensor_walks(workload, order):
        last = max((i for i, x in enumerate(walk) if x in tdims), default=-1)
        sig.append(frozenset(x for x in walk[:last] if x not in tdims))
    return tuple(sig)


def order_classes(workload: Workload, key=order_signature) -> list[tuple[str, ...]]:
    """One representative order per equivalence class, in a stable order."""
    shared = workload.shared_loops
    private = [x for x in workload.dims if x not in shared]
    seen: dict[tuple, tuple[str, ...]] = {}
    for head in itertools.permutations(shared):
        for tail in itertools.permutations(private):
            order = head + tail
            seen.setdefault(key(workload, order), order)
    reps = list(seen.values())
    for order in reps:
        check_order(workload, order)
    return reps


def vector_loops(workload: Workload) -> set[str]:
    """Loops indexing some output's last dimension: the backend vectorises them."""
    return {workload.tensors[op.output].dims[-1] for op in workload.ops}


@dataclass
class Space:
    """Everything a solver needs that does not depend on the plan being searched."""

    workload: Workload
    hardware: Hardware
    fine: bool = True
    loops: list[str] = field(init=False)
    candidates: dict[str, np.ndarray] = field(init=False)
    orders: list[tuple[str, ...]] = field(init=False)
    compute_seconds: float = field(init=False)
    lower_bound: float = field(init=False)
    lanes: dict[str, int] = field(init=False)

    def __post_init__(self):
        w, hw = self.workload, self.hardware
        self.loops = list(w.dims)
        self.candidates = {x: tile_candidates(e, self.fine) for x, e in w.dims.items()}
        self.orders = order_classes(w)
        self.compute_seconds = w.flops / hw.peak_flops
        # Every level loads each input and output at least once.
        io_bytes = sum(
            float(np.prod([w.dims[x] for x in t.dims])) for t in w.tensors.values() if t.role != "intermediate"
        ) * w.elem_bytes
        lanes = hw.vector_bytes // w.elem_bytes if hw.vector_bytes else 1
        self.lanes = {x: lanes if x in vector_loops(w) else 1 for x in self.loops}
        self.lower_bound = max([self.compute_seconds] + [io_bytes / lv.bandwidth_bytes_per_s for lv in hw.levels])

    def meets_lower_bound(self, seconds: float) -> bool:
        """True when a plan this fast cannot be beaten by any plan (up to rounding)."""
        return seconds <= self.lower_bound * (1 + 1e-12)

    def grid_size(self) -> int:
        """Number of tile combinations per level."""
        return math.prod(len(c) for c in self.candidates.values())

    @property
    def n_levels(self) -> int:
        return len(self.hardware.levels)

    def smallest_tiles(self) -> dict[str, int]:
        """The smallest emittable tile of each loop: 1, or the vector lanes on vector loops."""
        return {x: min(self.lanes[x], e) for x, e in self.workload.dims.items()}

    def min_footprint(self) -> float:
        """MU with the smallest tiles: below this no level can hold a plan."""
        return float(memory_usage(self.workload, self.smallest_tiles()))

    def legal(self, x: str, tiles: np.ndarray, parent: np.ndarray | int) -> np.ndarray:
        """Which tiles of loop x nest in the parent tile and suit its vector lanes (see module docstring)."""
        extent, lanes = self.workload.dims[x], self.lanes[x]
        tiles, parent = np.asarray(tiles), np.asarray(parent)
        nests = (parent % tiles == 0) | (parent == extent)
        return (tiles <= parent) & nests & ((tiles % lanes == 0) | (tiles == extent))
