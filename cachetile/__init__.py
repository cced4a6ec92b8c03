"""cachetile: analytical cache tiling.

The public Python API, in the order data flows:

    from cachetile import builtin, preset, tune
    result = tune(builtin("gemm", {"m": 512, "n": 512, "k": 512}), preset("host"))
    result.plan.predicted_seconds, result.plan.levels[0].tile

`data_volume` and `memory_usage` cost any plan you write by hand, and
`make_plan` turns orders and tiles into the same Plan the optimizer returns.
`pareto` sweeps one level's capacity for the DV/MU trade-off. Errors are the
classes of cachetile.models.errors (InvalidInput, Infeasible, NoPlanInTime, ...).

Names load on first use, so `python -m cachetile.backends.cuda_run` on a GPU
machine needs only numpy, pydantic and CuPy.
"""
from importlib import import_module

_NAMES = {
    "data_volume": "models.checked", "memory_usage": "models.checked",
    "Hardware": "models.hardware", "Level": "models.hardware", "hardware_from": "models.hardware",
    "preset": "models.hardware",
    "Plan": "models.plan", "TuneResult": "models.plan", "make_plan": "models.plan",
    "Workload": "models.workload", "builtin": "models.workload", "workload_from_dict": "models.workload",
    "workload_from_equations": "models.einsum",
    "ParetoFront": "optimizer.pareto", "ParetoPoint": "optimizer.pareto", "capacity_sweep": "optimizer.pareto",
    "pareto": "optimizer.pareto",
    "SOLVERS": "optimizer.registry",
    "InfeasibleError": "optimizer.tune", "tune": "optimizer.tune",
    "CachetileError": "models.errors", "InvalidInput": "models.errors", "Infeasible": "models.errors",
    "NoPlanInTime": "models.errors", "SolverFailed": "models.errors", "BuildFailed": "models.errors",
    "KernelMismatch": "models.errors", "Unavailable": "models.errors",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'cachetile' has no attribute {name!r}")
    value = getattr(import_module(f".{_NAMES[name]}", __name__), name)
    globals()[name] = value
    return value
