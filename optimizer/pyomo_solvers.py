"""`pyomo-ipopt` and `pyomo-scip`: mathematical-programming models of the tiling problem.

Loop orders are discrete, so each model fixes one order per level and
optimises the tiles. Under the assumption that every loop runs more than once
and tiles divide evenly, DV is a posynomial in the tiles:

    DV_l = sum_T |T| * prod_{y not in T} E_y / T_{j(y), y}

where j(y) is l when y comes before T's last loop in level l's order and l+1
otherwise (the model in models/costmodel.py, minus edge effects), and MU is a
posynomial too.

* pyomo-ipopt: in log space (u = log T) both become sums of exponentials of
  linear forms, a convex program that an IPOPT-class solver (ripopt, shipped as
  a wheel) solves to its global optimum; the answer is rounded to integers,
  repaired and polished on the exact model.
* pyomo-scip: integer tiles and integer block counts N >= E/T, a MINLP solved by
  SCIP through pyscipopt with a time and gap limit.

A loop with a single trip at a level is a discrete choice too (it changes
which loops the formula sees), so each level picks an (order, single-trip
loops) pair; distinct formulas only. Every combination is solved when there
are few, else coordinate descent changes one level's pair at a time.

Rounding: floor, nearest and ceil of the relaxed tiles, repaired to fit
(local.repair); if none obeys every rule (GPU launches need whole warps, which
no relaxation sees), one level is re-chosen among all its candidates
(local.refit). If still nothing is feasible, `enumerate` decides with the time
left, so these solvers never call a problem infeasible that has a plan.
"""
from __future__ import annotations

import itertools
import logging
import math
import sys
import warnings

import numpy as np

from . import budget
from .local import polish, refit, repair
from .registry import SOLVERS, Candidate, Deadline, SolveResult, TopK, register, score
from .space import Space, order_classes, relaxed_signature

EXHAUSTIVE_COMBOS = 32
TIE_WEIGHT = 1e-3  # weight of the summed link times, which breaks compute-bound ties


def _multiplier_levels(space: Space, choice, level: int):
    """For each op tensor at `level`: (|T| elements, [(loop, level of its block count)]).

    `choice` holds per level an (order, single-trip loops) pair. A loop with one
    trip never changes a block, so the deepest position of T that matters is the
    last one of a multi-trip loop; every other loop placed above it multiplies
    T's reloads by its block count at the innermost level where it is above.
    """
    w, n = space.workload, space.n_levels
    terms = []
    for op in w.ops:
        walk = [(j, y) for j in reversed(range(level, n)) for y in choice[j][0] if y in op.loops]
        for name in w.moved_tensors(op, level, space.target.local_level(n)):
            tdims = w.tensors[name].loops
            deepest = max((i for i, (j, y) in enumerate(walk) if y in tdims and y not in choice[j][1]), default=-1)
            factors = []
            for y in op.loops:
                if y in tdims:
                    continue
                above = [j for i, (j, z) in enumerate(walk) if z == y and i < deepest]
                if above:
                    factors.append((y, min(above)))
            terms.append((math.prod(w.dims[x] for x in tdims) if w.tensors[name].plain else w.size(name), factors))
    return terms


def _mu_terms(space: Space):
    """Per op, each of its tensors' (loop, coefficient) terms per dim (MU_l = max over ops of the
    sum of block sizes; a plain dim is one term with coefficient 1)."""
    w = space.workload
    return [[[ix.terms for ix in w.index(t)] for t in [*op.inputs, op.output]] for op in w.ops]


def _block_bound(dims, tile, log_cap=None):
    """A tensor's block in a model: the product of its plain dims' tiles times, per affine dim,
    sum c T, an upper bound on its window sum c (T - 1) + 1 (a posynomial). With `log_cap`
    the tiles are log-variables and the block is divided by the capacity."""
    import pyomo.environ as pyo

    plain = [d[0][0] for d in dims if len(d) == 1 and d[0][1] == 1]
    affine = [d for d in dims if not (len(d) == 1 and d[0][1] == 1)]
    if log_cap is not None:
        block = pyo.exp(sum(tile[x] for x in plain) - log_cap)
        grow = pyo.exp
    else:
        block, grow = pyo.prod([tile[x] for x in plain]), (lambda v: v)
    for d in affine:
        block = block * sum(c * grow(tile[x]) for x, c in d)
    return block


def _scale(space: Space) -> float:
    return space.lower_bound


def _ipopt_model(space: Space, choice):
    import pyomo.environ as pyo

    w, n = space.workload, space.n_levels
    m = pyo.ConcreteModel()
    idx = [(j, x) for j in range(n) for x in space.loops]
    m.u = pyo.Var(idx, bounds=lambda _, j, x: (0.0, math.log(w.dims[x])), initialize=lambda _, j, x: 0.0)
    m.t = pyo.Var(bounds=(space.compute_seconds / _scale(space), None), initialize=1.0)
    m.c = pyo.ConstraintList()
    costs = []
    for j in range(n):
        for x in space.loops:
            parent = m.u[j + 1, x] if j + 1 < n else math.log(w.dims[x])
            m.c.add(m.u[j, x] == parent if x in choice[j][1] else m.u[j, x] <= parent)
        coef = w.elem_bytes / space.objective.divisors[j] / _scale(space)
        cost = sum(
            coef * size * pyo.exp(sum(math.log(w.dims[y]) - m.u[jy, y] for y, jy in factors))
            for size, factors in _multiplier_levels(space, choice, j)
        )
        costs.append(cost)
        m.c.add(cost <= m.t)
        log_cap = math.log(space.capacity(j) / w.elem_bytes)
        tile = {x: m.u[j, x] for x in space.loops}
        for tensors in _mu_terms(space):
            m.c.add(sum(_block_bound(dims, tile, log_cap) for dims in tensors) <= 1.0)
    m.obj = pyo.Objective(expr=m.t + TIE_WEIGHT * sum(costs))
    return m, lambda: [{x: math.exp(pyo.value(m.u[j, x])) for x in space.loops} for j in range(n)]


def _scip_model(space: Space, choice):
    import pyomo.environ as pyo

    w, n = space.workload, space.n_levels
    m = pyo.ConcreteModel()
    idx = [(j, x) for j in range(n) for x in space.loops]
    m.T = pyo.Var(idx, domain=pyo.PositiveIntegers, bounds=lambda _, j, x: (1, w.dims[x]), initialize=1)
    m.N = pyo.Var(idx, domain=pyo.PositiveIntegers, bounds=lambda _, j, x: (1, w.dims[x]), initialize=lambda _, j, x: w.dims[x])
    m.t = pyo.Var(bounds=(space.compute_seconds / _scale(space), None))
    m.c = pyo.ConstraintList()
    costs = []
    for j in range(n):
        for x in space.loops:
            m.c.add(m.N[j, x] * m.T[j, x] >= w.dims[x])  # N = ceil(E / T) at the optimum
            parent = m.T[j + 1, x] if j + 1 < n else w.dims[x]
            m.c.add(m.T[j, x] == parent if x in choice[j][1] else m.T[j, x] <= parent)
        coef = w.elem_bytes / space.objective.divisors[j] / _scale(space)
        cost = sum(
            coef * size * pyo.prod([m.N[jy, y] for y, jy in factors]) if factors else coef * size
            for size, factors in _multiplier_levels(space, choice, j)
        )
        costs.append(cost)
        m.c.add(cost <= m.t)
        cap = space.capacity(j) / w.elem_bytes
        tile = {x: m.T[j, x] for x in space.loops}
        for tensors in _mu_terms(space):
            m.c.add(sum(_block_bound(dims, tile) for dims in tensors) <= cap)
    m.obj = pyo.Objective(expr=m.t + TIE_WEIGHT * sum(costs))
    return m, lambda: [{x: pyo.value(m.T[j, x]) for x in space.loops} for j in range(n)]


def _run(engine: str, model, seconds: float) -> str:
    """Solve with a time limit; returns Pyomo's termination condition as text."""
    import pyomo.environ as pyo

    if engine == "ipopt":
        import pyomo_ripopt  # noqa: F401  (registers the 'ripopt' solver)

        solver = pyo.SolverFactory("ripopt")
        options = {"max_cpu_time": max(seconds, 0.1), "max_iter": 3000, "print_level": 0}
    else:
        solver = pyo.SolverFactory("scip_direct")
        # Quiet output and a gap limit: SCIP's console pipe can otherwise fill and stall.
        options = {"display/verblevel": 0, "limits/gap": 1e-4, "limits/time": max(seconds, 0.1)}
    # Pyomo logs a warning for every non-optimal status; the status is reported instead.
    quiet = logging.getLogger("pyomo")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = solver.solve(model, options=options, load_solutions=False)
        cond = str(result.solver.termination_condition)
        if len(result.solution) > 0:
            model.solutions.load_from(result)
    except Exception as exc:  # a solver crash must not take the request down
        return f"error: {exc}"
    finally:
        quiet.setLevel(level)
    return cond


def _round(space: Space, orders, relaxed: list[dict[str, float]], deadline: Deadline) -> Candidate | None:
    """Integer tiles near a relaxed solution: floor, nearest and ceil variants, repaired and scored;
    when none is feasible, one level of a repaired variant is re-chosen (local.refit)."""
    best, repaired = None, []
    for fn in (math.floor, round, math.ceil):
        tiles = repair(space, [{x: max(1, int(fn(v + 1e-9))) for x, v in t.items()} for t in relaxed], deadline)
        if tiles is None or tiles in repaired:
            continue
        repaired.append(tiles)
        pred, mmax, msum, ok = score(space, orders, tiles)
        if not ok:
            continue
        cand = Candidate(tuple(orders), tuple(tuple(t[x] for x in space.loops) for t in tiles), (float(pred), float(mmax), float(msum)))
        if best is None or cand.key < best.key:
            best = cand
    for tiles in repaired if best is None else []:
        best = refit(space, orders, tiles, deadline)
        if best is not None:
            break
    return None if best is None else polish(space, best, Deadline(min(deadline.left(), budget.ROUND_POLISH_SECONDS)), rounds=10)


def _level_choices(space: Space) -> list[tuple[tuple[str, ...], frozenset]]:
    """(order, single-trip loops) pairs, one per distinct cost formula at a level."""
    seen = {}
    signatures: dict[tuple, tuple] = {}  # many (order, fixed) pairs leave the same moving loops
    orders = (order_classes(space.workload, key=lambda _, o: o, leading=space.target.leading_loops(space.workload))
              if space.exhaustive_orders else space.orders)
    for order in orders:
        for r in range(len(space.loops) + 1):
            for fixed in itertools.combinations(space.loops, r):
                moving = tuple(x for x in order if x not in fixed)
                if moving not in signatures:
                    signatures[moving] = relaxed_signature(space.workload, moving)
                key = (signatures[moving], frozenset(fixed))
                seen.setdefault(key, (order, frozenset(fixed)))
    return list(seen.values())


def _solve(space: Space, deadline: Deadline, top: int, engine: str) -> SolveResult:
    build = _ipopt_model if engine == "ipopt" else _scip_model
    choices = _level_choices(space)
    best = TopK(max(top, 1))
    solved = [0]
    conditions: list[str] = []
    if "pyomo.environ" not in sys.modules and deadline.left() < budget.PYOMO_LOAD_SECONDS:
        return SolveResult("timeout", [], 0, f"less than {budget.PYOMO_LOAD_SECONDS:g} s left to load Pyomo")
    import pyomo.environ  # noqa: F401  (first use in a process: 0.4-0.9 s, before the rounding share is set)

    # Without a feasible rounded solution by then, the rest of the time goes to enumeration.
    rounding = Deadline(deadline.left() * budget.ROUNDING_SHARE)

    def at_bound() -> bool:
        return bool(best.items) and space.meets_lower_bound(best.items[0].key[0])

    def attempt(choice) -> Candidate | None:
        limit = deadline if best.items else rounding
        if limit.expired() or at_bound():
            return None
        model, extract = build(space, choice)
        cond = _run(engine, model, limit.left())
        conditions.append(cond)
        solved[0] += 1
        if cond in ("infeasible", "unknown") or cond.startswith(("error", "other")):
            return None
        try:
            cand = _round(space, tuple(c[0] for c in choice), extract(), deadline)
        except (TypeError, ValueError):  # variables without values
            return None
        if cand is not None:
            best.add(cand)
        return cand

    if len(choices) ** space.n_levels <= EXHAUSTIVE_COMBOS:
        for combo in itertools.product(choices, repeat=space.n_levels):
            attempt(tuple(combo))
    else:
        # Coordinate descent over levels, starting from no single-trip loops at any level.
        current = tuple([choices[0]] * space.n_levels)
        current_key = (attempt(current) or Candidate((), (), (np.inf,) * 3)).key
        improved = True
        while improved and not deadline.expired() and not at_bound():
            improved = False
            for j in reversed(range(space.n_levels)):
                for choice in choices:
                    if choice == current[j]:
                        continue
                    trial = current[:j] + (choice,) + current[j + 1 :]
                    cand = attempt(trial)
                    if cand is not None and cand.key < current_key:
                        current, current_key, improved = trial, cand.key, True
    if at_bound():  # meets the lower bound: nothing can do better
        return SolveResult("optimal", best.items, solved[0])
    timed_out = deadline.expired() or any(c == "maxTimeLimit" for c in conditions)
    if not best.items:
        errors = [c for c in conditions if c.startswith("error")]
        if errors and len(errors) == len(conditions):
            return SolveResult("error", [], solved[0], errors[0].removeprefix("error: "))
        if deadline.expired():
            return SolveResult("timeout", [], solved[0], "no feasible rounded solution")
        # No rounded solution was feasible, which proves nothing (the relaxation cannot see every
        # rule, such as whole warps on GPUs): enumeration decides with the time left.
        found = SOLVERS["enumerate"](space, deadline, top)
        return SolveResult(found.status, found.plans, solved[0] + found.evaluated, found.message)
    return SolveResult("timeout" if timed_out else "feasible", best.items, solved[0])


@register("pyomo-ipopt")
def solve_ipopt(space: Space, deadline: Deadline, top: int) -> SolveResult:
    return _solve(space, deadline, top, "ipopt")


@register("pyomo-scip")
def solve_scip(space: Space, deadline: Deadline, top: int) -> SolveResult:
    return _solve(space, deadline, top, "scip")
