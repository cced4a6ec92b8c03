"""The errors cachetile raises on purpose, one class per way a request can fail.

Every front end maps them the same way (api/errors.py): the CLI to an exit
status, the service to an HTTP status, a job to its `error`. Anything else
that escapes is a bug and is reported as `internal`.
"""
from __future__ import annotations


class CachetileError(Exception):
    """Base class; `kind` is the short name the service and the jobs report."""

    kind = "internal"


class InvalidInput(CachetileError, ValueError):
    """The request itself is wrong (a size, a name, a file, a combination of options).
    A ValueError too, so pydantic validators may raise it."""

    kind = "invalid"


class Infeasible(InvalidInput):
    """No plan fits the hardware: the message names the level and the bytes."""

    kind = "infeasible"


class NoPlanInTime(CachetileError):
    """The time limit passed before the solver found any feasible plan."""

    kind = "no-plan"


class SolverFailed(CachetileError):
    """The solver itself failed (a crash inside Pyomo, SCIP or ripopt), with its message."""

    kind = "solver-failed"


class BuildFailed(CachetileError):
    """Emitting, compiling or exporting the kernel failed, with the compiler's message."""

    kind = "build-failed"


class KernelMismatch(CachetileError, AssertionError):
    """A built kernel's result differs from the reference beyond the dtype's tolerance."""

    kind = "mismatch"


class Unavailable(CachetileError):
    """What was asked for needs something this machine lacks (a GPU, CuPy, nvcc)."""

    kind = "unavailable"


def describe(errors) -> str:
    """pydantic's list of errors as one line: `field.path: message; ...`."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


class one_line_errors:
    """Re-raise pydantic's ValidationError (many lines) as InvalidInput (one): for the Python
    API's constructors, which the front ends also call."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            raise InvalidInput(describe(exc.errors())) from None
        return False
