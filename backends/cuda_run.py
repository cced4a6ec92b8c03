"""Run an exported CUDA kernel on a GPU with CuPy, check it against cuBLAS, time both.

Needs only CuPy and a GPU (no TVM): it reads kernel.cu and launch.json from an
export directory (backends/cuda_build.export_cuda), so the source can be
generated on one machine and run on another:

    python -m cachetile.backends.cuda_run DIR

cuBLAS is the reference: CuPy's matmul per op (two calls for a chain), whose
result is the correctness check and whose time the kernel is compared with.
"""
from __future__ import annotations

import json
import string
import sys
from pathlib import Path

from pydantic import BaseModel

TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "float64": 1e-9}


class GpuUnavailable(RuntimeError):
    """No CuPy, or no CUDA device: the kernel cannot run here."""


class GpuMeasurement(BaseModel):
    kernel_tflops: float
    cublas_tflops: float
    ratio: float  # kernel / cuBLAS
    max_abs_error: float
    kernel_seconds: float  # median
    cublas_seconds: float  # median
    device: str


def _cupy():
    try:
        import cupy
    except ImportError:
        raise GpuUnavailable("CuPy is not installed (pip install cupy-cuda12x); --measure for cuda needs it") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing: CuPy raises its own runtime errors
        raise GpuUnavailable(f"no CUDA device: {exc}") from None
    if count == 0:
        raise GpuUnavailable("no CUDA device")
    return cupy


def _einsum_spec(plan: dict, op: dict) -> str:
    tensors = plan["workload"]["tensors"]
    letters = dict(zip(op["loops"], string.ascii_letters))
    ins = ",".join("".join(letters[x] for x in tensors[t]["dims"]) for t in op["inputs"])
    return ins + "->" + "".join(letters[x] for x in tensors[op["output"]]["dims"])


def _median(cupy, fn, repeat: int) -> float:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return sorted(times)[len(times) // 2]


def run(directory: str | Path, repeat: int = 20, seed: int = 0) -> GpuMeasurement:
    """Load DIR/kernel.cu, run it per DIR/launch.json, check against cuBLAS and time both."""
    cupy = _cupy()
    out = Path(directory)
    launch = json.loads((out / "launch.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    dtype = launch["dtype"]
    module = cupy.RawModule(code=(out / "kernel.cu").read_text(), options=("-std=c++17",))
    rng = cupy.random.default_rng(seed)
    arrays = {}
    for name, shape in launch["shapes"].items():
        role = plan["workload"]["tensors"][name]["role"]
        arrays[name] = (rng.standard_normal(shape, dtype="float32").astype(dtype) if role == "input"
                        else cupy.zeros(shape, dtype=dtype))
    kernels = []
    for k in launch["kernels"]:
        fn = module.get_function(k["name"])
        if k["dynamic_shared_bytes"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = k["dynamic_shared_bytes"]
        kernels.append((fn, k))

    def kernel():
        for fn, k in kernels:
            fn(tuple(k["grid"]), tuple(k["block"]), tuple(arrays[a] for a in k["args"]),
               shared_mem=k["dynamic_shared_bytes"])

    ops = plan["workload"]["ops"]

    def reference():
        values = dict(arrays)
        for op in ops:
            values[op["output"]] = cupy.einsum(_einsum_spec(plan, op), *[values[t] for t in op["inputs"]])
        return values

    kernel()
    cupy.cuda.Device().synchronize()
    expected = reference()
    worst = 0.0
    for op in ops:
        name = op["output"]
        if plan["workload"]["tensors"][name]["role"] != "output":
            continue
        got, want = arrays[name].astype("float64"), expected[name].astype("float64")
        err = float(cupy.abs(got - want).max())
        scale = float(cupy.abs(want).max()) or 1.0
        if err > TOLERANCE.get(dtype, 1e-3) * scale:
            raise AssertionError(f"{name} differs from cuBLAS by {err:.3g} (largest value {scale:.3g})")
        worst = max(worst, err)
    flops = sum(2.0 * _points(plan, op) for op in ops)
    k_s = _median(cupy, kernel, repeat)
    r_s = _median(cupy, reference, repeat)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return GpuMeasurement(kernel_tflops=flops / k_s / 1e12, cublas_tflops=flops / r_s / 1e12, ratio=r_s / k_s,
                          max_abs_error=worst, kernel_seconds=k_s, cublas_seconds=r_s,
                          device=name.decode() if isinstance(name, bytes) else str(name))


def _points(plan: dict, op: dict) -> float:
    points = 1.0
    for x in op["loops"]:
        points *= plan["workload"]["dims"][x]
    return points


if __name__ == "__main__":
    try:
        print(run(sys.argv[1]).model_dump_json(indent=2))
    except GpuUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
