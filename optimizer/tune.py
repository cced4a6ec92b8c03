"""The optimizer's front door: workload + hardware -> ranked, costed plans."""
from __future__ import annotations

import time

from ..models.errors import Infeasible, InvalidInput, NoPlanInTime, SolverFailed
from ..models.hardware import Hardware
from ..models.objective import Objective
from ..models.plan import SolverInfo, TuneResult, make_plan
from ..models.workload import Workload
from . import auto, budget, enumeration, pyomo_solvers  # noqa: F401  (registers the solvers)
from .local import polish
from .registry import SOLVERS, Deadline, SolveResult, rescore
from .space import Space

InfeasibleError = Infeasible  # the name this module exported before errors were typed
MAX_STAGES = 8


def check_capacities(space: Space) -> None:
    for j, lv in enumerate(space.hardware.levels):
        need, usable = space.level_footprint(j), space.capacity(j)
        if usable < need:
            share = f" ({usable} usable with {lv.ways}-way LRU)" if usable < lv.capacity_bytes else ""
            raise Infeasible(
                f"level {lv.name!r} holds {lv.capacity_bytes} bytes{share} but the smallest tiling "
                f"({_smallest(space)}) needs {need:.0f} bytes"
            )


def _smallest(space: Space) -> str:
    tiles = space.smallest_tiles()
    if all(v == 1 for v in tiles.values()):
        return "every tile 1"
    return "tiles " + ", ".join(f"{x}={v}" for x, v in tiles.items())


def tune(
    workload: Workload,
    hardware: Hardware,
    solver: str = "auto",
    time_limit: float = 10.0,
    top: int = 3,
    stages: int | None = None,
    objective: Objective | None = None,
) -> TuneResult:
    """Find the plan minimising predicted_seconds, plus up to `top` alternatives.

    `stages`: buffers per shared-memory input cache on GPUs (default 2, double
    buffering; N > 2 rotates N buffers); CPUs take 1. `objective` replaces the
    predicted time as what is minimised (pareto passes one level's DV); the
    returned plans are costed on the hardware as always.
    Raises InvalidInput on bad arguments, Infeasible when nothing fits,
    NoPlanInTime when the time limit passes before any feasible plan is found,
    and SolverFailed when the solver itself fails.
    """
    if solver not in SOLVERS:
        raise InvalidInput(f"unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}")
    if time_limit <= 0:
        raise InvalidInput(f"time limit must be > 0 seconds, got {time_limit}")
    if top < 0:
        raise InvalidInput(f"top must be >= 0, got {top}")
    target = hardware.target
    if stages is None:
        stages = target.default_stages
    if not 1 <= stages <= MAX_STAGES:
        raise InvalidInput(f"stages must be between 1 and {MAX_STAGES}, got {stages}")
    target.check_stages(stages)
    start = time.perf_counter()
    space = Space(workload, hardware, stages=stages, objective=objective)
    check_capacities(space)
    deadline = Deadline(time_limit)
    result: SolveResult = SOLVERS[solver](space, deadline, top + 1)
    if not result.plans:
        if result.status == "infeasible":
            raise Infeasible(result.message or "no tiling fits the level capacities")
        if result.status == "error":
            raise SolverFailed(f"solver {solver!r} failed: {result.message}")
        raise NoPlanInTime(f"solver {solver!r} found no feasible plan within {time_limit:g} s ({result.status})")
    polish_deadline = Deadline(min(deadline.left(), budget.POLISH_SECONDS))
    plans = [rescore(space, polish(space, c, polish_deadline)) for c in result.plans]
    plans = sorted({(c.orders, c.tiles): c for c in plans}.values(), key=lambda c: c.key)
    costed = [make_plan(workload, hardware, c.orders, c.tile_dicts(space.loops), stages) for c in plans[: top + 1]]
    return TuneResult(
        workload=workload,
        hardware=hardware,
        plan=costed[0],
        solver=SolverInfo(
            name=solver, status=result.status, seconds=time.perf_counter() - start, evaluated=result.evaluated
        ),
        alternatives=costed[1:],
    )
