"""Run a built CPU kernel: check it against numpy and time both in one process.

numpy is the reference twice over: its result is the correctness check, and
its speed (np.matmul per op, so two calls for a chain) is the baseline the
kernel's GFLOP/s is compared with. The two are timed in alternating rounds.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np
import tvm

from ..models.measurement import Measurement, compare, measurement, random_inputs, reference
from ..models.workload import Workload
from .llvm_asm import fma_loop_spills

Progress = Callable[[float, str], None]

ROUNDS = 5  # side-by-side rounds of numpy and kernel timing in measure_built


def kernel_args(workload: Workload, arrays: dict[str, np.ndarray], device=None) -> list:
    """Device tensors in signature order: the given arrays, zeros for the rest (the outputs)."""
    dev = device or tvm.cpu()
    return [tvm.runtime.tensor(arrays[n] if n in arrays else np.zeros(workload.shape(n), workload.dtype), dev)
            for n in workload.signature]


def time_kernel(lib, args: list, repeat: int = 10, device=None) -> float:
    """Median seconds of `repeat` calls of kernel "main" (after one warm-up), each at least 20 ms of calls."""
    timer = lib.time_evaluator("main", device or tvm.cpu(), number=1, repeat=repeat + 1, min_repeat_ms=20)
    return statistics.median(timer(*args).results[1:])


def run_kernel(workload: Workload, lib, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call kernel "main" with the arrays in signature order; returns the outputs."""
    args = kernel_args(workload, arrays)
    lib["main"](*args)
    return {n: a.numpy() for n, a in zip(workload.signature, args) if n not in arrays}


def time_exported(paths: list[str], workload: Workload, repeat: int = 10, seed: int = 0) -> list[float]:
    """Load each exported kernel (`lib.export_library`) and time it in turn (time_kernel), on one
    set of random inputs; in this process, so that a fresh one (TVM's PopenWorker) can run it and
    give the kernels its own heap."""
    args = kernel_args(workload, random_inputs(workload, seed))
    return [time_kernel(tvm.runtime.load_module(path), args, repeat) for path in paths]


def check(workload: Workload, lib, seed: int = 0) -> float:
    """Run the kernel on random inputs; raise KernelMismatch unless it matches numpy. Returns max |error|."""
    arrays = random_inputs(workload, seed)
    expected = reference(workload)({n: a.astype(np.float64) for n, a in arrays.items()})
    return compare(workload, run_kernel(workload, lib, arrays), expected)


def settle() -> None:
    """Wait until the other library's worker threads stop spinning before timing a kernel or numpy.

    OpenBLAS's workers spin for about 0.1 s after each call, and TVM's pool after each kernel;
    on a 2-core machine a kernel timed at once ran 2-4x slower (gemm 1x4096x4096: 2-4 ms within
    0.05 s of a np.matmul, 0.7-1.3 ms from 0.1 s on)."""
    time.sleep(0.2)


def _median_seconds(fn, repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_name() -> str:
    """The CPU model, as /proc/cpuinfo names it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def measure_built(workload: Workload, lib, build_seconds: float | None, repeat: int = 10,
                  progress: Progress | None = None, rounds: int = ROUNDS) -> Measurement:
    """Check a built kernel against numpy, and time both side by side: `rounds` rounds, each timing
    numpy then the kernel (median of `repeat` >= 10 runs each); each one's time is the median over
    the rounds. Counts the kernel's FMA-loop spills (backends/llvm_asm).

    Rounds, not one block each, because this VM's memory bandwidth drifts within seconds: the
    memory-bound gemm 1x4096x4096 ran 1.0 ms in one block and 1.7 ms in the next, for the kernel
    and numpy alike, so one block each gave ratios from 0.72 to 1.23; alternating 12 times gave
    medians within 3% of each other (BENCHMARKS.md, "Rounds session")."""
    repeat = max(repeat, 10)
    report = progress or (lambda fraction, message: None)
    arrays = random_inputs(workload, seed=1)
    ref = reference(workload)
    report(0.0, "checking against numpy")
    error = check(workload, lib)
    args = kernel_args(workload, arrays)
    numpy_s, kernel_s = [], []
    for r in range(rounds):
        report(r / rounds, f"timing numpy and the kernel, round {r + 1} of {rounds}")
        settle()  # the kernel's pool, or the check's numpy, may still spin
        numpy_s.append(_median_seconds(lambda: ref(arrays), repeat))
        settle()
        kernel_s.append(time_kernel(lib.mod, args, repeat))
    report(1.0, "done")
    return measurement(workload, statistics.median(kernel_s), statistics.median(numpy_s), error, device=cpu_name(),
                       reference="numpy", build_s=build_seconds, spills=fma_loop_spills(lib.mod))
