"""One tuning request, whether it comes from the CLI's flags or the service's JSON body.

Both front ends build a PlanRequest and call `solve`, so they answer the same
document for the same request, and the service's cache key is defined here.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, TypeAdapter, ValidationError, create_model,
                      field_validator, model_validator)

from ..models.errors import InvalidInput
from ..models.hardware import PRESETS, Hardware, preset
from ..models.plan import TuneResult
from ..models.einsum import workload_from_equations
from ..models.workload import KINDS, MAX_EXTENT, Dtype, Kind, Workload, builtin
from ..backends.rpc_tracker import parse_rpc
from ..optimizer.tune import SOLVERS, tune
from .autotune import MAX_AUTOTUNE
from .errors import one_line

MAX_TOP = 100
MAX_MEASURE_BYTES = 2**30  # measuring allocates every tensor, twice (kernel and numpy)

# The short forms of the built-in workloads, generated from models.workload.KINDS and typed, so
# the schema says what a valid body is.
Extent = Annotated[int, Field(ge=1, le=MAX_EXTENT)]
_BATCH = "a batch loop indexing every tensor"


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("-"))


def _short_form(kind: Kind) -> type[BaseModel]:
    """{kind, dims, dtype} for one kind: dims takes its loops (those with a default may be
    left out) and the batch loop b."""
    fields: dict[str, Any] = {}
    for x in kind.loops:
        default = kind.defaults.get(x)
        fields[x] = (Extent, ...) if default is None else (Extent | None, Field(None, description=f"defaults to {default}"))
    if kind.batch != "none":
        fields["b"] = (Extent, Field(description=_BATCH)) if kind.batch == "required" else \
            (Extent | None, Field(None, description=f"optional: {_BATCH}"))
    config = ConfigDict(extra="forbid")
    dims = create_model(f"{_camel(kind.name)}Dims", __config__=config, **fields)
    options: dict[str, Any] = {}
    for p in kind.params:
        kind_of = Literal[p.choices] if p.choices else Annotated[int, Field(ge=p.minimum)]
        options[p.name] = (kind_of if p.default is not None else kind_of | None, Field(p.default, description=p.help))
    return create_model(_camel(kind.name), __config__=config, __doc__=kind.summary,
                        kind=(Literal[kind.name], ...), dims=(dims, ...), dtype=(Dtype, "float32"), **options)


class Einsum(BaseModel):
    """Equations such as 'C[m,n] = A[m,k]*B[k,n]' run in order (or one einsum spec 'mk,kn->mn'),
    with every loop's extent; `shapes` gives the stored shape of an input whose affine index
    reaches outside it (padding)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["einsum"]
    equations: list[str] | str
    dims: dict[str, Extent]
    dtype: Dtype = "float32"
    shapes: dict[str, list[Extent]] | None = None


SHORT_FORMS = (*(_short_form(k) for k in KINDS.values()), Einsum)
ShortForm = Union[SHORT_FORMS]  # noqa: UP007  (a runtime tuple of models)
_SHORT = TypeAdapter(Annotated[ShortForm, Field(discriminator="kind")])


def parse_workload(value: Any) -> Workload:
    """A request's workload: the short form or a full object, validated strictly (the service's
    schema; the CLI's workload files go through here too)."""
    if isinstance(value, Workload):
        return value
    # Strict: a JSON body's "5" is not the integer its schema promises.
    try:
        if isinstance(value, dict) and "tensors" not in value and "ops" not in value:
            if "equations" in value and "kind" not in value:
                value = {"kind": "einsum", **value}
            spec = _SHORT.validate_python(value, strict=True)
            if isinstance(spec, Einsum):
                return workload_from_equations(spec.equations, spec.dims, spec.dtype, spec.shapes)
            params = {p.name: getattr(spec, p.name) for p in KINDS[spec.kind].params}
            return builtin(spec.kind, spec.dims.model_dump(exclude_none=True), spec.dtype, params)
        return Workload.model_validate(value, strict=True)
    except ValidationError as exc:  # re-raised as one message under the `workload` field
        raise InvalidInput(one_line(exc)) from None


def parse_hardware(value: Any) -> Hardware:
    """A request's hardware: a preset name or an object, validated strictly (the service's schema;
    the CLI's hardware files go through here too)."""
    if isinstance(value, Hardware):
        return value
    expected = f"expected one of {', '.join(PRESETS)} or a hardware object"
    if isinstance(value, str):  # preset names only: a request must not read the server's files
        if value not in PRESETS:
            raise InvalidInput(f"unknown hardware {value!r}; {expected}")
        return preset(value)
    if not isinstance(value, dict):
        raise InvalidInput(f"hardware must be a preset name or an object; {expected}")
    try:
        return Hardware.model_validate(value, strict=True)
    except ValidationError as exc:
        raise InvalidInput(one_line(exc)) from None


WorkloadSpec = Annotated[Workload, PlainValidator(parse_workload, json_schema_input_type=Union[(*SHORT_FORMS, Workload)])]
HardwareSpec = Annotated[Hardware, PlainValidator(parse_hardware, json_schema_input_type=Literal[PRESETS] | Hardware)]
SolverName = Literal[tuple(sorted(SOLVERS))]  # sorted: the schema must not depend on import order


class PlanRequest(BaseModel):
    """Workload, hardware and solver options: everything a plan depends on."""

    model_config = ConfigDict(extra="forbid", strict=True)
    workload: WorkloadSpec = Field(description="the short form {kind, dims, dtype, options} of a built-in, "
                                   "{kind: einsum, equations, dims}, or a full workload object")
    hardware: HardwareSpec = Field("host", validate_default=True, description="a preset name or a hardware object")
    solver: SolverName = "auto"
    time_limit: float = Field(10.0, gt=0, allow_inf_nan=False, description="seconds the solver may take")
    top: int = Field(3, ge=0, le=MAX_TOP, description="alternatives to return besides the plan")
    stages: int | None = Field(None, ge=1, le=8, description="GPU: buffers per shared-memory input cache (default 2)")
    autotune: int = Field(0, ge=0, le=MAX_AUTOTUNE, description="build and time K of the model's best distinct plans "
                          "(one per register tile first on SIMD CPUs) and return the measured fastest (0: the "
                          "model's choice, unmeasured)")
    rpc: str | None = Field(None, description="with autotune: HOST:PORT:KEY of a TVM RPC tracker whose servers "
                            "measure the candidates")
    target_host: str | None = Field(None, description="with rpc: the servers' LLVM target, 'llvm -mtriple=T -mcpu=C' "
                                    "or its JSON form (default: asked from a server)")

    @field_validator("rpc")
    @classmethod
    def _rpc_address(cls, value: str | None) -> str | None:
        return None if value is None else str(parse_rpc(value))

    @model_validator(mode="after")
    def _measuring_options(self) -> PlanRequest:
        if self.rpc is not None and not self.autotune:
            raise InvalidInput("rpc measures autotune candidates: set autotune (--autotune K) too")
        if self.target_host is not None and self.rpc is None:
            raise InvalidInput("target_host (--target-host) compiles for RPC servers: set rpc (--rpc) too")
        if self.autotune:
            check_measurable(self.workload)
        return self

    def cache_key(self) -> str:
        """A hash of everything the answer depends on: the model and optimizer that solve it
        (model_version), the resolved workload and hardware, the solver options."""
        data = {
            "model": model_version(),
            "workload": self.workload.model_dump(mode="json"),
            "hardware": self.hardware.model_dump(mode="json"),
            "solver": self.solver,
            "time_limit": self.time_limit,
            "top": self.top,
            "stages": self.stages,
        }
        if self.autotune:  # only then: a plain plan depends on none of these
            data.update(autotune=self.autotune, rpc=self.rpc, target_host=self.target_host)
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def solve(self, progress=None, store=None) -> TuneResult:
        """Run the optimizer, and with `autotune` measure its top plans (api/autotune.py, keeping
        them in `store`); raises as `tune` and `autotune` do."""
        if self.autotune:
            from .autotune import autotune

            return autotune(self, progress, store)
        return tune(self.workload, self.hardware, self.solver, self.time_limit, self.top, self.stages)


@functools.cache
def model_version() -> str:
    """A hash of the source that decides a plan (the models and optimizer packages). The plan
    cache keys by it, so an upgrade that changes the model answers with the new model's plan
    instead of serving the documents an older one cached, which never expire."""
    from .. import models, optimizer

    return source_hash([Path(package.__file__).parent for package in (models, optimizer)])


def source_hash(roots: list[Path]) -> str:
    """A hash of the Python files under `roots`: their paths relative to their root and their bytes."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def check_measurable(workload: Workload) -> None:
    """Raise InvalidInput when measuring the workload would allocate more than MAX_MEASURE_BYTES."""
    size = int(sum(workload.size(n) for n in workload.tensors)) * workload.elem_bytes
    if size > MAX_MEASURE_BYTES:
        raise InvalidInput(f"measuring needs {size} bytes of tensors, more than {MAX_MEASURE_BYTES}; "
                           "ask with measure false (and no autotune) for the plan alone")


def document(result: TuneResult) -> str:
    """The JSON text `tune --json` prints and the service returns."""
    return result.model_dump_json(indent=2)
