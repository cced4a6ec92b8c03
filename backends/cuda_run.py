"""Run an exported CUDA kernel on a GPU with CuPy, check it against cuBLAS, time both.

Needs CuPy and a GPU, not TVM: it reads kernel.cu and launch.json from an
export directory (backends/cuda_build.export_cuda), so the source can be
generated on one machine and run on another:

    python -m cachetile.backends.cuda_run DIR

cuBLAS is the reference: CuPy's matmul per op (two calls for a chain), whose
result is the correctness check (models/measurement.compare, the same
tolerance as on the CPU) and whose time the kernel is compared with.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..models.errors import Unavailable
from ..models.measurement import Measurement, compare, measurement, reference
from ..models.workload import Workload


def gpu_unavailable() -> str | None:
    """Why no kernel can run on a GPU here (None: CuPy and a device are present)."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing: CuPy raises its own runtime errors
        return f"no CUDA device: {' '.join(str(exc).split())}"
    return None if count else "no CUDA device"


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


def run(directory: str | Path, repeat: int = 20, seed: int = 0) -> Measurement:
    """Load DIR/kernel.cu, run it per DIR/launch.json, check against cuBLAS and time both."""
    reason = gpu_unavailable()
    if reason:
        raise Unavailable(reason)
    import cupy

    out = Path(directory)
    launch = json.loads((out / "launch.json").read_text())
    workload = Workload.model_validate(json.loads((out / "plan.json").read_text())["workload"])
    module = cupy.RawModule(code=(out / "kernel.cu").read_text(), options=("-std=c++17",))
    rng = cupy.random.default_rng(seed)
    arrays = {}
    for name, shape in launch["shapes"].items():
        arrays[name] = (rng.standard_normal(shape, dtype="float32").astype(workload.dtype)
                        if workload.tensors[name].role == "input" else cupy.zeros(shape, dtype=workload.dtype))
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

    inputs = {n: a for n, a in arrays.items() if workload.tensors[n].role == "input"}
    cublas = reference(workload, cupy)
    kernel()
    cupy.cuda.Device().synchronize()
    expected = reference(workload, cupy)({n: a.astype("float64") for n, a in inputs.items()})
    outputs = [n for n, t in workload.tensors.items() if t.role == "output"]
    error = compare(workload, {n: cupy.asnumpy(arrays[n]) for n in outputs}, {n: cupy.asnumpy(expected[n]) for n in outputs})
    k_s = _median(cupy, kernel, repeat)
    r_s = _median(cupy, lambda: cublas(inputs), repeat)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    device = name.decode() if isinstance(name, bytes) else str(name)
    return measurement(workload, k_s, r_s, error, device=device, reference="cuBLAS")


if __name__ == "__main__":
    try:
        print(run(sys.argv[1]).model_dump_json(indent=2))
    except Unavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
