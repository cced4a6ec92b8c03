"""Run exported CUDA kernels on a GPU with CuPy, check them against cuBLAS, time both.

Needs CuPy and a GPU, not TVM: it reads kernel.cu, launch.json and plan.json
from export folders (backends/cuda_build.export_cuda), so the source can be
generated on one machine and run on another:

    python -m cachetile.backends.cuda_run DIR [DIR ...] [--repeat N] [--json]

Each DIR is an export folder or a folder holding export folders at any depth;
all of them run in one process, one after another, and a kernel that fails to
compile, launch or verify is reported in its row without stopping the rest
(exit status 1 if any did).

Per kernel: random standard-normal inputs in the workload's dtype (bfloat16,
which CuPy lacks, is carried as its 16-bit patterns); one launch checked
against a float64 reference of the same inputs (models/measurement.compare: the
dtype's tolerance from TOLERANCE, scaled by the result's magnitude); then the
kernel and cuBLAS timed with CUDA events, 3 warm-up calls and the median of at
least 20. cuBLAS is CuPy's matmul for float32 and cublasGemmStridedBatchedEx
with fp32 accumulation for float16 and bfloat16 (one call per op: two for a
chain), so both sides accumulate in fp32.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..models.errors import CachetileError, InvalidInput, Unavailable
from ..models.measurement import Measurement, compare, measurement, op_function, reference
from ..models.workload import Workload

MIN_REPEAT = 20
WARMUP = 3
# cuBLAS's enums (cublas_api.h, library_types.h): what gemmStridedBatchedEx is called with.
_CUDA_DTYPE = {"float16": 2, "bfloat16": 14, "float32": 0}
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_CUBLAS_OP_N = 0


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


def export_dirs(paths) -> list[Path]:
    """The export folders (those holding launch.json) named by `paths`, or found under them."""
    found = []
    for p in map(Path, paths):
        if (p / "launch.json").is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(f.parent for f in p.rglob("launch.json"))
        else:
            raise InvalidInput(f"{p} is not a folder")
    if not found:
        raise InvalidInput(f"no exported kernel (launch.json) under {', '.join(map(str, paths))}")
    return list(dict.fromkeys(found))


# --- bfloat16 as 16-bit patterns (xp: numpy or cupy) ------------------------------------
def to_bfloat16_bits(x, xp=np):
    """float32 values -> their bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))
    return (rounded >> 16).astype(xp.uint16)


def from_bfloat16_bits(bits, xp=np):
    """bfloat16 bit patterns (uint16) -> float32 values."""
    return (xp.asarray(bits).astype(xp.uint32) << 16).view(xp.float32)


def storage_dtype(dtype: str) -> str:
    """The array dtype a tensor of `dtype` is held in on the device."""
    return "uint16" if dtype == "bfloat16" else dtype


def encode(x, dtype: str, xp=np):
    """float32 values as device storage of `dtype`."""
    return to_bfloat16_bits(x, xp) if dtype == "bfloat16" else x.astype(dtype)


def decode(x, dtype: str, xp=np):
    """Device storage of `dtype` as float64 values."""
    return (from_bfloat16_bits(x, xp) if dtype == "bfloat16" else x).astype(xp.float64)


def _product_dims(workload: Workload, op):
    """(batch, m, n, k) when the op is a row-major (batched) matrix product, else None."""
    if op_function(workload, op) is not np.matmul:
        return None
    *batch, m, k = workload.shape(op.inputs[0])
    n = workload.shape(op.inputs[1])[-1]
    return int(np.prod(batch)) if batch else 1, m, n, k


def cublas_ops(workload: Workload, arrays: dict, cupy):
    """A function running the workload with cuBLAS into fresh buffers, one call per op."""
    dtype = workload.dtype
    if dtype not in ("float16", "bfloat16"):
        ops = reference(workload, cupy)
        inputs = {n: a for n, a in arrays.items() if workload.tensors[n].role == "input"}
        return lambda: ops(inputs)
    from cupy.cuda import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    out = {n: cupy.empty(workload.shape(n), storage_dtype(dtype)) for n, t in workload.tensors.items()
           if t.role != "input"}
    calls = []
    for op in workload.ops:
        dims = _product_dims(workload, op)
        if dims is None:
            raise InvalidInput(f"the cuBLAS reference takes matrix products in {dtype}; op {op.name!r} is not one")
        batch, m, n, k = dims
        a, b, c = (arrays.get(t, out.get(t)) for t in (*op.inputs, op.output))
        # Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets B first.
        calls.append((n, m, k, b, n, n * k, a, k, m * k, c, n, m * n, batch))
    t = _CUDA_DTYPE[dtype]

    def run():
        for n, m, k, b, ldb, sb, a, lda, sa, c, ldc, sc, batch in calls:
            cublas.gemmStridedBatchedEx(handle, _CUBLAS_OP_N, _CUBLAS_OP_N, n, m, k, one.ctypes.data,
                                        b.data.ptr, t, ldb, sb, a.data.ptr, t, lda, sa, zero.ctypes.data,
                                        c.data.ptr, t, ldc, sc, batch, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)

    return run


def _median(cupy, fn, repeat: int) -> float:
    """Median seconds of `repeat` timed calls (CUDA events around each), after WARMUP calls."""
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(max(repeat, MIN_REPEAT)):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return sorted(times)[len(times) // 2]


def run(directory: str | Path, repeat: int = MIN_REPEAT, seed: int = 0) -> Measurement:
    """Load DIR/kernel.cu, run it per DIR/launch.json, check it against a float64 reference and
    time it beside cuBLAS. Raises Unavailable without a GPU, KernelMismatch on a wrong result."""
    reason = gpu_unavailable()
    if reason:
        raise Unavailable(reason)
    import cupy

    out = Path(directory)
    launch = json.loads((out / "launch.json").read_text())
    workload = Workload.model_validate(json.loads((out / "plan.json").read_text())["workload"])
    dtype = workload.dtype
    module = cupy.RawModule(code=(out / "kernel.cu").read_text(), options=("-std=c++17",))
    rng = cupy.random.default_rng(seed)
    arrays = {}
    for name, shape in launch["shapes"].items():
        if workload.tensors[name].role == "input":
            arrays[name] = encode(rng.standard_normal(shape, dtype="float32"), dtype, cupy)
        else:
            arrays[name] = cupy.zeros(shape, dtype=storage_dtype(dtype))
    kernels = []
    for k in launch["kernels"]:
        fn = module.get_function(k["name"])
        if k["dynamic_shared_bytes"] > 48 * 1024:  # above the default limit a kernel must opt in
            fn.max_dynamic_shared_size_bytes = k["dynamic_shared_bytes"]
        kernels.append((fn, k))

    def kernel():
        for fn, k in kernels:
            fn(tuple(k["grid"]), tuple(k["block"]), tuple(arrays[a] for a in k["args"]),
               shared_mem=k["dynamic_shared_bytes"])

    kernel()
    cupy.cuda.Device().synchronize()
    inputs = {n: decode(a, dtype, cupy) for n, a in arrays.items() if workload.tensors[n].role == "input"}
    expected = reference(workload, cupy)(inputs)
    outputs = [n for n, t in workload.tensors.items() if t.role == "output"]
    error = compare(workload, {n: cupy.asnumpy(decode(arrays[n], dtype, cupy)) for n in outputs},
                    {n: cupy.asnumpy(expected[n]) for n in outputs})
    k_s = _median(cupy, kernel, repeat)
    r_s = _median(cupy, cublas_ops(workload, arrays, cupy), repeat)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    device = name.decode() if isinstance(name, bytes) else str(name)
    return measurement(workload, k_s, r_s, error, device=device, reference="cuBLAS")


def describe(directory: Path) -> dict:
    """What a row shows of an export besides its measurement: workload, stages, tensor cores,
    and the model's predicted TFLOP/s."""
    doc = json.loads((directory / "plan.json").read_text())
    w, plan = doc["workload"], doc["plan"]
    launch = plan.get("launch") or {}
    flops = Workload.model_validate(w).flops
    return {"dir": str(directory), "workload": f"{w['kind']} {'x'.join(str(v) for v in w['dims'].values())}",
            "dtype": w["dtype"], "stages": launch.get("stages"), "tensor_cores": bool(launch.get("tensor_cores")),
            "predicted_tflops": flops / plan["predicted_seconds"] / 1e12}


def run_all(paths, repeat: int = MIN_REPEAT) -> list[dict]:
    """Run every export under `paths` in this process; one row per export, failures included."""
    rows = []
    for directory in export_dirs(paths):
        row = describe(directory)
        try:
            m = run(directory, repeat)
            row.update(status="ok", kernel_tflops=m.kernel_gflops / 1e3, cublas_tflops=m.reference_gflops / 1e3,
                       ratio=m.ratio, max_abs_error=m.max_abs_error, device=m.device)
        except Unavailable:
            raise
        except CachetileError as exc:  # a result that disagrees with the reference
            row.update(status=f"mismatch: {exc}")
        except Exception as exc:  # noqa: BLE001 - a kernel that does not compile or launch: report, go on
            row.update(status=f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    """The rows as a markdown table (TFLOP/s: flops / median seconds)."""
    head = "| export | workload | dtype | stages | tensor cores | ours TFLOP/s | cuBLAS TFLOP/s | ratio | predicted TFLOP/s | status |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ok = r.get("status") == "ok"
        cells = [Path(r["dir"]).name, r["workload"], r["dtype"], str(r["stages"]), "yes" if r["tensor_cores"] else "no",
                 f"{r['kernel_tflops']:.1f}" if ok else "-", f"{r['cublas_tflops']:.1f}" if ok else "-",
                 f"{r['ratio']:.2f}" if ok else "-", f"{r['predicted_tflops']:.1f}", r["status"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cachetile.backends.cuda_run", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", metavar="DIR", help="export folders, or folders holding them")
    p.add_argument("--repeat", type=int, default=MIN_REPEAT, help=f"timed runs per kernel (at least {MIN_REPEAT})")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    try:
        rows = run_all(args.dirs, args.repeat)
    except (Unavailable, InvalidInput) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
