"""Progress for long phases: a bar on a terminal, a periodic one-line log message otherwise (CI, SLURM,
``| tee``), never a flood of carriage-return bars in a log file."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("cprobe")

LOG_EVERY_S = 30.0


def interactive() -> bool:
    return sys.stderr.isatty()


def track(items: Iterable[T], desc: str, enabled: bool = True, total: int | None = None,
          every_s: float = LOG_EVERY_S) -> Iterator[T]:
    """Iterate ``items`` with progress: tqdm when stderr is a terminal, else a log line every ``every_s``."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    if not enabled:
        yield from items
        return
    if interactive():
        from tqdm.auto import tqdm

        yield from tqdm(items, desc=desc, total=total, leave=False)
        return
    start = last = time.monotonic()
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= every_s:
            last = now
            of = f"/{total}" if total else ""
            log.info("%s: %d%s done (%.0f s)", desc, done, of, now - start)
