"""Plans for the service: the SQLite cache first, then one solve per distinct request.

Concurrent identical requests share one solve (and so one answer, byte for
byte), which is then cached; errors are not cached. A solve whose every
waiter was cancelled (a cancelled job) is cancelled too, which kills its process.
"""
from __future__ import annotations

import asyncio

from . import worker
from .autotune import autotune_limit
from .cache import PlanCache
from .pool import ProcessPool
from .progress import Progress
from .request import PlanRequest


def hard_limit(time_limit: float) -> float:
    """When a solve's process is killed: its time limit, plus room for setting up and polishing."""
    return 2 * time_limit + 10


class PlanService:
    def __init__(self, cache: PlanCache, pool: ProcessPool, measure_pool: ProcessPool | None = None):
        # Autotuning requests measure kernels: they run in the pool that runs one measurement at a time.
        self.cache, self.pool, self.measure_pool = cache, pool, measure_pool or pool
        self._solving: dict[str, asyncio.Future] = {}
        self._waiting: dict[str, int] = {}

    async def get(self, request: PlanRequest, progress: Progress | None = None) -> tuple[str, bool]:
        """The plan document and whether it came from the cache; raises pool.WorkerError.
        `progress` hears how an autotune goes (only the caller that starts a solve hears it)."""
        key = request.cache_key()
        cached = await asyncio.to_thread(self.cache.get, key)
        if cached is not None:
            return cached, True
        solving = self._solving.get(key)
        if solving is None:
            solving = asyncio.ensure_future(self._solve(key, request, progress))
            self._solving[key] = solving
            solving.add_done_callback(lambda done: self._forget(key, done))
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            # shield: one caller going away must not cancel the solve others are waiting for
            return await asyncio.shield(solving), False
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
                solving.cancel()  # nobody is left to wait: a no-op if it is done

    def _forget(self, key: str, done: asyncio.Future) -> None:
        self._solving.pop(key, None)
        if not done.cancelled():
            done.exception()  # retrieved here, so an error nobody waited for is not logged as lost

    async def _solve(self, key: str, request: PlanRequest, progress: Progress | None) -> str:
        if request.autotune:
            doc = await self.measure_pool.run(worker.plan_document, request, str(self.cache.path), progress=progress,
                                              timeout=autotune_limit(request))
        else:
            doc = await self.pool.run(worker.plan_document, request, timeout=hard_limit(request.time_limit))
        return await asyncio.to_thread(self.cache.put, key, doc)
