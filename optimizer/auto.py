"""`auto`: exact enumeration with 60% of the budget; if that times out, pyomo-ipopt with the rest, best of both."""
from __future__ import annotations

from .registry import SOLVERS, Deadline, SolveResult, TopK, register
from .space import Space


ENUMERATE_SHARE = 0.6


@register("auto")
def solve(space: Space, deadline: Deadline, top: int) -> SolveResult:
    # Enumeration is exact and usually fastest; keep a share of the budget for the NLP fallback.
    first = Deadline(max(deadline.left() * ENUMERATE_SHARE, 0.0))
    result = SOLVERS["enumerate"](space, first, top)
    if result.status != "timeout" or deadline.left() <= 0.1:
        return result
    fallback = SOLVERS["pyomo-ipopt"](space, deadline, top)
    merged = TopK(top)
    for cand in result.plans + fallback.plans:
        merged.add(cand)
    return SolveResult("feasible" if merged.items else "timeout", merged.items, result.evaluated + fallback.evaluated)
