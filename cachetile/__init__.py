"""cachetile: analytical cache tiling.

The public Python API, in the order data flows:

    from cachetile import builtin, preset, tune
    result = tune(builtin("gemm", {"m": 512, "n": 512, "k": 512}), preset("host"))
    result.plan.predicted_seconds, result.plan.levels[0].tile

`data_volume` and `memory_usage` cost any plan you write by hand, and
`make_plan` turns orders and tiles into the same Plan the optimizer returns.
`pareto` sweeps one level's capacity for the DV/MU trade-off.
"""
from .models.costmodel import data_volume, memory_usage
from .models.hardware import Hardware, Level, hardware_from, preset
from .models.plan import Plan, TuneResult, make_plan
from .models.workload import Workload, builtin, workload_from_dict
from .optimizer.pareto import ParetoFront, ParetoPoint, capacity_sweep, pareto
from .optimizer.registry import SOLVERS
from .optimizer.tune import InfeasibleError, tune

__all__ = [
    "Hardware", "InfeasibleError", "Level", "ParetoFront", "ParetoPoint", "Plan", "SOLVERS", "TuneResult",
    "Workload", "builtin", "capacity_sweep", "data_volume", "hardware_from", "make_plan", "memory_usage",
    "pareto", "preset", "tune", "workload_from_dict",
]
