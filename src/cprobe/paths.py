"""Where things live: config dir, data dir, cache dir (all overridable by env vars)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def roots(cfg: Mapping[str, Any]) -> tuple[Path, Path]:
    """A job config's (cache root, data root): its ``paths.cache_dir`` and ``paths.data_dir``, else the defaults."""
    p = cfg.get("paths") or {}
    return (Path(p["cache_dir"]) if p.get("cache_dir") else cache_dir(),
            Path(p["data_dir"]) if p.get("data_dir") else data_dir())


_NAME_OK = frozenset("._,=+~@:[]-")


def safe_name(text: object, limit: int = 120) -> str:
    """``text`` made safe as one file or directory name: every character other than letters, digits and
    ``._,=+~@:[]-`` becomes ``_`` (so ``/`` and ``\\`` cannot add path components), leading dots are dropped (no
    hidden files, no ``.``/``..``), and a name longer than ``limit`` is cut and given a stable hash.

    Every config or data string that becomes part of a path goes through this (model names, template and SCM
    names, experiment names in run directories): ``model.name='../../escaped'`` stays inside the run directory.
    """
    import hashlib

    raw = str(text)
    name = "".join(c if c.isalnum() or c in _NAME_OK else "_" for c in raw).lstrip(".") or "_"
    if len(name) > limit:
        name = name[: limit - 9] + "~" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    return name


def relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` as text (``.`` for the root itself): how run and sweep dirs name their jobs."""
    return str(path.relative_to(root)) if path != root else "."


def plain_name(text: str, what: str) -> str:
    """``text`` when it is already a safe single name (see :func:`safe_name`), else a ConfigError: for names that
    select an existing file (a model config, a relation's triples), where rewriting would read another one."""
    from cprobe.errors import ConfigError

    if not text or safe_name(text) != text:
        raise ConfigError(f"{what}={text!r} must be a plain name (letters, digits, {''.join(sorted(_NAME_OK))}), "
                          "not a path")
    return text


def group_config(group: str, name: str, where: str | None = None) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` as a plain mapping, interpolations resolved (as the CLI would without a compute
    group: ``${oc.select:compute.dtype,float32}`` -> ``float32``); an unknown name is a one-line ConfigError listing
    the known ones, naming the setting ``where`` when given."""
    from omegaconf import OmegaConf

    from cprobe.errors import ConfigError

    path = config_dir() / group / f"{plain_name(name, where or group)}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
        what = f"{group} config {name!r} for {where}" if where else f"{group} {name!r}"
        raise ConfigError(f"unknown {what}; choose from {known}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """The process environment with ``values`` set for the block, and as it was afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
