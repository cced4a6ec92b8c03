"""CPUs without SIMD registers (hardware with no `vector_bytes`): the plain model of base.py.
They stand for abstract hierarchies (the DV model's own terms); the kernel-cost terms of
simd_cpu.py were measured on the SIMD micro-kernel and are not applied here."""
from __future__ import annotations

from .base import Target


class ScalarCpu(Target):
    name = "scalar-cpu"
