"""Progress for long phases, bars or not.

On a terminal with progress on, a tqdm bar. Otherwise — progress off (``progress=false``, ``--smoke``, parallel
launcher workers), or stderr not a terminal (CI, SLURM, ``| tee``) — a one-line log message every
:data:`LOG_EVERY_S` seconds with the count, the elapsed time and an ETA, and a closing line when the phase
logged at least once. So a long step is never silent, and a log file never fills with carriage-return bars.

``track(items, desc)`` wraps an iterable; :class:`Progress` is the same for loops that count by hand
(``with Progress("fine-tune", total=n) as p: ... p.update(k)``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("cprobe")

LOG_EVERY_S = 30.0
"""Seconds between two progress log lines when no bar is shown."""


def interactive() -> bool:
    return sys.stderr.isatty()


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta_message(desc: str, done: int, total: int | None, elapsed: float) -> str:
    """``desc: 7/20 (35%) after 31 s, ETA 58 s`` (``desc: 7 done after 31 s`` without a total)."""
    if not total:
        return f"{desc}: {done} done after {_duration(elapsed)}"
    msg = f"{desc}: {done}/{total} ({100 * done / total:.0f}%) after {_duration(elapsed)}"
    if 0 < done < total:
        msg += f", ETA {_duration(elapsed / done * (total - done))}"
    return msg


class Progress:
    """Counts work done; shows a bar (``bars`` and a terminal) or logs every ``every_s`` seconds with an ETA."""

    def __init__(self, desc: str, total: int | None = None, bars: bool = True,
                 every_s: float | None = None) -> None:
        self.desc, self.total = desc, total
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.done = 0
        self.start = self._last = time.monotonic()
        self._logged = False
        self._bar: Any = None
        if bars and interactive():
            from tqdm.auto import tqdm

            self._bar = tqdm(desc=desc, total=total, leave=False)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._logged = True
            log.info(eta_message(self.desc, self.done, self.total, now - self.start))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._logged and (self.total is None or self.done >= self.total):
            self._logged = False
            log.info("%s: %d done in %s", self.desc, self.done, _duration(time.monotonic() - self.start))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(items: Iterable[T], desc: str, enabled: bool = True, total: int | None = None,
          every_s: float | None = None) -> Iterator[T]:
    """Iterate ``items`` with progress: a bar when ``enabled`` and stderr is a terminal, else a log line every
    ``every_s`` seconds (default :data:`LOG_EVERY_S`) with an ETA — also when ``enabled`` is false."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with Progress(desc, total, bars=enabled, every_s=every_s) as p:
        for item in items:
            yield item
            p.update()
