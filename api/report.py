"""Human-readable reports: the plan table, a hardware summary and a Pareto sweep."""
from __future__ import annotations

from ..models.hardware import Hardware
from ..models.measurement import Measurement
from ..models.profile import RUN_BYTES, SHORT_RUN_BYTES, Profile
from ..models.targets.simd_cpu import FMA_CHAINS
from ..models.plan import CacheRecord, TuneResult
from ..optimizer.pareto import ParetoFront


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
    """The human-readable report: per level the order, tiles, DV, the traffic expected, MU against
    capacity, and the link's time as a share of the predicted time."""
    w, hw, plan = result.workload, result.hardware, result.plan
    dims = " ".join(f"{x}={e}" for x, e in w.dims.items())
    peak = hw.target.peak_flops(w)
    cores = f", {plan.launch.tensor_cores}" if plan.launch is not None and plan.launch.tensor_cores else ""
    lines = [
        f"{w.kind} {dims} {w.dtype} on {hw.name} ({len(hw.levels)} levels, peak {_si(peak, 'FLOP/s')}{cores}; "
        f"{_figures(hw)})",
        f"solver {result.solver.name}: {result.solver.status} in {result.solver.seconds:.2f} s, "
        f"{result.solver.evaluated} evaluated",
        f"predicted {_seconds(plan.predicted_seconds)}, bound by {plan.bottleneck} "
        f"(compute alone {_seconds(w.flops / peak)})",
        "",
    ]
    rows = [("level", "order", "tile", "DV", "expected", "MU / capacity", "time share")]
    for lp in plan.levels:
        share = lp.link_seconds / plan.predicted_seconds
        rows.append((
            lp.name,
            " ".join(lp.order),
            " ".join(f"{x}={t}" for x, t in lp.tile.items()),
            _bytes(lp.dv_bytes),
            _bytes(lp.expected_bytes),
            f"{_bytes(lp.mu_bytes)} / {_bytes(lp.capacity_bytes)}",
            f"{100 * share:.1f}%",
        ))
    lines += _rows(rows)
    lines.append("(levels innermost first; orders outermost loop first; expected: the traffic the kernel causes, "
                 "copies included; time share: the link's time over the predicted time)")
    for i, alt in enumerate(result.alternatives, 1):
        delta = alt.predicted_seconds / plan.predicted_seconds - 1
        tiles = "; ".join(f"{lp.name} " + ",".join(str(t) for t in lp.tile.values()) for lp in alt.levels)
        lines.append(f"alternative {i}: {_seconds(alt.predicted_seconds)} ({100 * delta:+.2f}%), bound by {alt.bottleneck}: {tiles}")
    return "\n".join(lines)


def _figures(hw: Hardware) -> str:
    """Where the hardware's figures come from; for an uncalibrated host, how to measure them (its
    assumed figures can pick plans 2x slower than calibrated ones: BENCHMARKS.md)."""
    if hw.calibrated:
        return f"calibrated on {hw.calibrated}"
    if hw.name == "host" and hw.target.calibration:
        return f"{hw.target.figures}: {hw.target.calibration}"
    return hw.target.figures


def format_hardware(hw: Hardware) -> str:
    state = _figures(hw)
    lines = [f"{hw.name}: peak {_si(hw.peak_flops, 'FLOP/s')} ({state})"]
    if hw.gpu is not None and hw.gpu.tensor_flops:
        peaks = ", ".join(f"{d} {_si(v, 'FLOP/s')}" for d, v in hw.gpu.tensor_flops.items())
        lines.append(f"  tensor cores ({hw.gpu.arch or 'arch not given'}): {peaks}")
    for lv in hw.levels:
        lines.append(f"  {lv.name:<10} {_bytes(lv.capacity_bytes):>10}  filled at {_si(lv.bandwidth_bytes_per_s, 'B/s')}")
    if hw.accumulator_bytes_per_s:
        lines.append(f"  accumulators stored and reloaded at {_si(hw.accumulator_bytes_per_s, 'B/s')}")
    if hw.parallel_region_seconds or hw.call_seconds:  # CPU overheads (kernel_costs)
        lines.append(f"  parallel region {_seconds(hw.parallel_region_seconds)}, kernel call {_seconds(hw.call_seconds)}, "
                     f"run start from memory {_bytes(hw.run_start_bytes)} of stream"
                     + (f" ({_bytes(hw.short_run_start_bytes)} for {SHORT_RUN_BYTES}-byte runs)"
                        if hw.short_run_start_bytes is not None else ""))
        if hw.run_start_reach:
            lines.append(f"  share of a run start paid by inputs of {_reach(hw.run_start_reach)}"
                         + (f" ({SHORT_RUN_BYTES}-byte runs: {_reach(hw.short_run_start_reach)})"
                            if hw.short_run_start_reach else ""))
        if hw.band_stall:
            lines.append(f"  stall on rows read in turn, by band, of their stream: {_bands(hw.band_stall)}")
        if hw.tall_band_stall:
            lines.append(f"  the same under {hw.tall_rows} rows of A per vector: {_bands(hw.tall_band_stall)}")
        if hw.stride_stall:
            lines.append(f"  stall on rows read in place, by stride, of their L1 link time: {_reach(hw.stride_stall)}")
        if hw.fed_share:
            lines.append(f"  register tiles fed from L2, share of peak by width: {_widths(hw.fed_share)}")
        if hw.copy_vector_seconds or hw.copy_element_seconds:
            lines.append(f"  packing copies issue a vector per {_seconds(hw.copy_vector_seconds)}, a single element per "
                         f"{_seconds(hw.copy_element_seconds)} (one core)")
        if hw.handoff_seconds:
            lines.append(f"  a buffer another core wrote costs {_seconds(hw.handoff_seconds * 1024)} more per KiB read")
        if hw.shared_line_seconds:
            lines.append(f"  an output line two cores write costs {_seconds(hw.shared_line_seconds)}")
        if hw.fma_chains:
            lines.append(f"  the FMA pipes need {hw.fma_chains:.1f} accumulator vectors in flight")
    if hw.source:
        lines.append(f"  source: {hw.source}")
    return "\n".join(lines)


def format_calibration(profile: Profile, assumed: Hardware, path: str) -> str:
    """What calibration measured, one core and all cores, beside the figures assumed without it."""
    rows = [("figure", "assumed (all cores)", "measured, 1 core", f"measured, {profile.cores} cores")]
    rows.append(("peak", _si(assumed.peak_flops, "FLOP/s"), _si(profile.peak_flops.one_core, "FLOP/s"),
                 _si(profile.peak_flops.all_cores, "FLOP/s")))
    for lv in assumed.levels:
        fill = profile.fill_bandwidth.get(lv.name)
        if fill:
            rows.append((f"fill {lv.name}", _si(lv.bandwidth_bytes_per_s, "B/s"), _si(fill.one_core, "B/s"),
                         _si(fill.all_cores, "B/s")))
    if profile.accumulator_bandwidth:
        rows.append(("accumulators", "(fill registers)", _si(profile.accumulator_bandwidth.one_core, "B/s"),
                     _si(profile.accumulator_bandwidth.all_cores, "B/s")))
    for name, figure in profile.stream_bandwidth.items():
        rows.append((f"stream from {name}", "-", _si(figure.one_core, "B/s"), _si(figure.all_cores, "B/s")))
    if profile.run_start_bytes:
        rows.append((f"run start (memory, {RUN_BYTES} B runs)", _bytes(assumed.run_start_bytes),
                     _bytes(profile.run_start_bytes.one_core), _bytes(profile.run_start_bytes.all_cores)))
    if profile.short_run_start_bytes:
        rows.append((f"run start ({SHORT_RUN_BYTES} B runs)", "(at most the run)",
                     _bytes(profile.short_run_start_bytes.one_core), _bytes(profile.short_run_start_bytes.all_cores)))
    if profile.last_level_bytes:
        last = assumed.levels[-1]
        rows.append((f"{last.name} size", f"{_bytes(last.capacity_bytes)} (sysfs)", "-", _bytes(profile.last_level_bytes)))
    if profile.run_start_reach:
        rows.append(("run start share by size" + (f" ({RUN_BYTES} B runs)" if profile.short_run_start_reach else ""),
                     "none within the last cache", "-", _reach(profile.run_start_reach)))
    if profile.short_run_start_reach:
        rows.append((f"the same, {SHORT_RUN_BYTES} B runs", "as above", "-", _reach(profile.short_run_start_reach)))
    if profile.band_stall:
        rows.append(("stall by band of rows", "none", "-", _bands(profile.band_stall)))
    if profile.tall_band_stall:
        rows.append((f"the same under {profile.tall_rows} rows of A", "as above", "-", _bands(profile.tall_band_stall)))
    if profile.stride_stall:
        rows.append(("stall by row stride", "none", "-", _reach(profile.stride_stall)))
    if profile.fed_share:
        rows.append(("fed from L2, by tile width", "all alike", "-", _widths(profile.fed_share)))
    if profile.copy_vector_seconds and profile.copy_element_seconds:
        rows.append(("packing copy, per vector", "0 (streams only)", _seconds(profile.copy_vector_seconds), "-"))
        rows.append(("packing copy, per element", "0 (streams only)", _seconds(profile.copy_element_seconds), "-"))
    if profile.handoff_seconds:
        rows.append(("handed between cores, per KiB", "0", "-", _seconds(profile.handoff_seconds * 1024)))
    if profile.shared_line_seconds:
        rows.append(("output line two cores write", "0", "-", _seconds(profile.shared_line_seconds)))
    if profile.fma_chains:
        rows.append(("accumulator chains needed", str(FMA_CHAINS), f"{profile.fma_chains:.1f}", "-"))
    rows.append(("parallel region", "0", "-", _seconds(profile.parallel_region_seconds)))
    rows.append(("kernel call", "0", _seconds(profile.call_seconds), "-"))
    notes = [f"note: {n}" for n in profile.notes]
    return "\n".join([f"calibrated {profile.cpu} in {profile.seconds:.1f} s; profile {path}", *_rows(rows), *notes])


def _reach(points) -> str:
    return ", ".join(f"{_bytes(size)} {100 * share:.0f}%" for size, share in points)


def _widths(points) -> str:
    return ", ".join(f"{vectors:.0f} vector{'s' if vectors != 1 else ''} {100 * share:.0f}%" for vectors, share in points)


def _bands(points) -> str:
    return ", ".join(f"{rows:.0f} rows {100 * share:.0f}%" for rows, share in points)


def _rows(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(wd) for cell, wd in zip(r, widths)).rstrip() for r in rows]


def format_pareto(front: ParetoFront) -> str:
    """One row per capacity: the least DV, the MU it takes, the time; `*` marks the Pareto front."""
    i = [lv.name for lv in front.hardware.levels].index(front.level)
    rows = [("", "capacity", "MU", "DV", "predicted", "status", "order", "tile")]
    for p in front.points:
        lp = p.plan.levels[i]
        rows.append((
            "*" if p.on_front else "",
            _bytes(p.capacity_bytes),
            _bytes(p.mu_bytes),
            _bytes(p.dv_bytes),
            _seconds(p.predicted_seconds),
            p.status,
            " ".join(lp.order),
            " ".join(f"{x}={t}" for x, t in lp.tile.items()),
        ))
    return "\n".join([f"level {front.level}: least DV for each capacity (* on the Pareto front)", *_rows(rows)])


def format_measurement(m: Measurement) -> str:
    """One line: the kernel's speed beside its reference's (numpy or cuBLAS)."""
    build = f"; build {m.build_seconds:.2f} s" if m.build_seconds is not None else ""
    return (f"measured on {m.device}: kernel {_si(m.kernel_gflops * 1e9, 'FLOP/s')} ({_seconds(m.kernel_seconds)}), "
            f"{m.reference} {_si(m.reference_gflops * 1e9, 'FLOP/s')} ({_seconds(m.reference_seconds)}), "
            f"ratio {m.ratio:.2f}x{build}; max |error| {m.max_abs_error:.2g}{_spills(m)}")


def _spills(m: Measurement) -> str:
    """A clause when the kernel's FMA loops spill: then its time is not the plan's to answer for."""
    if not m.fma_loop_spills:
        return ""
    return (f"; its FMA loops store {m.fma_loop_spills} vector registers to the stack (more accumulators live "
            f"than registers, which the cost model does not see)")


def format_double_buffer(caches: list[CacheRecord]) -> str:
    """One line: which input caches --double-buffer pipelined, or why it changed nothing."""
    done = [f"{c.tensor} at {c.attach_loop}" for c in caches if c.double_buffer]
    if done:
        return "double buffering: pipelined " + ", ".join(done)
    reasons = [f"{c.tensor} in {c.level}: {c.note}" for c in caches if c.note and not c.skipped_thrifty]
    return "double buffering changes nothing: " + ("; ".join(reasons) or "no input is copied")
