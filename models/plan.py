"""Plans: per-level loop orders and tiles with their predicted cost.

These pydantic models are the JSON that `tune --json` prints (and, later, the
service returns). `make_plan` is the one place a scalar plan is costed.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from . import gpu
from .caches import CacheRecord, gpu_cache_records, plan_caches
from .costmodel import (
    Orders, Tiles, check_order, check_tiles, compute_seconds, data_volume, level_usage, predicted_seconds,
)
from .hardware import Hardware
from .workload import Workload

Status = Literal["optimal", "feasible", "timeout", "infeasible"]


class LevelPlan(BaseModel):
    name: str
    order: list[str] = Field(description="loops, outermost first")
    tile: dict[str, int] = Field(description="extent of each loop's block resident at this level")
    dv_bytes: float = Field(description="bytes moved into this level")
    mu_bytes: float = Field(description="bytes this level holds")
    capacity_bytes: int


class LaunchPlan(BaseModel):
    """How a GPU plan launches (estimates from models/gpu.py)."""

    grid_blocks: int
    threads_per_block: int
    registers_per_thread: int = Field(description="estimated: tiles plus a reserve, before the compiler's choices")
    shared_bytes: int = Field(description="per block, all stages included")
    blocks_per_sm: int
    waves: int
    stages: int = Field(description="buffers per shared-memory input cache")


class Plan(BaseModel):
    levels: list[LevelPlan] = Field(description="innermost first, one per hardware level")
    predicted_seconds: float
    bottleneck: str = Field(description="the level whose link sets the time, or 'compute'")
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


def level_seconds(hardware: Hardware, dv: list) -> list:
    """Time of each level's link: DV_l / bandwidth_l."""
    return [d / lv.bandwidth_bytes_per_s for d, lv in zip(dv, hardware.levels)]


def make_plan(workload: Workload, hardware: Hardware, orders: Orders, tiles: Tiles, stages: int = 1) -> Plan:
    """Validate and cost one plan (orders and tiles innermost level first); `stages` is the
    number of buffers of each shared-memory input cache on GPUs."""
    if len(orders) != len(hardware.levels) or len(tiles) != len(hardware.levels):
        raise ValueError(f"a plan needs one order and one tile per level ({len(hardware.levels)})")
    for order in orders:
        check_order(workload, order)
    check_tiles(workload, tiles)
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware)]
    secs = level_seconds(hardware, dv)
    compute = float(compute_seconds(workload, hardware, orders, tiles, stages))
    predicted, worst = predicted_seconds(hardware, compute, secs)
    predicted, bottleneck = float(predicted), ("compute" if int(worst) < 0 else hardware.levels[int(worst)].name)
    levels = [
        LevelPlan(
            name=lv.name,
            order=list(orders[i]),
            tile={x: int(tiles[i][x]) for x in workload.dims},
            dv_bytes=dv[i],
            mu_bytes=float(level_usage(workload, hardware, i, tiles[i], stages)),
            capacity_bytes=lv.capacity_bytes,
        )
        for i, lv in enumerate(hardware.levels)
    ]
    caches, launch, names = [], None, [lv.name for lv in hardware.levels]
    try:
        if hardware.kind == "cpu":
            caches = plan_caches(workload, names, orders, tiles)
        else:
            caches = gpu_cache_records(workload, names, orders, tiles, stages)
    except ValueError:
        pass  # tiles that do not nest: the model costs them, but no backend emits them
    if hardware.kind == "gpu":
        g = gpu.launch(workload, hardware, tiles, stages)
        launch = LaunchPlan(grid_blocks=int(g.blocks), threads_per_block=int(g.threads), registers_per_thread=int(g.registers),
                            shared_bytes=int(g.shared_bytes), blocks_per_sm=int(g.blocks_per_sm), waves=int(g.waves),
                            stages=stages)
    return Plan(levels=levels, predicted_seconds=predicted, bottleneck=bottleneck, caches=caches, launch=launch)
