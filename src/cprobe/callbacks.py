"""Hydra callbacks: a ``latest`` link to the newest run/sweep dir, sweep aggregation when a sweep ends, and
failed jobs noted for the CLI's exit code."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from cprobe.paths import LATEST

log = logging.getLogger("cprobe")

FAILED: list[str] = []


def reset() -> None:
    FAILED.clear()


def link_latest(target: Path) -> None:
    """``<parent>/latest`` -> ``target`` (relative), replaced atomically; best effort (never fails a run)."""
    target = Path(target)
    link = target.parent / LATEST
    if target.name == LATEST:
        return
    tmp = target.parent / f".{LATEST}.{os.getpid()}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        os.symlink(target.name, tmp)
        os.replace(tmp, link)
    except OSError as e:  # e.g. a filesystem without symlinks
        tmp.unlink(missing_ok=True)
        log.debug("could not link %s -> %s: %s", link, target, e)


class AggregateResults(Callback):
    """Links ``latest``; on multirun end (in the parent, for every launcher) aggregates the sweep."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        link_latest(Path(config.hydra.run.dir))

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        link_latest(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from cprobe.errors import CprobeError
        from cprobe.pipeline import collect

        sweep_dir = Path(config.hydra.sweep.dir)
        for status in sorted(sweep_dir.rglob("status.json")):
            try:
                s = json.loads(status.read_text())
            except (OSError, ValueError):
                continue
            if s.get("state") != "done":
                FAILED.append(f"{status.parent.name}: {s.get('error', s.get('state'))}")
        try:
            out = collect(sweep_dir, partial=True)
            log.info("sweep table: %s", out)
        except CprobeError as e:
            log.error("could not aggregate the sweep: %s", e)
