import atexit
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))  # plans.parse_plan
# The `host` preset applies this machine's calibration profile when one exists; the tests must not
# depend on whether the developer ran `tune hardware host --calibrate`, so they see an empty store.
os.environ["CACHETILE_PROFILES"] = tempfile.mkdtemp(prefix="cachetile-test-profiles-")
atexit.register(shutil.rmtree, os.environ["CACHETILE_PROFILES"], ignore_errors=True)
# TVM sizes its thread pool once per process, from TVM_NUM_THREADS as the first build set it
# (llvm_build.use_all_cores: that plan's cores). Two threads in every worker, whichever test
# builds first there: the two-thread races tests/test_backend.py checks then always run on two.
os.environ.setdefault("TVM_NUM_THREADS", "2")

from cachetile.models.hardware import Hardware  # noqa: E402
from cachetile.models.workload import builtin  # noqa: E402
from cachetile.optimizer.space import order_classes  # noqa: E402

NAMES = {"gemm": "mnk", "batch-gemm": "bmnk", "gemm-chain": "mlkn"}

# The Intel Xeon (Emerald Rapids, 2 cores) of BENCHMARKS.md, its calibrated peak and fill
# bandwidths rounded; the other figures are the defaults. Measurements quoted in tests that use
# it were taken there.
XEON = Hardware(name="cpu", peak_flops=3.53e11, cores=2, vector_bytes=64, calibrated="2026-11-29T02:46:58+00:00",
               levels=[
    {"name": "registers", "capacity_bytes": 2048, "bandwidth_bytes_per_s": 1.94e13},
    {"name": "L1", "capacity_bytes": 49152, "bandwidth_bytes_per_s": 2.72e11, "ways": 12},
    {"name": "L2", "capacity_bytes": 2 << 20, "bandwidth_bytes_per_s": 5.52e10, "ways": 16},
    {"name": "L3", "capacity_bytes": 64 << 20, "bandwidth_bytes_per_s": 2.76e10, "ways": 16}])

# The AMD EPYC Zen 3 (AVX2, 2 cores) of BENCHMARKS.md as its calibration of 2026-11-30 06:58 found
# it, rounded: an 8 MiB L3 as the sweep saw it, and wide bands of rows that stall 4.7x.
ZEN3 = Hardware(name="cpu", peak_flops=1.7e11, cores=2, vector_bytes=32, calibrated="2026-11-30T06:58:29+00:00",
                run_start_bytes=353.0, short_run_start_bytes=214.0,
                run_start_reach=[(1 << 20, 0.0), (4 << 20, 0.59), (16 << 20, 1.0)],
                band_stall=[(8.0, 0.0), (16.0, 0.63), (32.0, 1.56), (64.0, 4.72)],
                fed_share=[(1.0, 0.51), (2.0, 1.0), (4.0, 0.86)], copy_vector_seconds=9.9e-10,
                copy_element_seconds=3.0e-10, parallel_region_seconds=1.04e-6, call_seconds=9.2e-9,
                accumulator_bytes_per_s=7.6e11, shared_line_seconds=2.0e-8, levels=[
    {"name": "registers", "capacity_bytes": 512, "bandwidth_bytes_per_s": 2.16e11},
    {"name": "L1", "capacity_bytes": 32768, "bandwidth_bytes_per_s": 1.35e11, "ways": 8},
    {"name": "L2", "capacity_bytes": 512 << 10, "bandwidth_bytes_per_s": 1.21e11, "ways": 8},
    {"name": "L3", "capacity_bytes": 8 << 20, "bandwidth_bytes_per_s": 3.47e10, "ways": 16}])


# The Intel Xeon of BENCHMARKS.md's "Warm-L3 session" (Sapphire-Rapids-class) as its calibration
# of 2026-12-01 18:35 found it, rounded: a 480 MiB L3 that holds 128 MiB, filled from memory at
# 31.3 GB/s, the L2 from it at 58.0.
WARM_L3 = Hardware(
    name="xeon", peak_flops=4.6e11, cores=2, vector_bytes=64, calibrated="2026-12-01T18:35:03+00:00",
    call_seconds=5.5e-9, accumulator_bytes_per_s=1.15e12, parallel_region_seconds=8.2e-7, run_start_bytes=386.0,
    short_run_start_bytes=207.0, copy_vector_seconds=1.3e-9, copy_element_seconds=1.17e-10, fma_chains=8.5, levels=[
    {"name": "registers", "capacity_bytes": 2048, "bandwidth_bytes_per_s": 3.13e12},
    {"name": "L1", "capacity_bytes": 49152, "bandwidth_bytes_per_s": 2.36e11, "ways": 12},
    {"name": "L2", "capacity_bytes": 2 << 20, "bandwidth_bytes_per_s": 5.8e10, "ways": 16},
    {"name": "L3", "capacity_bytes": 128 << 20, "bandwidth_bytes_per_s": 3.13e10, "ways": 16}])


def gemm_plan(dims: dict, spec: str, hardware: Hardware):
    """(workload, plan) of a gemm and a plan written as bench/plans.py reads one (`order:m,n,k`
    per level, innermost first)."""
    from plans import parse_plan

    from cachetile import make_plan

    w = builtin("gemm", dims)
    return w, make_plan(w, hardware, *parse_plan(spec))


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


def _conv_equations(rng: random.Random, s: int, d: int, pad: int) -> tuple[dict, dict, list]:
    """Tensors and ops of a small random conv workload (2-D, depthwise 1-D, conv -> 1x1 chain or a
    three-term index), with stride s, dilation d and padding `pad` (a negative offset)."""
    off = f"-{pad}" if pad else ""
    form = rng.choice(["conv2d", "depthwise", "chain", "three"])
    if form == "depthwise":
        tensors = {"I": ["c", f"{s}*oh+{d}*kh{off}"], "W": ["c", "kh"], "O": ["c", "oh"]}
        return form, tensors, [("dw", ["c", "oh", "kh"], ["I", "W"], "O")]
    if form == "three":
        tensors = {"I": [f"{s}*oh+{d}*kh+{rng.randint(1, 3)}*z"], "W": ["kh", "z"], "O": ["oh"]}
        return form, tensors, [("t", ["oh", "kh", "z"], ["I", "W"], "O")]
    tensors = {"I": ["n", "c", f"{s}*oh+{d}*kh{off}", f"{s}*ow+{d}*kw{off}"], "W": ["k", "c", "kh", "kw"],
               "C": ["n", "k", "oh", "ow"]}
    ops = [("conv", ["n", "k", "oh", "ow", "c", "kh", "kw"], ["I", "W"], "C")]
    if form == "chain":
        tensors |= {"V": ["f", "k"], "E": ["n", "f", "oh", "ow"]}
        ops.append(("pointwise", ["n", "k", "oh", "ow", "f"], ["C", "V"], "E"))
    return form, tensors, ops


def random_affine_case(rng: random.Random, max_levels: int = 3):
    """A random convolution-like workload with affine indices (strides 1-3, dilations 1-2,
    padding, odd extents), hierarchy depth, nested clipped tiles and a valid order per level."""
    from cachetile.models.indexing import parse_index
    from cachetile.models.workload import Workload

    s, d, pad = rng.randint(1, 3), rng.randint(1, 2), rng.choice([0, 0, 1])
    form, tensors, ops = _conv_equations(rng, s, d, pad)
    loops = dict.fromkeys(x for _, lp, _, _ in ops for x in lp)
    small = {"n": 2, "c": 3, "k": 3, "f": 3, "kh": 3, "kw": 3, "z": 3}
    dims = {x: rng.randint(1, small.get(x, 6)) for x in loops}
    spec = {n: {"dims": t} for n, t in tensors.items()}
    if pad:  # the stored input: the padded one less `pad` on each side of each affine dim
        spec["I"]["shape"] = [max(1, ix.extent(dims) - 2 * pad) if not ix.plain else dims[ix.loops[0]]
                              for ix in map(parse_index, tensors["I"])]
    w = Workload(kind=form, dims=dims, dtype=rng.choice(["float32", "float16"]), tensors=spec,
                 ops=[{"name": n, "loops": lp, "inputs": i, "output": o} for n, lp, i, o in ops])
    levels = rng.randint(1, max_levels)
    tiles, parent = [None] * levels, dict(w.dims)
    for j in reversed(range(levels)):
        tiles[j] = {x: rng.randint(1, parent[x]) for x in w.dims}
        parent = tiles[j]
    orders = []
    for _ in range(levels):
        shared, private = list(w.shared_loops), [x for x in w.dims if x not in w.shared_loops]
        rng.shuffle(shared), rng.shuffle(private)
        orders.append(shared + private)
    return w, orders, tiles, (s, d)
