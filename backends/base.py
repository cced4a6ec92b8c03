"""The backend interface: what every backend does with a plan, and the registry.

A backend turns a plan into a TensorIR schedule (emit), compiles it (build),
writes it to a folder (export), and runs it against a reference (measure).
The CLI, the service's jobs and the benchmarks call backends only through
`get_backend` / `backend_for` and this interface, so a new backend is one
module that registers itself here (and its target lists its name).

TVM is imported by each backend's methods, not here: the registry is cheap to
import, and the CLI only pays for TVM when a kernel is wanted.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..models.errors import BuildFailed, CachetileError, InvalidInput, Unavailable
from ..models.hardware import Hardware
from ..models.measurement import Export, Measurement
from ..models.plan import CacheRecord, Plan, TuneResult
from ..models.workload import Workload

Progress = Callable[[float, str], None]


@dataclass
class BuildOptions:
    """Choices that change the kernel but not the plan."""

    double_buffer: bool = False  # llvm: software-pipeline the input caches' copies
    arch: str = "sm_90"  # cuda: the architecture the source is generated for
    target: dict | None = None  # llvm: compile for this LLVM target (mtriple, mcpu) instead of this machine


@dataclass
class Emitted:
    """A plan as a schedule: the schedule, the caches it made, the padded extents."""

    schedule: object  # tvm.s_tir.Schedule
    caches: list[CacheRecord]
    padded: dict[str, int]
    launch: dict = field(default_factory=dict)  # GPU: threads and blocks
    prefetches: list = field(default_factory=list)  # CPU: llvm_prefetch.insert_prefetches' sites
    edges: list = field(default_factory=list)  # CPU: llvm_partition.partition_edges' copy loops


@dataclass
class Built:
    """A compiled plan: `lib` (an executable module) and/or `source` (generated code)."""

    lib: object
    emitted: Emitted
    seconds: float  # emit + compile
    source: str | None = None
    launches: list[dict] = field(default_factory=list)  # GPU: per kernel, grid, block, shared bytes, args


@dataclass
class Trial:
    """One plan's outcome in `Backend.measure_plans`: its Measurement, or why it was dropped."""

    measurement: Measurement | None = None
    error: str | None = None  # one line
    kind: str | None = None  # the error's kind (build-failed, mismatch, timeout, unavailable)
    threads: int | None = None  # the CPU threads the kernel ran on (CPU backends report it)


class Backend:
    """One code generator. Subclasses set `name` and `files` and implement the four steps."""

    name: str = ""
    files: tuple[str, ...] = ()  # what export writes
    device: str = "its device"  # what measuring its kernels needs (raise_if_unavailable's message)

    def unavailable(self) -> str | None:
        """Why kernels cannot be measured on this machine (None: they can)."""
        return None

    def raise_if_unavailable(self) -> None:
        """Raise Unavailable where kernels cannot be measured on this machine: callers that will
        measure ask first, before planning and building for nothing."""
        reason = self.unavailable()
        if reason:
            raise Unavailable(f"measuring a {self.name} kernel needs {self.device}: {reason}")

    def check(self, hardware: Hardware) -> None:
        """Raise InvalidInput unless this backend builds plans for the hardware's target."""
        target = hardware.target
        if self.name not in target.backends:
            raise InvalidInput(f"--target {self.name} does not build for {hardware.kind} hardware {hardware.name!r} "
                               f"(its backend is {target.backends[0]})")

    def build(self, workload: Workload, hardware: Hardware, plan: Plan, options: BuildOptions | None = None) -> Built:
        """Emit and compile; any failure inside the code generator becomes BuildFailed."""
        self.check(hardware)
        with build_errors():
            return self._build(workload, hardware, plan, options or BuildOptions())

    def export(self, result: TuneResult, directory: str | Path, options: BuildOptions | None = None,
               built: Built | None = None) -> Export:
        """Write the plan's files (self.files) into `directory`, building first unless `built`."""
        options = options or BuildOptions()
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidInput(f"cannot write {directory}: {exc.strerror or exc}") from None
        built = built or self.build(result.workload, result.hardware, result.plan, options)
        with build_errors():
            files, checks = self._export(result, Path(directory), options, built)
        return Export(directory=str(directory), files=files, checks=checks)

    def measure(self, result: TuneResult, plan: Plan | None = None, repeat: int = 10,
                progress: Progress | None = None, built: Built | None = None,
                options: BuildOptions | None = None) -> Measurement:
        """Build `plan` (default: the result's) unless `built`, check it against the reference
        and time both. Raises Unavailable where this machine cannot run it, KernelMismatch on
        a wrong result."""
        raise NotImplementedError

    def measure_plans(self, result: TuneResult, plans: list[Plan], repeat: int = 10,
                      progress: Progress | None = None, options: BuildOptions | None = None,
                      remote=None, timeout: float = 30.0) -> list[Trial]:
        """Build, check and time each plan (of `result`'s workload and hardware); a plan that
        fails gives a Trial with its reason, and the others go on. `remote` (an
        rpc_tracker.RpcAddress) measures on a TVM RPC fleet, where the backend can; `timeout`
        bounds each plan's measurement. This default measures one plan after another."""
        if remote is not None:
            raise InvalidInput(f"--rpc measures llvm kernels; the {self.name} backend cannot measure remotely")
        trials = []
        for i, plan in enumerate(plans):
            step = None if progress is None else \
                (lambda f, m, i=i: progress((i + f) / len(plans), f"plan {i + 1} of {len(plans)}: {m}"))
            try:
                trials.append(Trial(self.measure(result, plan, repeat, step, options=options)))
            except CachetileError as exc:
                trials.append(Trial(error=str(exc), kind=exc.kind))
        return trials

    def _build(self, workload, hardware, plan, options) -> Built:
        raise NotImplementedError

    def _export(self, result, directory: Path, options, built) -> tuple[list[str], list[str]]:
        raise NotImplementedError


class build_errors:
    """Turn a code generator's exception (TVM's errors, a compiler's) into BuildFailed with its
    message on one line; cachetile's own errors pass through."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, CachetileError) or not isinstance(exc, Exception):
            return False
        raise BuildFailed(f"build failed: {error_summary(exc)}") from exc


def error_summary(exc: BaseException) -> str:
    """The message of an exception from TVM or a compiler, without its IR dump or traceback,
    on one line, led by the exception's class (e.g. `ScheduleError: The "vectorize" cannot ...`)."""
    text = str(exc)
    if "Error message:" in text:  # TVM's schedule errors print the IR first, then the message
        text = text.split("Error message:")[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(line.startswith(("File ", "Traceback")) for line in lines):
        lines = lines[-1:]  # a traceback ends with the error itself
    message = " ".join(lines) or "no message"
    name = type(exc).__name__
    return message if message.startswith(name) else f"{name}: {message}"


def run_checked(command: list[str], what: str, timeout: float = 120) -> None:
    """Run a compiler check; BuildFailed with its first error lines if it fails or hangs."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"{what} did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        errors = [line for line in (done.stderr or done.stdout).splitlines() if "error" in line.lower()][:3]
        raise BuildFailed(f"{what} failed: {' | '.join(errors) or done.stderr.strip()[:300]}")


def have(program: str) -> bool:
    return shutil.which(program) is not None


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str) -> Backend:
    """The backend registered under `name` (llvm, cuda)."""
    _load()
    if name not in BACKENDS:
        raise InvalidInput(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return BACKENDS[name]


def backend_for(hardware: Hardware, name: str | None = None) -> Backend:
    """The backend `name` (default: the hardware target's own), checked against the hardware."""
    backend = get_backend(name or hardware.target.backends[0])
    backend.check(hardware)
    return backend


def names() -> list[str]:
    _load()
    return list(BACKENDS)


def _load() -> None:
    from . import cuda, llvm  # noqa: F401  (each registers itself)
