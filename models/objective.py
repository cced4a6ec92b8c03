"""What a plan is ranked by: its predicted time, or the data moved into one level.

Every solver, the polish and the plan document rank plans through an
Objective, so the formula lives in one place (costmodel.predicted_seconds):
each level's link costs DV_l / divisor_l, compute counts or not, on SIMD CPUs
level 0's link adds to compute, and the kernel's serial costs (the target's
kernel_costs: packing copies, parallel regions, the call) add to the whole.
`time_objective` divides by each link's bandwidth; `dv_objective(l)` (the
Pareto sweeps) costs DV_l alone, in bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .costmodel import predicted_seconds
from .hardware import Hardware


@dataclass(frozen=True)
class Objective:
    divisors: tuple[float, ...]  # per level, innermost first: DV_l / divisor_l is the link's cost
    counts_compute: bool  # whether the arithmetic's time enters the cost
    shares_issue: bool  # level 0's cost adds to compute instead of overlapping it
    level: int | None = None  # dv_objective's level

    @property
    def counts_serial(self) -> bool:
        """Whether the kernel's serial costs (copies, regions, the call) enter the cost."""
        return self.counts_compute

    def links(self, dv: Sequence) -> list:
        """Each level's cost from its DV in bytes (scalars or arrays)."""
        return [d / div for d, div in zip(dv, self.divisors)]

    def compute(self, seconds):
        """The arithmetic's share of the cost (0 when it does not count)."""
        return seconds if self.counts_compute else np.zeros_like(np.asarray(seconds, dtype=np.float64))

    def value(self, compute, links, serial=0.0) -> tuple[np.ndarray, np.ndarray]:
        """The cost of plans and the index of the level that sets it (-1: compute), plus the
        serial seconds when they count. Vectorised."""
        best, index = predicted_seconds(self.compute(compute), links, self.shares_issue)
        return (best + serial if self.counts_serial else best), index


def time_objective(hardware: Hardware) -> Objective:
    """Predicted seconds on the hardware."""
    return Objective(tuple(lv.bandwidth_bytes_per_s for lv in hardware.levels), True,
                     hardware.target.registers_share_issue)


def dv_objective(hardware: Hardware, level: int) -> Objective:
    """Bytes moved into `level` alone (other links and compute cost nothing)."""
    divisors = tuple(1.0 if j == level else np.inf for j in range(len(hardware.levels)))
    return Objective(divisors, False, hardware.target.registers_share_issue and level == 0, level)
