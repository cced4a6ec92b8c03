"""The DV/MU trade-off at one memory level: least data movement for each capacity.

For a level l and a capacity c, the point is the plan minimising DV_l (bytes
moved into level l) subject to MU_l <= c, the other levels' capacities and the
nesting of tiles. DV_l depends only on the orders and tiles of levels >= l, so
this is found by the ordinary optimizer with DV_l as its objective
(models/objective.dv_objective). Sweeping c gives the least-DV curve; its
non-dominated (MU, DV) points are the Pareto front.
"""
from __future__ import annotations

import numbers
from typing import Callable, Sequence

import numpy as np
from pydantic import BaseModel, Field

from ..models.checked import check_hardware, check_workload
from ..models.errors import Infeasible, InvalidInput, NoPlanInTime
from ..models.hardware import Hardware
from ..models.objective import dv_objective
from ..models.plan import Plan, Status
from ..models.workload import Workload
from .space import Space
from .tune import tune

Progress = Callable[[float, str], None]

class ParetoPoint(BaseModel):
    capacity_bytes: int = Field(description="the level's capacity for this solve")
    mu_bytes: float = Field(description="MU of the level in the least-DV plan")
    dv_bytes: float = Field(description="least DV of the level with this capacity")
    predicted_seconds: float = Field(description="that plan's time on the hardware with this capacity")
    on_front: bool = Field(description="no other point has MU and DV both <= with one strictly less")
    status: Status = Field(description="the solver's status for this capacity")
    plan: Plan


class ParetoFront(BaseModel):
    workload: Workload
    hardware: Hardware
    level: str
    points: list[ParetoPoint] = Field(description="one per capacity, ascending")

    @property
    def front(self) -> list[ParetoPoint]:
        """The non-dominated points, ascending MU (and so descending DV)."""
        return [p for p in self.points if p.on_front]


def level_index(hardware: Hardware, level: int | str) -> int:
    """A level given by name or index, checked against the hardware."""
    names = [lv.name for lv in hardware.levels]
    if isinstance(level, str) and level in names:
        return names.index(level)
    if isinstance(level, int) and not isinstance(level, bool) and 0 <= level < len(names):
        return level
    raise InvalidInput(f"unknown level {level!r}; expected one of {', '.join(names)} or an index below {len(names)}")


def with_capacity(hardware: Hardware, level: int, capacity: int) -> Hardware:
    """The hardware with one level's capacity replaced."""
    levels = [lv.model_copy(update={"capacity_bytes": capacity}) if i == level else lv
              for i, lv in enumerate(hardware.levels)]
    return hardware.model_copy(update={"levels": levels})


def capacity_sweep(workload: Workload, hardware: Hardware, level: int | str, points: int = 12) -> list[int]:
    """`points` capacities, geometrically spaced, from the smallest tiling's MU to the most the level can use.

    The smallest tiling is the one tune's feasibility check uses at this level
    (Space.level_footprint: on SIMD registers and GPU levels the target's own usage); the
    sweep starts at the smallest capacity whose usable share (the target's) holds it.

    The most is the MU of the whole problem, or the next level out's capacity
    if smaller (inner tiles never exceed outer ones). The level's own capacity
    is added when it lies in that range, so the design point is on the curve.
    """
    check_workload(workload)
    check_hardware(hardware)
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise InvalidInput(f"a sweep needs an integer number of points >= 2, got {points!r}")
    i = level_index(hardware, level)
    space = Space(workload, hardware, stages=hardware.target.default_stages)
    lo = hardware.target.capacity_for(hardware.levels[i], space.level_footprint(i))
    hi = float(space.usage(i, workload.dims))
    if i + 1 < len(hardware.levels):
        hi = min(hi, hardware.levels[i + 1].capacity_bytes)
    hi = max(hi, lo)
    caps = {int(round(c)) for c in np.geomspace(lo, hi, points)}
    own = hardware.levels[i].capacity_bytes
    if lo <= own <= hi:
        caps.add(own)
    return sorted(caps)


def _mark_front(points: list[ParetoPoint]) -> None:
    best = np.inf
    for p in sorted(points, key=lambda p: (p.mu_bytes, p.dv_bytes)):
        p.on_front = p.dv_bytes < best
        best = min(best, p.dv_bytes)


def pareto(
    workload: Workload,
    hardware: Hardware,
    level: int | str = 0,
    capacities: Sequence[int] | None = None,
    points: int = 12,
    solver: str = "auto",
    time_limit: float = 10.0,
    progress: Progress | None = None,
) -> ParetoFront:
    """The least DV of `level` (name or index) for each capacity, and which points are Pareto-optimal.

    `capacities` defaults to `capacity_sweep(workload, hardware, level, points)`.
    Each capacity is one solve with `solver` and `time_limit` seconds, whose
    status the point reports (`optimal` means DV_l is the proven minimum).
    A capacity given in `capacities` that no plan fits raises InfeasibleError; the
    default sweep leaves such capacities out (on GPUs a block needs whole warps of
    threads, so the smallest footprint alone may not launch), and those where the
    solver found no plan in time (the tightest capacities search longest), and
    raises only when no capacity gave a plan.
    `progress(fraction, message)` is called before each solve and at the end.
    """
    check_workload(workload)
    check_hardware(hardware)
    i = level_index(hardware, level)
    if capacities is not None:
        bad = [c for c in capacities if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1]
        if bad or not capacities:
            raise InvalidInput(f"capacities must be whole numbers of bytes >= 1, got {bad[0] if bad else 'none'!r}")
    caps = sorted({int(c) for c in (capacity_sweep(workload, hardware, i, points) if capacities is None else capacities)})
    swept = []
    for n, cap in enumerate(caps):
        if progress:
            progress(n / len(caps), f"{hardware.levels[i].name} capacity {cap} B")
        real = with_capacity(hardware, i, cap)
        try:
            result = tune(workload, real, solver, time_limit, top=0, objective=dv_objective(real, i))
        except (Infeasible, NoPlanInTime):
            if capacities is not None or (n == len(caps) - 1 and not swept):
                raise
            continue
        plan = result.plan  # costed on the hardware with this capacity
        swept.append(ParetoPoint(
            capacity_bytes=cap, mu_bytes=plan.levels[i].mu_bytes, dv_bytes=plan.levels[i].dv_bytes,
            predicted_seconds=plan.predicted_seconds, on_front=False, status=result.solver.status, plan=plan,
        ))
    _mark_front(swept)
    if progress:
        progress(1.0, "done")
    return ParetoFront(workload=workload, hardware=hardware, level=hardware.levels[i].name, points=swept)
