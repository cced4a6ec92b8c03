"""Jobs: plan, then build, export and measure each plan, in the background with progress.

A job's plan comes from PlanService (cache or solve); building and measuring
run in their own one-process pool, so timings never share the CPU with each
other. Each plan goes through the hardware's backend: exported into the
job's folder (CUDA source is checked with nvcc where it is installed), and
measured where this machine can run it; a GPU job on a server without a GPU
is done with its exports and a note saying why it was not measured. Jobs live
in memory: they do not survive a restart (plans do, in the cache).
"""
from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from ..models.measurement import Export, Measurement
from ..models.plan import TuneResult
from . import worker
from .autotune import AutotuneResult, parse_document
from .plans import PlanService
from .pool import ProcessPool, WorkerError
from .progress import scaled
from .request import PlanRequest, check_measurable

State = Literal["queued", "running", "done", "failed", "cancelled"]
PLAN_SHARE = 0.1  # of the fraction done, when the job also measures
AUTOTUNE_SHARE = 0.8  # of the fraction done, for planning when planning autotunes (it measures)
KEEP = 1000  # finished jobs remembered


class JobRequest(PlanRequest):
    measure: bool = Field(True, description="build, export and time the plan and each alternative on the server "
                          "(GPU plans are exported and checked only, unless the server has a GPU); with autotune, "
                          "the autotune's measurements are reported and the plans only built and exported")
    repeat: int = Field(10, ge=10, le=1000, description="timing runs per kernel (median reported)")

    @model_validator(mode="after")
    def _small_enough_to_measure(self) -> JobRequest:
        if self.measure:
            check_measurable(self.workload)
        return self


class JobResult(BaseModel):
    plan: AutotuneResult | TuneResult = Field(description="the document `tune --json` prints")
    measurements: list[Measurement] | None = Field(
        None, description="per plan, then per alternative; null when not measured (see note)")
    exports: list[Export] | None = Field(None, description="per plan, then per alternative: the files written")
    note: str | None = Field(None, description="why the plans were exported but not measured, when they were not")


class Job(BaseModel):
    id: str
    status: State
    fraction: float = Field(description="of the work done, 0 to 1")
    message: str = ""
    result: JobResult | None = None
    error: str | None = Field(None, description="one line, when failed")
    created: float
    finished: float | None = None


class JobService:
    def __init__(self, plans: PlanService, measure_pool: ProcessPool, exports: Path):
        self.plans, self.pool, self.exports = plans, measure_pool, Path(exports)
        self.jobs: dict[str, Job] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def submit(self, request: JobRequest) -> Job:
        """Queue a job and start it in the background."""
        job = Job(id=uuid.uuid4().hex, status="queued", fraction=0.0, message="queued", created=time.time())
        self.jobs[job.id] = job
        task = asyncio.ensure_future(self._run(job, request))
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))
        self._forget_old()
        return job

    def cancel(self, job_id: str) -> Job | None:
        """Cancel a queued or running job (its process is killed); a finished one is left as it is."""
        job = self.jobs.get(job_id)
        if job and job.status in ("queued", "running"):
            self._finish(job, "cancelled", "cancelled")
            task = self._tasks.get(job_id)
            if task:
                task.cancel()
        return job

    def _progress(self, job: Job, fraction: float, message: str) -> None:
        if job.status == "running":
            job.fraction, job.message = round(min(max(fraction, 0.0), 1.0), 4), message

    def _finish(self, job: Job, status: State, message: str, error: str | None = None) -> None:
        job.status, job.message, job.error, job.finished = status, message, error, time.time()

    async def _run(self, job: Job, request: JobRequest) -> None:
        job.status = "running"
        self._progress(job, 0.0, "planning")
        plan_request = PlanRequest(**{name: getattr(request, name) for name in PlanRequest.model_fields})
        report = lambda f, m: self._progress(job, f, m)  # noqa: E731
        share = AUTOTUNE_SHARE if request.autotune else PLAN_SHARE
        try:
            doc, _ = await self.plans.get(plan_request, scaled(report, 0.0, share) if request.autotune else None)
            built = {}
            if request.measure:
                self._progress(job, share, "building")
                built = await self.pool.run(worker.build_plans, doc, request.repeat, str(self.exports / job.id),
                                            progress=scaled(report, share, 1.0))
        except WorkerError as exc:
            self._finish(job, "failed", exc.kind, str(exc))
            return
        job.result = JobResult(plan=parse_document(doc), **built)
        job.fraction = 1.0
        self._finish(job, "done", "done")

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.finished is not None]
        for job in sorted(finished, key=lambda j: j.finished)[: max(0, len(finished) - KEEP)]:
            del self.jobs[job.id]
            shutil.rmtree(self.exports / job.id, ignore_errors=True)
