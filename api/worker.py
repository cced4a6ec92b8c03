"""What the service's child processes run (see pool.py); each takes a `progress` callback."""
from __future__ import annotations

from ..models.plan import TuneResult
from ..optimizer import tune as _tune  # noqa: F401  (preloaded by the pool's fork server)
from .progress import Progress, scaled
from .request import PlanRequest, document


def plan_document(request: PlanRequest, progress: Progress | None = None) -> str:
    """Solve and return the `tune --json` document."""
    return document(request.solve())


def measure_plans(doc: str, repeat: int, progress: Progress | None = None) -> list[dict]:
    """Build and time the plan and each alternative of a `tune --json` document on this CPU with TVM."""
    from ..backends.measure import measure  # TVM loads only for jobs that measure

    result = TuneResult.model_validate_json(doc)
    plans = [result.plan, *result.alternatives]
    out = []
    for i, plan in enumerate(plans):
        step = scaled(progress, i / len(plans), (i + 1) / len(plans))
        out.append(measure(result, plan, repeat=repeat, progress=step).model_dump(mode="json"))
    return out
