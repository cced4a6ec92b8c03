"""Refit the model's machine coefficients to measured plans, so the model improves as it is used.

Every autotuned candidate is kept as a MeasuredPlan: the workload, the plan,
the hardware profile it was costed on, and the seconds it took. `refit`
scales the coefficients the cost model takes from calibration (the effective
peak, each level's fill bandwidth, and on SIMD CPUs the serial costs: a
parallel region's entry and a call) so that the model's predicted times match
the measured ones best, in the least-squares sense on log times (each plan
counts by its ratio, not its size):

    predicted_i = model(compute_i / p, [DV_il / (bandwidth_l b_l)])
                  + sum_l S_il / (bandwidth_l b_l) + regions_i r_0 r + call_0 c + H_i
                  + sum_c max(sum_l S_cl / (bandwidth_l b_l), I_c)

with DV, compute, the bytes S_il the kernel's serial passes stream over each
link beside its packing copies, its parallel regions, H_i, what its copies
hand between cores, and per copy c the bytes S_cl it streams and I_c, what its
loop issues (calibrated, not fitted), from the cost model on the base hardware
(models/kernel_costs.py), and p, b_l, r, c the multipliers (bounded to
[1/20, 20]; a small ridge term keeps a multiplier that no measurement
constrains at 1). Only the figures move; capacities, cores and vector width
are what identify the machine (`fingerprint`), and only measurements on a
machine with the same fingerprint and thread count are used.

For the host, the multipliers are kept in its calibration profile
(models/profile.Refit, `refit_profile`) and apply to the calibrated figures;
for any other hardware the result is a Hardware usable as `--hardware FILE.json`.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json

import numpy as np
from pydantic import BaseModel, Field

from .caches import tiles_nest
from .costmodel import compute_seconds, data_volume
from .errors import InvalidInput
from .hardware import Hardware, apply_profile
from .objective import charged_dv, time_objective
from .plan import Plan, make_plan
from .profile import Profile, Refit
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


class Fit(Refit):
    """What a refit found: the multipliers and how well each model fits (Refit), and the fitted hardware."""

    hardware: Hardware


def _terms(hardware: Hardware, record: MeasuredPlan) -> tuple[np.ndarray, list]:
    """The plan's terms on the base hardware, in the order the multipliers come: compute
    seconds, per-level DV (effective), per-level bytes its serial passes stream beside its
    copies, parallel regions entered, calls (1 when the target charges serial costs, else 0),
    the seconds its copies hand between cores (calibrated, kept as they are), and per-level bytes
    its copies inside the loop nest read and spare the links (kernel_costs.relieved); and per copy,
    the bytes it streams per level and the seconds its loop issues (calibrated per vector and
    element, kept as they are), of which the longer counts (kernel_costs.overlaps)."""
    orders = [lp.order for lp in record.plan.levels]
    tiles = [lp.tile for lp in record.plan.levels]
    stages = record.plan.launch.stages if record.plan.launch else 1
    compute = float(compute_seconds(record.workload, hardware, orders, tiles, stages))
    dv = [float(d) for d in data_volume(record.workload, orders, tiles, hardware=hardware)]
    # the bytes the time objective charges each link (effective_dv): no bandwidth changes them
    dv = charged_dv(record.workload, hardware, dv, [lp.mu_bytes for lp in record.plan.levels], orders, tiles)
    costs = hardware.target.kernel_costs(record.workload, orders, tiles, stages) \
        if tiles_nest(record.workload, tiles) else None
    if costs is None:
        return np.array([compute, *dv, *[0.0] * len(dv), 0.0, 0.0, 0.0, *[0.0] * (2 * len(dv))]), []
    copies = [(np.array(nbytes), issued) for nbytes, issued in costs.overlaps]
    streamed = np.array(costs.stream_bytes) - sum((nbytes for nbytes, _ in copies), np.zeros(len(dv)))
    return np.array([compute, *dv, *streamed, costs.regions, 1.0,
                     costs.handoff_seconds + costs.sharing_seconds, *costs.read_bytes,
                     *costs.relief]), copies


def scaled(hardware: Hardware, peak: float, bandwidths: list[float], region: float = 1.0,
           call: float = 1.0) -> Hardware:
    """The hardware with its peak, each level's bandwidth and its serial costs multiplied (the
    accumulators' bandwidth with the registers': both are the register link)."""
    levels = [lv.model_copy(update={"bandwidth_bytes_per_s": lv.bandwidth_bytes_per_s * b})
              for lv, b in zip(hardware.levels, bandwidths)]
    spill = hardware.accumulator_bytes_per_s
    return hardware.model_copy(update={
        "levels": levels, "peak_flops": hardware.peak_flops * peak,
        "accumulator_bytes_per_s": spill * bandwidths[0] if spill else None,
        "parallel_region_seconds": hardware.parallel_region_seconds * region,
        "call_seconds": hardware.call_seconds * call,
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


def enough(records: list[MeasuredPlan], hardware: Hardware) -> list[MeasuredPlan]:
    """The records that match `hardware` (`matching`); InvalidInput when fewer than MIN_RECORDS do."""
    records = matching(records, hardware)
    if len(records) < MIN_RECORDS:
        raise InvalidInput(f"refitting {hardware.name!r} needs at least {MIN_RECORDS} measured plans on a machine "
                           f"like it; found {len(records)} (autotune some workloads first: tune ... --autotune 8)")
    return records


def refit(hardware: Hardware, records: list[MeasuredPlan]) -> Fit:
    """Fit the hardware's peak, per-level bandwidth and serial-cost multipliers to the records
    that match it (`enough`)."""
    from scipy.optimize import least_squares

    records = enough(records, hardware)
    n = len(hardware.levels)
    terms, copies = zip(*[_terms(hardware, r) for r in records])
    terms = np.array(terms)
    # Every record's copies in one table, so that the residuals take their max without a loop.
    owner = np.array([i for i, plan in enumerate(copies) for _ in plan], dtype=int)
    copy_bytes = np.array([nbytes for plan in copies for nbytes, _ in plan]).reshape(len(owner), n)
    copy_issue = np.array([issued for plan in copies for _, issued in plan])
    compute, dv, streamed, regions, calls, handed = (terms[:, 0], terms[:, 1:1 + n], terms[:, 1 + n:1 + 2 * n],
                                                     terms[:, 1 + 2 * n], terms[:, 2 + 2 * n], terms[:, 3 + 2 * n])
    read, relief = terms[:, 4 + 2 * n:4 + 3 * n], terms[:, 4 + 3 * n:]
    measured = np.log([r.measured_seconds for r in records])
    objective = time_objective(hardware)
    # the links a record's whole problem leaves idle (objective.warm_levels) cost it nothing, whatever their bandwidth
    dv = np.where([np.isinf(time_objective(hardware, r.workload).divisors) for r in records], 0.0, dv)
    bandwidth = np.array([lv.bandwidth_bytes_per_s for lv in hardware.levels])

    def residuals(theta: np.ndarray) -> np.ndarray:
        links = bandwidth * np.exp(theta[1:1 + n])
        overlapped = np.bincount(owner, np.maximum((copy_bytes / links).sum(axis=1), copy_issue), len(records))
        serial = (streamed / links).sum(axis=1) + regions * hardware.parallel_region_seconds * np.exp(theta[1 + n]) \
            + calls * hardware.call_seconds * np.exp(theta[2 + n]) + handed + overlapped
        # the relief in bytes that the base bandwidths (the objective's divisors) turn into the scaled links' seconds
        predicted, _ = objective.value(compute / np.exp(theta[0]), list((dv / links).T), serial,
                                       list((relief / np.exp(theta[1:1 + n])).T), (read / links).sum(axis=1))
        return np.concatenate([np.log(predicted) - measured, RIDGE * theta])

    # Two starts: unchanged, and everything scaled by the median misprediction.
    k = n + 3
    uniform = float(np.median(residuals(np.zeros(k))[: len(records)]))
    fits = [least_squares(residuals, x0, bounds=(-BOUND, BOUND), method="trf", diff_step=1e-3)
            for x0 in (np.zeros(k), np.clip(np.full(k, uniform), -BOUND, BOUND))]
    m = np.exp(min(fits, key=lambda f: f.cost).x)
    fitted = scaled(hardware, float(m[0]), [float(b) for b in m[1:1 + n]], float(m[1 + n]), float(m[2 + n]))
    (rms0, median0, rho0), (rms1, median1, rho1) = agreement(hardware, records), agreement(fitted, records)
    return Fit(
        hardware=fitted,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        records=len(records),
        peak_multiplier=float(m[0]),
        bandwidth_multipliers={lv.name: float(b) for lv, b in zip(hardware.levels, m[1:1 + n])},
        parallel_region_multiplier=float(m[1 + n]), call_multiplier=float(m[2 + n]),
        rms_log_error_before=rms0, rms_log_error_after=rms1,
        median_ratio_before=median0, median_ratio_after=median1,
        spearman_before=rho0, spearman_after=rho1,
    )


def refit_profile(profile: Profile, assumed: Hardware, records: list[MeasuredPlan]) -> tuple[Profile, Fit]:
    """Refit a calibration profile: the base is `assumed` (the host preset without a profile)
    with the profile's measured figures, never a previous refit's, so refits do not compound;
    returns the profile with the new multipliers and the fit."""
    base = apply_profile(assumed, profile.model_copy(update={"refit": None}))
    fit = refit(base, records)
    return profile.model_copy(update={"refit": Refit.model_validate(fit.model_dump(exclude={"hardware"}))}), fit
