"""Predicted data movement against a cache simulator: valgrind's, on real kernels.

    python bench/cachegrind.py [--plans 2] [--keep DIR] [--l1 49152,12,64 --l2 2097152,16,64] [--dump FILE]
    python bench/cachegrind.py --recost FILE

Each kernel is built for an AVX2 CPU (valgrind cannot execute AVX-512) on one
core, with a plan made for that machine: this CPU's caches (sysfs), 256-bit
vectors, 16 vector registers, one core. It then runs once under valgrind's
cache simulator (callgrind with --cache-sim=yes, the same simulator as
cachegrind, counting only inside the kernel with --toggle-collect) with the
real L1d geometry as D1 and the real L2 as LL, after a sweep that evicts the
inputs, so the kernel starts cold as the model assumes. The kernel is called by a
small C program (bench/cachegrind_harness.c, built here with gcc against
tvm_ffi's headers), so valgrind simulates neither Python nor TVM. Per level the table
gives the model's bytes (dv_bytes, then the expected traffic with the kernel's
copies, models/traffic.py) beside the simulator's miss bytes (misses x line).
The simulator has no prefetchers and models LRU with the real associativity.
`--l1`/`--l2` plan for and simulate another machine's caches (an Intel Xeon's
48 KiB 12-way L1d and 2 MiB 16-way L2, say): what the model would predict there.
Which kernels are simulated depends on the model (its plan and alternatives), so
`--dump FILE` keeps them with their misses, and `--recost FILE` costs the same
kernels with the model as it is now: a change judged on a fixed set of plans.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_times import table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = [
    ("gemm-256", "gemm", {"m": 256, "n": 256, "k": 256}),
    ("gemm-250", "gemm", {"m": 250, "n": 250, "k": 250}),
    ("gemm-97x211x131", "gemm", {"m": 97, "n": 211, "k": 131}),
    ("gemm-decode-4x1024x512", "gemm", {"m": 4, "n": 1024, "k": 512}),
    ("batch-gemm-4x96x128x64", "batch-gemm", {"b": 4, "m": 96, "n": 128, "k": 64}),
    ("chain-128", "gemm-chain", {"m": 128, "l": 128, "k": 64, "n": 64}),
    ("chain-2x97x113", "gemm-chain", {"b": 2, "m": 97, "l": 113, "k": 64, "n": 64}),
]
def build_harness(work: Path) -> tuple[Path, Path]:
    """Compile the C harness; returns it and the libtvm_ffi it loads."""
    import tvm_ffi

    ffi = Path(tvm_ffi.__file__).parent
    exe = work / "harness"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(Path(__file__).with_name("cachegrind_harness.c")),
                    f"-I{ffi / 'include'}", "-ldl"], check=True)
    return exe, ffi / "lib" / "libtvm_ffi.so"


def avx2_host(d1: str | None = None, ll: str | None = None):
    """This machine's caches, as an AVX2 CPU with one core (what valgrind can run); `d1`, `ll`
    (size,ways,line) put another machine's L1d and L2 in their place."""
    from cachetile.models.hardware import host

    hw = host(calibrated=False)
    levels = [hw.levels[0].model_copy(update={"capacity_bytes": 16 * 32}), *hw.levels[1:]]
    for i, geometry in ((1, d1), (2, ll)):
        if geometry:
            size, ways, _ = map(int, geometry.split(","))
            levels[i] = levels[i].model_copy(update={"capacity_bytes": size, "ways": ways})
    return hw.model_copy(update={"levels": levels, "vector_bytes": 32, "cores": 1, "name": "host-avx2-1core"})


def cache_geometry(name: str) -> str:
    """size,ways,line of a cache level from sysfs, for valgrind's --D1/--LL."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        level = f"L{(index / 'level').read_text().strip()}"
        if level == name and (index / "type").read_text().strip() != "Instruction":
            size = (index / "size").read_text().strip()
            size = int(size[:-1]) * {"K": 1024, "M": 2**20}[size[-1]] if size[-1] in "KM" else int(size)
            return f"{size},{int((index / 'ways_of_associativity').read_text())},{int((index / 'coherency_line_size').read_text())}"
    raise SystemExit(f"no {name} cache in sysfs")


def simulate(harness, kernel: Path, shapes, d1: str, ll: str, sweep_bytes: int) -> dict:
    """Run the kernel once under callgrind's cache simulator; miss counts inside the kernel."""
    exe, ffi = harness
    out = kernel.parent / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--D1={d1}", f"--LL={ll}", "--I1=32768,8,64",
           "--toggle-collect=__tvm_ffi_main", f"--callgrind-out-file={out}", str(exe), str(kernel), str(ffi),
           str(sweep_bytes), *["x".join(map(str, s)) for s in shapes]]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    text = out.read_text()
    events = re.search(r"^events: (.*)$", text, re.M).group(1).split()
    # The summary line, which callgrind_annotate reports as the program's totals. The file's
    # "totals:" line can disagree with it: gemm 250^3's plan, whose packed buffers are
    # allocated (mmap) inside the kernel, had half its write misses missing there (LL 4481
    # against 8388, fewer than the 11,845 lines its packed buffers and C take).
    summary = [int(v) for v in re.search(r"^summary: (.*)$", text, re.M).group(1).split()]
    return dict(zip(events, summary + [0] * (len(events) - len(summary))))


def rows_for(name, kind, dims, plans: int, work: Path, d1: str, ll: str, harness):
    from cachetile import builtin, tune
    from cachetile.backends.base import get_backend

    hw = avx2_host(d1, ll)
    w = builtin(kind, dims)
    result = tune(w, hw, time_limit=10, top=plans)
    line = int(d1.split(",")[2])
    rows = []
    for i, plan in enumerate([result.plan, *result.alternatives][: plans + 1]):
        one = result.model_copy(update={"plan": plan, "alternatives": []})
        folder = work / f"{name}-{i}"
        get_backend("llvm").export(one, folder)
        sweep = 4 * hw.levels[2].capacity_bytes if len(hw.levels) > 2 else 2**24
        sim = simulate(harness, folder / "kernel.so", [w.shape(n) for n in w.signature], d1, ll, sweep)
        d1_bytes = (sim["D1mr"] + sim["D1mw"]) * line
        ll_bytes = (sim["DLmr"] + sim["DLmw"]) * line
        rows.append({"kernel": f"{name} #{i}", "L1 sim": d1_bytes, "L2 sim": ll_bytes, **model_columns(plan),
                     "kind": kind, "dims": dims, "orders": [lp.order for lp in plan.levels],
                     "tiles": [lp.tile for lp in plan.levels]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def model_columns(plan) -> dict:
    """What the model says of a plan's L1 and L2: DV, expected bytes, L1's fill."""
    l1, l2 = plan.levels[1], plan.levels[2]
    return {"L1 dv": l1.dv_bytes, "L1 expected": l1.expected_bytes, "L2 dv": l2.dv_bytes,
            "L2 expected": l2.expected_bytes, "L1 fill": l1.mu_bytes / l1.capacity_bytes}


def recost(rows: list[dict], d1: str, ll: str) -> list[dict]:
    """`rows` (a --dump) with each level's DV and expected bytes from the model as it is now, for
    the same kernels and simulated misses: a change to the model judged on a fixed set of plans,
    not on the plans it would pick."""
    from cachetile import builtin, make_plan

    hw = avx2_host(d1, ll)
    return [{**r, **model_columns(make_plan(builtin(r["kind"], r["dims"]), hw, r["orders"], r["tiles"]))} for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=1, help="alternatives per workload beside the plan")
    ap.add_argument("--workloads", nargs="+", default=[w[0] for w in WORKLOADS])
    ap.add_argument("--keep", help="keep the kernels and simulator outputs here")
    ap.add_argument("--l1", metavar="SIZE,WAYS,LINE", help="plan for and simulate this L1d instead of this machine's")
    ap.add_argument("--l2", metavar="SIZE,WAYS,LINE", help="the same for L2")
    ap.add_argument("--dump", metavar="FILE", help="write the kernels' plans and simulated misses to FILE (JSON)")
    ap.add_argument("--recost", metavar="FILE", help="re-cost the kernels --dump wrote with the model as it is now; "
                                                     "build and simulate nothing")
    args = ap.parse_args()
    os.environ["CACHETILE_MCPU"] = "znver3"  # AVX2 code that valgrind can execute
    os.environ["TVM_NUM_THREADS"] = "1"
    from scipy.stats import spearmanr

    if args.recost:
        dumped = json.loads(Path(args.recost).read_text())
        d1, ll = dumped["d1"], dumped["ll"]
        rows = recost(dumped["rows"], d1, ll)
    else:
        if not shutil.which("valgrind"):
            raise SystemExit("valgrind is not installed (apt-get install valgrind)")
        d1, ll = args.l1 or cache_geometry("L1"), args.l2 or cache_geometry("L2")
        work = Path(args.keep or tempfile.mkdtemp(prefix="cachetile-cg-"))
        work.mkdir(parents=True, exist_ok=True)
        harness = build_harness(work)
        rows = []
        for name, kind, dims in WORKLOADS:
            if name in args.workloads:
                rows += rows_for(name, kind, dims, args.plans, work, d1, ll, harness)
        if args.dump:
            Path(args.dump).write_text(json.dumps({"d1": d1, "ll": ll, "rows": rows}))
    mib = lambda v: f"{v / 2**20:.3f}"  # noqa: E731
    print(f"# predicted bytes against valgrind's cache simulator (D1 {d1}, LL {ll}; size,ways,line)\n")
    print(table(("kernel", "L1 fill", "L1 DV MiB", "L1 expected MiB", "L1 simulated MiB", "L1 sim/expected",
                 "L2 DV MiB", "L2 expected MiB", "L2 simulated MiB", "L2 sim/expected"),
                [(r["kernel"], f"{r['L1 fill']:.0%}", mib(r["L1 dv"]), mib(r["L1 expected"]), mib(r["L1 sim"]),
                  f"{r['L1 sim'] / r['L1 expected']:.2f}", mib(r["L2 dv"]), mib(r["L2 expected"]), mib(r["L2 sim"]),
                  f"{r['L2 sim'] / r['L2 expected']:.2f}") for r in rows]))
    for level in ("L1", "L2"):
        ratios = [r[f"{level} sim"] / r[f"{level} expected"] for r in rows]
        rho = spearmanr([r[f"{level} expected"] for r in rows], [r[f"{level} sim"] for r in rows]).statistic
        within = sum(abs(x - 1) <= 0.25 for x in ratios)
        print(f"\n{level}: {within}/{len(rows)} kernels within 25%; Spearman {rho:.2f}; "
              f"geomean sim/expected {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")


if __name__ == "__main__":
    main()
