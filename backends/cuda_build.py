"""Compile an emitted CUDA schedule to source and export it.

No GPU or nvcc is needed: TVM generates the CUDA source itself. `export`
writes plan.json, schedule.py (rebuilds kernel.cu from the unscheduled
TensorIR plus the schedule trace), kernel.cu and launch.json: per kernel, in
launch order, its name, grid, block, dynamic shared-memory bytes and argument
order (row-major arrays, `workload.signature` names).

Tensor-core plans (backends/cuda_tc.py) build with TVM's async-copy pass on
(cp.async), and report the dynamic shared memory TVM actually allocates: its
merged layout overlaps buffers whose lifetimes do not meet (the output's
staging tile reuses the copies' ring), so it is read from the IR right after
MergeSharedMemoryAllocations. A chain builds through a pipeline that runs
LowerWarpMemory repeatedly: TVM 0.27 lowers only the first warp-scope buffer of
a statement sequence per run, which left the second accumulator as a
whole-warp array in local memory (thousands of bytes of stack).
"""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import tvm

from ..models.errors import BuildFailed, InvalidInput
from ..models.hardware import Hardware
from ..models.plan import TuneResult
from ..models.workload import Workload
from .base import Built, Emitted, have, run_checked
from .cuda import ARCHES
from .cuda_emit import emit_cuda
from .cuda_tc import check_arch, emit_tensor_cores, primfunc as tc_primfunc
from .llvm_build import rebuild_script

_KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)\s*\{')
_SHARED = re.compile(r'(\w+) = T\.(?:sblock_)?alloc_buffer\(\(([\d, ]+)\),[^\n]*scope="shared\.dyn"')


def cuda_target(arch: str) -> dict:
    if arch not in ARCHES:
        raise InvalidInput(f"unknown CUDA arch {arch!r}; expected one of {', '.join(ARCHES)}")
    return {"kind": "cuda", "arch": arch}


def shared_buffers(emitted: Emitted, target) -> dict[str, int]:
    """Elements of each shared buffer once software pipelining has multiplied them (before
    TVM overlaps buffers whose lifetimes do not meet)."""
    mod = tvm.IRModule({"main": emitted.schedule.mod["main"].with_attr("target", target)})
    t = tvm.s_tir.transform
    passes = [t.LowerInitBlock(), t.PlanAndUpdateBufferAllocationLocation(), t.ConvertBlocksToOpaque(),
              t.CompactBufferAllocation(), t.LowerMatchBuffer(), t.InjectSoftwarePipeline()]
    with target:
        text = tvm.ir.transform.Sequential(passes)(mod).script()
    return {name: math.prod(int(v) for v in shape.split(",") if v.strip()) for name, shape in _SHARED.findall(text)}


def _launches(source: str, emitted: Emitted, workload: Workload, shared_bytes: int) -> list[dict]:
    """Launch parameters per kernel, in the order TVM's host code launches them: the planned
    kernel, then (a padded output accumulated in place) the copy of its real part."""
    kernels = []
    for i, (threads, name, params) in enumerate(_KERNEL.findall(source)):
        args = [re.sub(r"_ptr$", "", p.split()[-1]) for p in params.split(",") if p.strip()]
        if i == 0:
            grid, smem = emitted.launch["blocks"], shared_bytes
        else:
            out = workload.tensors[workload.ops[-1].output].dims
            grid, smem = -(-math.prod(workload.dims[x] for x in out) // int(threads)), 0
        kernels.append({"name": name, "grid": [grid, 1, 1], "block": [int(threads), 1, 1],
                        "dynamic_shared_bytes": smem, "args": [a for a in args if a in workload.tensors]})
    return kernels


def build_cuda(workload: Workload, hardware: Hardware, plan, arch: str = "sm_90") -> Built:
    """Emit the plan's schedule and generate CUDA source for `arch` (`Built.source`, `Built.launches`)."""
    start = time.perf_counter()
    if plan.launch is not None and plan.launch.tensor_cores:
        check_arch(plan, arch)
        emitted = emit_tensor_cores(workload, hardware, plan)
        source, smem = generate_tensor_core_source(emitted.schedule.mod, arch, emitted.launch["chain"])
        launches = _tensor_core_launch(source, emitted, workload, smem)
        return Built(None, emitted, time.perf_counter() - start, source=source, launches=launches)
    emitted = emit_cuda(workload, hardware, plan)
    target = tvm.target.Target(cuda_target(arch))
    mod = tvm.IRModule({"main": emitted.schedule.mod["main"].with_attr("target", target)})
    lib = tvm.compile(mod, target=target)
    source = lib.mod.imports[0].inspect_source()
    # Dynamic shared memory: every buffer at its full size, an upper bound of TVM's overlapped layout.
    smem = sum(shared_buffers(emitted, target).values()) * workload.elem_bytes
    launches = _launches(source, emitted, workload, smem)
    return Built(None, emitted, time.perf_counter() - start, source=source, launches=launches)


@tvm.instrument.pass_instrument
class _MergedShared:
    """Reads the merged dynamic shared allocation right after MergeSharedMemoryAllocations."""

    def __init__(self):
        self.bytes = 0

    def run_after_pass(self, mod, info):
        if info.name.endswith("MergeSharedMemoryAllocations"):
            sizes = re.findall(r'buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\), "uint8", scope="shared\.dyn"\)', mod.script())
            self.bytes = max([int(b) for b in sizes], default=0)


WARP_PIPELINE = "cachetile_all_warp_buffers"
_WARP_LOWERINGS = 32  # more than the fragment buffers a kernel has (pipeline prologues copy some)


def _register_warp_pipeline() -> None:
    """TVM's default s_tir pipeline with LowerWarpMemory run _WARP_LOWERINGS times (already
    lowered buffers are local and skipped); see the module docstring."""
    from tvm.s_tir.pipeline import default_s_tir_pipeline
    from tvm.tirx import compilation_pipeline

    if WARP_PIPELINE in compilation_pipeline.PIPELINE_MAP:
        return

    def factory():
        pipeline, host, _ = default_s_tir_pipeline()

        def device():
            t = tvm.tirx.transform
            return tvm.ir.transform.Sequential([t.LowerWarpMemory()] * _WARP_LOWERINGS + [t.StmtSimplify(), t.LowerIntrin()])

        return pipeline, host, device

    compilation_pipeline.register_tir_pipeline(WARP_PIPELINE, factory)


def generate_tensor_core_source(mod, arch: str, chain: bool) -> tuple[str, int]:
    """CUDA source of a tensor-core schedule and its dynamic shared bytes (TVM's merged layout)."""
    target = tvm.target.Target(cuda_target(arch))
    mod = tvm.IRModule({"main": mod["main"].with_attr("target", target)})
    config = {"tirx.use_async_copy": True}  # InjectPTXAsyncCopy: the pipelined copies become cp.async
    options = {}
    if chain:
        # CommonSubexprElim would bind threadIdx.x * 8 to a variable before the repeated
        # LowerWarpMemory, which then finds no threadIdx.x in the ldmatrix offsets and fails.
        config["tirx.disable_cse_tir"] = True
        _register_warp_pipeline()
        options["tir_pipeline"] = WARP_PIPELINE
    probe = _MergedShared()
    with tvm.transform.PassContext(config=config, instruments=[probe]):
        lib = tvm.compile(mod, target=target, **options)
    return lib.mod.imports[0].inspect_source(), probe.bytes


def _tensor_core_launch(source: str, emitted: Emitted, workload: Workload, shared_bytes: int) -> list[dict]:
    """The one kernel of a tensor-core schedule: grid, block (32 lanes x warps), shared bytes,
    arguments by the workload's names."""
    kernels = _KERNEL.findall(source)
    launch = emitted.launch
    if len(kernels) != 1 or int(kernels[0][0]) != launch["threads"]:
        raise BuildFailed(f"expected one kernel of {launch['threads']} threads, TVM generated {len(kernels)}")
    by_tir = {v: k for k, v in launch["names"].items()}
    threads, name, params = kernels[0]
    args = [by_tir[re.sub(r"_ptr$", "", p.split()[-1])] for p in params.split(",") if p.strip()]
    return [{"name": name, "grid": [launch["blocks"], 1, 1], "block": launch["block"],
             "dynamic_shared_bytes": shared_bytes, "args": args}]


def schedule_script(workload: Workload, emitted: Emitted, arch: str) -> str:
    """A standalone Python script that rebuilds this schedule and writes kernel.cu."""
    if "names" in emitted.launch:  # tensor cores: cachetile's intrinsics and build settings
        main = f'''    from cachetile.backends.cuda_build import generate_tensor_core_source

    source, _ = generate_tensor_core_source(sch.mod, {arch!r}, chain={emitted.launch["chain"]})
    with open(out, "w") as f:
        f.write(source)'''
        prelude = ("from cachetile.backends.cuda_intrin import register_all\n\n"
                   "register_all()  # the bfloat16 and cast intrinsics the trace names")
        return rebuild_script(workload, emitted.padded, emitted.schedule, "kernel.cu", main,
                              func=tc_primfunc(workload, emitted.launch["names"]), prelude=prelude)
    main = f'''    lib = tvm.compile(sch.mod, target=tvm.target.Target({cuda_target(arch)!r}))
    with open(out, "w") as f:
        f.write(lib.mod.imports[0].inspect_source())'''
    return rebuild_script(workload, emitted.padded, emitted.schedule, "kernel.cu", main)


def export_cuda(result: TuneResult, directory: str | Path, arch: str = "sm_90", built: Built | None = None) -> list[str]:
    """Write plan.json, schedule.py, kernel.cu and launch.json for the result's plan; returns the file names."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    built = built or build_cuda(result.workload, result.hardware, result.plan, arch)
    w = result.workload
    plan = result.plan.model_copy(update={"caches": built.emitted.caches})
    (out / "plan.json").write_text(result.model_copy(update={"plan": plan}).model_dump_json(indent=2) + "\n")
    (out / "schedule.py").write_text(schedule_script(w, built.emitted, arch))
    (out / "kernel.cu").write_text(built.source)
    launch = {"arch": arch, "dtype": w.dtype, "kernels": built.launches,
              "shapes": {n: w.shape(n) for n, t in w.tensors.items() if t.role != "intermediate"}}
    (out / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
    return ["plan.json", "schedule.py", "kernel.cu", "launch.json"]


def nvcc_check(source: Path, arch: str) -> str:
    """Compile the source with nvcc for `arch` (a cubin, discarded): 'nvcc -arch=..: compiled',
    or why it was not checked. BuildFailed when nvcc rejects it."""
    command = f"nvcc -arch={arch}"
    if not have("nvcc"):
        return f"{command}: not checked (nvcc is not on PATH)"
    run_checked(["nvcc", f"-arch={arch}", "-cubin", "-o", "/dev/null", str(source)], command)
    return f"{command}: compiled"
