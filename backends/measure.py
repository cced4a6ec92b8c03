"""Build a plan, check it against numpy, and time both in one process.

numpy is the reference twice over: its result is the correctness check, and
its speed (np.matmul per op, so two calls for a chain) is the baseline the
kernel's GFLOP/s is compared with. Both timings are medians of >= 10 runs.
"""
from __future__ import annotations

import statistics
import string
import time
from typing import Callable

import numpy as np
import tvm
from pydantic import BaseModel

from ..models.plan import Plan, TuneResult
from ..models.workload import Workload
from .build import Built, build

TOLERANCE = {"float32": 1e-3, "float64": 1e-9, "float16": 2e-2}

Progress = Callable[[float, str], None]


class Measurement(BaseModel):
    kernel_gflops: float
    numpy_gflops: float
    ratio: float  # kernel / numpy
    max_abs_error: float
    build_seconds: float
    kernel_seconds: float  # median
    numpy_seconds: float  # median


class MismatchError(AssertionError):
    """The kernel's result differs from numpy's beyond the dtype's tolerance."""


def random_inputs(workload: Workload, seed: int = 0) -> dict[str, np.ndarray]:
    if workload.dtype not in TOLERANCE:
        raise ValueError(f"measuring supports {', '.join(TOLERANCE)}; got {workload.dtype}")
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal([workload.dims[x] for x in t.dims]).astype(workload.dtype)
            for name, t in workload.tensors.items() if t.role == "input"}


def _op_fn(workload: Workload, op) -> Callable[..., np.ndarray]:
    """numpy for one op: np.matmul when it is a (batched) matrix product, else einsum."""
    dims = [workload.tensors[t].dims for t in op.inputs]
    out = workload.tensors[op.output].dims
    if len(dims) == 2 and len(dims[0]) == len(dims[1]) == len(out) >= 2:
        (*b0, m, k), (*b1, k2, n), (*bo, mo, no) = dims[0], dims[1], out
        if b0 == b1 == bo and k == k2 and (m, n) == (mo, no) and len({m, n, k}) == 3:
            return np.matmul
    letters = dict(zip(op.loops, string.ascii_letters))
    spec = ",".join("".join(letters[x] for x in d) for d in dims) + "->" + "".join(letters[x] for x in out)
    return lambda *arrays: np.einsum(spec, *arrays, optimize=True)


def numpy_reference(workload: Workload) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A function from input arrays to every tensor the ops compute."""
    fns = [(_op_fn(workload, op), op) for op in workload.ops]

    def run(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = dict(arrays)
        for fn, op in fns:
            values[op.output] = fn(*[values[t] for t in op.inputs])
        return values

    return run


def kernel_args(workload: Workload, arrays: dict[str, np.ndarray]) -> list:
    """Device tensors in signature order: the given arrays, zeros for the rest (the outputs)."""
    dev = tvm.cpu()
    return [tvm.runtime.tensor(arrays[n] if n in arrays else
                               np.zeros([workload.dims[x] for x in workload.tensors[n].dims], workload.dtype), dev)
            for n in workload.signature]


def time_kernel(lib, args: list, repeat: int = 10) -> float:
    """Median seconds of `repeat` calls of kernel "main" (after one warm-up), each at least 20 ms of calls."""
    timer = lib.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat + 1, min_repeat_ms=20)
    return statistics.median(timer(*args).results[1:])


def run_kernel(workload: Workload, lib, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call kernel "main" with the arrays in signature order; returns the outputs."""
    args = kernel_args(workload, arrays)
    lib["main"](*args)
    return {n: a.numpy() for n, a in zip(workload.signature, args) if n not in arrays}


def check(workload: Workload, lib, seed: int = 0) -> float:
    """Run the kernel on random inputs; raise MismatchError unless it matches numpy. Returns max |error|."""
    arrays = random_inputs(workload, seed)
    expected = numpy_reference(workload)({n: a.astype(np.float64) for n, a in arrays.items()})
    got = run_kernel(workload, lib, arrays)
    rtol = TOLERANCE[workload.dtype]
    worst = 0.0
    for name, value in got.items():
        ref = expected[name]
        err = np.abs(value.astype(np.float64) - ref)
        # Sums of many products: scale the tolerance by the result's magnitude.
        limit = rtol * (np.abs(ref) + np.abs(ref).max())
        if not np.all(err <= limit):
            i = np.unravel_index(int(np.argmax(err - limit)), err.shape)
            raise MismatchError(f"{name}{[int(v) for v in i]} = {value[i]}, numpy says {ref[i]} (rtol {rtol})")
        worst = max(worst, float(err.max()) if err.size else 0.0)
    return worst


def _median_seconds(fn, repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(result: TuneResult, plan: Plan | None = None, repeat: int = 10, progress: Progress | None = None,
            built: Built | None = None) -> Measurement:
    """Build `plan` (default: the result's), check it against numpy, and time both (median of `repeat` >= 10)."""
    repeat = max(repeat, 10)
    report = progress or (lambda fraction, message: None)
    w = result.workload
    arrays = random_inputs(w, seed=1)
    reference = numpy_reference(w)
    # numpy first: TVM's pool threads spin for a while after each kernel call and would
    # steal the cores OpenBLAS needs.
    time.sleep(0.2)
    report(0.0, "timing numpy")
    numpy_s = _median_seconds(lambda: reference(arrays), repeat)
    report(0.25, "building")
    built = built or build(w, result.hardware, plan or result.plan)
    report(0.5, "checking against numpy")
    error = check(w, built.lib)
    report(0.6, "timing the kernel")
    kernel = time_kernel(built.lib, kernel_args(w, arrays), repeat)
    report(1.0, "done")
    return Measurement(
        kernel_gflops=w.flops / kernel / 1e9, numpy_gflops=w.flops / numpy_s / 1e9, ratio=numpy_s / kernel,
        max_abs_error=error, build_seconds=built.seconds, kernel_seconds=kernel, numpy_seconds=numpy_s,
    )
