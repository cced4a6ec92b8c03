"""Compile an emitted CUDA schedule to source and export it.

No GPU or nvcc is needed: TVM generates the CUDA source itself. `export`
writes plan.json, schedule.py (rebuilds kernel.cu from the unscheduled
TensorIR plus the schedule trace), kernel.cu and launch.json: per kernel, in
launch order, its name, grid, block, dynamic shared-memory bytes and argument
order (row-major arrays, `workload.signature` names).
"""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import tvm

from ..models.errors import InvalidInput
from ..models.hardware import Hardware
from ..models.plan import TuneResult
from ..models.workload import Workload
from .base import Built, Emitted, have, run_checked
from .cuda import ARCHES
from .cuda_emit import emit_cuda
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
    emitted = emit_cuda(workload, hardware, plan)
    target = tvm.target.Target(cuda_target(arch))
    mod = tvm.IRModule({"main": emitted.schedule.mod["main"].with_attr("target", target)})
    lib = tvm.compile(mod, target=target)
    source = lib.mod.imports[0].inspect_source()
    # Dynamic shared memory: every buffer at its full size, an upper bound of TVM's overlapped layout.
    smem = sum(shared_buffers(emitted, target).values()) * workload.elem_bytes
    launches = _launches(source, emitted, workload, smem)
    return Built(None, emitted, time.perf_counter() - start, source=source, launches=launches)


def schedule_script(workload: Workload, emitted: Emitted, arch: str) -> str:
    """A standalone Python script that rebuilds this schedule and writes kernel.cu."""
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
