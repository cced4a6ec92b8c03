"""Calibration profiles: what `tune hardware host --calibrate` measured on this machine.

A profile is a JSON file in the user's cache directory
($XDG_CACHE_HOME/cachetile/profiles, else ~/.cache/cachetile/profiles;
$CACHETILE_PROFILES overrides), named by a key made of the CPU model, the
core count, the vector width and the cache sizes, so a profile is only ever
applied to the machine it was measured on. The `host` preset applies the
profile when one exists (models/hardware.host); without one, its figures are
the documented assumptions.

A profile may also hold a refit (`tune hardware host --from-measurements`,
models/refit.py): multipliers on its all-core figures that make the cost model
predict the plans autotuning measured on this machine. The measured figures
stay as they were measured; the host preset applies them times the multipliers.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from .errors import InvalidInput

# The runs whose starts the calibration times (backends/calibrate.py) from memory: a micro-kernel
# reads an unpacked input in runs as long as its L1 block's rows, 128 B for 32 floats.
SHORT_RUN_BYTES, RUN_BYTES = 128, 1024


def _points(field: str, what: str, top: float, shares: str):
    """A validator of (x, share) points: x > 0, finite and increasing (`what` names them), each
    share in [0, top] (`shares` says so in the error); the model interpolates between them in log x."""
    def check(points):
        if points is not None:
            xs = [x for x, _ in points]
            if not points or any(not 0 < x < float("inf") for x in xs) or xs != sorted(set(xs)):
                raise ValueError(f"{field} needs {what} > 0, finite and increasing")
            if any(not 0 <= share <= top for _, share in points):
                raise ValueError(f"{field} shares must be {shares}")
        return points
    return AfterValidator(check)


# Checked where a profile loads as well as on the hardware: a hand-edited profile with shares out
# of order is then ignored like any unreadable one (the assumed figures apply) instead of reaching
# the model through apply_profile's model_copy, which validates nothing.
# kernel_costs.run_start_reach: per input size
ReachPoints = Annotated[list[tuple[float, float]] | None, _points("run_start_reach", "sizes", 1.0, "between 0 and 1")]
ShortReachPoints = Annotated[list[tuple[float, float]] | None,
                             _points("short_run_start_reach", "sizes", 1.0, "between 0 and 1")]
# kernel_costs.stride_stall: per row stride
StridePoints = Annotated[list[tuple[float, float]] | None,
                         _points("stride_stall", "strides", sys.float_info.max, "finite and >= 0")]
# simd_cpu.fed_share: per vectors across the register tile, a share of peak
FedPoints = Annotated[list[tuple[float, float]] | None, _points("fed_share", "vectors", 1.0, "between 0 and 1")]
# kernel_costs.band_stall: per rows read in turn
BandPoints = Annotated[list[tuple[float, float]] | None,
                       _points("band_stall", "rows", sys.float_info.max, "finite and >= 0")]


class Figure(BaseModel):
    """One quantity measured on one core and on all cores."""

    one_core: float
    all_cores: float


class Refit(BaseModel):
    """What a refit to measured plans found: multipliers on the calibrated figures, and how well
    the model predicts those plans before and after."""

    created: str = Field("", description="when it was fitted (ISO 8601, UTC)")
    records: int = Field(description="measured plans it was fitted to")
    peak_multiplier: float
    bandwidth_multipliers: dict[str, float] = Field(description="per level's fill bandwidth, innermost first")
    parallel_region_multiplier: float = 1.0
    call_multiplier: float = 1.0
    rms_log_error_before: float = Field(description="root mean square of ln(predicted / measured)")
    rms_log_error_after: float
    median_ratio_before: float = Field(description="median of predicted / measured")
    median_ratio_after: float
    spearman_before: float | None = Field(None, description="rank correlation of predicted and measured seconds")
    spearman_after: float | None = None


class Profile(BaseModel):
    key: str = Field(description="CPU model, cores, vector width and caches this profile was measured on")
    cpu: str
    created: str = Field(description="when it was measured (ISO 8601, UTC)")
    seconds: float = Field(description="how long the calibration took")
    cores: int
    peak_flops: Figure = Field(description="FLOP/s the emitted micro-kernel reaches with its data in L1")
    register_bandwidth: Figure = Field(description="bytes/s of register loads, fitted with peak_flops "
                                                   "from two micro-kernels with different loads per FMA")
    accumulator_bandwidth: Figure | None = Field(
        None, description="bytes/s of the register tile's accumulators stored and reloaded at every k step "
                          "(both ways); none in profiles older than this figure: the register bandwidth")
    stream_bandwidth: dict[str, Figure] = Field(
        description="bytes/s of streaming reads over a working set that lives in each level (or memory)")
    fill_bandwidth: dict[str, Figure] = Field(
        description="per level name, bytes/s of the link filling it: the stream from the next level out "
                    "(memory for the outermost); for the registers, register_bandwidth")
    parallel_region_seconds: float = Field(description="cost of entering one parallel loop (TVM's thread pool)")
    run_start_bytes: Figure | None = Field(
        None, description="what each run start costs a strided stream from memory (runs of RUN_BYTES, one per "
                          "16 KiB row), in bytes of the contiguous stream; none in older profiles: assumed")
    short_run_start_bytes: Figure | None = Field(
        None, description="the same for runs of SHORT_RUN_BYTES (two cache lines); none in older profiles: "
                          "a run's start costs run_start_bytes, but no more than the run")
    last_level_bytes: int | None = Field(
        None, gt=0, description="the last cache's size where its sweep shows it holding less than sysfs says: the "
                                "largest working set (all cores) still streaming at the cache's speed; none: as sysfs says")
    run_start_reach: ReachPoints = Field(
        None, description="per working-set size (bytes over all cores, increasing), the share of the memory figure "
                          "above that a strided stream that large pays, measured on all cores with runs of RUN_BYTES "
                          "(in profiles without short_run_start_reach: the mean over both run lengths); none in "
                          "older profiles: all of it beyond the last cache, none within")
    short_run_start_reach: ShortReachPoints = Field(
        None, description="the same for runs of SHORT_RUN_BYTES; none in older profiles: run_start_reach")
    band_stall: BandPoints = Field(
        None, description="per band of rows (increasing) that a GEMV's micro-kernel reads in turn, walking along "
                          "them, from an array twice the last cache: the time it takes beyond the narrowest band's, "
                          "as a share of that time (all cores); none in older profiles: no stall")
    tall_band_stall: BandPoints = Field(
        None, description="the same for a decode GEMM's micro-kernel: tall_rows rows of A broadcast against two "
                          "vectors of B; none in older profiles: band_stall for every register tile")
    tall_rows: int | None = Field(None, ge=2, description="rows of A under which tall_band_stall was measured")
    stride_stall: StridePoints = Field(
        None, description="per row stride in bytes (increasing), the time an FMA loop reading its vector input's "
                          "rows that far apart from L2 adds over reading them contiguous, as a share of the L1 fill "
                          "link's time for those bytes (all cores); the first point is the contiguous read, 0; none "
                          "in older profiles: no stall")
    fed_share: FedPoints = Field(
        None, description="per register tile width in vectors (increasing), the share of the widest-fed tile's rate "
                          "that a micro-kernel with that many vectors a row reaches when its packed panels stream "
                          "from L2 rather than sit in L1 (all cores); none in older profiles: every width alike")
    call_seconds: float = Field(description="cost of one kernel call that does almost nothing")
    copy_vector_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="seconds one core spends per vector a packing copy moves (its source's rows read in "
                    "vectors, in L2); none in older profiles: a copy costs its streams only")
    copy_element_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="the same per element of a copy that moves one element at a time (a pack that stores "
                    "the source's rows across its innermost dim); none in older profiles: its streams only")
    handoff_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="seconds more per byte one core spends reading what another core has just written than "
                    "reading its own (a quarter of its private cache each); none in older profiles or on one core")
    shared_line_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="seconds per cache line that two cores write in one call (rows split between the cores "
                    "at a boundary inside a line) beyond the same rows split on lines; none in older profiles "
                    "or on one core")
    fma_chains: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="accumulator vectors the FMA pipes need in flight, from a register tile of FMA_CHAINS "
                    "vectors on one core: FMA_CHAINS over the share of the peak it reached (at least FMA_CHAINS); "
                    "none in older profiles: FMA_CHAINS")
    notes: list[str] = Field(default_factory=list,
                             description="what the calibration found doubtful in its own figures, in words")
    refit: Refit | None = Field(None, description="multipliers fitted to measured plans (tune hardware host "
                                                  "--from-measurements), applied on top of the figures above")


def profile_dir() -> Path:
    env = os.environ.get("CACHETILE_PROFILES")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cachetile" / "profiles"


def machine_key(cpu: str, cores: int, vector_bytes: int | None, caches: list[tuple[str, int]]) -> str:
    """A file-name-safe key: CPU model, cores, vector width, cache sizes."""
    parts = [re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") or "cpu", f"{cores}c", f"v{vector_bytes or 0}"]
    parts += [f"{name}-{size // 1024}k" for name, size in caches]
    return "_".join(parts)


def profile_path(key: str) -> Path:
    return profile_dir() / f"{key}.json"


def load_profile(key: str) -> Profile | None:
    """The profile stored for this key, or None (also when the file is unreadable or stale)."""
    path = profile_path(key)
    try:
        profile = Profile.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
    return profile if profile.key == key else None


def save_profile(profile: Profile) -> Path:
    path = profile_path(profile.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(profile.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        raise InvalidInput(f"cannot write the profile {path}: {exc.strerror or exc}") from None
    return path
