"""The CPU backend: TensorIR built with LLVM for this machine (llvm_emit, llvm_build,
llvm_measure), checked and timed against numpy in the same process."""
from __future__ import annotations

from .base import Backend, BuildOptions, Built, register


class LlvmBackend(Backend):
    name = "llvm"
    files = ("plan.json", "schedule.py", "kernel.so")

    def _build(self, workload, hardware, plan, options: BuildOptions) -> Built:
        from .llvm_build import build

        return build(workload, hardware, plan, options.double_buffer, options.target)

    def _export(self, result, directory, options, built):
        from .llvm_build import export

        return export(result, directory, built), []

    def measure(self, result, plan=None, repeat=10, progress=None, built=None, options=None):
        from .llvm_measure import measure_built

        built = built or self.build(result.workload, result.hardware, plan or result.plan, options)
        return measure_built(result.workload, built.lib, built.seconds, repeat, progress)

    def measure_plans(self, result, plans, repeat=10, progress=None, options=None, remote=None, timeout=30.0):
        from .llvm_trials import measure_plans

        return measure_plans(self, result, plans, repeat, progress, options or BuildOptions(), remote, timeout)


register(LlvmBackend())
