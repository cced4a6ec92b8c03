"""Plans: per-level loop orders and tiles with their predicted cost.

These pydantic models are the JSON that `tune --json` prints (and, later, the
service returns). `make_plan` is the one place a scalar plan is costed.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .caches import CacheRecord, plan_caches
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


class Plan(BaseModel):
    levels: list[LevelPlan] = Field(description="innermost first, one per hardware level")
    predicted_seconds: float
    bottleneck: str = Field(description="the level whose link sets the time, or 'compute'")
    caches: list[CacheRecord] = Field(
        [], description="what the CPU backend caches, where, in which layout, and what the thrifty rule skips"
    )


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


def make_plan(workload: Workload, hardware: Hardware, orders: Orders, tiles: Tiles) -> Plan:
    """Validate and cost one plan (orders and tiles innermost level first)."""
    if len(orders) != len(hardware.levels) or len(tiles) != len(hardware.levels):
        raise ValueError(f"a plan needs one order and one tile per level ({len(hardware.levels)})")
    for order in orders:
        check_order(workload, order)
    check_tiles(workload, tiles)
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware)]
    secs = level_seconds(hardware, dv)
    compute = float(compute_seconds(workload, hardware, orders, tiles))
    predicted, worst = predicted_seconds(hardware, compute, secs)
    predicted, bottleneck = float(predicted), ("compute" if int(worst) < 0 else hardware.levels[int(worst)].name)
    levels = [
        LevelPlan(
            name=lv.name,
            order=list(orders[i]),
            tile={x: int(tiles[i][x]) for x in workload.dims},
            dv_bytes=dv[i],
            mu_bytes=float(level_usage(workload, hardware, i, tiles[i])),
            capacity_bytes=lv.capacity_bytes,
        )
        for i, lv in enumerate(hardware.levels)
    ]
    caches = []
    if hardware.kind == "cpu":
        try:
            caches = plan_caches(workload, [lv.name for lv in hardware.levels], orders, tiles)
        except ValueError:
            pass  # tiles that do not nest: the model costs them, but no backend emits them
    return Plan(levels=levels, predicted_seconds=predicted, bottleneck=bottleneck, caches=caches)
