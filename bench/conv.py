"""Convolution benchmark: planned TVM conv kernels against im2col + np.matmul, fused chains
against their unfused pair, and MetaSchedule on one layer.

    python bench/conv.py [--threads N] [--layout nhwc] [--time-limit 10] [--trials 64] [--skip-metaschedule | --skip-layers]

One process. For each layer (ResNet-50 3x3 and 1x1 layers, stride-2 layers, a
MobileNet depthwise + pointwise pair, conv -> 1x1 chains from ResNet and FSRCNN; batch 1, and
MobileNet's first block at batch 8): the plan
`tune` returns (default 10 s limit, `auto`), built by the CPU backend and
checked against numpy, then timed beside im2col + np.matmul on the same
arrays, both medians of >= 10 runs. im2col is part of the baseline: zero-pad,
gather the windows into a (pixels, R*S*C) matrix, one np.matmul with the
weights laid out as (R*S*C, K) beforehand (depthwise: one batched matmul per
channel). numpy runs first: TVM's pool threads spin after a kernel and would
slow OpenBLAS. For chains, `unfused` is the conv and the 1x1 conv planned and
built as two kernels and run back to back (the second reads the first's output),
as a network runs them; the pair and the fused kernel are timed from Python in
alternating rounds (alternating_medians), the pair paying two calls' overhead
(a few microseconds) against one. The ceiling beside each ratio is the most any
fused kernel could gain on that pair (fused_floor: the chain's FLOPs at the peak,
or its compulsory memory traffic, whichever takes longer).
`--threads N` runs both OpenBLAS and TVM on N threads (default: every core),
and plans for that many cores (models/hardware.on_cores: on one core, the
calibration profile's one-core figures).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path

if "--threads" in sys.argv:  # before numpy loads: OpenBLAS reads it once
    _threads = sys.argv[sys.argv.index("--threads") + 1]
    os.environ.update(OPENBLAS_NUM_THREADS=_threads, OMP_NUM_THREADS=_threads, TVM_NUM_THREADS=_threads)

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from kernels import log  # noqa: E402
from solve_times import table  # noqa: E402

# (name, sizes, options): ResNet-50 (v1.5, stride in the 3x3) and MobileNet-v1 layers.
LAYERS = [
    ("r50 conv2 3x3", dict(n=1, c=64, h=56, w=56, k=64, r=3, s=3), dict(pad=1)),
    ("r50 conv2 1x1 64->256", dict(n=1, c=64, h=56, w=56, k=256, r=1, s=1), {}),
    ("r50 conv3 3x3", dict(n=1, c=128, h=28, w=28, k=128, r=3, s=3), dict(pad=1)),
    ("r50 conv3 3x3 s2", dict(n=1, c=128, h=56, w=56, k=128, r=3, s=3), dict(pad=1, stride=2)),
    ("r50 conv4 3x3", dict(n=1, c=256, h=14, w=14, k=256, r=3, s=3), dict(pad=1)),
    ("r50 conv4 1x1 1024->256", dict(n=1, c=1024, h=14, w=14, k=256, r=1, s=1), {}),
    ("r50 conv5 3x3", dict(n=1, c=512, h=7, w=7, k=512, r=3, s=3), dict(pad=1)),
    ("r50 down 1x1 s2", dict(n=1, c=512, h=28, w=28, k=1024, r=1, s=1), dict(stride=2)),
    ("mbv1 dw+pw 128", dict(n=1, c=128, h=56, w=56, k=128, r=3, s=3), dict(pad=1, groups=128, pointwise=128)),
    ("r50 3x3 -> 1x1", dict(n=1, c=64, h=56, w=56, k=64, r=3, s=3), dict(pad=1, pointwise=256)),
    # FSRCNN's feature extraction (5x5, 1 -> 56 channels) and shrinking (1x1, 56 -> 12) on a 256x256
    # image: 56 channels per pixel between two light layers, so the unfused pair's intermediate
    # (14.7 MB) sets its pace, while ResNet's pair above is compute-bound on both sides.
    ("fsrcnn 5x5 -> 1x1", dict(n=1, c=1, h=256, w=256, k=56, r=5, s=5), dict(pad=2, pointwise=12)),
    # Batch 8: the intermediate (12.8 MB) no longer fits L2, and an unfused pair moves it through memory.
    ("mbv1 dw+pw 32 b8", dict(n=8, c=32, h=112, w=112, k=32, r=3, s=3), dict(pad=1, groups=32, pointwise=64)),
]


def depthwise(options, channels: int) -> bool:
    """Whether the layer is depthwise (one group per channel; a 1-channel conv is a plain one)."""
    return options.get("groups", 1) == channels > 1


def im2col_conv(x, w, sizes, options):
    """The baseline, nhwc: x (N, H, W, C), w (R*S*C/G, K) or, depthwise, (C, R*S, 1)."""
    stride, pad, dilation = options.get("stride", 1), options.get("pad", 0), options.get("dilation", 1)
    r, s = sizes["r"], sizes["s"]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0))) if pad else x
    win = sliding_window_view(xp, (dilation * (r - 1) + 1, dilation * (s - 1) + 1), axis=(1, 2))
    win = win[:, ::stride, ::stride, :, ::dilation, ::dilation]  # n, oh, ow, c, r, s
    n, oh, ow, c = win.shape[:4]
    if depthwise(options, c):  # per channel, (pixels, R*S) @ (R*S, 1)
        cols = np.ascontiguousarray(win.transpose(3, 0, 1, 2, 4, 5)).reshape(c, n * oh * ow, r * s)
        return np.matmul(cols, w).reshape(c, n, oh, ow).transpose(1, 2, 3, 0)
    cols = np.ascontiguousarray(win.transpose(0, 1, 2, 4, 5, 3)).reshape(n * oh * ow, r * s * c)
    return np.matmul(cols, w).reshape(n, oh, ow, -1)


def baseline(sizes, options, rng):
    """A function running im2col + matmul (then the 1x1 conv's matmul) on fresh arrays."""
    n, c, h, wd, k = (sizes[x] for x in "nchwk")
    x = rng.standard_normal((n, h, wd, c)).astype(np.float32)
    if depthwise(options, c):
        w = rng.standard_normal((c, sizes["r"] * sizes["s"], 1)).astype(np.float32)
    else:
        w = rng.standard_normal((sizes["r"] * sizes["s"] * c, k)).astype(np.float32)
    f = options.get("pointwise")
    v = rng.standard_normal((k, f)).astype(np.float32) if f else None
    if v is None:
        return lambda: im2col_conv(x, w, sizes, options)
    return lambda: np.matmul(im2col_conv(x, w, sizes, options), v)


def workload(sizes, options, layout):
    from cachetile import builtin

    return builtin("conv2d", sizes, params={**options, "layout": layout})


def planned(w, hw, time_limit):
    """(plan seconds, built kernel, seconds per call, its arguments) for the plan `tune` returns;
    checked against numpy."""
    from cachetile import tune
    from cachetile.backends.base import get_backend
    from cachetile.backends.llvm_measure import check, kernel_args, settle, time_kernel
    from cachetile.models.measurement import random_inputs

    start = time.perf_counter()
    result = tune(w, hw, time_limit=time_limit, top=0)
    plan_s = time.perf_counter() - start
    built = get_backend("llvm").build(w, hw, result.plan)
    check(w, built.lib)
    args = kernel_args(w, random_inputs(w))
    settle()  # the check ran numpy
    seconds = time_kernel(built.lib.mod, args)
    return plan_s, built, seconds, args


def unfused_pair(sizes, options, layout, hw, time_limit):
    """The conv and the 1x1 conv as two planned kernels: a callable that runs them back to back,
    the second reading the first's output, as a network runs them."""
    from cachetile import tune
    from cachetile.backends.base import get_backend
    from cachetile.backends.llvm_measure import kernel_args
    from cachetile.models.measurement import random_inputs

    first = workload(sizes, {o: v for o, v in options.items() if o != "pointwise"}, layout)
    oh = first.dims["oh"]
    second = workload(dict(n=sizes["n"], c=sizes["k"], h=oh, w=first.dims["ow"], k=options["pointwise"], r=1, s=1),
                      {}, layout)
    calls, previous = [], None
    for w in (first, second):
        lib = get_backend("llvm").build(w, hw, tune(w, hw, time_limit=time_limit, top=0).plan).lib.mod
        args = kernel_args(w, random_inputs(w))
        if previous is not None:
            args[0] = previous  # the 1x1 conv reads the conv's output
        calls.append((lib["main"], args))
        previous = args[-1]
    return lambda: [f(*a) for f, a in calls]


def alternating_medians(fns, rounds: int = 10, min_seconds: float = 0.02) -> list[float]:
    """Median seconds per call of each callable, timed in alternating rounds of >= `min_seconds`
    of calls each (after one warm-up call), so that drift in the machine's speed hits all alike."""
    for fn in fns:
        fn()
    calls = []
    for fn in fns:
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < min_seconds / 4:
            fn()
            n += 1
        calls.append(max(1, math.ceil(n * 4)))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, n, out in zip(fns, calls, times):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - start) / n)
    return [float(np.median(t)) for t in times]


def fused_floor(w, hw) -> float:
    """Seconds no fused kernel can beat: its FLOPs at the peak, or its inputs read and outputs
    written back once (fetched, then evicted) over the memory link, whichever is longer."""
    moved = w.bytes_of("input", "output") + w.bytes_of("output")
    return max(w.flops / hw.peak_flops, moved / hw.levels[-1].bandwidth_bytes_per_s)


def layer_rows(hw, layout, time_limit):
    from cachetile.backends.llvm_measure import _median_seconds as median_seconds
    from cachetile.backends.llvm_measure import settle

    rng = np.random.default_rng(0)
    rows, ratios, fused = [], [], []
    for name, sizes, options in LAYERS:
        log(f"conv: {name}")
        w = workload(sizes, options, layout)
        settle()
        numpy_s = median_seconds(baseline(sizes, options, rng), 10)
        plan_s, built, kernel_s, args = planned(w, hw, time_limit)
        ratio = numpy_s / kernel_s
        ratios.append(ratio)
        unfused = "-"
        if "pointwise" in options:
            # Both from Python, alternating: the pair's two calls against the fused kernel's one.
            main = built.lib.mod["main"]
            chain_s, pair = alternating_medians([lambda: main(*args), unfused_pair(sizes, options, layout, hw,
                                                                                   time_limit)])
            fused.append(pair / chain_s)
            unfused = f"{w.flops / pair / 1e9:.1f} ({pair / chain_s:.2f}x; at most {pair / fused_floor(w, hw):.2f}x)"
        shape = f"{sizes['c']}x{sizes['h']}x{sizes['w']} -> {sizes['k']}, {sizes['r']}x{sizes['s']}" + \
            "".join(f" {o}={v}" for o, v in options.items())
        rows.append((name, shape, f"{plan_s:.2f}", f"{built.seconds:.2f}", f"{w.flops / kernel_s / 1e9:.1f}",
                     f"{w.flops / numpy_s / 1e9:.1f}", f"{ratio:.2f}", unfused))
    text = table(("layer", "shape (layout " + layout + ")", "plan s", "build s", "kernel GFLOP/s",
                  "im2col+matmul GFLOP/s", "kernel/im2col", "unfused pair GFLOP/s (fused/unfused; its ceiling)"), rows)
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    text += f"\n\ngeomean kernel/im2col+matmul: {geo:.2f} over {len(ratios)} layers (target >= 1.0)"
    if fused:
        text += f"\nfused/unfused: {', '.join(f'{f:.2f}' for f in fused)} (target >= 1.2)"
    return text


def metaschedule_rows(hw, layout, trials, time_limit, layer=2):
    """MetaSchedule on one layer's unscheduled TensorIR against cachetile's plan + build."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from cachetile.backends.llvm_build import llvm_target
    from cachetile.backends.llvm_measure import time_kernel
    from cachetile.backends.tensorir import primfunc

    try:
        import xgboost  # noqa: F401  MetaSchedule's cost model, trained after the first batch of trials
    except ImportError:
        return "MetaSchedule skipped: its cost model needs xgboost (`pip install -e '.[bench]'`)"
    name, sizes, options = LAYERS[layer]
    w = workload(sizes, options, layout)
    target = tvm.target.Target(llvm_target(hw.cores))
    plan_s, built, kernel_s, args = planned(w, hw, time_limit)
    ours_s = plan_s + built.seconds
    rows = [(name, "cachetile", f"{ours_s:.2f}", f"{w.flops / kernel_s / 1e9:.1f}", "1", "1.00")]
    for n in trials:
        log(f"metaschedule: {name}, {n} trials")
        mod = tvm.IRModule({"main": primfunc(w)})
        with tempfile.TemporaryDirectory() as work, contextlib.redirect_stdout(sys.stderr):
            begin = time.perf_counter()
            db = ms.tune_tir(mod, target, work, max_trials_global=n, num_trials_per_iter=64, num_tuning_cores=hw.cores)
            sch = ms.tir_integration.compile_tir(db, mod, target)
            lib = tvm.compile(sch.mod, target=target)
            secs = time.perf_counter() - begin
        its = time_kernel(lib.mod, args)
        rows.append((name, f"MetaSchedule {n}", f"{secs:.1f}", f"{w.flops / its / 1e9:.1f}", f"{secs / ours_s:.0f}",
                     f"{its / kernel_s:.2f}"))
    return table(("layer", "method", "seconds to a kernel", "GFLOP/s", "its seconds / ours", "our GFLOP/s / its"), rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="host")
    ap.add_argument("--layout", default="nhwc", choices=["nhwc", "nchw"])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--trials", type=int, nargs="+", default=[64])
    ap.add_argument("--skip-metaschedule", action="store_true")
    ap.add_argument("--skip-layers", action="store_true", help="only the MetaSchedule table")
    ap.add_argument("--threads", type=int, help="OpenBLAS and TVM threads, and the cores plans assume (default: all)")
    args = ap.parse_args()

    from cachetile import hardware_from
    from cachetile.backends.llvm_build import use_all_cores
    from cachetile.backends.llvm_measure import cpu_name
    from cachetile.models.hardware import on_cores

    hw = hardware_from(args.hardware)
    if args.threads:
        hw = on_cores(hw, args.threads)
    use_all_cores(hw)
    print(f"# conv kernels on {hw.name}: {cpu_name()} ({hw.cores} cores, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']})\n")
    if not args.skip_layers:
        print(layer_rows(hw, args.layout, args.time_limit) + "\n", flush=True)
    if not args.skip_metaschedule:
        print(metaschedule_rows(hw, args.layout, args.trials, args.time_limit), flush=True)


if __name__ == "__main__":
    main()
