"""The optimizer's front door: workload + hardware -> ranked, costed plans."""
from __future__ import annotations

import math
import numbers
import time

from ..models.checked import check_hardware, check_workload
from ..models.errors import Infeasible, InvalidInput, NoPlanInTime, SolverFailed
from ..models.hardware import Hardware
from ..models.objective import Objective
from ..models.plan import SolverInfo, TuneResult, make_plan
from ..models.workload import Workload
from . import auto, budget, enumeration, forked, pyomo_solvers  # noqa: F401  (registers the solvers)
from .local import collapsed, polish
from .registry import SOLVERS, Deadline, SolveResult, TopK, rescore
from .space import Space

InfeasibleError = Infeasible  # the name this module exported before errors were typed
MAX_STAGES = 8


def check_capacities(space: Space) -> None:
    space.target.check_launch(space.workload, space.stages)
    for j, lv in enumerate(space.hardware.levels):
        need, usable = space.level_footprint(j), space.capacity(j)
        if usable < need:
            share = f" ({usable} usable with {lv.ways}-way LRU)" if usable < lv.capacity_bytes else ""
            raise Infeasible(
                f"level {lv.name!r} holds {lv.capacity_bytes} bytes{share} but the smallest tiling "
                f"({_smallest(space, j)}) needs {need:.0f} bytes"
            )


def _smallest(space: Space, level: int) -> str:
    tiles = space.smallest_tiles(level)
    if all(v == 1 for v in tiles.values()):
        return "every tile 1"
    return "tiles " + ", ".join(f"{x}={v}" for x, v in tiles.items())


def check_time_limit(seconds) -> float:
    """The time limit as a float; InvalidInput unless it is a finite number of seconds > 0
    (nan would never expire, inf never end)."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not math.isfinite(seconds) or seconds <= 0:
        raise InvalidInput(f"time limit must be a finite number of seconds > 0, got {seconds!r}")
    return float(seconds)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def tune(
    workload: Workload,
    hardware: Hardware,
    solver: str = "auto",
    time_limit: float = 10.0,
    top: int = 3,
    stages: int | None = None,
    objective: Objective | None = None,
    register_tiles: int = 0,
) -> TuneResult:
    """Find the plan minimising predicted_seconds, plus up to `top` alternatives.

    `stages`: buffers per shared-memory input cache on GPUs (default 2, double
    buffering; N > 2 rotates N buffers); CPUs take 1. `objective` replaces the
    predicted time as what is minimised (pareto passes one level's DV); the
    returned plans are costed on the hardware as always. `register_tiles`: on
    SIMD CPUs, the alternatives also hold the best plan found around each of the
    n best register tiles alone (for autotuning to measure across micro-kernels).
    The polishes from different starts run side by side on the machine's cores, in forked
    children where that is safe (optimizer/forked.py), with the plans they give one after another.
    Raises InvalidInput on bad arguments, Infeasible when nothing fits,
    NoPlanInTime when the time limit passes before any feasible plan is found,
    and SolverFailed when the solver itself fails.
    """
    start = time.perf_counter()
    deadline = Deadline(check_time_limit(time_limit))  # setting up the space counts against the limit
    check_workload(workload)
    check_hardware(hardware)
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise InvalidInput(f"unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}")
    if not _is_int(top) or top < 0:
        raise InvalidInput(f"top must be an integer >= 0, got {top!r}")
    if not _is_int(register_tiles) or register_tiles < 0:
        raise InvalidInput(f"register_tiles must be an integer >= 0, got {register_tiles!r}")
    target = hardware.target
    if stages is None:
        stages = target.default_stages
    if not _is_int(stages) or not 1 <= stages <= MAX_STAGES:
        raise InvalidInput(f"stages must be between 1 and {MAX_STAGES}, got {stages!r}")
    target.check_stages(stages)
    space = Space(workload, hardware, stages=stages, objective=objective)
    check_capacities(space)
    result: SolveResult = SOLVERS[solver](space, deadline, max(top + 1, budget.SEARCH_PLANS))
    if not result.plans:
        if result.status == "infeasible":
            raise Infeasible(result.message or "no tiling fits the level capacities")
        if result.status == "error":
            raise SolverFailed(f"solver {solver!r} failed: {result.message}")
        why = f"{result.status}: {result.message}" if result.message else result.status
        raise NoPlanInTime(f"solver {solver!r} found no feasible plan within {time_limit:g} s ({why})")
    parts = _polish_parts(space, result.plans, deadline)
    # The collapsed starts are numbered after the search's plans, so that ties keep that order.
    for i, cand in enumerate(collapsed(space, result.plans[0]), start=len(result.plans)):
        parts.append((budget.COLLAPSED_WORK, lambda i=i, cand=cand: [
            (i, rescore(space, polish(space, cand, Deadline(deadline.left(), budget.COLLAPSED_WORK))))]))
    polished = _run(parts)
    plans = _ranked(space, [polished[i] for i in sorted(polished)])[: top + 1]
    if register_tiles:
        # One budget for them all, as before POLISH_STARTS: each is there for its register tile,
        # which a polish of its own may trade for another's.
        extra = _polished(space, enumeration.per_register_tile(space, deadline, register_tiles), deadline, starts=1)
        plans = _ranked(space, plans + extra)
    costed = [make_plan(workload, hardware, c.orders, c.tile_dicts(space.loops), stages) for c in plans]
    return TuneResult(
        workload=workload,
        hardware=hardware,
        plan=costed[0],
        solver=SolverInfo(
            name=solver, status=result.status, seconds=time.perf_counter() - start, evaluated=result.evaluated
        ),
        alternatives=costed[1:],
    )


def _polished(space: Space, cands, deadline: Deadline, starts: int | None = None) -> list:
    """The candidates polished (_polish_parts) and rescored, canonical and distinct, best first."""
    polished = _run(_polish_parts(space, cands, deadline, starts))
    return _ranked(space, [polished[i] for i in range(len(cands))])


def _run(parts: list[forked.Part]) -> dict:
    """The polished candidates of the parts, by their index."""
    return dict(pair for part in forked.run(parts) for pair in part)


def _polish_parts(space: Space, cands, deadline: Deadline, starts: int | None = None) -> list[forked.Part]:
    """The polishes of the candidates, as independent parts (optimizer/forked.py), each giving
    (index in `cands`, polished and rescored candidate) pairs: those of the first `starts` (default
    budget.POLISH_STARTS) register tiles, in rank order, each tile within a budget.POLISH_WORK of
    its own (of `deadline`), the rest within the last such tile's, one after the other; the tile
    that reads an input once (Space.read_once_seed) gets a polish of its own wherever it ranks. A
    polish is a local search, and where it ends depends on where it starts more than on the start's rank."""
    starts = budget.POLISH_STARTS if starts is None else starts
    once = space.read_once_seed()  # a start of its own as well (Space.read_once_seed)
    groups: list[list] = []
    owner: dict = {}  # register tile -> its group
    for i, cand in enumerate(cands):
        tile = cand.tiles[0]
        if tile not in owner and (len(owner) < starts or tile == once):
            owner[tile] = len(groups)
            groups.append([])
        groups[owner.get(tile, len(groups) - 1)].append((i, cand))

    def part(group: list) -> forked.Part:
        def compute() -> list:
            work = Deadline(deadline.left(), budget.POLISH_WORK)
            return [(i, rescore(space, polish(space, cand, work))) for i, cand in group]

        return budget.POLISH_WORK, compute

    return [part(group) for group in groups]


def _ranked(space: Space, cands) -> list:
    """The candidates canonical and distinct, best first (ties in the order given)."""
    out = TopK(len(cands), space)
    for cand in cands:
        out.add(cand)
    return out.items
