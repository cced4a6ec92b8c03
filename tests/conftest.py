import os
import random
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The `host` preset applies this machine's calibration profile when one exists; the tests must not
# depend on whether the developer ran `tune hardware host --calibrate`, so they see an empty store.
os.environ["CACHETILE_PROFILES"] = tempfile.mkdtemp(prefix="cachetile-test-profiles-")

from cachetile.models.hardware import Hardware  # noqa: E402
from cachetile.models.workload import builtin  # noqa: E402
from cachetile.optimizer.space import order_classes  # noqa: E402

NAMES = {"gemm": "mnk", "batch-gemm": "bmnk", "gemm-chain": "mlkn"}


def random_case(rng: random.Random, max_extent: int = 9, max_levels: int = 3):
    """A random workload, hierarchy depth, nested tiles (clipped, often non-divisible) and valid orders."""
    kind = rng.choice(list(NAMES))
    dims = {x: rng.randint(1, max_extent) for x in NAMES[kind]}
    if kind == "gemm-chain" and rng.random() < 0.4:
        dims["b"] = rng.randint(1, 3)
    w = builtin(kind, dims, rng.choice(["float32", "float16", "int8"]))
    levels = rng.randint(1, max_levels)
    tiles, parent = [None] * levels, dict(w.dims)
    for j in reversed(range(levels)):
        tiles[j] = {x: rng.randint(1, parent[x]) for x in w.dims}
        parent = tiles[j]
    valid = order_classes(w, key=lambda _, o: o)
    orders = [list(rng.choice(valid)) for _ in range(levels)]
    return w, orders, tiles


def memory_bound(levels) -> Hardware:
    """A hierarchy with effectively infinite compute, so data movement decides."""
    return Hardware(
        name="test",
        levels=[{"name": n, "capacity_bytes": c, "bandwidth_bytes_per_s": b} for n, c, b in levels],
        peak_flops=1e30,
    )


@pytest.fixture
def rng():
    return random.Random(20261121)
