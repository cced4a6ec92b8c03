"""CPUs without SIMD registers (hardware with no `vector_bytes`): the plain model of base.py,
plus the kernel's own costs (cpu.py)."""
from __future__ import annotations

from .cpu import CpuTarget


class ScalarCpu(CpuTarget):
    name = "scalar-cpu"
