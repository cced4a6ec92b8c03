"""The measurement store: every plan autotuning measured, with the hardware profile it was costed
on, in a `measurements` table beside the plan cache (the same SQLite file), for `models.refit`."""
from __future__ import annotations

import time

from ..models.hardware import Hardware
from ..models.refit import Fit, MeasuredPlan, fingerprint, refit
from .cache import PlanCache


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


def format_fit(fit: Fit) -> str:
    """What a refit changed, and how well the model fits the measurements before and after."""
    def rho(value):
        return "-" if value is None else f"{value:.2f}"

    multipliers = ", ".join(f"{name} x{m:.3g}" for name, m in fit.bandwidth_multipliers.items())
    return "\n".join([
        f"refitted {fit.hardware.name!r} to {fit.records} measured plans:",
        f"  peak x{fit.peak_multiplier:.3g} ({fit.hardware.peak_flops / 1e9:.1f} GFLOP/s); bandwidths {multipliers}",
        f"  predicted/measured: median {fit.median_ratio_before:.3g} -> {fit.median_ratio_after:.3g}, "
        f"rms of ln {fit.rms_log_error_before:.3g} -> {fit.rms_log_error_after:.3g}, "
        f"Spearman {rho(fit.spearman_before)} -> {rho(fit.spearman_after)}",
    ])


def refit_command(hardware: Hardware, as_json: bool = False) -> int:
    """`tune hardware NAME --from-measurements`: refit NAME to the measurement store (the plan
    cache's file); prints the fitted hardware (--json: the hardware file on stdout, the summary
    on stderr, so `> fitted.json` gives a file for --hardware)."""
    import sys

    from .cache import default_path

    store = MeasurementStore(default_path())
    fit = refit(hardware, store.records(like=hardware))
    if as_json:
        print(format_fit(fit), file=sys.stderr)
        print(fit.hardware.model_dump_json(indent=2))
    else:
        from .report import format_hardware

        print(format_fit(fit) + "\n\n" + format_hardware(fit.hardware))
    return 0
