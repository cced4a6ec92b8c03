"""The `tune` command line.

    tune gemm --M 512 --N 512 --K 512
    tune gemm-chain --M 256 [--N .. --K .. --L ..] [--batch B]
    tune batch-gemm --batch 8 --M 256 --N 256 --K 256
    tune workload FILE.json
    tune hardware [NAME|FILE.json]
    tune gemm ... [--target llvm] [--export DIR] [--measure]   (build the plan's kernel)
    tune gemm ... --hardware h100 --target cuda --arch sm_90 [--stages N] [--export DIR] [--measure]
    tune pareto [--level NAME] gemm-chain --M 256 ...   (any workload command above)
    tune serve [--host 127.0.0.1] [--port 8000]

Bad input prints one line, `tune: error: ...`, and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

from ..models.hardware import PRESETS, hardware_from, read_json
from ..models.workload import DTYPE_BYTES, Workload, builtin, workload_from_dict
from ..optimizer.pareto import ParetoFront, pareto
from ..optimizer.tune import SOLVERS
from .progress import progress_bar, scaled
from .report import format_hardware, format_measurement, format_pareto, format_table
from .request import PlanRequest, document, one_line


class UsageError(Exception):
    """Bad input: reported on one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        raise UsageError(message)


def _number(cast, minimum, inclusive=True):
    """An argparse type: `cast` the text and require it >= minimum (or > when not inclusive)."""
    word = "an integer" if cast is int else "a number"

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {word}") from None
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"{text} must be {'>=' if inclusive else '>'} {minimum}")
        return value

    return parse


_positive_int = _number(int, 1)
_nonnegative_int = _number(int, 0)
_positive_float = _number(float, 0, inclusive=False)


def _add_workloads(sub, parents: list[argparse.ArgumentParser]) -> None:
    """The workload commands (gemm, batch-gemm, gemm-chain, workload), each with `parents`' flags."""
    g = sub.add_parser("gemm", parents=parents, help="C[m,n] = A[m,k] B[k,n]")
    for d in "MNK":
        g.add_argument(f"--{d}", type=_positive_int, required=True)
    g.add_argument("--batch", type=_positive_int, help="adds a batch loop b indexing every tensor")
    bg = sub.add_parser("batch-gemm", parents=parents, help="C[b,m,n] = A[b,m,k] B[b,k,n]")
    bg.add_argument("--batch", type=_positive_int, required=True)
    for d in "MNK":
        bg.add_argument(f"--{d}", type=_positive_int, required=True)
    c = sub.add_parser("gemm-chain", parents=parents, help="C[m,l] = A[m,k] B[k,l]; E[m,n] = C[m,l] D[l,n]")
    c.add_argument("--M", type=_positive_int, required=True)
    for d in "NKL":
        c.add_argument(f"--{d}", type=_positive_int, help="defaults to M")
    c.add_argument("--batch", type=_positive_int, help="adds a batch loop b indexing every tensor")
    wl = sub.add_parser("workload", parents=parents, help="a workload from a JSON file")
    wl.add_argument("file")
    for name, parser in (("gemm", g), ("batch-gemm", bg), ("gemm-chain", c), ("workload", wl)):
        parser.set_defaults(kind=name)


def _capacities(text: str) -> list[int]:
    return [_positive_int(part) for part in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    solve = _Parser(add_help=False)
    solve.add_argument("--dtype", default="float32", choices=list(DTYPE_BYTES), help="element type (default float32)")
    solve.add_argument("--hardware", default="host", help=f"{'|'.join(PRESETS)} or a JSON file (default host)")
    solve.add_argument("--solver", default="auto", choices=list(SOLVERS), help="default auto")
    solve.add_argument("--time-limit", type=_positive_float, default=10.0, metavar="S", help="seconds per solve (default 10)")
    solve.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    top = _Parser(add_help=False)
    top.add_argument("--top", type=_nonnegative_int, default=3, metavar="K", help="alternatives to list (default 3)")
    top.add_argument("--target", choices=["llvm", "cuda"], help="backend (default: llvm for CPU hardware)")
    top.add_argument("--export", metavar="DIR",
                     help="write plan.json, schedule.py and kernel.so (llvm) or kernel.cu and launch.json (cuda) into DIR")
    top.add_argument("--arch", choices=["sm_70", "sm_80", "sm_90"], default="sm_90", help="CUDA architecture (cuda)")
    top.add_argument("--stages", type=_number(int, 1), default=None,
                     help="GPU: buffers per shared-memory input cache (default 2; N > 2 rotates N buffers)")
    top.add_argument("--measure", action="store_true",
                     help="build, check against numpy, and print GFLOP/s beside numpy's (medians of 10 runs)")
    top.add_argument("--double-buffer", action="store_true",
                     help="with --export/--measure: software-pipeline the input caches' copies (two buffers each)")
    sweep = _Parser(add_help=False)
    sweep.add_argument("--level", action="append", help="a level name (repeatable; default every level)")
    sweep.add_argument("--points", type=_number(int, 2), default=12, help="capacities per level (default 12)")
    sweep.add_argument("--capacities", type=_capacities, metavar="B,B,..", help="bytes to sweep instead of --points")

    parser = _Parser(prog="tune", description="Loop orders and tile sizes per memory level that minimise data movement.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_workloads(sub, [solve, top])
    hw = sub.add_parser("hardware", help="list presets, or show one")
    hw.add_argument("name", nargs="?")
    hw.add_argument("--json", action="store_true")
    pa = sub.add_parser("pareto", help="least DV for each capacity of a level: the DV/MU trade-off")
    _add_workloads(pa.add_subparsers(dest="kind", required=True, parser_class=_Parser), [solve, sweep])
    sv = sub.add_parser("serve", help="run the REST service")
    sv.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    sv.add_argument("--port", type=_number(int, 0), default=8000, help="default 8000")
    sv.add_argument("--cache", metavar="PATH", help="SQLite plan cache (default $CACHETILE_CACHE or ~/.cache/cachetile/plans.sqlite)")
    sv.add_argument("--workers", type=_positive_int, help="solver processes at once (default: CPU count)")
    sv.add_argument("--max-time-limit", type=_positive_float, default=60.0, metavar="S",
                    help="largest time_limit a request may ask for (default 60)")
    sv.add_argument("--openapi", action="store_true", help="print the OpenAPI schema and exit")
    return parser


def _workload(args) -> Workload:
    if args.kind == "workload":
        return workload_from_dict(read_json(args.file))
    if args.kind == "gemm-chain":
        dims = {"m": args.M, "n": args.N or args.M, "k": args.K or args.M, "l": args.L or args.M}
    else:
        dims = {"m": args.M, "n": args.N, "k": args.K}
    if args.batch is not None:
        dims["b"] = args.batch
    return builtin(args.kind, dims, args.dtype)


def _pareto(args) -> list[ParetoFront]:
    workload, hardware = _workload(args), hardware_from(args.hardware)
    levels = args.level or [lv.name for lv in hardware.levels]
    fronts = []
    with progress_bar("pareto") as bar:
        for i, level in enumerate(levels):
            fronts.append(pareto(
                workload, hardware, level, capacities=args.capacities, points=args.points, solver=args.solver,
                time_limit=args.time_limit, progress=scaled(bar, i / len(levels), (i + 1) / len(levels)),
            ))
    return fronts


def _cuda(args, result):
    """Export the CUDA kernel and, with --measure, run it against cuBLAS (needs a GPU and CuPy)."""
    import tempfile

    from ..backends.cuda_build import build_cuda, export_cuda  # TVM loads only when a kernel is wanted

    built = build_cuda(result.workload, result.hardware, result.plan, args.arch)
    result.plan.caches = built.emitted.caches
    directory = args.export or tempfile.mkdtemp(prefix="cachetile-")
    export_cuda(result, directory, args.arch, built)
    if not args.measure:
        return None
    from ..backends.cuda_run import GpuUnavailable, run as run_on_gpu

    try:
        return run_on_gpu(directory)
    except GpuUnavailable as exc:
        raise UsageError(f"--measure for cuda runs the kernel on a GPU: {exc}") from None


def run(argv: list[str]) -> int:
    """Parse, solve, print; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from .service import serve  # the web stack loads only for this command

        return serve(args)
    if args.command == "hardware":
        if args.name is None:
            if args.json:
                print(json.dumps({"presets": list(PRESETS)}))
            else:
                print("presets: " + ", ".join(PRESETS) + "  (tune hardware NAME for details)")
            return 0
        hw = hardware_from(args.name)
        print(hw.model_dump_json(indent=2) if args.json else format_hardware(hw))
        return 0
    if args.command == "pareto":
        fronts = _pareto(args)
        if args.json:
            print(json.dumps([f.model_dump(mode="json") for f in fronts], indent=2))
        else:
            print("\n\n".join(format_pareto(f) for f in fronts))
        return 0
    hardware = hardware_from(args.hardware)
    target = args.target or ("llvm" if hardware.kind == "cpu" else "cuda")
    backend = args.export is not None or args.measure
    if (target == "cuda") != (hardware.kind == "gpu"):
        raise UsageError(f"--target {target} does not build for {hardware.kind} hardware {hardware.name!r} "
                         f"(llvm is for CPUs, cuda for GPUs)")
    request = PlanRequest(workload=_workload(args), hardware=hardware, solver=args.solver,
                          time_limit=args.time_limit, top=args.top, stages=args.stages)
    result = request.solve()
    measurement = None
    if backend and target == "cuda":
        measurement = _cuda(args, result)
    elif backend:
        from ..backends.build import build, export  # TVM loads only when a kernel is wanted

        built = build(result.workload, result.hardware, result.plan, double_buffer=args.double_buffer)
        result.plan.caches = built.emitted.caches  # what was emitted, double buffers included
        if args.export is not None:
            export(result, args.export, built)
        if args.measure:
            from ..backends.measure import measure

            with progress_bar("measure") as bar:
                measurement = measure(result, built=built, progress=bar)
    if args.json:
        doc = json.loads(document(result))
        if measurement is not None:
            doc["measurement"] = measurement.model_dump()
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(result))
        if args.export is not None:
            files = "kernel.cu and launch.json" if target == "cuda" else "kernel.so"
            print(f"exported plan.json, schedule.py and {files} to {args.export}")
        if measurement is not None:
            print(format_measurement(measurement))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except UsageError as exc:
        print(f"tune: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, ValidationError) as exc:  # bad workload, hardware or an infeasible problem
        print(f"tune: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # --export into a path that cannot be written
        print(f"tune: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # the time limit passed before any plan was found
        print(f"tune: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
