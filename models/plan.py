"""Plans: per-level loop orders and tiles with their predicted cost.

These pydantic models are the JSON that `tune --json` prints (and, later, the
service returns). `make_plan` is the one place a scalar plan is costed.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .caches import CacheRecord, tiles_nest
from .checked import check_hardware, check_plan, check_workload
from .costmodel import Orders, Tiles, compute_seconds, data_volume, level_usage
from .gpu import LaunchPlan
from .hardware import Hardware
from .objective import charged_dv, time_objective
from .traffic import with_kernel_traffic
from .workload import Workload

Status = Literal["optimal", "feasible", "timeout", "infeasible", "error"]


class LevelPlan(BaseModel):
    name: str
    order: list[str] = Field(description="loops, outermost first")
    tile: dict[str, int] = Field(description="extent of each loop's block resident at this level")
    dv_bytes: float = Field(description="bytes moved into this level (Accera's refills of its tile)")
    mu_bytes: float = Field(description="bytes this level holds")
    copy_bytes: float = Field(0.0, description="bytes the kernel's packing copies write into buffers filled at "
                                               "this level (beside dv_bytes, which keeps Accera's refill count)")
    expected_bytes: float = Field(0.0, description="bytes the kernel is expected to move into this level, what a "
                                                   "cache simulator counts as misses: the bytes its link is charged "
                                                   "(dv_bytes, or less where a hardware cache keeps an outer tile) "
                                                   "plus the packing copies, zeroing and write-back")
    link_seconds: float = Field(0.0, description="the time predicted_seconds charges this level's link: its charged "
                                                 "bytes at its bandwidth, before compute and the links overlap")
    capacity_bytes: int


class Plan(BaseModel):
    levels: list[LevelPlan] = Field(description="innermost first, one per hardware level")
    predicted_seconds: float
    bottleneck: str = Field(description="the level whose link sets the overlapped time, or 'compute'")
    serial_seconds: float = Field(0.0, description="of predicted_seconds, what the kernel spends outside its "
                                                   "overlapped loops: packing copies, zeroing, parallel regions, the call")
    caches: list[CacheRecord] = Field(
        [], description="what the backend caches, where, in which layout, and what the thrifty rule skips"
    )
    launch: LaunchPlan | None = Field(None, description="GPU plans: the kernel launch")


class SolverInfo(BaseModel):
    name: str
    status: Status
    seconds: float
    evaluated: int = Field(description="candidate plans costed")


class TuneResult(BaseModel):
    workload: Workload
    hardware: Hardware
    plan: Plan
    solver: SolverInfo
    alternatives: list[Plan] = []


def make_plan(workload: Workload, hardware: Hardware, orders: Orders, tiles: Tiles, stages: int = 1) -> Plan:
    """Validate and cost one plan (orders and tiles innermost level first); `stages` is the
    number of buffers of each shared-memory input cache on GPUs. The plan comes back as its
    kernel runs it: on SIMD CPUs a register tile LLVM merges with the short loop around it is
    reported as the merged tile (Target.emitted_tiles)."""
    check_workload(workload)
    check_hardware(hardware)
    check_plan(workload, orders, tiles, len(hardware.levels))
    tiles = hardware.target.emitted_tiles(workload, orders, tiles)  # the plan as its kernel runs it
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware)]
    objective = time_objective(hardware, workload)
    compute = float(compute_seconds(workload, hardware, orders, tiles, stages))
    nests = tiles_nest(workload, tiles)  # tiles that do not nest are costed, but no backend emits them
    costs = hardware.target.kernel_costs(workload, orders, tiles, stages) if nests else None
    serial = costs.seconds if costs else 0.0
    relief, reads = (costs.relief, costs.read_seconds(hardware)) if costs else (None, 0.0)
    mu = [float(level_usage(workload, hardware, i, tiles[i], stages)) for i in range(len(hardware.levels))]
    charged = [float(d) for d in charged_dv(workload, hardware, dv, mu, orders, tiles)]
    links = objective.links(charged)
    predicted, worst = objective.value(compute, links, serial, relief, reads)
    expected = with_kernel_traffic(workload, hardware, orders, tiles, charged, costs)
    # The registers' link is charged in load slots (a broadcast costs a vector load, a reloaded
    # accumulator its store and load at the accumulators' bandwidth); reported, their DV is
    # bytes, Accera's refills of the register tile, as every other level's.
    dv[0] = float(data_volume(workload, orders, tiles, levels=[0], hardware=hardware, weighted=False)[0])
    predicted, bottleneck = float(predicted), ("compute" if int(worst) < 0 else hardware.levels[int(worst)].name)
    levels = [
        LevelPlan(
            name=lv.name,
            order=list(orders[i]),
            tile={x: int(tiles[i][x]) for x in workload.dims},
            dv_bytes=dv[i],
            mu_bytes=mu[i],
            copy_bytes=costs.copy_bytes[i] if costs else 0.0,
            expected_bytes=expected[i],
            link_seconds=float(links[i]),
            capacity_bytes=lv.capacity_bytes,
        )
        for i, lv in enumerate(hardware.levels)
    ]
    caches, launch = [], None
    if nests:
        caches, launch = hardware.target.plan_extras(workload, [lv.name for lv in hardware.levels], orders, tiles, stages)
    return Plan(levels=levels, predicted_seconds=predicted, bottleneck=bottleneck, serial_seconds=serial, caches=caches,
                launch=launch)
