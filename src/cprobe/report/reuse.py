"""`cprobe collect` again over what it collected: a study's report whose table, code and libraries are unchanged is
copied from the last collect instead of drawn again.

A study's report (its paper tables and figures) is a function of its table alone where the task declares so (the
capability ``report_from_table``, :data:`cprobe.tasks.CAPABILITIES`). Each collect writes :data:`MANIFEST` beside
its outputs: per report folder, the :func:`key` it was drawn under and the SHA-256 of every file it wrote. The next
collect over the same directory copies a report whose key is the same and whose files are all there, byte for byte
as written; anything else (a new job, an edited source file of cprobe or of the task's module, another pandas or
matplotlib, a figure the user deleted or edited) draws it again. Copying 20 files costs milliseconds; drawing a
study's figures, seconds (the README's nine studies: ~25 s on a CI core).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from cprobe.io import parquet_bytes, read_json, write_json

PACKAGE = Path(__file__).resolve().parents[1]
"""cprobe's sources."""
MANIFEST = ".cprobe-reports.json"
"""{report folder (relative, "" for the directory itself): {"key": key, "files": {name: sha256}}}."""
LIBRARIES = ("matplotlib", "pandas", "numpy", "pyarrow")
"""What draws and writes a report besides cprobe: their versions are part of the key."""
ENV = ("CPROBE_STRICT_FIGURES",)
"""Environment variables a report reads (the strict caption check): part of the key."""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def _tree_digest(root: str) -> str:
    """SHA-256 over every ``.py`` file under ``root`` (path and bytes), once per process."""
    h = hashlib.sha256()
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(f for f in files if f.endswith(".py")):
            p = Path(top, f)
            h.update(os.path.relpath(p, root).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def code_digest(module: ModuleType) -> str:
    """What the report's code is: cprobe's sources, the task module's own file where it lives elsewhere (a plugin's),
    and the versions of :data:`LIBRARIES`."""
    from importlib.metadata import PackageNotFoundError, version

    parts = [_tree_digest(str(PACKAGE))]
    own = getattr(module, "__file__", None)
    if own and not Path(own).resolve().is_relative_to(PACKAGE):
        parts.append(_tree_digest(str(Path(own).parent)) if Path(own).name == "__init__.py" else _sha(Path(own)))
    for lib in LIBRARIES:
        try:
            parts.append(f"{lib}={version(lib)}")
        except PackageNotFoundError:
            parts.append(f"{lib}=-")
    return "|".join(parts)


def key(study: str, table: pd.DataFrame, module: ModuleType) -> str | None:
    """The key a report of ``study`` over ``table`` is drawn under; None when the table cannot be written as Parquet
    (it is then always drawn)."""
    try:
        data = parquet_bytes(table)
    except (TypeError, ValueError, ImportError):  # a column Parquet cannot hold
        return None
    h = hashlib.sha256()
    for part in (study, code_digest(module), *(f"{v}={os.environ.get(v, '')}" for v in ENV)):
        h.update(part.encode() + b"\0")
    h.update(data)
    return h.hexdigest()


def previous(directory: Path) -> dict[str, Any]:
    """The last collect's :data:`MANIFEST` in ``directory`` ({} when there is none, or it does not read)."""
    try:
        got = read_json(Path(directory) / MANIFEST)
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def reuse(directory: Path, sub: str, report_key: str | None, last: Mapping[str, Any], dest: Path) -> bool:
    """Copy the report ``sub`` of ``directory`` into ``dest`` when the last collect drew it under ``report_key`` and
    every file it wrote is there unchanged; False (nothing copied) otherwise."""
    entry = last.get(sub)
    if report_key is None or not isinstance(entry, dict) or entry.get("key") != report_key:
        return False
    files = entry.get("files")
    if not isinstance(files, dict) or not files:
        return False
    src = Path(directory) / sub
    try:
        if any(not (src / name).is_file() or _sha(src / name) != digest for name, digest in files.items()):
            return False
    except OSError:
        return False
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, dest / name)
    return True


def entry(report_key: str | None, dest: Path) -> dict[str, Any] | None:
    """The :data:`MANIFEST` entry of a report just written into ``dest`` (None without a key)."""
    if report_key is None:
        return None
    files = {str(p.relative_to(dest)): _sha(p) for p in sorted(dest.rglob("*")) if p.is_file()}
    return {"key": report_key, "files": files}


def write(stage: Path, entries: Mapping[str, dict[str, Any] | None]) -> None:
    """The :data:`MANIFEST` of this collect into ``stage`` (reports without a key are left out)."""
    kept = {sub: e for sub, e in entries.items() if e is not None}
    if kept:
        write_json(Path(stage) / MANIFEST, kept)
