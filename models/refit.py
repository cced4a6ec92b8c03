"""Refit the model's machine coefficients to measured plans, so the model improves as it is used.

Every autotuned candidate is kept as a MeasuredPlan: the workload, the plan,
the hardware profile it was costed on, and the seconds it took. `refit`
scales the hardware's effective peak and each level's fill bandwidth so that
the cost model's predicted times match the measured ones best, in the least-
squares sense on log times (each plan counts by its ratio, not its size):

    predicted_i(p, b) = model(compute_i / p, [DV_il / (bandwidth_l * b_l)])

with DV and compute from the cost model on the base hardware, p and b_l the
multipliers (bounded to [1/20, 20]; a small ridge term keeps a multiplier
that no measurement constrains at 1). The result is a Hardware with the
fitted figures, usable as `--hardware FILE.json`. Only the bandwidths and the
peak move; capacities, cores and vector width are what identify the machine
(`fingerprint`), and only measurements on a machine with the same
fingerprint and thread count are used.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
from pydantic import BaseModel, Field

from .costmodel import compute_seconds, data_volume
from .errors import InvalidInput
from .hardware import Hardware, Level
from .objective import time_objective
from .plan import Plan, make_plan
from .workload import Workload

MIN_RECORDS = 3
BOUND = np.log(20.0)  # multipliers stay within [1/20, 20]
RIDGE = 0.05  # weight of log(multiplier) against the fit, per multiplier


class MeasuredPlan(BaseModel):
    """One plan as it ran: what was predicted, what was measured, and where."""

    workload: Workload
    hardware: Hardware = Field(description="the profile the plan was costed on")
    plan: Plan
    measured_seconds: float = Field(gt=0)
    device: str = Field(description="where it ran: the CPU model, or the RPC server")
    threads: int | None = Field(None, description="threads the kernel ran on")
    source: str = Field("autotune", description="what measured it, e.g. 'autotune' or 'autotune via rpc HOST:PORT:KEY'")
    created: float = 0.0


def fingerprint(hardware: Hardware) -> str:
    """What identifies a machine's profile apart from the figures a refit changes: kind, cores,
    vector width, and each level's name and capacity."""
    data = {"kind": hardware.kind, "cores": hardware.cores, "vector_bytes": hardware.vector_bytes,
            "levels": [[lv.name, lv.capacity_bytes] for lv in hardware.levels]}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def matching(records: list[MeasuredPlan], hardware: Hardware) -> list[MeasuredPlan]:
    """The records measured on a machine like `hardware`, with as many threads as it has cores."""
    want = fingerprint(hardware)
    return [r for r in records if fingerprint(r.hardware) == want and r.threads in (None, hardware.cores)]


class Fit(BaseModel):
    """What a refit found: the fitted hardware, its multipliers, and how well each model fits."""

    hardware: Hardware
    peak_multiplier: float
    bandwidth_multipliers: dict[str, float] = Field(description="per level, innermost first")
    records: int
    rms_log_error_before: float = Field(description="root mean square of ln(predicted / measured)")
    rms_log_error_after: float
    median_ratio_before: float = Field(description="median of predicted / measured")
    median_ratio_after: float
    spearman_before: float | None = Field(None, description="rank correlation of predicted and measured seconds")
    spearman_after: float | None = None


def _terms(hardware: Hardware, record: MeasuredPlan) -> tuple[float, np.ndarray]:
    """The plan's compute seconds and per-level DV on the base hardware."""
    orders = [lp.order for lp in record.plan.levels]
    tiles = [lp.tile for lp in record.plan.levels]
    stages = record.plan.launch.stages if record.plan.launch else 1
    compute = float(compute_seconds(record.workload, hardware, orders, tiles, stages))
    dv = np.array([float(d) for d in data_volume(record.workload, orders, tiles, hardware=hardware)])
    return compute, dv


def scaled(hardware: Hardware, peak: float, bandwidths: list[float]) -> Hardware:
    """The hardware with its peak and each level's bandwidth multiplied."""
    levels = [Level(name=lv.name, capacity_bytes=lv.capacity_bytes, bandwidth_bytes_per_s=lv.bandwidth_bytes_per_s * b)
              for lv, b in zip(hardware.levels, bandwidths)]
    return hardware.model_copy(update={"levels": levels, "peak_flops": hardware.peak_flops * peak,
                                       "source": f"{hardware.source or hardware.name}, refitted to measurements"})


def predictions(hardware: Hardware, records: list[MeasuredPlan]) -> np.ndarray:
    """The cost model's predicted seconds of each record's plan on `hardware` (make_plan)."""
    return np.array([make_plan(r.workload, hardware, [lp.order for lp in r.plan.levels],
                               [lp.tile for lp in r.plan.levels],
                               r.plan.launch.stages if r.plan.launch else 1).predicted_seconds for r in records])


def agreement(hardware: Hardware, records: list[MeasuredPlan]) -> tuple[float, float, float | None]:
    """How well the cost model on `hardware` predicts the records: the root mean square of
    ln(predicted / measured), the median of predicted / measured, and Spearman's rank correlation
    (None for fewer than 3 records or constant values)."""
    from scipy.stats import spearmanr

    predicted = predictions(hardware, records)
    measured = np.array([r.measured_seconds for r in records])
    ratio = predicted / measured
    rho = None
    if len(records) >= 3 and np.ptp(predicted) > 0 and np.ptp(measured) > 0:
        rho = float(spearmanr(predicted, measured).statistic)
    return float(np.sqrt(np.mean(np.log(ratio) ** 2))), float(np.median(ratio)), rho


def refit(hardware: Hardware, records: list[MeasuredPlan]) -> Fit:
    """Fit the hardware's peak and per-level bandwidth multipliers to the records that match it
    (`matching`); InvalidInput when fewer than MIN_RECORDS do."""
    from scipy.optimize import least_squares

    records = matching(records, hardware)
    if len(records) < MIN_RECORDS:
        raise InvalidInput(f"refitting {hardware.name!r} needs at least {MIN_RECORDS} measured plans on a machine "
                           f"like it; found {len(records)} (autotune some workloads first: tune ... --autotune 8)")
    terms = [_terms(hardware, r) for r in records]
    compute = np.array([c for c, _ in terms])
    dv = np.array([d for _, d in terms])  # records x levels
    measured = np.log([r.measured_seconds for r in records])
    objective = time_objective(hardware)
    n = len(hardware.levels)

    def residuals(theta: np.ndarray) -> np.ndarray:
        links = [dv[:, j] / (hardware.levels[j].bandwidth_bytes_per_s * np.exp(theta[1 + j])) for j in range(n)]
        predicted, _ = objective.value(compute / np.exp(theta[0]), links)
        return np.concatenate([np.log(predicted) - measured, RIDGE * theta])

    # Two starts: unchanged, and everything scaled by the median misprediction.
    uniform = float(np.median(residuals(np.zeros(n + 1))[: len(records)]))
    fits = [least_squares(residuals, x0, bounds=(-BOUND, BOUND), method="trf", diff_step=1e-3)
            for x0 in (np.zeros(n + 1), np.clip(np.full(n + 1, uniform), -BOUND, BOUND))]
    theta = min(fits, key=lambda f: f.cost).x
    fitted = scaled(hardware, float(np.exp(theta[0])), [float(np.exp(t)) for t in theta[1:]])
    (rms0, median0, rho0), (rms1, median1, rho1) = agreement(hardware, records), agreement(fitted, records)
    return Fit(
        hardware=fitted,
        peak_multiplier=float(np.exp(theta[0])),
        bandwidth_multipliers={lv.name: float(np.exp(t)) for lv, t in zip(hardware.levels, theta[1:])},
        records=len(records),
        rms_log_error_before=rms0, rms_log_error_after=rms1,
        median_ratio_before=median0, median_ratio_after=median1,
        spearman_before=rho0, spearman_after=rho1,
    )
