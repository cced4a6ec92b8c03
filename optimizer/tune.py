"""The optimizer's front door: workload + hardware -> ranked, costed plans."""
from __future__ import annotations

import time

from ..models.hardware import Hardware
from ..models.plan import SolverInfo, TuneResult, make_plan
from ..models.workload import Workload
from . import auto, budget, enumeration, pyomo_solvers  # noqa: F401  (registers the solvers)
from .local import polish
from .registry import SOLVERS, Deadline, SolveResult
from .space import Space


DEFAULT_GPU_STAGES = 2
MAX_STAGES = 8


class InfeasibleError(ValueError):
    """No plan fits the hardware: the reason names the level and the bytes."""


def check_capacities(space: Space) -> None:
    for j, lv in enumerate(space.hardware.levels):
        need = space.level_footprint(j)
        if lv.capacity_bytes < need:
            raise InfeasibleError(
                f"level {lv.name!r} holds {lv.capacity_bytes} bytes but the smallest tiling "
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
) -> TuneResult:
    """Find the plan minimising predicted_seconds, plus up to `top` alternatives.

    `stages`: buffers per shared-memory input cache on GPUs (default 2, double
    buffering; N > 2 rotates N buffers); CPUs take 1.
    Raises InfeasibleError when nothing fits, ValueError on bad arguments, and
    RuntimeError when the time limit passes before any feasible plan is found.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}")
    if time_limit <= 0:
        raise ValueError(f"time limit must be > 0 seconds, got {time_limit}")
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    if stages is None:
        stages = DEFAULT_GPU_STAGES if hardware.kind == "gpu" else 1
    if not 1 <= stages <= MAX_STAGES:
        raise ValueError(f"stages must be between 1 and {MAX_STAGES}, got {stages}")
    if stages > 1 and hardware.kind != "gpu":
        raise ValueError(f"stages apply to GPU shared memory; {hardware.name!r} is a CPU (use --double-buffer)")
    start = time.perf_counter()
    space = Space(workload, hardware, stages=stages)
    check_capacities(space)
    deadline = Deadline(time_limit)
    result: SolveResult = SOLVERS[solver](space, deadline, top + 1)
    if not result.plans:
        if result.status == "infeasible":
            raise InfeasibleError(result.message or "no tiling fits the level capacities")
        raise RuntimeError(f"solver {solver!r} found no feasible plan within {time_limit:g} s ({result.status})")
    polish_deadline = Deadline(min(deadline.left(), budget.POLISH_SECONDS))
    plans = [polish(space, c, polish_deadline) for c in result.plans]
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
