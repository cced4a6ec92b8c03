"""One tuning request, whether it comes from the CLI's flags or the service's JSON body.

Both front ends build a PlanRequest and call `solve`, so they answer the same
document for the same request, and the service's cache key is defined here.
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError

from ..models.hardware import PRESETS, Hardware, preset
from ..models.plan import TuneResult
from ..models.workload import BuiltinSpec, Workload, workload_from_dict
from ..optimizer.tune import SOLVERS, tune

MAX_TOP = 100


def describe(errors) -> str:
    """pydantic's list of errors as one line: `field.path: message; ...`."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def one_line(exc: Exception) -> str:
    """An error as one line."""
    if isinstance(exc, ValidationError):
        return describe(exc.errors())
    return str(exc).replace("\n", " ")


def _workload(value: Any) -> Workload:
    if isinstance(value, Workload):
        return value
    try:
        return workload_from_dict(value)
    except ValidationError as exc:  # re-raised as one message under the `workload` field
        raise ValueError(one_line(exc)) from None


def _hardware(value: Any) -> Hardware:
    if isinstance(value, Hardware):
        return value
    expected = f"expected one of {', '.join(PRESETS)} or a hardware object"
    if isinstance(value, str):  # preset names only: a request must not read the server's files
        if value not in PRESETS:
            raise ValueError(f"unknown hardware {value!r}; {expected}")
        return preset(value)
    if not isinstance(value, dict):
        raise ValueError(f"hardware must be a preset name or an object; {expected}")
    try:
        return Hardware.model_validate(value)
    except ValidationError as exc:
        raise ValueError(one_line(exc)) from None


WorkloadSpec = Annotated[Workload, PlainValidator(_workload, json_schema_input_type=BuiltinSpec | Workload)]
HardwareSpec = Annotated[Hardware, PlainValidator(_hardware, json_schema_input_type=Literal[PRESETS] | Hardware)]
SolverName = Literal[tuple(SOLVERS)]


class PlanRequest(BaseModel):
    """Workload, hardware and solver options: everything a plan depends on."""

    model_config = ConfigDict(extra="forbid")
    workload: WorkloadSpec = Field(description="the short form {kind, dims, dtype} or a full workload object")
    hardware: HardwareSpec = Field("host", description="a preset name or a hardware object")
    solver: SolverName = "auto"
    time_limit: float = Field(10.0, gt=0, allow_inf_nan=False, description="seconds the solver may take")
    top: int = Field(3, ge=0, le=MAX_TOP, description="alternatives to return besides the plan")

    def cache_key(self) -> str:
        """A hash of everything the answer depends on (the resolved workload and hardware, the solver options)."""
        data = {
            "workload": self.workload.model_dump(mode="json"),
            "hardware": self.hardware.model_dump(mode="json"),
            "solver": self.solver,
            "time_limit": self.time_limit,
            "top": self.top,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def solve(self) -> TuneResult:
        """Run the optimizer; raises as `tune` does."""
        return tune(self.workload, self.hardware, self.solver, self.time_limit, self.top)


def document(result: TuneResult) -> str:
    """The JSON text `tune --json` prints and the service returns."""
    return result.model_dump_json(indent=2)
