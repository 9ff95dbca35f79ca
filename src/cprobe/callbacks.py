"""Hydra callbacks: aggregate a sweep when it ends, and note failed jobs for the CLI's exit code."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

log = logging.getLogger("cprobe")

FAILED: list[str] = []


def reset() -> None:
    FAILED.clear()


class AggregateResults(Callback):
    """On multirun end (in the parent process, for every launcher): ``cprobe collect <sweep dir>``."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from cprobe.errors import CprobeError
        from cprobe.results import collect

        sweep_dir = Path(config.hydra.sweep.dir)
        for status in sorted(sweep_dir.rglob("status.json")):
            try:
                s = json.loads(status.read_text())
            except (OSError, ValueError):
                continue
            if s.get("state") != "done":
                FAILED.append(f"{status.parent.name}: {s.get('error', s.get('state'))}")
        try:
            out = collect(sweep_dir)
            log.info("sweep table: %s", out)
        except CprobeError as e:
            log.error("could not aggregate the sweep: %s", e)
