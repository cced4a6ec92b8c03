"""The CPU check of tensor-core schedules (no GPU needed).

The scheduled module is built for LLVM with every thread binding a serial loop
and shared/warp memory as plain memory (what tests/test_cuda.py does for the
CUDA-core schedules), after tensorizing onto the CPU twins of ldmatrix, mma and
the fragment fill (backends/cuda_intrin.emulated): the real descriptions, with
implementations that replay the PTX instructions lane by lane at the offsets
TVM's CUDA implementations compute.

What a match with numpy establishes, for this schedule: the tiling, padding and
crop, the index arithmetic, the software pipelines' buffer rotation, prologue
and epilogue (synchronous semantics), the fragment layouts, that each tensorized
region matches its intrinsic, and that TVM's ldmatrix/mma offsets compose with
the hardware's lane layouts (the .trans choices, the bfloat16 intrinsics, the
accumulator fragment reused as an A operand). What it cannot see: cp.async
commit/wait counts (the async annotation is left out), missing barriers or
races between warps (serial threads have none), TVM's warp-memory lowering,
the PTX text itself, shared-memory aliasing, and register or shared limits.
The lane tables are transcribed from the PTX ISA; only a GPU run
(backends/cuda_run.py) checks the kernel itself.
"""
from __future__ import annotations

import re

import numpy as np
import tvm

from ..models.measurement import compare, numpy_dtype, random_inputs, reference
from .cuda_tc import emit_tensor_cores

_SCOPES = ("shared.dyn", "shared", "warp")


def serial_llvm(mod):
    """Build a scheduled (not yet lowered) module for the CPU, thread bindings as serial loops."""
    text = mod.script()
    text = re.sub(r'T\.thread_binding\((?:0, )?(\d+), thread="[a-zA-Z.]+"\)', r"T.serial(\1)", text)
    for scope in _SCOPES:
        text = text.replace(f'scope="{scope}"', 'scope="global"')
    return tvm.compile(tvm.script.from_source(text), target=tvm.target.Target({"kind": "llvm"}))


def run_serial(workload, lib, arrays: dict) -> dict:
    """Call `main` with the inputs in signature order; returns the outputs."""
    args = [tvm.runtime.tensor(arrays[n] if n in arrays else np.zeros(workload.shape(n), numpy_dtype(workload.dtype)))
            for n in workload.signature]
    lib["main"](*args)
    return {n: a.numpy() for n, a in zip(workload.signature, args) if n not in arrays}


def check_tensor_cores(workload, hardware, plan, seed: int = 0, intrins=None) -> float:
    """Run a tensor-core plan's schedule on the CPU (see the module docstring) and compare it
    with numpy within the dtype's tolerance (KernelMismatch otherwise); returns the largest
    |error|. `intrins` overrides the CPU twins (a negative control)."""
    emitted = emit_tensor_cores(workload, hardware, plan, cpu_twins=True, intrins=intrins)
    lib = serial_llvm(emitted.schedule.mod)
    arrays = random_inputs(workload, seed)
    got = run_serial(workload, lib, arrays)
    want = reference(workload)({n: a.astype(np.float64) for n, a in arrays.items()})
    return compare(workload, got, want)
