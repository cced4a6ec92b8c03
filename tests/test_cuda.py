"""The GPU model and CUDA backend: launch limits, emitted schedules that compute the right
numbers, nvcc-clean source, multi-buffered shared memory, export and the CLI."""
import itertools
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tvm

from cachetile import builtin, preset, tune
from cachetile.backends.cuda_build import build_cuda, export_cuda, shared_buffers
from cachetile.backends.cuda_check import serial_llvm
from cachetile.backends.cuda_emit import emit_cuda
from cachetile.backends.llvm_measure import kernel_args
from cachetile.models.measurement import random_inputs
from cachetile.models.measurement import reference as numpy_reference
from cachetile.models import gpu
from cachetile.models.costmodel import level_usage

H100 = preset("h100")
SHAPES = [
    ("gemm", {"m": 64, "n": 96, "k": 80}),
    ("gemm", {"m": 97, "n": 257, "k": 197}),
    ("gemm", {"m": 7, "n": 1, "k": 197}),
    ("batch-gemm", {"b": 3, "m": 40, "n": 24, "k": 50}),
    ("gemm-chain", {"b": 2, "m": 128, "k": 64, "l": 128, "n": 64}),
    ("gemm-chain", {"m": 96, "k": 40, "l": 200, "n": 72}),
    ("gemm-chain", {"b": 3, "m": 7, "k": 1, "l": 97, "n": 33}),
    # One-element blocks (k = 1 with m or n = 1) are read from memory, not copied to shared memory.
    ("gemm", {"m": 1, "n": 1, "k": 1}),
    ("gemm-chain", {"m": 64, "k": 1, "l": 64, "n": 64}),
]


def _launch_of(result):
    tiles = [lv.tile for lv in result.plan.levels]
    return gpu.launch(result.workload, result.hardware, tiles, result.plan.launch.stages)


@pytest.mark.parametrize("name", ["h100", "a100", "v100"])
def test_gpu_plans_respect_the_launch_limits(name):
    hw = preset(name)
    for kind, dims in [("gemm", {"m": 4096, "n": 4096, "k": 4096}),
                       ("gemm-chain", {"b": 12, "m": 512, "k": 64, "l": 512, "n": 64})]:
        for stages in (1, 2, 4):
            result = tune(builtin(kind, dims), hw, time_limit=5, stages=stages)
            for plan in [result.plan, *result.alternatives]:
                tiles = [lv.tile for lv in plan.levels]
                ln = plan.launch
                assert ln.threads_per_block <= 1024 and ln.threads_per_block % 32 == 0
                assert ln.registers_per_thread <= 255
                # Shared memory counts every input cache `stages` times (an independent sum).
                w = result.workload
                smem = sum(np.prod([tiles[1][x] for x in w.tensors[t].dims]) * (1 if w.tensors[t].role == "intermediate" else stages)
                           for op in w.ops for t in op.inputs) * w.elem_bytes
                assert ln.shared_bytes == smem <= hw.levels[1].capacity_bytes
                assert ln.threads_per_block * ln.registers_per_thread * ln.blocks_per_sm <= hw.gpu.registers_per_sm
                # Threads: block tile over thread tile along every output dim, equal for every op.
                for op in w.ops:
                    out = w.tensors[op.output].dims
                    assert np.prod([-(-tiles[1][x] // tiles[0][x]) for x in out]) == ln.threads_per_block


@pytest.mark.parametrize("name,dtype", [("h100", "float32"), ("a100", "float16"), ("v100", "float32")])
def test_a_gpu_admits_every_plan_whose_thread_tiles_pass_the_level_filter(name, dtype):
    """The search checks a GPU plan's launch once, at level 0's filter (CudaGpu.admits_filtered),
    so admits must add nothing to that filter, under every order: checked on random tile rows
    under a block tile, on CUDA cores and on tensor cores (float16)."""
    hw, rng = preset(name), np.random.default_rng(5)
    for kind, dims in [("gemm", {"m": 256, "n": 192, "k": 96}), ("gemm-chain", {"b": 2, "m": 128, "k": 64, "l": 96, "n": 64})]:
        w = builtin(kind, dims, dtype)
        outer = [{x: min(e, 32) for x, e in w.dims.items()}, dict(w.dims)]
        rows = {x: rng.choice([v for v in (1, 2, 4, 8, 16, 32) if v <= t], size=400) for x, t in outer[0].items()}
        tiles = [rows, *outer]
        passed = np.broadcast_to(hw.target.level_filter(w, 0, tiles, 2), (400,))
        assert 0 < passed.sum() < 400
        kept = [{x: v[passed] for x, v in rows.items()}, *outer]
        for order in [list(w.dims), list(reversed(w.dims))]:
            assert np.all(hw.target.admits(w, kept, 2, [order] * 3)), (name, kind)


@pytest.mark.parametrize("name,dtype", [("h100", "float32"), ("a100", "float16")])
def test_the_stretch_of_the_rows_the_level_filter_kept_is_their_own_launchs(name, dtype, monkeypatch):
    """launch_stretch of exactly the rows level 0's filter kept reuses the filter's launch
    (enumerate asks for both): the same slowdown as their launch computed afresh, with one
    gpu.launch call, not two; rows it did not keep (here a sample) are computed afresh."""
    hw, rng = preset(name), np.random.default_rng(7)
    w = builtin("gemm-chain", {"b": 2, "m": 128, "k": 64, "l": 96, "n": 64}, dtype)
    outer = [{x: min(e, 32) for x, e in w.dims.items()}, dict(w.dims)]
    rows = {x: rng.choice([v for v in (1, 2, 4, 8, 16, 32) if v <= t], size=300) for x, t in outer[0].items()}
    passed = np.broadcast_to(hw.target.level_filter(w, 0, [rows, *outer], 2), (300,))
    kept = [{x: v[passed] for x, v in rows.items()}, *outer]
    sample = [{x: v[::2] for x, v in kept[0].items()}, *outer]
    model = hw.target.model(w)
    fresh = [gpu.launch(w, hw, t, 2, model).slowdown(hw) for t in (kept, sample)]
    calls = []
    counted = gpu.launch
    monkeypatch.setattr(gpu, "launch", lambda *a, **k: calls.append(1) or counted(*a, **k))
    assert np.array_equal(hw.target.launch_stretch(w, kept, 2), fresh[0]) and calls == []
    assert np.array_equal(hw.target.launch_stretch(w, sample, 2), fresh[1]) and calls == [1]
    # A block tile given as a one-element array broadcasts over the rows: nothing is kept.
    single = [rows, {x: np.array([v]) for x, v in outer[0].items()}, outer[1]]
    assert np.array_equal(hw.target.level_filter(w, 0, single, 2), passed)


@pytest.mark.parametrize("name", ["a100", "v100"])
def test_the_slowdown_floor_of_a_block_tile_bounds_every_launch_under_it(name):
    """gpu.slowdown_floor is enumerate's bound at the block level: no feasible launch of a thread
    tile under a block tile runs faster than it, and a block tile whose shared memory fits no SM
    has an infinite floor. Random block tiles (some too large for shared memory), and under each
    every thread tile of powers of two, launched as one array."""
    hw, rng = preset(name), np.random.default_rng(11)
    w = builtin("gemm-chain", {"b": 12, "m": 512, "k": 64, "l": 512, "n": 64})
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    blocks = {x: rng.choice([v for v in sizes if v <= e], size=200) for x, e in w.dims.items()}
    floor = gpu.slowdown_floor(w, hw, blocks, stages=2)
    launched = np.full(200, np.inf)
    for x in range(200):
        block = {d: int(v[x]) for d, v in blocks.items()}
        rows = np.array(list(itertools.product(*[[v for v in sizes if v <= block[d]] for d in w.dims])))
        ln = gpu.launch(w, hw, [dict(zip(w.dims, rows.T)), block, dict(w.dims)], 2)
        slowdown = np.broadcast_to(ln.slowdown(hw), len(rows))[np.broadcast_to(ln.feasible, len(rows))]
        launched[x] = slowdown.min(initial=np.inf)
    assert np.all(floor <= launched)
    assert np.isinf(floor).any() and np.isinf(launched[np.isinf(floor)]).all()
    reached = floor[np.isfinite(launched)] == launched[np.isfinite(launched)]
    assert np.isfinite(launched).sum() > 50 and reached.mean() > 0.3


def test_wave_quantisation_counts_the_last_wave():
    w = builtin("gemm", {"m": 128 * 133, "n": 128, "k": 64})
    tiles = [{"m": 8, "n": 8, "k": 1}, {"m": 128, "n": 128, "k": 64}, {"m": 128 * 133, "n": 128, "k": 64}]
    ln = gpu.launch(w, H100, tiles, stages=2)
    assert int(ln.blocks) == 133 and int(ln.threads) == 256
    # 128 KiB of shared memory per block leaves room for one per SM: 133 blocks on 132 SMs take
    # two waves, the second with one block.
    assert int(ln.shared_bytes) == 2 * (128 * 64 + 64 * 128) * 4 and int(ln.blocks_per_sm) == 1
    assert int(ln.waves) == 2 and float(ln.slowdown(H100)) == pytest.approx(2 * 132 / 133)
    # 16-deep k tiles: 32 KiB per block (7 fit), but 256 threads x 112 registers leave room for
    # 2 blocks in 65536 registers: one wave of 264 slots, 131 of them idle.
    tiles[1]["k"] = 16
    ln = gpu.launch(w, H100, tiles, stages=2)
    assert int(ln.registers) == 8 * 8 + 8 + 8 + gpu.RESERVED_REGISTERS
    assert int(ln.blocks_per_sm) == 2 and int(ln.waves) == 1 and float(ln.slowdown(H100)) == pytest.approx(264 / 133)


def test_shared_usage_counts_stages_and_registers_are_per_thread():
    w = builtin("gemm", {"m": 256, "n": 256, "k": 256})
    tile = {"m": 64, "n": 128, "k": 32}
    one = float(level_usage(w, H100, 1, tile, stages=1))
    assert one == (64 * 32 + 32 * 128) * 4
    assert float(level_usage(w, H100, 1, tile, stages=3)) == 3 * one
    assert float(level_usage(w, H100, 0, {"m": 8, "n": 8, "k": 1})) == (64 + 16 + gpu.RESERVED_REGISTERS) * 4


def test_bad_stages_and_targets_are_one_line_errors():
    w = builtin("gemm", {"m": 64, "n": 64, "k": 64})
    with pytest.raises(ValueError, match="stages must be between 1 and 8, got 9"):
        tune(w, H100, stages=9)
    with pytest.raises(ValueError, match="stages apply to GPU shared memory"):
        tune(w, preset("host"), stages=2)


def _serial_llvm(emitted):
    """The emitted CUDA schedule with its thread bindings run as serial loops on the CPU: in
    program order every cooperative copy finishes before the compute reading it, which is
    what the barriers guarantee on a GPU."""
    return serial_llvm(emitted.schedule.mod)


@pytest.mark.parametrize("kind,dims", SHAPES)
def test_emitted_cuda_schedule_computes_the_workload(kind, dims):
    w = builtin(kind, dims)
    for stages in (1, 3):
        result = tune(w, H100, time_limit=2, stages=stages)
        lib = _serial_llvm(emit_cuda(w, H100, result.plan))
        arrays = random_inputs(w)
        args = kernel_args(w, arrays)
        lib["main"](*args)
        want = numpy_reference(w)(arrays)[w.signature[-1]]
        got = args[-1].numpy()
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


@pytest.mark.parametrize("kind,dims", [("gemm", {"m": 1, "n": 1, "k": 1}), ("gemm", {"m": 1, "n": 4096, "k": 1}),
                                       ("gemm", {"m": 64, "n": 1, "k": 1}),
                                       ("gemm-chain", {"m": 64, "k": 1, "l": 64, "n": 64})])
def test_one_element_blocks_build_for_cuda(kind, dims):
    """Every plan tune returns builds: a one-element block is read from memory by every thread
    (TVM 0.27 fails to place a one-element dynamic shared buffer), and the plan says so."""
    w = builtin(kind, dims)
    result = tune(w, H100, time_limit=2)
    built = build_cuda(w, H100, result.plan)
    single = [c for c in built.emitted.caches if c.layout == "one element, read from memory by every thread"]
    assert single and all(c.skipped_thrifty and not c.double_buffer for c in single)
    script = built.emitted.schedule.mod.script()
    assert all(f"{c.tensor}_shared_dyn" not in script for c in single) and "__global__" in built.source


def test_a_wrong_schedule_is_caught_by_the_serial_check():
    w = builtin("gemm", {"m": 64, "n": 64, "k": 64})
    result = tune(w, H100, time_limit=2)
    emitted = emit_cuda(w, H100, result.plan)
    text = emitted.schedule.mod.script().replace("T.float32(0.0)", "T.float32(1.0)")  # a bad zeroing
    lib = serial_llvm(tvm.script.from_source(text))
    arrays = random_inputs(w)
    args = kernel_args(w, arrays)
    lib["main"](*args)
    assert np.abs(args[-1].numpy() - numpy_reference(w)(arrays)["C"]).max() > 0.5


@pytest.mark.parametrize("kind,dims", [("gemm", {"m": 512, "n": 512, "k": 512}),
                                       ("gemm-chain", {"b": 4, "m": 256, "k": 64, "l": 256, "n": 64})])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_each_shared_buffer_is_stages_times_its_block(kind, dims, stages):
    w = builtin(kind, dims)
    result = tune(w, H100, time_limit=2, stages=stages)
    emitted = emit_cuda(w, H100, result.plan)
    buffers = shared_buffers(emitted, tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    tiles = result.plan.levels[1].tile
    checked = 0
    for record in emitted.caches:
        if record.level != "shared" or record.attach_loop == "producer":
            continue
        single = int(np.prod([tiles[x] for x in w.tensors[record.tensor].dims]))
        name = next(n for n in buffers if n.split("_")[0] == record.tensor)
        assert buffers[name] == record.stages * single, (record, buffers)
        checked += record.stages > 1
    assert checked >= 1 or kind == "gemm-chain"  # a gemm multi-buffers its k-tile caches


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: kernel.cu is generated but not compile-checked")
@pytest.mark.parametrize("kind,dims", [("gemm", {"m": 1024, "n": 1024, "k": 1024}),
                                       ("gemm", {"m": 97, "n": 257, "k": 197}),
                                       ("gemm-chain", {"b": 12, "m": 512, "k": 64, "l": 512, "n": 64}),
                                       ("gemm-chain", {"m": 96, "k": 40, "l": 200, "n": 72})])
def test_exported_kernel_compiles_with_nvcc(tmp_path, kind, dims):
    w = builtin(kind, dims)
    result = tune(w, H100, time_limit=2, stages=3)
    export_cuda(result, tmp_path, "sm_90")
    done = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-o", str(tmp_path / "kernel.cubin"), str(tmp_path / "kernel.cu")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    launch = json.loads((tmp_path / "launch.json").read_text())
    main = launch["kernels"][0]
    assert main["grid"][0] == result.plan.launch.grid_blocks
    assert main["block"][0] == result.plan.launch.threads_per_block
    assert 0 < main["dynamic_shared_bytes"] <= result.plan.launch.shared_bytes  # loops that cannot pipeline keep one buffer
    assert all(k["args"] == [a for a in w.signature if a in k["args"]] for k in launch["kernels"])
    assert set((tmp_path / f).exists() for f in ("plan.json", "schedule.py", "kernel.cu", "launch.json")) == {True}


def test_exported_schedule_script_rebuilds_the_source(tmp_path):
    w = builtin("gemm", {"m": 128, "n": 128, "k": 128})
    result = tune(w, H100, time_limit=2)
    built = build_cuda(w, H100, result.plan, "sm_80")
    export_cuda(result, tmp_path, "sm_80", built)
    done = subprocess.run([sys.executable, str(tmp_path / "schedule.py"), str(tmp_path / "again.cu")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "again.cu").read_text() == built.source


def _tune(*args):
    return subprocess.run([sys.executable, "-m", "cachetile.api.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_exports_cuda_and_measure_says_why_it_cannot_run(tmp_path):
    done = _tune("gemm", "--M", "256", "--N", "256", "--K", "256", "--hardware", "a100", "--target", "cuda",
                 "--arch", "sm_80", "--stages", "3", "--export", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["plan"]["launch"]["stages"] == 3
    assert {c["copy_mode"] for c in doc["plan"]["caches"] if c["level"] == "shared"} <= {"blocked", "striped"}
    assert json.loads((tmp_path / "launch.json").read_text())["arch"] == "sm_80"
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed: the runner is exercised on a GPU machine instead")
    except ImportError:
        pass
    done = _tune("gemm", "--M", "64", "--N", "64", "--K", "64", "--hardware", "h100", "--measure")
    assert done.returncode == 2
    assert done.stderr.strip() == ("tune: error: measuring a cuda kernel needs a GPU: CuPy is not installed "
                                   "(pip install cupy-cuda12x)")


@pytest.mark.parametrize("args,message", [
    (["--hardware", "h100", "--target", "llvm"], "--target llvm does not build for gpu hardware 'h100' (its backend is cuda)"),
    (["--hardware", "host", "--target", "cuda"], "--target cuda does not build for cpu hardware 'host' (its backend is llvm)"),
    (["--hardware", "h100", "--stages", "0"], "argument --stages"),
    (["--hardware", "h100", "--arch", "sm_50"], "argument --arch: invalid choice"),
])
def test_cli_cuda_usage_errors(args, message):
    done = _tune("gemm", "--M", "64", "--N", "64", "--K", "64", *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


CONVS = [  # odd shapes, strides, dilation, padding, depthwise -> pointwise, conv -> 1x1 in nhwc
    {"n": 2, "c": 3, "h": 9, "w": 10, "k": 4, "r": 3, "s": 2, "params": {"stride": 2, "pad": 1, "dilation": 2}},
    {"n": 1, "c": 6, "h": 8, "w": 8, "r": 3, "s": 3, "params": {"groups": 6, "pointwise": 5, "pad": 1}},
    {"n": 1, "c": 4, "h": 7, "w": 9, "k": 6, "r": 3, "s": 3, "params": {"pointwise": 3, "layout": "nhwc", "stride": 2}},
]


def _conv(case):
    return builtin("conv2d", {x: v for x, v in case.items() if x != "params"}, params=case["params"])


@pytest.mark.parametrize("case", CONVS, ids=["strided", "dw-pw", "conv-1x1-nhwc"])
def test_emitted_cuda_conv_computes_the_workload(tmp_path, case):
    w = _conv(case)
    result = tune(w, H100, time_limit=2)
    lib = _serial_llvm(emit_cuda(w, H100, result.plan))
    arrays = random_inputs(w)
    args = kernel_args(w, arrays)
    lib["main"](*args)
    want = numpy_reference(w)(arrays)[w.signature[-1]]
    assert np.abs(args[-1].numpy() - want).max() <= 1e-3 * np.abs(want).max()
    if NVCC is not None:
        export_cuda(result, tmp_path, "sm_90")
        done = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-o", str(tmp_path / "kernel.cubin"),
                               str(tmp_path / "kernel.cu")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
