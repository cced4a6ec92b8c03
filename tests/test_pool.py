"""The service's process pool on its own: results, progress, errors, the hard timeout and cancellation."""
import asyncio
import os
import time

import pytest

from cachetile.api.pool import ProcessPool, WorkerError
from cachetile.models.errors import BuildFailed, Infeasible, InvalidInput, NoPlanInTime, Unavailable


def steps(n, progress=None):
    for i in range(n):
        progress(i / n, f"step {i}")
    return os.getpid()


def fail(exc, progress=None):
    raise exc


def sleep(seconds, progress=None):
    progress(0.5, "sleeping")
    time.sleep(seconds)


def test_result_and_progress_come_back_from_another_process():
    seen = []
    pid = asyncio.run(ProcessPool(1).run(steps, 3, progress=lambda f, m: seen.append((f, m))))
    assert pid != os.getpid()
    assert seen == [(0.0, "step 0"), (1 / 3, "step 1"), (2 / 3, "step 2")]


@pytest.mark.parametrize("exc,kind", [
    (Infeasible("level 'L1' holds 8 bytes"), "infeasible"),
    (InvalidInput("bad\ninput"), "invalid"),
    (NoPlanInTime("no plan within 1 s"), "no-plan"),
    (BuildFailed("build failed: ScheduleError: ..."), "build-failed"),
    (Unavailable("CuPy is not installed"), "unavailable"),
    # Python's own types say nothing about who failed: TVM's errors subclass RuntimeError and
    # ValueError, so neither may read as "no plan" or "invalid input".
    (RuntimeError("no plan within 1 s"), "internal"),
    (ValueError("bad\ninput"), "internal"),
    (KeyError("x"), "internal"),
])
def test_errors_keep_their_kind_and_one_line(exc, kind):
    with pytest.raises(WorkerError) as info:
        asyncio.run(ProcessPool(1).run(fail, exc))
    assert info.value.kind == kind and "\n" not in str(info.value)


def test_timeout_kills_the_child():
    start = time.perf_counter()
    with pytest.raises(WorkerError, match="did not finish within 0.5 s and was stopped") as info:
        asyncio.run(ProcessPool(1).run(sleep, 30, timeout=0.5))
    assert info.value.kind == "timeout" and time.perf_counter() - start < 5


def test_cancelling_frees_the_slot():
    async def scenario():
        pool = ProcessPool(1)
        slow = asyncio.ensure_future(pool.run(sleep, 30))
        await asyncio.sleep(0.5)
        slow.cancel()
        start = time.perf_counter()
        await pool.run(steps, 1, progress=lambda f, m: None)  # would wait 30 s behind a live child
        return time.perf_counter() - start

    assert asyncio.run(scenario()) < 5
