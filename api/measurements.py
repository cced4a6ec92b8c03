"""The measurement store: every plan autotuning measured, with the hardware profile it was costed
on, in a `measurements` table beside the plan cache (the same SQLite file), for `models.refit`;
and the `tune hardware ... --from-measurements` / `--calibrate` commands that refit and store."""
from __future__ import annotations

import sys
import time

from ..models.errors import InvalidInput
from ..models.hardware import Hardware, host, host_key
from ..models.profile import Refit, load_profile, save_profile
from ..models.refit import MeasuredPlan, enough, fingerprint, refit, refit_profile
from .cache import PlanCache, default_path
from .progress import progress_bar
from .report import format_calibration, format_hardware


class MeasurementStore(PlanCache):
    """Measured plans, appended; read back by the fingerprint of the hardware they ran on."""

    TABLES = PlanCache.TABLES + (
        "CREATE TABLE IF NOT EXISTS measurements (id INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL, "
        "record TEXT NOT NULL, created REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS measurements_by_machine ON measurements (fingerprint)",
    )

    def add(self, records: list[MeasuredPlan]) -> None:
        now = time.time()
        rows = [(fingerprint(r.hardware), r.model_copy(update={"created": r.created or now}).model_dump_json(), now)
                for r in records]
        with self._db() as db:
            db.executemany("INSERT INTO measurements (fingerprint, record, created) VALUES (?, ?, ?)", rows)

    def records(self, like: Hardware | None = None) -> list[MeasuredPlan]:
        """Every stored record, or those measured on hardware with `like`'s fingerprint, oldest first."""
        with self._db() as db:
            if like is None:
                rows = db.execute("SELECT record FROM measurements ORDER BY id").fetchall()
            else:
                rows = db.execute("SELECT record FROM measurements WHERE fingerprint = ? ORDER BY id",
                                  (fingerprint(like),)).fetchall()
        return [MeasuredPlan.model_validate_json(row[0]) for row in rows]


def stored_records(like: Hardware) -> list[MeasuredPlan]:
    """The measured plans in the default store (the plan cache's file) taken on a machine like `like`."""
    return MeasurementStore(default_path()).records(like=like)


def format_fit(fit: Refit, name: str) -> str:
    """What a refit changed, and how well the model fits the measurements before and after."""
    def rho(value):
        return "-" if value is None else f"{value:.2f}"

    multipliers = ", ".join(f"{level} x{m:.3g}" for level, m in fit.bandwidth_multipliers.items())
    return "\n".join([
        f"refitted {name!r} to {fit.records} measured plans:",
        f"  peak x{fit.peak_multiplier:.3g}; bandwidths {multipliers}; parallel region "
        f"x{fit.parallel_region_multiplier:.3g}, call x{fit.call_multiplier:.3g}",
        f"  predicted/measured: median {fit.median_ratio_before:.3g} -> {fit.median_ratio_after:.3g}, "
        f"rms of ln {fit.rms_log_error_before:.3g} -> {fit.rms_log_error_after:.3g}, "
        f"Spearman {rho(fit.spearman_before)} -> {rho(fit.spearman_after)}",
    ])


def refit_command(hardware: Hardware, as_json: bool = False) -> int:
    """`tune hardware NAME --from-measurements` for any NAME but host: refit NAME to the
    measurement store and print the fitted hardware (--json: the hardware file on stdout, the
    summary on stderr, so `> fitted.json` gives a file for --hardware)."""
    fit = refit(hardware, stored_records(hardware))
    if as_json:
        print(format_fit(fit, hardware.name), file=sys.stderr)
        print(fit.hardware.model_dump_json(indent=2))
    else:
        print(format_fit(fit, hardware.name) + "\n\n" + format_hardware(fit.hardware))
    return 0


def host_profile_command(calibrate: bool, from_measurements: bool, as_json: bool = False) -> int:
    """`tune hardware host` with --calibrate, --from-measurements or both: measure this machine
    (--calibrate) or take its stored profile, refit the profile to the plans measured here
    (--from-measurements: models/refit.refit_profile), and store it, so the host preset uses it
    from then on. --json prints the profile (the refit's summary on stderr)."""
    assumed = host(calibrated=False)
    # Check the measurements before spending a minute calibrating.
    records = enough(stored_records(assumed), assumed) if from_measurements else []
    if calibrate:
        from ..backends.calibrate import calibrate as measure  # TVM loads only here

        with progress_bar("calibrate") as bar:
            profile = measure(bar)
    else:
        profile = load_profile(host_key(assumed))
        if profile is None:
            raise InvalidInput("the refit adjusts this machine's calibration profile, and it has none: run "
                               "`tune hardware host --calibrate --from-measurements`")
    fit = None
    if from_measurements:
        profile, fit = refit_profile(profile, assumed, records)
    path = str(save_profile(profile))
    summary = format_fit(fit, "host") if fit else ""
    if as_json:
        if summary:
            print(summary, file=sys.stderr)
        print(profile.model_dump_json(indent=2))
    elif calibrate:
        print(format_calibration(profile, assumed, path) + (f"\n\n{summary}" if summary else ""))
    else:
        print(f"{summary}\nprofile {path}\n\n{format_hardware(host())}")
    return 0
