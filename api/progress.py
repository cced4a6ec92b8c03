"""The CLI's progress bar for the project's `progress(fraction, message)` callbacks.

It writes to stderr so that `--json` keeps stdout to one document, and by
default shows only on a terminal.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

from tqdm import tqdm

Progress = Callable[[float, str], None]
_STEPS = 1000  # the bar's resolution: fractions are rounded to 0.1%
# No monitor thread: the bars are redrawn by their callbacks, and a process with a thread of its
# own running does not fork its search's parts (optimizer/forked.py).
tqdm.monitor_interval = 0


@contextmanager
def progress_bar(description: str, file: TextIO | None = None, enabled: bool | None = None) -> Iterator[Progress]:
    """Yield a progress callback drawing a bar; `enabled=None` shows it only when `file` is a terminal."""
    bar = tqdm(
        total=_STEPS, desc=description, file=file or sys.stderr, disable=None if enabled is None else not enabled,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}", leave=False,
    )

    def update(fraction: float, message: str) -> None:
        bar.n = min(_STEPS, max(0, round(fraction * _STEPS)))
        bar.set_postfix_str(message, refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


def scaled(progress: Progress | None, start: float, stop: float) -> Progress | None:
    """A callback reporting a sub-task's 0..1 as start..stop of the whole."""
    if progress is None:
        return None
    return lambda fraction, message: progress(start + (stop - start) * fraction, message)
