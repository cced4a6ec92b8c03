"""What a measured kernel reports, and the reference it is checked against; no TVM here.

Every backend answers with the same Measurement (the CPU one against numpy,
the CUDA one against cuBLAS), so the plan document, the service's jobs and
the reports read one shape. The reference computation and the tolerance check
live here too, so each backend checks the same way.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from pydantic import BaseModel, Field

from .errors import InvalidInput, KernelMismatch
from .workload import Workload

# Relative tolerance per dtype, scaled by the result's magnitude (sums of many products).
TOLERANCE = {"float32": 1e-3, "float64": 1e-9, "float16": 2e-2, "bfloat16": 5e-2}


class Measurement(BaseModel):
    """A kernel and its reference, timed side by side in one process (medians)."""

    device: str = Field(description="where it ran, e.g. the CPU model or the GPU name")
    reference: str = Field(description="what it is compared with: numpy (np.matmul per op) or cuBLAS")
    kernel_gflops: float
    reference_gflops: float | None = Field(description="null when the kernel ran on another machine (--rpc)")
    ratio: float | None = Field(description="kernel speed over the reference's (> 1: faster); null as above")
    max_abs_error: float
    kernel_seconds: float = Field(description="median")
    reference_seconds: float | None = Field(description="median; null when the kernel ran on another machine")
    build_seconds: float | None = Field(None, description="emit + compile, when built in this process")
    fma_loop_spills: int | None = Field(None, description="vector registers the kernel's FMA loops store to the "
                                        "stack (CPU kernels built in this process; null otherwise). Above 0, "
                                        "more accumulators are live than the registers hold (LLVM unrolls short "
                                        "loops around the register tile into one body), and the kernel waits on "
                                        "those stores, which the cost model does not see")


def measurement(workload: Workload, kernel_s: float, reference_s: float | None, error: float, *, device: str,
                reference: str, build_s: float | None = None, spills: int | None = None) -> Measurement:
    """A Measurement from the two median times (the reference's None when it was not timed beside
    the kernel, on the machine the kernel ran on), and the kernel's FMA-loop spills when known."""
    flops = workload.flops
    ref = reference_s is not None
    return Measurement(device=device, reference=reference, kernel_gflops=flops / kernel_s / 1e9,
                       reference_gflops=flops / reference_s / 1e9 if ref else None,
                       ratio=reference_s / kernel_s if ref else None,
                       max_abs_error=error, kernel_seconds=kernel_s, reference_seconds=reference_s,
                       build_seconds=build_s, fma_loop_spills=spills)


class Export(BaseModel):
    """Files a backend wrote for one plan, and the checks they passed."""

    directory: str
    files: list[str] = Field(description="names inside `directory`")
    checks: list[str] = Field([], description="e.g. 'nvcc -arch=sm_90: compiled'")


def random_inputs(workload: Workload, seed: int = 0, dtype: str | None = None) -> dict[str, np.ndarray]:
    """Standard-normal arrays for the workload's inputs (in its dtype unless one is given)."""
    if workload.dtype not in TOLERANCE:
        raise InvalidInput(f"measuring supports {', '.join(TOLERANCE)}; got {workload.dtype}")
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(workload.shape(name)).astype(dtype or numpy_dtype(workload.dtype))
            for name, t in workload.tensors.items() if t.role == "input"}


def numpy_dtype(dtype: str):
    """The numpy dtype of a workload dtype (bfloat16 from ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes  # numpy has no bfloat16; TVM's dependency ml_dtypes provides it

        return ml_dtypes.bfloat16
    return dtype


def op_function(workload: Workload, op, xp=np) -> Callable:
    """One op with array module `xp` (numpy or CuPy): matmul when it is a (batched) matrix
    product, else einsum."""
    dims = [workload.tensors[t].dims for t in op.inputs]
    out = workload.tensors[op.output].dims
    spec = workload.einsum(op)
    if not all(workload.tensors[t].plain for t in op.inputs):
        names = list(op.inputs)
        return lambda *arrays: xp.einsum(spec, *[loop_view(workload, n, a, xp) for n, a in zip(names, arrays)],
                                         optimize=True)
    if len(dims) == 2 and len(dims[0]) == len(dims[1]) == len(out) >= 2:
        (*b0, m, k), (*b1, k2, n), (*bo, mo, no) = dims[0], dims[1], out
        if b0 == b1 == bo and k == k2 and (m, n) == (mo, no) and len({m, n, k}) == 3:
            return xp.matmul
    return lambda *arrays: xp.einsum(spec, *arrays, optimize=True)


def loop_view(workload: Workload, name: str, array, xp=np):
    """An input with affine indices as a view with one axis per loop (in the tensor's loop
    order): its zero-padded copy, strided so that view[.., a, b, ..] is the element at
    index c1*a + c2*b of each dim. einsum then treats it like any plain tensor."""
    index, shape, extents = workload.index(name), workload.shape(name), workload.extents(name)
    padded = xp.zeros(extents, dtype=array.dtype)
    dst, src = [], []
    for ix, n, e in zip(index, shape, extents):
        lo, hi = max(0, -ix.offset), min(e, n - ix.offset)
        dst.append(slice(lo, max(lo, hi)))
        src.append(slice(lo + ix.offset, max(lo, hi) + ix.offset))
    padded[tuple(dst)] = array[tuple(src)]
    sizes, strides = [], []
    for ix, stride in zip(index, padded.strides):
        for x, c in ix.terms:
            sizes.append(workload.dims[x])
            strides.append(c * stride)
    return xp.lib.stride_tricks.as_strided(padded, shape=sizes, strides=strides)


def reference(workload: Workload, xp=np) -> Callable[[dict], dict]:
    """A function from input arrays to every tensor the ops compute."""
    fns = [(op_function(workload, op, xp), op) for op in workload.ops]

    def run(arrays: dict) -> dict:
        values = dict(arrays)
        for fn, op in fns:
            values[op.output] = fn(*[values[t] for t in op.inputs])
        return values

    return run


def compare(workload: Workload, got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> float:
    """Raise KernelMismatch, naming the element, unless every output in `got` matches `expected`
    within the dtype's tolerance scaled by the result's magnitude. Returns the largest |error|."""
    rtol = TOLERANCE[workload.dtype]
    worst = 0.0
    for name, value in got.items():
        ref = np.asarray(expected[name], dtype=np.float64)
        value = np.asarray(value).astype(np.float64)
        err = np.abs(value - ref)
        limit = rtol * (np.abs(ref) + np.abs(ref).max(initial=0.0))
        if not np.all(err <= limit):
            i = np.unravel_index(int(np.argmax(err - limit)), err.shape)
            raise KernelMismatch(f"{name}{[int(v) for v in i]} = {value[i]}, the reference says {ref[i]} (rtol {rtol})")
        worst = max(worst, float(err.max()) if err.size else 0.0)
    return worst
