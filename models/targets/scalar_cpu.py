"""CPUs without SIMD registers (hardware with no `vector_bytes`): the plain model of base.py."""
from __future__ import annotations

from .base import Target


class ScalarCpu(Target):
    name = "scalar-cpu"
