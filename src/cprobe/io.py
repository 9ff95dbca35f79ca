"""File IO every writer shares: atomic replaces that respect the umask, and checksummed safetensors.

Caches (activations, fitted probes, trained models) must never hand back silently corrupted numbers: a
safetensors header only checks shapes, so a bit flip inside the tensor data would load fine. Every tensor
file written here carries the SHA-256 of each tensor's bytes in its metadata, and :func:`load_tensors`
verifies them; a mismatch (or a missing checksum) reads as "not cached", so the entry is rebuilt.
Directories written by other libraries (a Hugging Face checkpoint) get a ``checksums.json`` manifest
instead (:func:`write_manifest` / :func:`verify_manifest`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

_CHECKSUM_KEY = "cprobe.sha256"
MANIFEST = "checksums.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory and an atomic rename.

    The file gets the permissions a plain ``open(path, "w")`` would (0666 minus the umask), not
    ``mkstemp``'s private 0600, so results are readable by collaborators on a shared machine.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory in ``parent`` (to fill, then rename into place) with the permissions a plain ``mkdir``
    would give (0777 minus the umask), not ``mkdtemp``'s private 0700: a cache shared on a machine stays readable
    by collaborators once the directory is renamed to its final name."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


def _digest(t: torch.Tensor) -> str:
    import torch

    raw = t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def tensor_digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """SHA-256 of each tensor's raw bytes (CPU copy), by name."""
    return {k: _digest(v.detach().cpu()) for k, v in tensors.items()}


def atomic_save_tensors(path: Path, tensors: Mapping[str, torch.Tensor],
                        metadata: Mapping[str, str] | None = None) -> None:
    """A safetensors file with per-tensor checksums in its metadata, written atomically."""
    from safetensors.torch import save

    data = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {**(metadata or {}), _CHECKSUM_KEY: json.dumps(tensor_digests(data), sort_keys=True)}
    atomic_write_bytes(path, save(data, metadata=meta))


def read_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return dict(f.metadata() or {})


def load_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """Tensors from a checksummed safetensors file, or None (with a warning) if it is missing, unreadable,
    written without checksums, or its bytes no longer match them."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        return None
    try:
        meta = read_metadata(path)
        tensors = load_file(path)
    except Exception as e:  # noqa: BLE001 - a torn or corrupt file: rebuild rather than crash
        log.warning("cache file %s is unreadable (%s); rebuilding it", path, e)
        return None
    expected = meta.get(_CHECKSUM_KEY)
    if expected is None:
        log.warning("cache file %s has no checksums (written by an older cprobe); rebuilding it", path)
        return None
    if json.loads(expected) != tensor_digests(tensors):
        log.warning("cache file %s failed its checksum (corrupted on disk); rebuilding it", path)
        return None
    return tensors


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, names: list[str]) -> None:
    """``checksums.json`` in ``directory`` with the SHA-256 of each named file (written last)."""
    directory = Path(directory)
    atomic_write_bytes(directory / MANIFEST,
                       json.dumps({n: file_digest(directory / n) for n in names}, indent=1, sort_keys=True).encode())


def verify_manifest(directory: Path) -> str | None:
    """None when every file in ``directory``'s manifest matches its checksum, else what is wrong."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable checksums.json"
    for name, digest in manifest.items():
        f = directory / name
        if not f.is_file():
            return f"{name} is missing"
        if file_digest(f) != digest:
            return f"{name} failed its checksum"
    return None
