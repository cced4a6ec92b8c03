"""Memory hierarchies: the levels that hold tiles, innermost first, and peak compute.

Each level's bandwidth is that of the link filling it from the next level out;
the outermost listed level is filled from memory, which is implicit.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import InvalidInput, one_line_errors
from .profile import (BandPoints, FedPoints, Profile, ReachPoints, ShortReachPoints, StridePoints, load_profile, machine_key,
                      profile_path)
from .workload import Dtype


# Bounds keep every figure a finite number numpy can hold (capacities are compared with int64 arrays).
MAX_CAPACITY = 2**62
# Real hierarchies have at most five; past about ten, enumerate's costing between deadline checks
# grows so fast that a 1 s limit overran by a minute at 15 levels.
MAX_LEVELS = 8


class Level(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    capacity_bytes: int = Field(gt=0, le=MAX_CAPACITY)
    bandwidth_bytes_per_s: float = Field(gt=0, allow_inf_nan=False)
    ways: int | None = Field(None, ge=1, description="associativity of a hardware cache (sysfs); none for registers "
                                                     "and software-managed memories")


class GpuLimits(BaseModel):
    """Per-SM and per-block limits of a GPU: what occupancy and the launch checks need."""

    model_config = ConfigDict(extra="forbid")
    sms: int = Field(ge=1, description="streaming multiprocessors")
    shared_per_sm_bytes: int = Field(gt=0, le=MAX_CAPACITY)
    registers_per_sm: int = Field(65536, ge=1, description="32-bit registers")
    max_threads_per_block: int = Field(1024, ge=1)
    max_threads_per_sm: int = Field(2048, ge=1)
    max_blocks_per_sm: int = Field(32, ge=1)
    warp: int = Field(32, ge=1)
    arch: str | None = Field(None, pattern=r"^sm_\d+$",
                             description="compute capability, e.g. sm_90; tensor-core kernels need sm_80 or newer")
    tensor_flops: dict[Dtype, float] = Field(
        {}, description="dense tensor-core peak FLOP/s per input dtype, fp32 accumulation (dtypes not listed run SIMT)")

    @field_validator("tensor_flops")
    @classmethod
    def _finite_peaks(cls, peaks: dict) -> dict:
        if any(not 0 < v < float("inf") for v in peaks.values()):
            raise ValueError("tensor_flops must be finite and > 0")
        return peaks


class Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    levels: list[Level] = Field(min_length=1, max_length=MAX_LEVELS, description="innermost first")
    peak_flops: float = Field(gt=0, allow_inf_nan=False)
    kind: Literal["cpu", "gpu"] = Field("cpu", description="picks the backend: llvm for cpu, cuda for gpu")
    cores: int = Field(1, ge=1, description="threads the kernel runs on (CPU)")
    vector_bytes: int | None = Field(
        None, gt=0, description="SIMD register width; the register tile's vector loop is a multiple of it (CPU)"
    )
    gpu: GpuLimits | None = Field(
        None, description="GPU only: level 0 is then a thread's registers (bytes), level 1 a block's shared memory"
    )
    call_seconds: float = Field(0.0, ge=0, allow_inf_nan=False, description="fixed cost of one kernel call")
    accumulator_bytes_per_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="SIMD CPU: bytes/s at which the register tile's accumulators are stored and reloaded (both "
                    "ways), when a loop runs between its reduction steps; none: the registers' fill bandwidth")
    parallel_region_seconds: float = Field(0.0, ge=0, allow_inf_nan=False,
                                           description="cost of entering one parallel loop (CPU thread pool)")
    run_start_bytes: float = Field(
        128.0, ge=0, allow_inf_nan=False,
        description="CPU: what starting a contiguous run costs a stream from memory, in bytes of that stream "
                    "(an unpacked input read in runs shorter than its rows), timed on runs of RUN_BYTES; assumed "
                    "two cache lines until calibrated")
    short_run_start_bytes: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="CPU: the same for runs of SHORT_RUN_BYTES (two cache lines); none until calibrated: then a "
                    "run's start costs run_start_bytes, but no more than the run")
    run_start_reach: ReachPoints = Field(
        None, description="CPU: per input size in bytes (increasing), the share of the run start figures its runs pay, "
                          "linear in the log of the size between points and the nearer point's outside them; none "
                          "until calibrated: all of them beyond the outermost level, none within")
    short_run_start_reach: ShortReachPoints = Field(
        None, description="CPU: the same for runs of SHORT_RUN_BYTES, run_start_reach then being that of runs of "
                          "RUN_BYTES (kernel_costs.run_start_reach interpolates between the two by the run's length); "
                          "none until calibrated, or in older profiles: run_start_reach for every run")
    band_stall: BandPoints = Field(
        None, description="CPU: per band of rows (increasing) an unpacked input is read in, each row in turn along "
                          "the rows, what its stream takes beyond a contiguous one, as a share of that stream's time "
                          "(kernel_costs.band_stall: linear in the log of the rows between points); none until "
                          "calibrated: no stall")
    tall_band_stall: BandPoints = Field(
        None, description="CPU: band_stall as measured under tall_rows rows of A broadcast against each vector of "
                          "the banded input (a decode GEMM's register tile); kernel_costs.band_stall interpolates "
                          "between the two by the register tile's rows; none until calibrated: band_stall alone")
    tall_rows: int | None = Field(None, ge=2, description="rows of A under which tall_band_stall was measured")
    stride_stall: StridePoints = Field(
        None, description="SIMD CPU: per row stride in bytes (increasing), what an FMA loop reading an input in place, "
                          "its rows that far apart, stalls for beside a contiguous read, as a share of the L1 fill "
                          "link's time for the bytes it reads (kernel_costs.stride_stall); none until calibrated: "
                          "no stall")
    fed_share: FedPoints = Field(
        None, description="SIMD CPU: per register tile width in vectors (increasing), the share of peak its FMA loop "
                          "reaches once its panels stream from L2 (simd_cpu.fed_share); none until calibrated: "
                          "every width alike")
    copy_vector_seconds: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="CPU: seconds one core spends per vector (or shorter piece of a row) a packing copy moves, "
                    "beside its streams (kernel_costs.copy_ops); 0 until calibrated")
    copy_element_seconds: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="CPU: the same per element of a copy that moves one element at a time; 0 until calibrated")
    fma_chains: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="CPU: independent accumulator vectors the FMA pipes need in flight to run at peak "
                    "(simd_cpu.issue_efficiency); none until calibrated: simd_cpu.FMA_CHAINS")
    handoff_seconds: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="CPU: seconds more per byte a core spends reading a buffer another core has just written "
                    "(dirty in that core's private cache) than one it wrote itself (kernel_costs.handed_off); "
                    "0 until calibrated")
    shared_line_seconds: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="CPU: seconds per cache line of an output that two cores write in one call, where the "
                    "parallel loop's chunks meet inside the line (models/sharing.py); 0 until calibrated")
    calibrated: str | None = Field(None, description="when the figures were measured on this machine (tune hardware "
                                                     "--calibrate); none: they are documented assumptions")
    source: str | None = Field(None, exclude=True, description="where the figures come from (not serialised)")

    @model_validator(mode="after")
    def _unique_names(self) -> Hardware:
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"level names must be unique, got {names}")
        if self.kind == "gpu" and (self.gpu is None or len(self.levels) < 2):
            raise ValueError("gpu hardware needs 'gpu' limits and at least two levels (registers per thread, "
                             "shared memory per block)")
        if self.kind == "cpu" and self.gpu is not None:
            raise ValueError("'gpu' limits only apply to kind 'gpu'")
        if self.kind == "gpu" and self.vector_bytes is not None:
            raise ValueError("'vector_bytes' only applies to kind 'cpu'")
        return self

    @property
    def target(self):
        """The strategy for this kind of machine (models/targets): what the cost model and the
        optimizer ask instead of branching on `kind`."""
        from .targets import target_for

        return target_for(self)


# GPU figures: SXM parts, boost clocks. Register and shared-memory fill bandwidths are
# 128 B/clock/SM (shared-memory bank throughput) times SMs times clock; L2 figures are
# published microbenchmark results since NVIDIA does not state them. The register level
# is one thread's 255-register limit, the shared level one block's limit (smem), and
# smem_sm the per-SM pool that occupancy divides. `tensor` is the dense tensor-core peak per
# input dtype with fp32 accumulation (the whitepapers' figures without sparsity).
_GPU = {
    "h100": dict(
        sms=132, clock=1.98e9, smem=227 * 1024, smem_sm=228 * 1024, l2=50 * 2**20, l2_bw=7.0e12, hbm=3.35e12,
        peak=66.9e12, arch="sm_90", tensor={"float16": 989.4e12, "bfloat16": 989.4e12},
        source="NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5: 132 SMs, 256 KB registers/SM, "
        "227 KB shared memory per block, 50 MB L2, 3.35 TB/s HBM3, 66.9 TFLOP/s FP32, 989.4 TFLOP/s dense "
        "FP16/BF16 tensor core); L2 ~7 TB/s from Chips and Cheese's H100 microbenchmarks",
    ),
    "a100": dict(
        sms=108, clock=1.41e9, smem=163 * 1024, smem_sm=164 * 1024, l2=40 * 2**20, l2_bw=5.1e12, hbm=2.039e12,
        peak=19.5e12, arch="sm_80", tensor={"float16": 312e12, "bfloat16": 312e12},
        source="NVIDIA A100 Tensor Core GPU Architecture whitepaper (SXM4 80GB: 108 SMs, 256 KB registers/SM, "
        "163 KB shared memory per block, 40 MB L2, 2.039 TB/s HBM2e, 19.5 TFLOP/s FP32, 312 TFLOP/s dense "
        "FP16/BF16 tensor core; L2 2.3x V100's)",
    ),
    "v100": dict(
        sms=80, clock=1.53e9, smem=96 * 1024, smem_sm=96 * 1024, l2=6 * 2**20, l2_bw=2.155e12, hbm=0.9e12,
        peak=15.7e12, arch="sm_70", tensor={"float16": 125e12},
        source="NVIDIA Tesla V100 GPU Architecture whitepaper (SXM2: 80 SMs, 256 KB registers/SM, 96 KB shared "
        "memory per block, 6 MB L2, 900 GB/s HBM2, 15.7 TFLOP/s FP32, 125 TFLOP/s FP16 tensor core; no BF16; "
        "sm_70 has no mma.sync m16n8k16, so cachetile runs fp16 there on CUDA cores); L2 2155 GB/s from Jia et al., "
        "'Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking' (2018)",
    ),
}


MAX_REGISTERS_PER_THREAD = 255  # every CUDA architecture since Kepler


def _gpu(name: str) -> Hardware:
    g = _GPU[name]
    smem_bw = 128 * g["sms"] * g["clock"]
    return Hardware(
        name=name,
        levels=[
            Level(name="registers", capacity_bytes=MAX_REGISTERS_PER_THREAD * 4, bandwidth_bytes_per_s=smem_bw),
            Level(name="shared", capacity_bytes=g["smem"], bandwidth_bytes_per_s=g["l2_bw"]),
            Level(name="L2", capacity_bytes=g["l2"], bandwidth_bytes_per_s=g["hbm"]),
        ],
        peak_flops=g["peak"],
        kind="gpu",
        gpu=GpuLimits(sms=g["sms"], shared_per_sm_bytes=g["smem_sm"], arch=g["arch"], tensor_flops=g["tensor"]),
        source=g["source"],
    )


# Bytes per cycle per core of the link that fills each cache level on current x86 cores
# (Zen 4 and Golden Cove load two vectors per cycle from L1 and take 64 B/cycle from L2,
# 32 B/cycle from L3); DRAM is taken as 8 B/cycle per core. All are documented
# assumptions: override them with --hardware FILE.json (start from `tune hardware host --json`).
_FILL_BYTES_PER_CYCLE = {1: 64, 2: 32, 3: 8}
_DRAM_BYTES_PER_CYCLE = 8


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def _cpu_flags() -> tuple[set[str], str]:
    flags, vendor = set(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("vendor_id") and not vendor:
                vendor = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return flags, vendor


def _cpu_hz() -> float:
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) * 1e3
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1]) * 1e6
    except (OSError, ValueError):
        pass
    return 2.5e9


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _data_caches(cache_root: str) -> list[tuple[int, int, int | None]]:
    """(level, bytes, ways) of each data or unified cache, innermost first."""
    caches = []
    for index in sorted(Path(cache_root).glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level, size = int((index / "level").read_text()), _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        try:
            ways = int((index / "ways_of_associativity").read_text()) or None
        except (OSError, ValueError):
            ways = None
        caches.append((level, size, ways))
    return sorted(caches)


def host(cache_root: str = "/sys/devices/system/cpu/cpu0/cache", calibrated: bool = True) -> Hardware:
    """Read this machine's data caches from sysfs; the vector register file is the innermost level.

    With `calibrated` (the default), figures measured by `tune hardware host --calibrate` on
    this machine replace the assumed peak, bandwidths and overheads (models/profile.py)."""
    cores = os.cpu_count() or 1
    hz = _cpu_hz()
    flags, vendor = _cpu_flags()
    vec_bytes = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    nregs = 32 if "avx512f" in flags else 16
    # AMD Zen 4 executes 512-bit FMAs on two 256-bit pipes; Intel AVX-512 parts have two 512-bit pipes.
    fma_bytes = 32 if vendor == "AuthenticAMD" else vec_bytes
    peak = cores * hz * 2 * (fma_bytes // 4) * 2
    levels = [Level(name="registers", capacity_bytes=nregs * vec_bytes, bandwidth_bytes_per_s=2 * vec_bytes * hz * cores)]
    for level, size, ways in _data_caches(cache_root):
        bpc = _FILL_BYTES_PER_CYCLE.get(level, 8)
        levels.append(Level(name=f"L{level}", capacity_bytes=size, bandwidth_bytes_per_s=bpc * hz * cores, ways=ways))
    # The outermost cache is filled from DRAM, not from a further cache.
    if len(levels) > 1:
        levels[-1] = levels[-1].model_copy(update={"bandwidth_bytes_per_s": _DRAM_BYTES_PER_CYCLE * hz * cores})
    hardware = Hardware(
        name="host",
        levels=levels,
        peak_flops=peak,
        cores=cores,
        vector_bytes=vec_bytes,
        source=f"{cache_root}, /proc/cpuinfo ({cores} cores at {hz / 1e9:.2f} GHz, {vec_bytes * 8}-bit vectors); "
        "assumed figures: fill bandwidths are per-cycle assumptions documented in models/hardware.py "
        "(tune hardware host --calibrate measures them)",
    )
    if calibrated:
        profile = load_profile(host_key(hardware))
        if profile is not None:
            hardware = apply_profile(hardware, profile)
    return hardware


def host_key(hardware: Hardware) -> str:
    """The profile key of a host preset (models/profile.machine_key)."""
    return machine_key(_cpu_model(), hardware.cores, hardware.vector_bytes,
                       [(lv.name, lv.capacity_bytes) for lv in hardware.levels[1:]])


def apply_profile(hardware: Hardware, profile: Profile, one_core: bool = False) -> Hardware:
    """The hardware with the profile's all-core figures (peak, each level's fill bandwidth,
    overheads), or with `one_core` its one-core figures, times the profile's refit multipliers
    when it has a refit; and the last level's size as calibration found it, where smaller than
    sysfs says."""
    fit = profile.refit
    bandwidth = fit.bandwidth_multipliers if fit else {}

    def figure(f) -> float:
        return f.one_core if one_core else f.all_cores

    levels = [lv.model_copy(update={"bandwidth_bytes_per_s": figure(profile.fill_bandwidth[lv.name])
                                    * bandwidth.get(lv.name, 1.0)})
              if lv.name in profile.fill_bandwidth else lv for lv in hardware.levels]
    if profile.last_level_bytes and profile.last_level_bytes < levels[-1].capacity_bytes:
        levels[-1] = levels[-1].model_copy(update={"capacity_bytes": profile.last_level_bytes})
    refitted = f", refitted on {fit.created} to {fit.records} measured plans" if fit else ""
    return hardware.model_copy(update={
        "levels": levels, "peak_flops": figure(profile.peak_flops) * (fit.peak_multiplier if fit else 1.0),
        "call_seconds": profile.call_seconds * (fit.call_multiplier if fit else 1.0),
        "accumulator_bytes_per_s": figure(profile.accumulator_bandwidth) * bandwidth.get(hardware.levels[0].name, 1.0)
                                   if profile.accumulator_bandwidth else None,  # the register link, as refitted
        "parallel_region_seconds": profile.parallel_region_seconds * (fit.parallel_region_multiplier if fit else 1.0),
        **({"run_start_bytes": figure(profile.run_start_bytes)} if profile.run_start_bytes else {}),
        **({"short_run_start_bytes": figure(profile.short_run_start_bytes)} if profile.short_run_start_bytes else {}),
        **({"run_start_reach": profile.run_start_reach} if profile.run_start_reach else {}),
        **({"short_run_start_reach": profile.short_run_start_reach} if profile.short_run_start_reach else {}),
        **({"band_stall": profile.band_stall} if profile.band_stall else {}),
        **({"tall_band_stall": profile.tall_band_stall, "tall_rows": profile.tall_rows}
           if profile.tall_band_stall and profile.tall_rows else {}),
        **({"stride_stall": profile.stride_stall} if profile.stride_stall else {}),
        **({"fed_share": profile.fed_share} if profile.fed_share else {}),
        **({"copy_vector_seconds": profile.copy_vector_seconds} if profile.copy_vector_seconds else {}),
        **({"copy_element_seconds": profile.copy_element_seconds} if profile.copy_element_seconds else {}),
        **({"handoff_seconds": profile.handoff_seconds} if profile.handoff_seconds else {}),
        **({"shared_line_seconds": profile.shared_line_seconds} if profile.shared_line_seconds else {}),
        **({"fma_chains": profile.fma_chains} if profile.fma_chains else {}),
        "calibrated": profile.created,
        "source": f"/sys/devices/system/cpu (caches), calibrated on {profile.created} in {profile.seconds:.0f} s"
                  f"{refitted} ({profile_path(profile.key)})" + "".join(f"; note: {n}" for n in profile.notes),
    })


def on_cores(hardware: Hardware, cores: int) -> Hardware:
    """The hardware as a kernel running on `cores` of its cores sees it (a benchmark pinned to
    fewer threads): on one core of a calibrated host, the profile's one-core figures, since a
    core alone streams more than its share of L3 and memory; otherwise the peak and every
    level's bandwidth scaled by cores / hardware.cores, as the host preset assumes them."""
    if cores == hardware.cores:
        return hardware
    if not 1 <= cores <= hardware.cores:
        raise InvalidInput(f"cores must be between 1 and {hardware.cores}, got {cores}")
    profile = load_profile(host_key(hardware)) if hardware.calibrated and cores == 1 else None
    if profile is not None:
        return apply_profile(hardware, profile, one_core=True).model_copy(update={"cores": 1})
    share = cores / hardware.cores
    levels = [lv.model_copy(update={"bandwidth_bytes_per_s": lv.bandwidth_bytes_per_s * share}) for lv in hardware.levels]
    accumulators = hardware.accumulator_bytes_per_s and hardware.accumulator_bytes_per_s * share
    return hardware.model_copy(update={"cores": cores, "peak_flops": hardware.peak_flops * share, "levels": levels,
                                       "accumulator_bytes_per_s": accumulators})


PRESETS = ("host", "h100", "a100", "v100")


def preset(name: str) -> Hardware:
    """A named hardware preset: host (read from this machine), h100, a100 or v100."""
    if name == "host":
        return host()
    if name in _GPU:
        return _gpu(name)
    raise InvalidInput(f"unknown hardware {name!r}; expected one of {', '.join(PRESETS)} or a .json file")


def hardware_from(spec: str | dict) -> Hardware:
    """A preset name, a path to a JSON file, or a dict (a `tune --json` document's `hardware` is accepted too)."""
    if isinstance(spec, dict):
        data = spec.get("hardware", spec) if isinstance(spec.get("hardware"), dict) else spec
        with one_line_errors():
            return Hardware.model_validate(data, strict=True)  # as the service: "4096" is not a capacity
    if spec in PRESETS:
        return preset(spec)
    if spec.endswith(".json") or Path(spec).exists():
        return hardware_from(read_json(spec))
    return preset(spec)  # raises with the list of presets


def read_json(path: str):
    """Parse a JSON file, with a one-line error for a missing or malformed file."""
    import json

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
