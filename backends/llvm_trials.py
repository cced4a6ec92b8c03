"""Measure several CPU plans of one workload: here, one after another, or on a TVM RPC fleet.

Every plan runs on the same random inputs and is checked against one numpy
result; here numpy is timed once, beside the kernels (an RPC server has no
numpy reference, so remote Measurements leave the reference fields null). A
plan that fails to build, disagrees with numpy, or would take longer than the
time limit is reported with its reason, and the others go on. Here, LLVM
generates every candidate's machine code at once, on all cores, before any is
timed; then every candidate is timed twice (the second time in reverse order)
and the leaders (within 10% of the fastest) a third time, each keeping its
fastest median, so one burst of another process does not decide the pick.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from ..models.errors import BuildFailed, CachetileError
from ..models.measurement import compare, measurement, random_inputs, reference
from ..models.plan import Plan, TuneResult
from ..models.workload import Workload
from .base import Backend, BuildOptions, Built, Progress, Trial


LEADERS_MARGIN = 0.10  # candidates this close to the fastest are timed a third time
MAX_LEADERS = 3


class TooSlow(CachetileError):
    """One run shows that timing the kernel would pass its time limit."""

    kind = "timeout"


@dataclass
class Kernel:
    """A kernel (a loaded module, or an exported file for a server), its inputs, and the numpy
    outputs it must match."""

    name: str
    path: str | None
    workload: Workload
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


def run_and_time(kernel: Kernel, lib, device, repeat: int, limit: float | None = None) -> tuple[float, float]:
    """Call the kernel once and check it (KernelMismatch), then time it: (median s, max |error|).
    TooSlow instead when that call (and a second, which may skip the first's one-time costs) shows
    the timing would pass `limit` seconds."""
    from .llvm_measure import kernel_args, time_kernel

    w = kernel.workload
    args = kernel_args(w, kernel.inputs, device)

    def once() -> float:
        start = time.perf_counter()
        lib["main"](*args)
        return time.perf_counter() - start

    first = once()
    outputs = {n: a.numpy() for n, a in zip(w.signature, args) if n not in kernel.inputs}
    error = compare(w, outputs, kernel.expected)
    needed = (repeat + 1) * max(first, 0.02)  # time_kernel: repeat + 1 rounds of >= 20 ms
    if limit is not None and needed > limit:
        # A first call can pay one-time costs: some plans of gemm 197x3072x768 took 4 s on their
        # first call and 6 ms on every later one (LLVM's code generation, before generate_code
        # ran ahead of the timings). Judge by the second.
        first = min(first, once())
        needed = (repeat + 1) * max(first, 0.02)
    if limit is not None and needed > limit:
        raise TooSlow(f"one run took {first:.3g} s, so timing it would take about {needed:.0f} s, "
                      f"past the {limit:g} s limit")
    return time_kernel(lib, args, repeat, device), error


def measure_plans(backend: Backend, result: TuneResult, plans: list[Plan], repeat: int, progress: Progress | None,
                  options: BuildOptions, remote, timeout: float) -> list[Trial]:
    """Backend.measure_plans for llvm: build each plan, then measure here or on `remote`."""
    from .llvm_measure import _median_seconds

    report = progress or (lambda fraction, message: None)
    w = result.workload
    inputs = random_inputs(w, seed=1)
    ref = reference(w)
    computed = ref({n: a.astype(np.float64) for n, a in inputs.items()})
    expected = {n: v for n, v in computed.items() if n not in inputs}
    target, threads = options.target, None
    if remote is not None:  # ask first: the pre-flight fails in one line before anything is built
        from .rpc import remote_target

        found = remote_target(remote, timeout)
        target, threads = target or found, found["num-cores"]
    else:  # numpy once, first: TVM's pool threads spin after each kernel call and would slow OpenBLAS
        report(0.0, "timing numpy")
        numpy_s = _median_seconds(lambda: ref(inputs), repeat)
    options = BuildOptions(options.double_buffer, options.arch, target)
    trials: list[Trial | None] = [None] * len(plans)
    built: dict[int, Built] = {}
    share = 0.5 if remote is not None else 0.3  # of the progress, for building
    for i, plan in enumerate(plans):
        report(share * i / len(plans), f"building plan {i + 1} of {len(plans)}")
        try:
            built[i] = backend.build(w, result.hardware, plan, options)
        except CachetileError as exc:
            trials[i] = Trial(error=str(exc), kind=exc.kind)
    if remote is None:
        report(share, "generating machine code")
        _generate_code(built, trials)
        for n, i in enumerate(sorted(built)):
            report(share + (0.95 - share) * n / len(built), f"timing plan {i + 1} of {len(plans)}")
            trials[i] = _local(Kernel(f"plan-{i}", None, w, inputs, expected), built[i], numpy_s, repeat, timeout)
        report(0.95, "timing the candidates again")
        _retime(w, trials, built, inputs, numpy_s, repeat)
    else:
        _remote(w, built, inputs, expected, trials, remote, target, threads, repeat, timeout,
                lambda done: report(share + (1 - share) * done / max(len(built), 1),
                                    f"measured {done} of {len(built)} on the fleet"))
    report(1.0, "done")
    return trials


def _generate_code(built: dict[int, Built], trials: list[Trial | None]) -> None:
    """Machine code for every built kernel at once, before any is timed (so the compiler's
    threads never share the cores with a timing); a kernel LLVM rejects is dropped."""
    from .base import error_summary
    from .llvm_build import generate_code

    order = sorted(built)
    for i, error in zip(order, generate_code([built[i] for i in order])):
        if error is not None:
            trials[i] = Trial(error=f"build failed: {error_summary(error)}", kind=BuildFailed.kind)
            del built[i]


def _retime(w: Workload, trials: list[Trial], built: dict[int, Built], inputs, numpy_s: float, repeat: int) -> None:
    """Time every candidate that ran once more, in reverse order, then the leaders (within
    LEADERS_MARGIN of the fastest, at most MAX_LEADERS) a third time; each keeps its fastest
    median. On a shared machine another process only ever slows a timing down, and a burst
    during one candidate's single timing would otherwise decide the pick."""
    import tvm

    from .llvm_measure import kernel_args, time_kernel

    args = kernel_args(w, inputs)

    def again(indices):
        for i in indices:
            m = trials[i].measurement
            seconds = min(m.kernel_seconds, time_kernel(built[i].lib.mod, args, repeat, tvm.cpu()))
            trials[i].measurement = measurement(w, seconds, numpy_s, m.max_abs_error, device=m.device,
                                                reference=m.reference, build_s=m.build_seconds,
                                                spills=m.fma_loop_spills)

    again([i for i in reversed(range(len(trials))) if trials[i] and trials[i].measurement])
    again(_leaders({i: t.measurement.kernel_seconds for i, t in enumerate(trials) if t and t.measurement}))


def _leaders(seconds: dict[int, float]) -> list[int]:
    """The candidates within LEADERS_MARGIN of the fastest, at most MAX_LEADERS, fastest first;
    none when only one is that close (nothing to decide between)."""
    ran = sorted((s, i) for i, s in seconds.items())
    leaders = [i for s, i in ran if s <= ran[0][0] * (1 + LEADERS_MARGIN)][:MAX_LEADERS]
    return leaders if len(leaders) > 1 else []


def _local(kernel: Kernel, built: Built, numpy_s: float, repeat: int, timeout: float) -> Trial:
    import tvm

    from .llvm_asm import fma_loop_spills
    from .llvm_measure import cpu_name

    threads = int(tvm.get_global_func("runtime.NumThreads")())
    try:
        seconds, error = run_and_time(kernel, built.lib.mod, tvm.cpu(), repeat, timeout)
    except CachetileError as exc:
        return Trial(error=str(exc), kind=exc.kind, threads=threads)
    m = measurement(kernel.workload, seconds, numpy_s, error, device=cpu_name(), reference="numpy",
                    build_s=built.seconds, spills=fma_loop_spills(built.lib.mod))
    return Trial(m, threads=threads)


def _remote(w, built: dict[int, Built], inputs, expected, trials, remote, target, threads, repeat, timeout,
            progress) -> None:
    from .rpc import export_for, measure_remote

    with tempfile.TemporaryDirectory(prefix="cachetile-rpc-") as tmp:
        order = sorted(built)
        kernels = [Kernel(f"plan-{i}", export_for(built[i].lib, os.path.join(tmp, f"plan-{i}.so"),
                                                  target.get("mtriple")), w, inputs, expected) for i in order]
        done = []

        def on_event(event: str, name: str, server: str) -> None:
            if event == "done":
                done.append(name)
                progress(len(done))

        results = dict(zip(order, measure_remote(kernels, remote, timeout=timeout, repeat=repeat, on_event=on_event)))
        # The fleet times the candidates at once. Where servers share a machine (its caches, its
        # memory) each timing is slowed by whatever ran beside it, which can reorder near-ties:
        # the leaders are timed again one at a time, alone, and each keeps its faster time.
        kernel = dict(zip(order, kernels))
        for i in _leaders({i: r.seconds for i, r in results.items() if r.ok}):
            alone = measure_remote([kernel[i]], remote, timeout=timeout, repeat=repeat)[0]
            if alone.ok and alone.seconds < results[i].seconds:
                results[i] = dataclasses.replace(results[i], seconds=alone.seconds, server=alone.server)
    for i, r in sorted(results.items()):
        if not r.ok:
            trials[i] = Trial(error=r.error, kind=r.kind, threads=threads)
            continue
        device = f"{target.get('mcpu', 'cpu')} via RPC {r.server}"
        m = measurement(w, r.seconds, None, r.max_abs_error, device=device, reference="numpy",
                        build_s=built[i].seconds)
        trials[i] = Trial(m, threads=threads)
