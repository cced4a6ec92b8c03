"""The plan cache: finished `tune --json` documents keyed by PlanRequest.cache_key, in SQLite.

Each call opens its own connection, so threads and processes may share one
file; WAL lets readers proceed while a writer commits, and a busy timeout
waits out another writer's lock instead of failing.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..models.errors import InvalidInput


def default_path() -> Path:
    """$CACHETILE_CACHE, else ~/.cache/cachetile/plans.sqlite."""
    env = os.environ.get("CACHETILE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "cachetile" / "plans.sqlite"


BUSY_SECONDS = 30.0  # how long one call waits out other writers before failing


def _retry_while_locked(create) -> None:
    """Run `create`, retrying while the file is locked. Switching a new file to WAL needs an
    exclusive lock, and SQLite answers "database is locked" at once there, without waiting in
    its busy handler, when another process is opening the same new file."""
    deadline = time.monotonic() + BUSY_SECONDS
    pause = 0.005
    while True:
        try:
            return create()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 0.2)


class PlanCache:
    """A persistent map from cache key to plan document."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._created = False  # the file is made on first use, not when the app is built

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        if not self._created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _retry_while_locked(self._create)
            self._created = True
        db = sqlite3.connect(self.path, timeout=BUSY_SECONDS)
        try:
            with db:  # one transaction, committed on success
                yield db
        finally:
            db.close()

    def _create(self) -> None:
        with sqlite3.connect(self.path, timeout=BUSY_SECONDS) as db:  # both statements are idempotent under races
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS plans "
                       "(key TEXT PRIMARY KEY, document TEXT NOT NULL, created REAL NOT NULL)")
        db.close()

    def check(self) -> None:
        """Raise InvalidInput, in one line, unless the file is (or can become) a plan cache: a
        directory, a file that is not SQLite or an unwritable place fails here, not on every request."""
        try:
            len(self)
            self.put("cachetile-check", "")
            with self._db() as db:
                db.execute("DELETE FROM plans WHERE key = ?", ("cachetile-check",))
        except (sqlite3.Error, OSError) as exc:
            self._created = False
            raise InvalidInput(f"--cache {self.path} is not a usable SQLite plan cache: {exc}") from None

    def get(self, key: str) -> str | None:
        """The cached document, or None."""
        with self._db() as db:
            row = db.execute("SELECT document FROM plans WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, document: str) -> str:
        """Store a document unless one is already there; returns the stored one, so racing writers agree."""
        with self._db() as db:
            db.execute("INSERT OR IGNORE INTO plans VALUES (?, ?, ?)", (key, document, time.time()))
            return db.execute("SELECT document FROM plans WHERE key = ?", (key,)).fetchone()[0]

    def __len__(self) -> int:
        with self._db() as db:
            return db.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
