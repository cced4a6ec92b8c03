"""What a plan is ranked by: its predicted time, or the data moved into one level.

Every solver, the polish and the plan document rank plans through an
Objective, so the formula lives in one place (costmodel.predicted_seconds):
each level's link costs DV_l / divisor_l, compute counts or not, on SIMD CPUs
level 0's link adds to compute, compute and the links overlap as the target's
overlap_norm says (the slowest alone, or on SIMD CPUs a 4-norm), and the
kernel's serial costs (the target's kernel_costs: packing copies, parallel
regions, the call) add to the whole.
`time_objective` divides by each link's bandwidth; `dv_objective(l)` (the
Pareto sweeps) costs DV_l alone, in bytes.

A hardware cache (the target's cache_bytes) is not emptied between the plan's
tiles at its level: it keeps whatever fits. So the time objective costs its link
with `effective_dv`: the least DV of any level, its own or an outer one
(or the whole problem, each tensor once), whose tile fits the cache. The
outermost level's DV counts no intermediate of a chain (the contract), but the
kernel writes each intermediate's buffer and reads it back: standing in for a
cache, that level adds those bytes (WholeProblem.intermediates). DV_l itself
keeps Accera's refill semantics (exact against the simulator); measured on gemm
1024^3, plans with 1x32x2 L2 tiles under a 29 KiB L3 tile ran in 6.5 ms, where
their L2 DV alone predicts 26 ms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from .costmodel import overlapped, predicted_seconds
from .hardware import Hardware


@dataclass(frozen=True)
class Objective:
    divisors: tuple[float, ...]  # per level, innermost first: DV_l / divisor_l is the link's cost
    counts_compute: bool  # whether the arithmetic's time enters the cost
    shares_issue: bool  # level 0's cost adds to compute instead of overlapping it
    level: int | None = None  # dv_objective's level
    caches: tuple[int | None, ...] = ()  # per level: bytes a hardware cache holds (None: its DV is exact)
    norm: float = np.inf  # how compute and the links overlap (costmodel.overlapped)

    @property
    def counts_serial(self) -> bool:
        """Whether the kernel's serial costs (copies, regions, the call) enter the cost."""
        return self.counts_compute

    def links(self, dv: Sequence, mu: Sequence | None = None, whole: WholeProblem | None = None) -> list:
        """Each level's cost from its DV in bytes (scalars or arrays); with the levels' MU and
        the whole problem's (DV, MU), from effective_dv."""
        if mu is not None and self.caches:
            dv = effective_dv(dv, mu, self.caches, whole)
        return [d / div for d, div in zip(dv, self.divisors)]

    def compute(self, seconds):
        """The arithmetic's share of the cost (0 when it does not count)."""
        return seconds if self.counts_compute else np.zeros_like(np.asarray(seconds, dtype=np.float64))

    def value(self, compute, links, serial=0.0) -> tuple[np.ndarray, np.ndarray]:
        """The cost of plans and the index of the level that sets it (-1: compute), plus the
        serial seconds when they count. Vectorised."""
        best, index = predicted_seconds(self.compute(compute), links, self.shares_issue, self.norm)
        return (best + serial if self.counts_serial else best), index

    def overlap(self, *terms):
        """Compute and link times (or what bounds them) combined as `value` combines them."""
        return overlapped(terms, self.norm)


def fitting_dv(fit: int, tiles) -> np.ndarray:
    """The least DV among `tiles`, (DV, MU) pairs (scalars or arrays), whose MU fits a hardware
    cache of `fit` bytes: at most what that cache moves (inf where none fits)."""
    least = np.inf
    for dv, mu in tiles:
        least = np.where(np.asarray(mu) <= fit, np.minimum(least, dv), least)
    return least


class WholeProblem(NamedTuple):
    """One tile holding the whole problem, as effective_dv's last stand-in for a cache."""

    dv: float  # each tensor moved once, a chain's intermediates too
    mu: float  # all of it held
    intermediates: float  # a chain's intermediates written and read back once: what the outermost
    # level's DV leaves out when it stands in for a cache (0 without intermediates)

    def standing(self, level: int, top: int) -> float:
        """What level `level` (of levels 0..top) adds to its DV when it stands in for an inner
        cache: the outermost, the intermediates its DV leaves out."""
        return self.intermediates if level == top else 0.0


def effective_dv(dv: Sequence, mu: Sequence, caches: Sequence[int | None], whole: WholeProblem | None) -> list:
    """Per level, the bytes moved into it: its DV, or where it is a hardware cache of
    `caches[l]` bytes, no more than the DV of a level outside it (the outermost with its
    intermediates, `whole.intermediates`) or of the whole problem whose MU fits (fitting_dv).
    Scalars or arrays, innermost level first."""
    top = len(dv) - 1
    outer = [(d + (whole.standing(j, top) if whole is not None else 0.0), m) for j, (d, m) in enumerate(zip(dv, mu))]
    out = list(dv)
    for i, fit in enumerate(caches):
        if fit is not None:
            outside = [*outer[i + 1:], *([whole[:2]] if whole is not None else [])]
            out[i] = np.minimum(dv[i], fitting_dv(fit, outside))
    return out


def charged_dv(workload, hardware: Hardware, dv: Sequence, mu: Sequence) -> list:
    """The bytes the time objective charges each level of one plan (its DV and MU per level):
    effective_dv with this hardware's caches and the workload as a whole."""
    return effective_dv(dv, mu, time_objective(hardware).caches, whole_problem(workload, hardware))


def whole_problem(workload, hardware: Hardware) -> WholeProblem:
    """The whole problem as one tile: each tensor moved once, a chain's intermediates too (the
    kernel writes and reads their buffers), all of it held; and the intermediates' bytes
    written and read back once."""
    from .costmodel import level_usage

    moved = sum(workload.size(name) for name in workload.tensors) * workload.elem_bytes
    inner = sum(workload.size(n) for n, t in workload.tensors.items() if t.role == "intermediate")
    held = float(level_usage(workload, hardware, len(hardware.levels) - 1, dict(workload.dims)))
    return WholeProblem(float(moved), held, 2.0 * inner * workload.elem_bytes)


def time_objective(hardware: Hardware) -> Objective:
    """Predicted seconds on the hardware."""
    target = hardware.target
    return Objective(tuple(lv.bandwidth_bytes_per_s for lv in hardware.levels), True,
                     target.registers_share_issue, caches=tuple(target.cache_bytes(i) for i in range(len(hardware.levels))),
                     norm=target.overlap_norm)


def dv_objective(hardware: Hardware, level: int) -> Objective:
    """Bytes moved into `level` alone (other links and compute cost nothing)."""
    divisors = tuple(1.0 if j == level else np.inf for j in range(len(hardware.levels)))
    return Objective(divisors, False, hardware.target.registers_share_issue and level == 0, level)
