"""Measured autotuning: the model ranks the plans, the machine picks among its top K.

`autotune(request)` solves with enough alternatives to find the model's K best
distinct plans, and on SIMD CPUs the best plan of each of its K best register
tiles; it takes K of them, one per register tile first (`spread`), builds each
with the hardware's backend, checks it against numpy and times it (here, or on
a TVM RPC fleet: `request.rpc`), drops the plans that fail with their reason,
and returns the fastest as `plan` (of those within TIE of the fastest, the
model's best: `ranked`). The document is `tune --json`'s plus an `autotune`
section: per candidate, its rank in the model's order, predicted and measured
seconds, and its Measurement or error. `[plan, *alternatives]` are the
candidates that ran, the returned one first, in the same order as the first
entries of `autotune.candidates`. Each measured plan is also kept in the measurement
store (api/measurements.py) for `models.refit`.
"""
from __future__ import annotations

import json
import math
import time

from pydantic import BaseModel, Field

from ..backends.base import BuildOptions, backend_for
from ..models.errors import BuildFailed, CachetileError, KernelMismatch, Unavailable
from ..models.measurement import Measurement
from ..models.plan import Plan, TuneResult
from ..models.refit import MeasuredPlan
from ..models.workload import Workload
from ..optimizer.tune import tune
from .cache import PlanCache
from .progress import Progress, scaled

MAX_AUTOTUNE = 32
REPEAT = 6  # timed rounds of >= 20 ms per candidate (medians); each is timed 2-3 times
TRIAL_TIMEOUT_S = 30.0  # per candidate's measurement (per RPC session with --rpc)
PLAN_SHARE = 0.1  # of the progress, for the solve
BUILD_ALLOWANCE_S = 30.0  # per candidate, in the service's limit on a whole autotune
# Plans the solver is asked for per candidate wanted: its ranking lists many plans that emit
# the same kernel (orders that differ only in loops running once), e.g. 16 plans of gemm
# 96x80x72 are 2 kernels, 128 are 15; asking for more costs little (0.2 s for 256).
SOLVER_PLANS_PER_CANDIDATE = 16
# Measured times within this fraction of the fastest are ties, which the model's order breaks
# (`ranked`): the same candidates timed twice differ by 0.8-1.4% here (BENCHMARKS.md, RPC).
TIE = 0.015


class Candidate(BaseModel):
    rank: int = Field(description="place in the model's ranking of the candidates (0: the model's own choice)")
    predicted_seconds: float
    measured_seconds: float | None = Field(description="median of the timed runs; null when the plan was dropped")
    error: str | None = Field(None, description="why the plan was dropped, on one line")
    error_kind: str | None = Field(None, description="build-failed, mismatch, timeout or unavailable")
    measurement: Measurement | None = None


class Autotune(BaseModel):
    k: int = Field(description="candidates asked for")
    measured: int = Field(description="candidates that built, matched numpy and were timed")
    device: str = Field(description="where they ran")
    threads: int | None = Field(None, description="threads the kernels ran on")
    rpc: str | None = Field(None, description="HOST:PORT:KEY of the tracker, when measured through TVM RPC")
    chosen_rank: int = Field(description="the model's rank of the plan returned: the fastest, or the model's "
                             "best among those measured within 1.5% of it (ties)")
    speedup: float | None = Field(None, description="the model's choice's measured time over the returned plan's")
    seconds: float = Field(description="wall time of solving, building and measuring")
    note: str | None = None
    candidates: list[Candidate] = Field(description="the one returned, then the others that ran, fastest first, "
                                        "then those dropped")


class AutotuneResult(TuneResult):
    autotune: Autotune


def signature(workload: Workload, plan: Plan) -> tuple:
    """What makes two plans different kernels: each level's tiles, and its order of the loops
    that run more than once there (a one-trip loop's position changes nothing)."""
    key, parent = [], dict(workload.dims)
    for lp in reversed(plan.levels):
        trips = {x: math.ceil(parent[x] / lp.tile[x]) for x in lp.tile}
        key.append((tuple(x for x in lp.order if trips[x] > 1), tuple(sorted(lp.tile.items()))))
        parent = lp.tile
    return tuple(key)


def distinct(workload: Workload, plans: list[Plan]) -> list[Plan]:
    """The plans in order, without those that would emit the same kernel as an earlier one."""
    seen, out = set(), []
    for plan in plans:
        key = signature(workload, plan)
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out


def spread(plans: list[Plan], k: int) -> list[Plan]:
    """k of the plans (best first), in their order, chosen one per register tile first: the best
    plan of each register tile, then the second best of each, and so on. The model ranks
    outer tilings of one micro-kernel within a few percent of what they measure, and register
    tiles least surely (their speed depends on the code generator), so the measurements go
    across register tiles first."""
    rounds: dict[tuple, list[int]] = {}
    for i, plan in enumerate(plans):
        rounds.setdefault(tuple(sorted(plan.levels[0].tile.items())), []).append(i)
    depth = max(map(len, rounds.values()), default=0)
    ordered = [group[d] for d in range(depth) for group in rounds.values() if d < len(group)]
    return [plans[i] for i in sorted(ordered[:k])]


def choose_candidates(workload: Workload, hardware, k: int, solver: str = "auto", time_limit: float = 10.0,
                      stages: int | None = None, top: int = 0) -> tuple[TuneResult, list[Plan]]:
    """The solve, and the k plans to measure: distinct kernels, one per register tile first."""
    top = max(top, SOLVER_PLANS_PER_CANDIDATE * k - 1)
    result = tune(workload, hardware, solver, time_limit, top, stages, register_tiles=k)
    return result, spread(distinct(workload, [result.plan, *result.alternatives]), k)


def ranked(trials) -> list[int]:
    """The indices of the trials that ran: the one to return first, then the others fastest first.
    The one returned is the fastest, or the best in the model's order (the lowest index) among
    those within TIE of it: differences that small are the measurement's noise, and letting the
    model break them makes two measurements of the same candidates (here and on a fleet, or
    another day) return the same plan."""
    ran = sorted((i for i, t in enumerate(trials) if t.measurement), key=lambda i: trials[i].measurement.kernel_seconds)
    if not ran:
        return []
    limit = trials[ran[0]].measurement.kernel_seconds * (1 + TIE)
    chosen = min(i for i in ran if trials[i].measurement.kernel_seconds <= limit)
    return [chosen, *(i for i in ran if i != chosen)]


def autotune(request, progress: Progress | None = None, store=None,
             trial_timeout: float = TRIAL_TIMEOUT_S) -> AutotuneResult:
    """Measure `request.autotune` of the model's best distinct plans (`choose_candidates`); return
    the fastest (`ranked`) as `plan`.

    `store` (a MeasurementStore) keeps every measured plan. Raises Unavailable when this
    machine cannot run the hardware's kernels (a GPU plan without a GPU) or the RPC tracker
    cannot be used, and the first candidate's error when every candidate failed.
    """
    from ..backends.rpc import parse_target
    from ..backends.rpc_tracker import parse_rpc

    start = time.perf_counter()
    w, hw, k = request.workload, request.hardware, request.autotune
    backend = backend_for(hw)
    reason = backend.unavailable()
    if reason:
        raise Unavailable(f"--autotune times kernels on this machine, and {backend.name} kernels need a GPU: {reason}")
    remote = parse_rpc(request.rpc) if request.rpc else None
    options = BuildOptions(target=parse_target(request.target_host) if request.target_host else None)
    report = progress or (lambda fraction, message: None)
    report(0.0, "planning")
    result, plans = choose_candidates(w, hw, k, request.solver, request.time_limit, request.stages, request.top)
    trials = backend.measure_plans(result, plans, REPEAT, scaled(report, PLAN_SHARE, 1.0), options, remote,
                                   trial_timeout)
    ran = ranked(trials)
    if not ran:
        raise _all_failed(trials)
    dropped = [i for i, t in enumerate(trials) if not t.measurement]
    candidates = [Candidate(rank=i, predicted_seconds=plans[i].predicted_seconds,
                            measured_seconds=trials[i].measurement.kernel_seconds if trials[i].measurement else None,
                            error=trials[i].error, error_kind=trials[i].kind, measurement=trials[i].measurement)
                  for i in ran + dropped]
    threads = next((t.threads for t in trials if t.threads), None)
    first = trials[0].measurement
    summary = Autotune(
        k=k, measured=len(ran), device=trials[ran[0]].measurement.device, threads=threads,
        rpc=str(remote) if remote else None, chosen_rank=ran[0],
        speedup=first.kernel_seconds / trials[ran[0]].measurement.kernel_seconds if first else None,
        seconds=time.perf_counter() - start, candidates=candidates,
        note=(f"the kernels ran on {threads} thread(s), the plans were made for {hw.cores} cores"
              if threads and threads != hw.cores else None),  # only CPU backends report threads
    )
    if store is not None:
        source = f"autotune via rpc {remote}" if remote else "autotune"
        store.add([MeasuredPlan(workload=w, hardware=hw, plan=plans[i], device=trials[i].measurement.device,
                                measured_seconds=trials[i].measurement.kernel_seconds, threads=threads,
                                source=source) for i in ran])
    return AutotuneResult(workload=w, hardware=hw, plan=plans[ran[0]], solver=result.solver,
                          alternatives=[plans[i] for i in ran[1:]], autotune=summary)


def autotune_limit(request) -> float:
    """When the service kills an autotune's process: a solve's limit plus, per candidate, a
    build's allowance and the measurement's limit."""
    return 2 * request.time_limit + 10 + request.autotune * (BUILD_ALLOWANCE_S + TRIAL_TIMEOUT_S)


def parse_document(doc: str) -> TuneResult:
    """A `tune --json` document as the model it is: AutotuneResult when it has `autotune`."""
    data = json.loads(doc)
    return (AutotuneResult if "autotune" in data else TuneResult).model_validate(data)


def _all_failed(trials) -> CachetileError:
    """Every candidate failed: KernelMismatch when each disagreed with numpy, BuildFailed when one
    failed to build, else Unavailable (timeouts, the fleet); the message lists each reason."""
    reasons = "; ".join(f"rank {i}: {t.error}" for i, t in enumerate(trials))
    kinds = {t.kind for t in trials}
    cls = KernelMismatch if kinds == {"mismatch"} else BuildFailed if "build-failed" in kinds else Unavailable
    return cls(f"every autotune candidate failed: {reasons}")


def cached(request, cache: PlanCache, progress: Progress | None = None,
           trial_timeout: float = TRIAL_TIMEOUT_S) -> tuple[str, bool]:
    """The autotuned document for `request` from the plan cache, or autotuned now and stored
    (with its measurements in the same file); and whether it came from the cache."""
    from .measurements import MeasurementStore
    from .request import document

    key = request.cache_key()
    doc = cache.get(key)
    if doc is not None:
        return doc, True
    result = autotune(request, progress, MeasurementStore(cache.path), trial_timeout)
    return cache.put(key, document(result)), False


def format_autotune(result: AutotuneResult) -> str:
    """The candidates as a table: rank, predicted, measured, GFLOP/s, or why each was dropped."""
    a = result.autotune
    where = f"on {a.device}" + (f", {a.threads} thread(s)" if a.threads else "")
    lines = [f"autotune: {a.measured} of {len(a.candidates)} candidates measured {where} in {a.seconds:.1f} s; "
             f"returned the model's rank {a.chosen_rank}" +
             (f", {a.speedup:.2f}x the model's choice" if a.speedup else " (the model's choice was dropped)")]
    if a.note:
        lines.append(f"note: {a.note}")
    lines.append(f"{'rank':>4}  {'predicted':>11}  {'measured':>11}  {'GFLOP/s':>8}  status")
    for c in a.candidates:
        if c.measurement:
            lines.append(f"{c.rank:>4}  {c.predicted_seconds * 1e3:>8.3f} ms  {c.measured_seconds * 1e3:>8.3f} ms  "
                         f"{c.measurement.kernel_gflops:>8.1f}  ok")
        else:
            lines.append(f"{c.rank:>4}  {c.predicted_seconds * 1e3:>8.3f} ms  {'-':>11}  {'-':>8}  "
                         f"dropped ({c.error_kind}): {c.error}")
    return "\n".join(lines)


def autotune_command(request, trial_timeout: float = TRIAL_TIMEOUT_S) -> AutotuneResult:
    """`tune ... --autotune K`: the result from the plan cache ($CACHETILE_CACHE, else
    ~/.cache/cachetile/plans.sqlite) when this request was autotuned before, else measured
    now with a progress bar on stderr and stored."""
    import sys

    from .cache import default_path
    from .progress import progress_bar

    cache = PlanCache(default_path())
    with progress_bar("autotune") as bar:
        doc, hit = cached(request, cache, bar, trial_timeout)
    if hit:
        print(f"tune: autotuned before; the result comes from the plan cache {cache.path}", file=sys.stderr)
    return AutotuneResult.model_validate_json(doc)
