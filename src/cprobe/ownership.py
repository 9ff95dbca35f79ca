"""Never delete or overwrite what cprobe did not write: where a run or sweep may write, what a failed start removes,
and which ``latest`` links cprobe moves.

**A directory cprobe wrote** (:func:`written_by_cprobe`) holds one of cprobe's own records: a job's ``status.json``
(a JSON object with ``state`` and ``started``); a Hydra record composed with cprobe's callback — a run's
``.hydra/hydra.yaml`` or a sweep's ``multirun.yaml`` whose ``hydra.callbacks`` name :data:`CALLBACK`; or a SLURM
sweep's manifest, ``.slurm/sweep.json``. A run or sweep directory the user names must be new, empty or written by
cprobe (:func:`check_target`); any other is refused before anything is written there.

**What a failed start removes** (:class:`Made`): recorded *before* the directory is created — which of the directory
and its parents did not exist, and for a directory that existed, the entries it held and the files Hydra writes over
at a start (:data:`REWRITTEN`). :func:`undo` removes the directory only when this process made it, each parent it
made only while that parent is empty, and in a directory that existed only the entries that were not there before,
and puts those files back as they were: an earlier run's record stays its own. ``latest`` goes back to where it
pointed.

**``latest``** is a symlink to a sibling's name (``latest -> 2024-05-01_12-00-00``): only such a link is replaced or
removed; a file, a directory or a link elsewhere named ``latest`` is left and not linked."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from cprobe.errors import CprobeError
from cprobe.io import TMP_SUFFIX, atomic_write_bytes, read_json
from cprobe.paths import LATEST

log = logging.getLogger("cprobe")

CALLBACK = "cprobe.callbacks.AggregateResults"
"""The Hydra callback every cprobe config runs: its name in a ``.hydra/hydra.yaml`` or ``multirun.yaml`` marks a
record cprobe composed."""

MADE: dict[Path, Made] = {}
"""What this process made for each run or sweep directory it claimed (by :func:`key`): the pipeline undoes it when a
single run's config is refused, the search and the SLURM launcher when nothing was started."""


def key(path: Path | str) -> Path:
    """``path`` absolute and normalised, as Hydra names a job's output dir (``hydra.runtime.output_dir``)."""
    return Path(os.path.abspath(path))


# ----------------------------------------------------------------------------------------------- recognising
def _composed_by_cprobe(path: Path) -> bool:
    """Whether the Hydra record ``path`` (``hydra.yaml`` or ``multirun.yaml``) was composed with cprobe's callback."""
    import yaml

    try:
        node = yaml.safe_load(path.read_text())
        callbacks = node["hydra"]["callbacks"] or {}
        return any(isinstance(c, dict) and c.get("_target_") == CALLBACK for c in callbacks.values())
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return False


def written_by_cprobe(d: Path) -> bool:
    """Whether directory ``d`` holds one of cprobe's own records (the module doc's rule)."""
    d = Path(d)
    status = read_json(d / "status.json") or {}
    if "state" in status and "started" in status:
        return True
    if read_json(d / ".slurm" / "sweep.json") is not None:
        return True
    return _composed_by_cprobe(d / ".hydra" / "hydra.yaml") or _composed_by_cprobe(d / "multirun.yaml")


def check_target(d: Path, setting: str, named: str = "") -> None:
    """A one-line :class:`CprobeError` unless directory ``d`` (what ``setting`` names; ``named``: how the error names
    it, if not ``setting=d``) is new, empty or written by cprobe: a run never writes over files it did not write."""
    d = Path(d)
    if not d.exists() and not d.is_symlink():
        return
    named = named or f"{setting}={d}" + (f" ({key(d)})" if str(key(d)) != str(d) else "")
    if not d.is_dir():
        raise CprobeError(f"{named} is not a directory; pick a new or empty directory")
    entries = sorted(p.name for p in d.iterdir())
    if entries and not written_by_cprobe(d):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise CprobeError(f"{named} holds files cprobe did not write ({shown}); cprobe writes only into a new or empty "
                          f"directory or one it wrote before: pick another {setting}")


# ----------------------------------------------------------------------------------------------- what was made
REWRITTEN = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "cprobe.log", "multirun.yaml")
"""What Hydra writes over in a run's (sweep's) directory before cprobe's job can refuse its config: the job's record
and log (``hydra.job.name`` is ``cprobe``), a sweep's ``multirun.yaml``."""


@dataclass
class Made:
    """A run or sweep directory and what this process made of it (recorded before the directory was created)."""

    directory: Path
    parents: tuple[Path, ...] = ()  # its ancestors that did not exist, outermost first
    before: frozenset[str] | None = None  # the entries it held when it existed; None: made here
    linked: bool = False  # whether this process pointed ``latest`` at it
    latest_before: str | None = None  # where ``latest`` pointed before
    kept: dict[str, bytes] = field(default_factory=dict)  # the files of REWRITTEN it held, as they were


def record(d: Path) -> Made:
    """What creating ``d`` (with its parents) will make: call it before the directory is created."""
    d = key(d)
    parents = tuple(p for p in reversed(d.parents) if not p.exists())
    if d.is_dir():
        return Made(d, parents, frozenset(p.name for p in d.iterdir()),
                    kept={n: (d / n).read_bytes() for n in REWRITTEN if (d / n).is_file()})
    return Made(d, parents)


def undo(made: Made) -> None:
    """Remove what ``made`` says this process made (the module doc), and point ``latest`` back."""
    d = made.directory
    if made.linked:
        link = d.parent / LATEST
        try:
            if is_cprobe_link(link) and os.readlink(link) == d.name:
                if made.latest_before is not None:
                    point(link, made.latest_before)
                else:
                    link.unlink()
        except OSError:
            pass
    if made.before is None:
        shutil.rmtree(d, ignore_errors=True)
    elif d.is_dir():
        for p in d.iterdir():
            if p.name not in made.before:
                remove(p)
        for name, data in made.kept.items():  # what Hydra wrote over, put back
            atomic_write_bytes(d / name, data)
    for parent in reversed(made.parents):  # innermost first, each only while empty
        try:
            parent.rmdir()
        except OSError:
            break


def remove(p: Path) -> None:
    """Delete file, link or directory tree ``p`` (best effort); the callers decide that cprobe wrote it."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------- latest
def is_cprobe_link(link: Path) -> bool:
    """Whether ``link`` is a symlink to a sibling's name: what cprobe writes as ``latest`` (it may replace it)."""
    if not link.is_symlink():
        return False
    to = os.readlink(link)
    return bool(to) and to not in (".", "..") and os.sep not in to and (os.altsep or os.sep) not in to


def point(link: Path, to: str) -> bool:
    """Symlink ``link`` -> ``to`` (a sibling's name), replaced atomically through a temporary link of a fresh name;
    False (nothing changed) when ``link`` exists and is not a link cprobe made."""
    if (link.exists() or link.is_symlink()) and not is_cprobe_link(link):
        log.info("not linking %s -> %s: %s is not a link cprobe made", link, to, link)
        return False
    while True:
        tmp = link.parent / f".{link.name}.{secrets.token_hex(6)}{TMP_SUFFIX}"
        try:
            os.symlink(to, tmp)  # fails on an existing name: never replaces anything
            break
        except FileExistsError:
            continue
    try:
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return True


def link_latest(made: Made) -> None:
    """``<parent>/latest`` -> ``made.directory`` (best effort: never fails a run), noted in ``made`` for :func:`undo`."""
    d = made.directory
    link = d.parent / LATEST
    try:
        before = os.readlink(link) if is_cprobe_link(link) else None
        if point(link, d.name):
            made.linked, made.latest_before = True, before
    except OSError as e:  # e.g. a filesystem without symlinks
        log.debug("could not link %s -> %s: %s", link, d, e)


# ----------------------------------------------------------------------------------------------- collected outputs
OUTPUTS = ".cprobe-outputs.json"
"""In a directory ``cprobe collect`` / ``cprobe report`` wrote into (not a run or sweep of cprobe's own): the files it
wrote there, relative to it. Only those — or anything in a directory :func:`written_by_cprobe` — are written over."""


def owned_outputs(d: Path) -> set[str]:
    return {str(n) for n in (read_json(Path(d) / OUTPUTS) or {}).get("files", [])}


def check_overwrite(d: Path, names: list[str], what: str) -> None:
    """A one-line :class:`CprobeError` when writing ``names`` (relative to ``d``) would replace a file cprobe did not
    write: one that exists in ``d``, which is not a run or sweep of cprobe's, and is not in ``d``'s :data:`OUTPUTS`."""
    d = Path(d)
    if written_by_cprobe(d):
        return
    owned = owned_outputs(d)
    foreign = sorted(n for n in names if (d / n).exists() and n not in owned)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise CprobeError(f"{what} would overwrite {d / foreign[0]}{more}, which cprobe did not write; move it away "
                          "or pick another directory")


def note_outputs(d: Path, names: list[str]) -> None:
    """Add ``names`` to ``d``'s :data:`OUTPUTS` (nothing in a run or sweep of cprobe's own: those are cprobe's)."""
    from cprobe.io import write_json

    d = Path(d)
    if written_by_cprobe(d):
        return
    write_json(d / OUTPUTS, {"files": sorted(owned_outputs(d) | set(names))})
