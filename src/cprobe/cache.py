"""Content-addressed caches under ``$CPROBE_CACHE_DIR``: activations (one checksummed safetensors file per
tensor), and the listing/clearing of every cache kind.

Activation entries are keyed by a hash of what determines them (model fingerprint, dtype, the items'
fingerprint, the formatter and readout specs, CACHE_VERSION). Inside an entry every tensor (a site's (n, d)
activations, the readout's scores) is its own file, so a layer sweep or a second probe reuses what an earlier
job extracted and a request for new sites extracts only those. Two jobs of a parallel sweep asking for the
same entry serialize on a file lock; the second finds the files. A file that fails to load, fails its
checksum or has the wrong length is treated as missing and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from cprobe.io import atomic_save_tensors, atomic_write_bytes, load_tensors

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: per-tensor files with checksums, keyed by site and readout
ACTS = "activations"

CACHE_KINDS: dict[str, str] = {
    ACTS: "extracted hidden states and readout scores",
    "models": "self-trained and fine-tuned models",
    "probes": "fitted probes (reliability oracles and interventional probes)",
    "probe_fits": "probing-task probe fits, keyed by the activations' content, the probe config and the seed",
}
"""Every subdirectory of the cache root that cprobe writes, with what it holds."""


def cache_key(fields: Mapping[str, Any]) -> str:
    blob = json.dumps({**fields, "cache_version": CACHE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


class ActivationCache:
    """Per-key directory ``<root>/activations/<key>/`` with ``<tensor name>.safetensors`` and ``meta.json``."""

    def __init__(self, root: Path, enabled: bool = True) -> None:
        self.root = Path(root) / ACTS
        self.enabled = enabled

    def get_or_compute(
        self, fields: Mapping[str, Any], names: Sequence[str], n: int,
        compute: Callable[[list[str]], Mapping[str, Any]],
    ) -> tuple[dict[str, Any], bool]:
        """({name: tensor with n rows}, hit): cached tensors, computing only the missing names.

        ``compute(missing)`` returns at least the missing tensors (it may return more; extras are stored).
        """
        names = list(dict.fromkeys(names))
        if not self.enabled:
            out = compute(names)
            return {k: out[k] for k in names}, False
        d = self.root / cache_key(fields)
        d.mkdir(parents=True, exist_ok=True)
        with FileLock(str(d) + ".lock"):
            have = {k: t for k in names if (t := self._read(d, k, n)) is not None}
            missing = [k for k in names if k not in have]
            if missing:
                new = compute(missing)
                for k, t in new.items():
                    if t.shape[0] != n:
                        raise RuntimeError(f"extraction returned {t.shape[0]} rows for {k}, expected {n}")
                    atomic_save_tensors(d / f"{_safe(k)}.safetensors", {"t": t})
                    have.setdefault(k, t)
                atomic_write_bytes(d / "meta.json", json.dumps({**fields, "n": n}, indent=1, default=str).encode())
            return {k: have[k] for k in names}, not missing

    @staticmethod
    def _read(d: Path, name: str, n: int) -> Any:
        t = load_tensors(d / f"{_safe(name)}.safetensors")
        if t is None or "t" not in t or t["t"].shape[0] != n:
            return None
        return t["t"]


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def cache_entries(root: Path) -> Iterator[tuple[str, str, int, str]]:
    """(kind, name, bytes, description) for every entry of every cache kind."""
    root = Path(root)
    for kind in CACHE_KINDS:
        base = root / kind
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir()):
            if entry.name.startswith(".") or entry.suffix == ".lock":
                continue
            yield kind, entry.name, _size(entry), _describe(kind, entry)


def _describe(kind: str, entry: Path) -> str:
    try:
        if kind == ACTS:
            meta = json.loads((entry / "meta.json").read_text())
            tensors = len(list(entry.glob("*.safetensors")))
            return (f"{meta.get('model')} × {meta.get('dataset')} n={meta.get('n')} "
                    f"{meta.get('formatter', meta.get('position', ''))} tensors={tensors}")
        if kind == "models":
            report = json.loads((entry / "training.json").read_text())
            return ", ".join(f"{k}={report[k]}" for k in ("kind", "heldout_accuracy", "dev_macro_f1") if k in report)
    except (OSError, ValueError):
        return "(incomplete)"
    return ""


def clear_cache(root: Path, what: str = "all") -> int:
    """Delete the entries of one cache kind (or all); returns how many entries were removed."""
    kinds = list(CACHE_KINDS) if what == "all" else [what]
    n = 0
    for kind in kinds:
        p = Path(root) / kind
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
                n += not child.name.endswith(".lock")
    return n
