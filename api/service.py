"""The REST service: FastAPI routes over PlanService and JobService; `tune serve` runs it with uvicorn.

Every error is JSON `{"detail": one line, "errors": [...]}`: 422 for a body that
does not validate (naming the field), an infeasible problem or no plan within
the time limit; 404 for an unknown hardware preset or job.
"""
from __future__ import annotations

import asyncio
import json
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from pydantic import BaseModel, Field

from ..models.hardware import PRESETS, Hardware, preset
from ..models.plan import TuneResult
from .cache import PlanCache, default_path
from .jobs import Job, JobRequest, JobService
from .plans import PlanService
from .errors import describe, http_status
from .pool import ProcessPool, WorkerError
from .request import PlanRequest


@dataclass
class Settings:
    cache_path: Path
    workers: int = os.cpu_count() or 1
    max_time_limit: float = 60.0
    exports: Path | None = None  # where jobs write their kernels (default: beside the cache)


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str


class ErrorBody(BaseModel):
    detail: str = Field(description="what is wrong, on one line")
    errors: list[FieldError] = Field([], description="per field, when the body did not validate")


class Presets(BaseModel):
    presets: list[str]


class Health(BaseModel):
    status: str
    version: str
    cached_plans: int


ERRORS = {422: {"model": ErrorBody}}


def _error(status: int, detail: str, errors: list | None = None) -> JSONResponse:
    errors = [{"loc": list(e["loc"]), "msg": e["msg"].removeprefix("Value error, ")} for e in errors or []]
    return JSONResponse(ErrorBody(detail=detail, errors=errors).model_dump(), status_code=status)


def _worker_error(exc: WorkerError) -> JSONResponse:
    return _error(http_status(exc.kind), f"{exc.kind}: {exc}")


def create_app(settings: Settings) -> FastAPI:
    """The service, with its cache at settings.cache_path and its process pools."""
    cache = PlanCache(settings.cache_path)
    plans = PlanService(cache, ProcessPool(settings.workers))
    jobs = JobService(plans, ProcessPool(1), settings.exports or settings.cache_path.parent / "exports")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for job_id in list(jobs.jobs):  # kills the processes of jobs still running
            jobs.cancel(job_id)
        await asyncio.sleep(0)
        plans.pool.close()
        jobs.pool.close()

    app = FastAPI(title="cachetile", version=version("cachetile"), lifespan=lifespan,
                  description="Optimised cache-tiling plans for loop nests on a memory hierarchy.")

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError):
        return _error(422, describe(exc.errors()), exc.errors())

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 400:  # FastAPI's word for a body that is not even text: invalid like any other
            return _error(422, f"body: {exc.detail}", [{"loc": ["body"], "msg": str(exc.detail)}])
        return _error(exc.status_code, str(exc.detail))

    def within_limit(req: PlanRequest) -> PlanRequest | JSONResponse:
        """The request, its default time limit lowered to the server's; or a 422 if it asks for more."""
        if req.time_limit <= settings.max_time_limit:
            return req
        if "time_limit" not in req.model_fields_set:
            return req.model_copy(update={"time_limit": settings.max_time_limit})
        msg = f"{req.time_limit:g} s exceeds this server's limit of {settings.max_time_limit:g} s"
        return _error(422, f"body.time_limit: {msg}", [{"loc": ["body", "time_limit"], "msg": msg}])

    @app.get("/healthz", response_model=Health)
    async def healthz():
        return Health(status="ok", version=app.version, cached_plans=await asyncio.to_thread(len, cache))

    @app.get("/v1/hardware", response_model=Presets)
    async def hardware_presets():
        """The preset names, as `tune hardware --json` prints them."""
        return Presets(presets=list(PRESETS))

    @app.get("/v1/hardware/{name}", response_model=Hardware, responses={404: {"model": ErrorBody}})
    async def hardware(name: str):
        """One preset, as `tune hardware NAME --json` prints it."""
        if name not in PRESETS:
            return _error(404, f"unknown hardware {name!r}; expected one of {', '.join(PRESETS)}")
        return preset(name)

    @app.post("/v1/plans", response_model=TuneResult, responses=ERRORS)
    async def make_plans(req: PlanRequest):
        """The document `tune --json` prints for the same request; cached (header X-Cache: hit or miss)."""
        req = within_limit(req)
        if isinstance(req, JSONResponse):
            return req
        try:
            doc, hit = await plans.get(req)
        except WorkerError as exc:
            return _worker_error(exc)
        return Response(doc, media_type="application/json", headers={"X-Cache": "hit" if hit else "miss"})

    @app.post("/v1/jobs", response_model=Job, status_code=202, responses=ERRORS)
    async def submit_job(req: JobRequest, response: Response):
        """Plan, then (unless measure is false) build, export and time each plan; poll GET /v1/jobs/{id}."""
        req = within_limit(req)
        if isinstance(req, JSONResponse):
            return req
        job = jobs.submit(req)
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return job

    def _job(job: Job | None, job_id: str):
        return job if job else _error(404, f"no job {job_id!r}")

    @app.get("/v1/jobs/{job_id}", response_model=Job, responses={404: {"model": ErrorBody}})
    async def job_status(job_id: str):
        """Status, fraction done, message, and the result once done."""
        return _job(jobs.jobs.get(job_id), job_id)

    @app.delete("/v1/jobs/{job_id}", response_model=Job, responses={404: {"model": ErrorBody}})
    async def cancel_job(job_id: str):
        """Cancel a queued or running job; a finished job is returned unchanged."""
        return _job(jobs.cancel(job_id), job_id)

    return app


def serve(args) -> int:
    """`tune serve`: run the service until interrupted (or print its OpenAPI schema)."""
    settings = Settings(cache_path=Path(args.cache) if args.cache else default_path(),
                        workers=args.workers or Settings.workers, max_time_limit=args.max_time_limit,
                        exports=Path(args.exports) if args.exports else None)
    app = create_app(settings)
    if args.openapi:
        print(json.dumps(app.openapi(), indent=2))
        return 0
    PlanCache(settings.cache_path).check()  # refuse to start rather than answer 500 to every request
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
