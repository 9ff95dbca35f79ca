"""Where things live: config dir, data dir, cache dir (all overridable by env vars)."""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]

LATEST = "latest"
"""The link beside run and sweep dirs that points at the newest one (``outputs/runs/<name>/latest``)."""


def config_dir() -> Path:
    """``$CPROBE_CONFIG_DIR``, else the repo's ``conf/`` (editable install), else the packaged copy."""
    env = os.environ.get("CPROBE_CONFIG_DIR")
    if env:
        return Path(env).resolve()
    repo_conf = _REPO / "conf"
    if (repo_conf / "config.yaml").is_file():
        return repo_conf
    return Path(__file__).resolve().parent / "conf"


def data_dir() -> Path:
    """``$CPROBE_DATA_DIR``, else ``../shared/data`` beside the repo (where CI puts it), else ``./data``."""
    env = os.environ.get("CPROBE_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    shared = _REPO.parent / "shared" / "data"
    return shared if shared.is_dir() else Path("data").resolve()


def cache_dir() -> Path:
    """``$CPROBE_CACHE_DIR``, else ``~/.cache/cprobe`` (never under outputs/, so cleaning runs keeps it)."""
    env = os.environ.get("CPROBE_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "cprobe"
