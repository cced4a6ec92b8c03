"""Where a planned CPU kernel spends its time, loop by loop (perf's software clock).

    python bench/loop_profile.py gemm --dims m=1000,n=1000,k=1000 [--plan plan.json] [--seconds 5]
    python bench/loop_profile.py conv2d --dims n=1,c=64,h=56,w=56,k=64,r=3,s=3 --params '{"pad": 1, "layout": "nhwc"}'

The plan (the one `tune` returns, or `--plan`: a file holding the JSON that
`tune ... --json` prints) is built for this CPU, exported as a shared library,
and called over and over for `--seconds` in a child process that
`perf record -e cpu-clock` samples; software sampling needs no hardware
counters, which virtual machines often lack. Each sample inside the library is
given to the innermost loop holding it (a backward branch in objdump's
disassembly). Per loop the table gives its share of the kernel's samples and
what one trip of its body issues: FMAs, loads, stores and stack moves (spilled
registers). The last line compares the FMA loops' share of the kernel's time
with what the workload's FLOPs need at the calibrated peak: the FMA pipes'
efficiency inside those loops, beside the time spent outside them (copies,
zeroing, write-back, the thread pool). Needs `perf` and `objdump` (binutils).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from solve_times import plan_spec, table  # noqa: E402

INSTRUCTION = re.compile(r"\s+([0-9a-f]+):\s+(\S+)\s*(.*)")
COLUMNS = ("instructions", "fma", "loads", "stores", "stack")  # per trip of a loop's body (body_mix)
MMAP = re.compile(r"MMAP2?.*\[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+|0) .*\]: r-xp (\S+)")


def workload_of(kind: str, dims: str, params: str | None = None):
    from cachetile import builtin
    from cachetile.api.cli import _extents  # the CLI's own reading of --dims

    return builtin(kind, _extents(dims), params=json.loads(params) if params else None)


def inputs_of(w):
    from cachetile.backends.llvm_measure import kernel_args
    from cachetile.models.measurement import random_inputs

    return kernel_args(w, random_inputs(w))


def child(args) -> None:
    """Call the exported kernel for `args.seconds` (the process perf samples)."""
    import tvm

    kernel = tvm.runtime.load_module(args.child)["main"]
    inputs = inputs_of(workload_of(args.kind, args.dims, args.params))
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        kernel(*inputs)


def samples(perf_data: Path, library: Path) -> Counter:
    """Samples per offset in `library` (its file offsets, which objdump's addresses match for the
    text of a shared library)."""
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "ip,dso", "--show-mmap-events"],
                         capture_output=True, text=True, check=True).stdout
    maps, counts = [], Counter()
    for line in out.splitlines():
        m = MMAP.search(line)
        if m and m.group(4) == str(library):
            maps.append(tuple(int(g, 16) for g in m.groups()[:3]))
        elif f"({library})" in line:
            ip = int(line.split()[0], 16)
            for start, length, offset in maps:
                if start <= ip < start + length:
                    counts[ip - start + offset] += 1
    return counts


def loops(library: Path) -> tuple[list[tuple[int, int]], list[tuple[int, str, str]]]:
    """The library's loops (target, branch address) innermost first, and its instructions."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                         check=True).stdout
    code = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(INSTRUCTION.match, dis.splitlines()) if m]
    found = []
    for addr, op, arg in code:
        target = re.match(r"([0-9a-f]+) <", arg)
        if op.startswith("j") and op != "jmp" and target and int(target.group(1), 16) < addr:
            found.append((int(target.group(1), 16), addr))
    return sorted(found, key=lambda loop: loop[1] - loop[0]), code


def body_mix(code, loop: tuple[int, int], found) -> dict[str, int]:
    """FMAs, loads, stores and stack moves in one trip of the loop's body, the loops nested in it
    left out (AT&T syntax: a store's memory operand is its last)."""
    inner = [lp for lp in found if loop[0] <= lp[0] and lp[1] <= loop[1] and lp != loop]
    body = [(op, arg) for addr, op, arg in code
            if loop[0] <= addr <= loop[1] and not any(a <= addr <= b for a, b in inner)]
    mix = Counter()
    for op, arg in body:
        mix["fma"] += op.startswith("vfmadd") or op.startswith("vfnmadd")
        if "(" in arg:
            store = arg.rstrip().endswith(")") and op.startswith(("mov", "vmov"))
            mix["stores" if store else "loads"] += 1
            mix["stack"] += "(%rsp)" in arg
    mix["instructions"] = len(body)
    return dict(mix)


def plan_from(path: str, parse_document):
    """The plan in the `tune --json` document at `path`; exits with one line when it is not one."""
    try:
        return parse_document(Path(path).read_text()).plan
    except (OSError, ValueError) as e:  # pydantic's ValidationError and json's errors are ValueErrors
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        sys.exit(f"loop_profile: --plan {path}: not a `tune --json` document ({first})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", help="a built-in workload kind (gemm, batch-gemm, gemm-chain, ...)")
    ap.add_argument("--dims", required=True, help="extents, e.g. m=1000,n=1000,k=1000")
    ap.add_argument("--params", help='a workload\'s parameters as JSON, e.g. \'{"pad": 1, "layout": "nhwc"}\'')
    ap.add_argument("--plan", help="a file holding `tune --json`'s output (default: tune's plan)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            sys.exit(f"loop_profile: needs {tool!r} on PATH")
    from kernels import llvm

    from cachetile import hardware_from, tune
    from cachetile.backends.llvm_build import use_all_cores
    from cachetile.backends.llvm_measure import time_kernel
    from cachetile.api.autotune import parse_document

    w, hw = workload_of(args.kind, args.dims, args.params), hardware_from("host")
    use_all_cores(hw)
    plan = plan_from(args.plan, parse_document) if args.plan else tune(w, hw).plan
    with tempfile.TemporaryDirectory(prefix="cachetile-profile-") as tmp:
        library, data = Path(tmp) / "kernel.so", Path(tmp) / "perf.data"
        built = llvm().build(w, hw, plan).lib
        built.export_library(str(library))
        per_call = time_kernel(built.mod, inputs_of(w), 10)  # unsampled: perf shares the cores
        subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4999", "-o", str(data), "--",
                        sys.executable, __file__, args.kind, "--dims", args.dims, "--seconds", str(args.seconds),
                        *(["--params", args.params] if args.params else []), "--child", str(library)],
                       capture_output=True, text=True, check=True)
        counts, (found, code) = samples(data, library), loops(library)
    total = sum(counts.values())
    if not total:
        sys.exit("loop_profile: perf recorded no samples inside the kernel")
    per_loop = Counter()
    for offset, n in counts.items():
        per_loop[next((lp for lp in found if lp[0] <= offset <= lp[1]), None)] += n
    mixes = {loop: body_mix(code, loop, found) if loop else {} for loop in per_loop}
    fma_share = sum(n for loop, n in per_loop.items() if mixes[loop].get("fma")) / total
    rows = []
    for loop, n in per_loop.most_common(8):
        mix = mixes[loop]
        rows.append([f"{loop[0]:#x}-{loop[1]:#x}" if loop else "outside loops", f"{100 * n / total:.1f}",
                     *(mix.get(k, "") for k in COLUMNS)])
    print(f"# {args.kind} {args.dims}, plan {plan_spec(plan)}: {per_call * 1e3:.3f} ms per call, {total} kernel samples")
    print(table(["loop", "kernel samples %", *COLUMNS], rows))
    need = w.flops / hw.peak_flops
    print(f"\nFMA loops: {100 * fma_share:.1f}% of the kernel's time; the FLOPs need {need * 1e3:.3f} ms at the "
          f"calibrated peak, so the FMA pipes run at {100 * need / (fma_share * per_call):.0f}% inside them")


if __name__ == "__main__":
    main()
