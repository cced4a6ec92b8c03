"""How each kind of error reaches the user: one table for the CLI's exit status and the
service's HTTP status, so the two never disagree."""
from __future__ import annotations

from pydantic import ValidationError

from ..models.errors import CachetileError, describe  # noqa: F401  (describe: used by the service too)

# kind -> (CLI exit status, HTTP status). Bad input is the user's to fix: exit 2 and 422.
# A request that is valid but cannot be answered (no plan in time, the solver or the compiler
# failed, a kernel that disagrees with the reference) exits 1 and is 422 too: the service
# worked, the request could not be processed. Only a bug is a 500.
STATUS = {
    "invalid": (2, 422),
    "infeasible": (2, 422),
    "unavailable": (2, 422),
    "no-plan": (1, 422),
    "solver-failed": (1, 422),
    "build-failed": (1, 422),
    "mismatch": (1, 422),
    "timeout": (1, 422),
    "too-large": (2, 422),
    "internal": (1, 500),
}


def kind_of(exc: BaseException) -> str:
    """The kind of an exception: its own for cachetile's errors, `invalid` for a model that did
    not validate, else `internal`."""
    if isinstance(exc, CachetileError):
        return exc.kind
    if isinstance(exc, ValidationError):
        return "invalid"
    if isinstance(exc, MemoryError):
        return "too-large"
    return "internal"


def one_line(exc: BaseException) -> str:
    """An error as one line: pydantic's list of errors joined, anything else without newlines."""
    if isinstance(exc, ValidationError):
        return describe(exc.errors())
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def exit_status(kind: str) -> int:
    return STATUS.get(kind, STATUS["internal"])[0]


def http_status(kind: str) -> int:
    return STATUS.get(kind, STATUS["internal"])[1]
