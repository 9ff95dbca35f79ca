"""Content-addressed activation cache: one safetensors file per layer, atomic and lock-protected.

Key = hash(model fingerprint, dtype, dataset fingerprint, position rule, CACHE_VERSION). Layers are
separate files, so a layer sweep or a second probe reuses what an earlier job extracted, and a
request for new layers only extracts those. Two jobs of a parallel sweep asking for the same entry
serialize on a file lock; the second finds the files and reads them. A file that fails to load or
has the wrong shape is treated as missing and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

log = logging.getLogger(__name__)

CACHE_VERSION = 1
ACTS = "activations"


def cache_key(fields: Mapping[str, Any]) -> str:
    blob = json.dumps({**fields, "cache_version": CACHE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_save_tensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    from safetensors.torch import save

    atomic_write_bytes(path, save({k: v.contiguous() for k, v in tensors.items()}))


def load_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """Tensors from a safetensors file, or None if it is missing or corrupt."""
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        return load_file(path)
    except Exception as e:  # corrupt/truncated file: rebuild rather than crash
        log.warning("cache file %s is unreadable (%s); rebuilding it", path, e)
        return None


class ActivationCache:
    """Per-key directory ``<root>/activations/<key>/`` with ``layer_<l>.safetensors``, ``scores.safetensors``
    and ``meta.json``."""

    def __init__(self, root: Path, enabled: bool = True) -> None:
        self.root = root / ACTS
        self.enabled = enabled

    def get_or_compute(
        self, fields: Mapping[str, Any], layers: Sequence[int], n: int,
        compute: Callable[[list[int]], tuple[dict[int, torch.Tensor], torch.Tensor | None]],
        want_scores: bool = True,
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor | None, bool]:
        """Return ({layer: (n, d)}, candidate logits (n, 2) or None, hit), computing only missing layers
        (and the task scores when ``want_scores`` and they are not cached yet)."""
        if not self.enabled:
            acts, scores = compute(list(layers))
            return acts, scores, False
        d = self.root / cache_key(fields)
        d.mkdir(parents=True, exist_ok=True)
        with FileLock(str(d) + ".lock"):
            have = {l: t for l in layers if (t := self._layer(d, l, n)) is not None}
            scores_t = load_tensors(d / "scores.safetensors")
            scores = scores_t.get("logits") if scores_t else None
            if scores is not None and scores.shape[0] != n:
                scores = None
            missing = [l for l in layers if l not in have]
            hit = not missing and (scores is not None or not want_scores)
            if not hit:
                acts, new_scores = compute(missing or [min(layers)])
                for l, t in acts.items():
                    atomic_save_tensors(d / f"layer_{l}.safetensors", {"h": t})
                    have.setdefault(l, t)
                if new_scores is not None:
                    atomic_save_tensors(d / "scores.safetensors", {"logits": new_scores})
                    scores = new_scores
                atomic_write_bytes(d / "meta.json", json.dumps({**fields, "n": n}, indent=1, default=str).encode())
            return {l: have[l] for l in layers}, scores, hit

    @staticmethod
    def _layer(d: Path, layer: int, n: int) -> torch.Tensor | None:
        t = load_tensors(d / f"layer_{layer}.safetensors")
        if t is None or "h" not in t or t["h"].ndim != 2 or t["h"].shape[0] != n:
            return None
        return t["h"]


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def cache_entries(root: Path) -> Iterator[tuple[str, str, int, str]]:
    """(kind, name, bytes, description) for every activation entry and trained tiny model."""
    for d in sorted((root / ACTS).glob("*/")) if (root / ACTS).is_dir() else []:
        try:
            meta = json.loads((d / "meta.json").read_text())
            desc = f"{meta.get('model')} × {meta.get('dataset')} n={meta.get('n')} position={meta.get('position')}"
        except (OSError, ValueError):
            desc = "(incomplete)"
        layers = len(list(d.glob("layer_*.safetensors")))
        yield "activations", d.name, _size(d), f"{desc} layers={layers}"
    for d in sorted((root / "models").glob("*/")) if (root / "models").is_dir() else []:
        if d.name.startswith("."):
            continue
        yield "model", d.name, _size(d), ""


def clear_cache(root: Path, what: str = "all") -> int:
    n = 0
    for sub in ((ACTS, "models") if what == "all" else (what,)):
        p = root / sub
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
                n += 1
    return n
