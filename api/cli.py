"""The `tune` command line.

    tune gemm --M 512 --N 512 --K 512
    tune gemm-chain --M 256 [--N .. --K .. --L ..] [--batch B]
    tune batch-gemm --batch 8 --M 256 --N 256 --K 256
    tune workload FILE.json
    tune hardware [NAME|FILE.json]

Bad input prints one line, `tune: error: ...`, and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

from ..models.hardware import PRESETS, Hardware, hardware_from, read_json
from ..models.plan import TuneResult
from ..models.workload import DTYPE_BYTES, Workload, builtin, workload_from_dict
from ..optimizer.tune import SOLVERS, tune


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


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--dtype", default="float32", choices=list(DTYPE_BYTES), help="element type (default float32)")
    common.add_argument("--hardware", default="host", help=f"{'|'.join(PRESETS)} or a JSON file (default host)")
    common.add_argument("--solver", default="auto", choices=list(SOLVERS), help="default auto")
    common.add_argument("--time-limit", type=_positive_float, default=10.0, metavar="S", help="seconds (default 10)")
    common.add_argument("--top", type=_nonnegative_int, default=3, metavar="K", help="alternatives to list (default 3)")
    common.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    common.add_argument("--target", choices=["llvm", "cuda"], help="backend (default: llvm for CPU hardware)")
    common.add_argument("--export", metavar="DIR", help="write plan.json, schedule.py and kernel.so into DIR")
    common.add_argument("--measure", action="store_true",
                        help="build, check against numpy, and print GFLOP/s beside numpy's (medians of 10 runs)")

    parser = _Parser(prog="tune", description="Loop orders and tile sizes per memory level that minimise data movement.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("gemm", parents=[common], help="C[m,n] = A[m,k] B[k,n]")
    for d in "MNK":
        g.add_argument(f"--{d}", type=_positive_int, required=True)
    g.add_argument("--batch", type=_positive_int, help="adds a batch loop b indexing every tensor")
    bg = sub.add_parser("batch-gemm", parents=[common], help="C[b,m,n] = A[b,m,k] B[b,k,n]")
    bg.add_argument("--batch", type=_positive_int, required=True)
    for d in "MNK":
        bg.add_argument(f"--{d}", type=_positive_int, required=True)
    c = sub.add_parser("gemm-chain", parents=[common], help="C[m,l] = A[m,k] B[k,l]; E[m,n] = C[m,l] D[l,n]")
    c.add_argument("--M", type=_positive_int, required=True)
    for d in "NKL":
        c.add_argument(f"--{d}", type=_positive_int, help="defaults to M")
    c.add_argument("--batch", type=_positive_int, help="adds a batch loop b indexing every tensor")
    wl = sub.add_parser("workload", parents=[common], help="a workload from a JSON file")
    wl.add_argument("file")
    hw = sub.add_parser("hardware", help="list presets, or show one")
    hw.add_argument("name", nargs="?")
    hw.add_argument("--json", action="store_true")
    return parser


def _workload(args) -> Workload:
    if args.command == "workload":
        return workload_from_dict(read_json(args.file))
    if args.command == "gemm-chain":
        dims = {"m": args.M, "n": args.N or args.M, "k": args.K or args.M, "l": args.L or args.M}
    else:
        dims = {"m": args.M, "n": args.N, "k": args.K}
    if args.batch is not None:
        dims["b"] = args.batch
    return builtin(args.command, dims, args.dtype)


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _bytes(value: float) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _seconds(value: float) -> str:
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"


def format_table(result: TuneResult) -> str:
    """The human-readable report: per level the order, tiles, DV, MU against capacity and share of time."""
    w, hw, plan = result.workload, result.hardware, result.plan
    dims = " ".join(f"{x}={e}" for x, e in w.dims.items())
    lines = [
        f"{w.kind} {dims} {w.dtype} on {hw.name} ({len(hw.levels)} levels, peak {_si(hw.peak_flops, 'FLOP/s')})",
        f"solver {result.solver.name}: {result.solver.status} in {result.solver.seconds:.2f} s, "
        f"{result.solver.evaluated} evaluated",
        f"predicted {_seconds(plan.predicted_seconds)}, bound by {plan.bottleneck} "
        f"(compute alone {_seconds(w.flops / hw.peak_flops)})",
        "",
    ]
    rows = [("level", "order", "tile", "DV", "MU / capacity", "time share")]
    for lp, lv in zip(plan.levels, hw.levels):
        share = lp.dv_bytes / lv.bandwidth_bytes_per_s / plan.predicted_seconds
        rows.append((
            lp.name,
            " ".join(lp.order),
            " ".join(f"{x}={t}" for x, t in lp.tile.items()),
            _bytes(lp.dv_bytes),
            f"{_bytes(lp.mu_bytes)} / {_bytes(lp.capacity_bytes)}",
            f"{100 * share:.1f}%",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(wd) for cell, wd in zip(r, widths)).rstrip() for r in rows]
    lines.append("(levels innermost first; orders outermost loop first)")
    for i, alt in enumerate(result.alternatives, 1):
        delta = alt.predicted_seconds / plan.predicted_seconds - 1
        tiles = "; ".join(f"{lp.name} " + ",".join(str(t) for t in lp.tile.values()) for lp in alt.levels)
        lines.append(f"alternative {i}: {_seconds(alt.predicted_seconds)} (+{100 * delta:.2f}%), bound by {alt.bottleneck}: {tiles}")
    return "\n".join(lines)


def format_hardware(hw: Hardware) -> str:
    lines = [f"{hw.name}: peak {_si(hw.peak_flops, 'FLOP/s')}"]
    for lv in hw.levels:
        lines.append(f"  {lv.name:<10} {_bytes(lv.capacity_bytes):>10}  filled at {_si(lv.bandwidth_bytes_per_s, 'B/s')}")
    if hw.source:
        lines.append(f"  source: {hw.source}")
    return "\n".join(lines)


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{where}: {msg}" if where else msg)
        return "; ".join(parts)
    return str(exc).replace("\n", " ")


def run(argv: list[str]) -> int:
    """Parse, solve, print; returns the exit status."""
    args = build_parser().parse_args(argv)
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
    hardware = hardware_from(args.hardware)
    target = args.target or ("llvm" if hardware.kind == "cpu" else "cuda")
    backend = args.export is not None or args.measure
    if backend and (target != "llvm" or hardware.kind != "cpu"):
        raise UsageError(f"--export and --measure need --target llvm and CPU hardware (got {target} on {hardware.kind})")
    result = tune(_workload(args), hardware, args.solver, args.time_limit, args.top)
    built = measurement = None
    if backend:
        from ..backends.build import build, export  # TVM loads only when a kernel is wanted

        built = build(result.workload, result.hardware, result.plan)
        if args.export is not None:
            export(result, args.export, built)
        if args.measure:
            from ..backends.measure import measure

            measurement = measure(result, built=built)
    if args.json:
        doc = json.loads(result.model_dump_json())
        if measurement is not None:
            doc["measurement"] = measurement.model_dump()
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(result))
        if args.export is not None:
            print(f"exported plan.json, schedule.py and kernel.so to {args.export}")
        if measurement is not None:
            print(format_measurement(measurement))
    return 0


def format_measurement(m) -> str:
    return (f"measured: kernel {m.kernel_gflops:.1f} GFLOP/s ({_seconds(m.kernel_seconds)}), numpy "
            f"{m.numpy_gflops:.1f} GFLOP/s ({_seconds(m.numpy_seconds)}), ratio {m.ratio:.2f}x; "
            f"build {m.build_seconds:.2f} s; max |error| {m.max_abs_error:.2g}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except UsageError as exc:
        print(f"tune: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, ValidationError) as exc:  # bad workload, hardware or an infeasible problem
        print(f"tune: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # --export into a path that cannot be written
        print(f"tune: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # the time limit passed before any plan was found
        print(f"tune: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
