"""The `tune` command line.

    tune gemm --M 512 --N 512 --K 512
    tune gemm-chain --M 256 [--N .. --K .. --L ..] [--batch B]
    tune batch-gemm --batch 8 --M 256 --N 256 --K 256
    tune conv2d --N 1 --C 64 --H 56 --W 56 --K 64 --R 3 --S 3 [--stride 1 --pad 1 --dilation 1 --layout nchw --groups 1 --pointwise F]
    tune einsum "bmk,bkn->bmn" --dims b=12,m=512,n=512,k=64   (or equations: "C[m,n] = A[m,k]*B[k,n]; ...")
    tune workload FILE.json
    tune hardware [NAME|FILE.json] [--from-measurements]   (refit NAME to the plans autotuning measured)
    tune gemm ... [--target llvm] [--export DIR] [--measure]   (build the plan's kernel)
    tune gemm ... --hardware h100 --target cuda --arch sm_90 [--stages N] [--export DIR] [--measure]
    tune gemm ... --autotune K [--rpc HOST:PORT:KEY [--target-host TARGET]]   (measure the top K plans)
    tune hardware host --calibrate [--from-measurements]   (measure this machine; refit to measured plans)
    tune pareto [--level NAME] gemm-chain --M 256 ...   (any workload command above)
    tune serve [--host 127.0.0.1] [--port 8000]

Bad input prints one line, `tune: error: ...`, and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from ..backends.base import BuildOptions, backend_for, names as backend_names
from ..backends.cuda import ARCHES
from ..models.errors import InvalidInput
from ..models.einsum import workload_from_equations
from ..models.hardware import PRESETS, Hardware, hardware_from, read_json
from ..models.workload import DTYPE_BYTES, KINDS, Workload, builtin
from ..optimizer.pareto import ParetoFront, pareto
from ..optimizer.tune import SOLVERS
from ..backends.rpc_tracker import parse_rpc
from .autotune import TRIAL_TIMEOUT_S, AutotuneResult, autotune_command, format_autotune
from .measurements import host_profile_command, refit_command
from .errors import exit_status, kind_of, one_line
from .progress import progress_bar, scaled
from .report import format_double_buffer, format_hardware, format_measurement, format_pareto, format_table
from .request import PlanRequest, document, parse_hardware, parse_workload


class UsageError(InvalidInput):
    """Bad command-line input: reported on one line with exit status 2."""


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
        if not math.isfinite(value):  # a limit of inf never ends, nan never compares
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"{text} must be {'>=' if inclusive else '>'} {minimum}")
        return value

    return parse


_positive_int = _number(int, 1)
_nonnegative_int = _number(int, 0)
_positive_float = _number(float, 0, inclusive=False)


def _rpc(text: str) -> str:
    try:
        return str(parse_rpc(text))
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _flag(loop: str) -> str:
    """The CLI flag of a loop: --batch for b, else the upper-cased name (--M for m)."""
    return "--batch" if loop == "b" else f"--{loop.upper()}"


def _add_workloads(sub, parents: list[argparse.ArgumentParser]) -> None:
    """One command per kind of models.workload.KINDS, plus `workload FILE`, each with `parents`' flags."""
    for kind in KINDS.values():
        p = sub.add_parser(kind.name, parents=parents, help=kind.summary)
        for x in kind.loops:
            default = kind.defaults.get(x)
            p.add_argument(_flag(x), dest=x, type=_positive_int, required=default is None,
                           help=f"defaults to {default.upper()}" if default else None)
        if kind.batch != "none":
            p.add_argument(_flag("b"), dest="b", type=_positive_int, required=kind.batch == "required",
                           help="a batch loop b indexing every tensor")
        for param in kind.params:
            p.add_argument(f"--{param.name}", dest=f"param_{param.name}", default=param.default,
                           choices=param.choices, type=None if param.choices else _number(int, param.minimum),
                           help=param.help + (f" (default {param.default})" if param.default is not None else ""))
        p.set_defaults(kind=kind.name, source="kind")
    es = sub.add_parser("einsum", parents=parents, help="equations such as 'C[m,n] = A[m,k]*B[k,n]' (';' between "
                        "ops), or an einsum spec such as 'bmk,bkn->bmn'")
    es.add_argument("spec")
    es.add_argument("--dims", type=_extents, required=True, metavar="X=E,..", help="every loop's extent")
    es.set_defaults(kind="einsum", source="einsum")
    wl = sub.add_parser("workload", parents=parents, help="a workload from a JSON file")
    wl.add_argument("file")
    wl.set_defaults(kind="workload", source="file")


def _extents(text: str) -> dict[str, int]:
    """`b=12,m=512` -> {"b": 12, "m": 512}."""
    dims = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise argparse.ArgumentTypeError(f"{part!r} is not LOOP=EXTENT")
        dims[name.strip()] = _positive_int(value.strip())
    return dims


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
    top.add_argument("--target", choices=backend_names(), help="backend (default: the hardware's, llvm for CPUs, cuda for GPUs)")
    top.add_argument("--export", metavar="DIR",
                     help="write plan.json, schedule.py and kernel.so (llvm) or kernel.cu and launch.json (cuda) into DIR")
    top.add_argument("--arch", choices=ARCHES, default="sm_90", help="CUDA architecture (cuda)")
    top.add_argument("--stages", type=_number(int, 1), default=None,
                     help="GPU: buffers per shared-memory input cache (default 2; N > 2 rotates N buffers)")
    top.add_argument("--measure", action="store_true",
                     help="build, check against numpy, and print GFLOP/s beside numpy's (medians of 10 runs)")
    top.add_argument("--double-buffer", action="store_true",
                     help="with --export/--measure: software-pipeline the input caches' copies (two buffers each)")
    top.add_argument("--autotune", type=_number(int, 1), default=0, metavar="K",
                     help="build, check and time K of the model's best distinct plans (one per register tile "
                          "first); return the fastest (cached)")
    top.add_argument("--rpc", type=_rpc, metavar="HOST:PORT:KEY",
                     help="with --autotune: measure on the servers of this TVM RPC tracker")
    top.add_argument("--target-host", metavar="TARGET",
                     help="with --rpc: the servers' LLVM target, 'llvm -mtriple=T -mcpu=C' (default: ask a server)")
    top.add_argument("--trial-timeout", type=_positive_float, default=TRIAL_TIMEOUT_S, metavar="S",
                     help=f"with --autotune: seconds one candidate's measurement may take (default {TRIAL_TIMEOUT_S:g})")
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
    hw.add_argument("--calibrate", action="store_true",
                    help="host only: measure this machine's peak, bandwidths and overheads (under a minute) and keep "
                         "them as its profile, which the host preset uses from then on")
    hw.add_argument("--from-measurements", action="store_true",
                    help="refit its peak, fill bandwidths and overheads to the plans autotuning measured on it "
                         "(models/refit.py); for host, the refit is stored in its calibration profile")
    pa = sub.add_parser("pareto", help="least DV for each capacity of a level: the DV/MU trade-off")
    _add_workloads(pa.add_subparsers(dest="kind", required=True, parser_class=_Parser), [solve, sweep])
    sv = sub.add_parser("serve", help="run the REST service")
    sv.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    sv.add_argument("--port", type=_number(int, 0), default=8000, help="default 8000")
    sv.add_argument("--cache", metavar="PATH", help="SQLite plan cache (default $CACHETILE_CACHE or ~/.cache/cachetile/plans.sqlite)")
    sv.add_argument("--exports", metavar="DIR", help="where jobs write their kernels (default: exports/ beside the cache)")
    sv.add_argument("--workers", type=_positive_int, help="solver processes at once (default: CPU count)")
    sv.add_argument("--max-time-limit", type=_positive_float, default=60.0, metavar="S",
                    help="largest time_limit a request may ask for (default 60)")
    sv.add_argument("--max-autotune", type=_nonnegative_int, default=8, metavar="K",
                    help="most candidates a request may autotune on this machine (default 8; 0: no autotuning)")
    sv.add_argument("--allow-rpc", action="store_true",
                    help="let requests name a TVM RPC tracker (rpc) to send their kernels to")
    sv.add_argument("--openapi", action="store_true", help="print the OpenAPI schema and exit")
    return parser


def _unwrap(data, key: str):
    """A `tune --json` document's `key` object, or the data itself."""
    return data[key] if isinstance(data, dict) and isinstance(data.get(key), dict) else data


def _hardware(spec: str) -> Hardware:
    """A preset name, or a JSON file validated as the service validates a hardware object."""
    if spec in PRESETS or not (spec.endswith(".json") or Path(spec).exists()):
        return hardware_from(spec)  # a preset, or the one-line list of presets
    return parse_hardware(_unwrap(read_json(spec), "hardware"))


def _workload(args) -> Workload:
    if args.source == "file":  # validated as the service validates a request's workload
        return parse_workload(_unwrap(read_json(args.file), "workload"))
    if args.source == "einsum":
        return workload_from_equations(args.spec, args.dims, args.dtype)
    kind = KINDS[args.kind]
    dims = {x: getattr(args, x, None) for x in ["b", *kind.loops]}
    params = {p.name: getattr(args, f"param_{p.name}") for p in kind.params}
    return builtin(args.kind, {x: v for x, v in dims.items() if v is not None}, args.dtype, params)


def _pareto(args) -> list[ParetoFront]:
    workload, hardware = _workload(args), _hardware(args.hardware)
    levels = args.level or [lv.name for lv in hardware.levels]
    fronts = []
    with progress_bar("pareto") as bar:
        for i, level in enumerate(levels):
            fronts.append(pareto(
                workload, hardware, level, capacities=args.capacities, points=args.points, solver=args.solver,
                time_limit=args.time_limit, progress=scaled(bar, i / len(levels), (i + 1) / len(levels)),
            ))
    return fronts


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
        if args.calibrate and args.name != "host":
            raise UsageError(f"--calibrate measures this machine: use `tune hardware host --calibrate` (got {args.name!r})")
        if args.calibrate or (args.from_measurements and args.name == "host"):
            return host_profile_command(args.calibrate, args.from_measurements, args.json)
        hw = _hardware(args.name)
        if args.from_measurements:
            return refit_command(hw, args.json)
        print(hw.model_dump_json(indent=2) if args.json else format_hardware(hw))
        return 0
    if args.command == "pareto":
        fronts = _pareto(args)
        if args.json:
            print(json.dumps([f.model_dump(mode="json") for f in fronts], indent=2))
        else:
            print("\n\n".join(format_pareto(f) for f in fronts))
        return 0
    hardware = _hardware(args.hardware)
    backend = backend_for(hardware, args.target)
    if args.measure:
        backend.raise_if_unavailable()  # before planning and building a kernel that cannot run here
    request = PlanRequest(workload=_workload(args), hardware=hardware, solver=args.solver,
                          time_limit=args.time_limit, top=args.top, stages=args.stages, autotune=args.autotune,
                          rpc=args.rpc, target_host=args.target_host)
    result = autotune_command(request, args.trial_timeout) if request.autotune else request.solve()
    measurement, exported = None, None
    if args.export is not None or args.measure:
        options = BuildOptions(double_buffer=args.double_buffer, arch=args.arch)
        built = backend.build(result.workload, result.hardware, result.plan, options)
        result.plan.caches = built.emitted.caches  # what was emitted, double buffers included
        if args.export is not None:
            exported = backend.export(result, args.export, options, built)
        if args.measure:
            with progress_bar("measure") as bar:
                measurement = backend.measure(result, built=built, progress=bar, options=options)
    if args.json:
        doc = json.loads(document(result))
        if measurement is not None:
            doc["measurement"] = measurement.model_dump()
        if exported is not None:
            doc["export"] = exported.model_dump()
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(result))
        if isinstance(result, AutotuneResult):
            print(format_autotune(result))
        if args.double_buffer and (exported is not None or measurement is not None):
            print(format_double_buffer(result.plan.caches))
        if exported is not None:
            print(f"exported {', '.join(exported.files)} to {exported.directory}" +
                  "".join(f"; {c}" for c in exported.checks))
        if measurement is not None:
            print(format_measurement(measurement))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every error is one line on stderr, with the exit status api/errors.py gives
    its kind (2 for bad input). CACHETILE_DEBUG=1 re-raises unexpected errors with a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except KeyboardInterrupt:
        print("tune: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # --export into a path that cannot be written, an unreadable file
        print(f"tune: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        what = kind_of(exc)
        if what == "internal" and os.environ.get("CACHETILE_DEBUG"):
            raise
        prefix = "internal error: " if what == "internal" else ""
        print(f"tune: error: {prefix}{one_line(exc)}", file=sys.stderr)
        return exit_status(what)


if __name__ == "__main__":
    sys.exit(main())
