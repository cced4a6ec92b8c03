"""`auto`: exact enumeration with 60% of the budget; if that times out, pyomo-ipopt with the rest, best of both.

On SIMD CPUs the register tile decides most of the time and full enumeration
rarely proves optimality within seconds (the lower bound assumes the best
register tile with ideal outer levels), so `auto` first searches around the
best register tiles (enumeration.seeded) for at most budget.SEED_WORK units of work and returns
the best plan found there (`feasible`, or `optimal` within the gap of the lower
bound); `enumerate` itself still searches the whole space. On GPUs `auto`
is enumerate stopped after budget.GPU_WORK units of work.
"""
from __future__ import annotations

from . import budget
from .enumeration import seeded
from .registry import SOLVERS, Deadline, SolveResult, TopK, register
from .space import Space


@register("auto")
def solve(space: Space, deadline: Deadline, top: int) -> SolveResult:
    if space.target.auto_strategy == "capped":
        result = SOLVERS["enumerate"](space, Deadline(deadline.left(), budget.GPU_WORK), top)
        if result.plans and result.status == "timeout":
            return SolveResult("feasible", result.plans, result.evaluated)
        return result
    if space.target.auto_strategy == "seeded" and space.objective.shares_issue:
        fast = seeded(space, deadline, top, cap=Deadline(deadline.left() * budget.ENUMERATE_SHARE, budget.SEED_WORK))
        if fast.plans:
            return SolveResult("optimal" if fast.status == "optimal" else "feasible", fast.plans, fast.evaluated)
    first = Deadline(max(deadline.left() * budget.ENUMERATE_SHARE, 0.0))
    result = SOLVERS["enumerate"](space, first, top)
    if result.status != "timeout" or deadline.left() <= 0.1:
        return result
    fallback = SOLVERS["pyomo-ipopt"](space, deadline, top)
    merged = TopK(top)
    for cand in result.plans + fallback.plans:
        merged.add(cand)
    return SolveResult("feasible" if merged.items else "timeout", merged.items, result.evaluated + fallback.evaluated)
