"""Targets: one strategy per kind of machine (see base.py), picked from the hardware here
and nowhere else."""
from __future__ import annotations

from .base import Target
from .cuda_gpu import CudaGpu
from .scalar_cpu import ScalarCpu
from .simd_cpu import SimdCpu

PLAIN = Target(None)  # the cost model without hardware: plain DV and MU


def target_for(hardware) -> Target:
    """The target strategy for a Hardware (PLAIN for None)."""
    if hardware is None:
        return PLAIN
    if hardware.kind == "gpu":
        return CudaGpu(hardware)
    if hardware.vector_bytes:
        return SimdCpu(hardware)
    return ScalarCpu(hardware)


__all__ = ["CudaGpu", "PLAIN", "ScalarCpu", "SimdCpu", "Target", "target_for"]
