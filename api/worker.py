"""What the service's child processes run (see pool.py); each takes a `progress` callback."""
from __future__ import annotations

import json
from pathlib import Path

from ..backends.base import backend_for
from ..models.plan import TuneResult
from ..optimizer import tune as _tune  # noqa: F401  (preloaded by the pool's fork server)
from .progress import Progress, scaled
from .request import PlanRequest, document


def plan_document(request: PlanRequest, store_path: str | None = None, progress: Progress | None = None) -> str:
    """Solve (and autotune, keeping the measurements in the store at `store_path`) and return the
    `tune --json` document."""
    from .measurements import MeasurementStore

    return document(request.solve(progress, MeasurementStore(store_path) if store_path else None))


def build_plans(doc: str, repeat: int, directory: str, progress: Progress | None = None) -> dict:
    """Build the plan and each alternative of a `tune --json` document with the hardware's
    backend, export each into directory/plan-N, and measure each where this machine can
    (the backend says why not otherwise: `note`). Returns the JobResult fields."""
    result = TuneResult.model_validate_json(doc)
    backend = backend_for(result.hardware)
    plans = [result.plan, *result.alternatives]
    reason = backend.unavailable()
    exports, measurements = [], None if reason else []
    autotuned = json.loads(doc).get("autotune")
    if autotuned:  # measured already: the candidates that ran, in the order of `plans`
        measurements = [c["measurement"] for c in autotuned["candidates"] if c["measurement"]]
    for i, plan in enumerate(plans):
        step = scaled(progress, i / len(plans), (i + 1) / len(plans))
        if step:
            step(0.0, f"building plan {i + 1} of {len(plans)}")
        one = result.model_copy(update={"plan": plan, "alternatives": []})
        built = backend.build(one.workload, one.hardware, plan)
        exports.append(backend.export(one, Path(directory) / f"plan-{i}", built=built).model_dump(mode="json"))
        if measurements is not None and not autotuned:
            measurements.append(backend.measure(one, built=built, repeat=repeat, progress=step).model_dump(mode="json"))
    note = f"not measured: {backend.name} kernels run on a GPU, and this server has none ({reason})" if reason else None
    return {"measurements": measurements, "exports": exports, "note": note}
