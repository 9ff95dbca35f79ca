"""File IO every writer shares: atomic replaces that respect the umask, and checksummed safetensors.

Caches (activations, fitted probes, trained models) must never hand back silently corrupted numbers: a
safetensors header only checks shapes, so a bit flip inside the tensor data would load fine. Every tensor
file written here carries a checksum of each tensor's bytes in its metadata, and :func:`load_tensors`
verifies them; a mismatch (or a missing checksum) reads as "not cached", so the entry is rebuilt.
Other files (a Hugging Face checkpoint directory, a parquet table) get a ``checksums.json`` manifest
instead (:func:`write_manifest` / :func:`verify_manifest`).

The checksum is XXH3-128 (the ``xxhash`` package): ~6 GB/s on one core against ~0.5 GB/s for SHA-256, so
verifying costs a fraction of reading the file. It detects corruption (torn writes, bit flips), not tampering:
nothing here is ever unpickled, so a forged file can only hand back wrong numbers it could have held anyway.
Files written with the SHA-256 of earlier versions (``cprobe.sha256``) are still verified and read.
Tensors are written straight from their memory (no ``tobytes()`` or serialised copy) and read into one buffer
that the returned tensors share (:func:`load_tensors`), or straight into a caller's tensor (:func:`read_into`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import torch

log = logging.getLogger(__name__)

_CHUNK = 64 << 20  # bytes read and hashed at a time
_CHECKSUM_KEY = "cprobe.xxh3_128"
_OLD_CHECKSUM_KEY = "cprobe.sha256"
MANIFEST = "checksums.json"
TMP_SUFFIX = ".cprobe-tmp"
"""Every temporary file or directory cprobe makes to rename into place ends so (``.<name>.<random>.cprobe-tmp``): a
leftover of a killed write is recognised as cprobe's, and no clean-up ever matches a name a user chose."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory and an atomic rename.

    The file gets the permissions a plain ``open(path, "w")`` would (0666 minus the umask), not
    ``mkstemp``'s private 0600, so results are readable by collaborators on a shared machine.
    """
    atomic_write_with(path, lambda f: f.write(data))


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a state file read back); None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: Any, **dumps: Any) -> None:
    """``data`` as indented JSON (``default=str``; ``dumps``: more ``json.dumps`` options), written atomically."""
    atomic_write_bytes(Path(path), json.dumps(data, indent=1, default=str, **dumps).encode())


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """``df`` as Parquet (no index): the same frame gives the same bytes (the one Parquet encoder: job tables,
    records, caches, resumable parts)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def write_parquet(df: pd.DataFrame, path: Path) -> bytes:
    """``df`` to ``path`` as Parquet, atomically (the one Parquet writer); returns the bytes written."""
    atomic_write_bytes(Path(path), data := parquet_bytes(df))
    return data


def _bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    import torch

    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def fast_digest(data: Any) -> str:
    """XXH3-128 of a bytes-like object (or a contiguous CPU tensor's bytes), as hex."""
    import xxhash

    if not isinstance(data, bytes | bytearray | memoryview):
        data = _bytes(data)
    return xxhash.xxh3_128(data).hexdigest()


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t)).hexdigest()


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _st_code(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    for code, n in _ST_DTYPES.items():
        if n == name:
            return code
    raise ValueError(f"cannot store tensors of dtype {dtype}")


def _header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> tuple[bytes, list[str]]:
    """A safetensors header (8-byte length + JSON padded to 8 bytes) and the order the tensors' bytes follow in:
    widest dtypes first, so every tensor starts aligned to its element size."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    head: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    at = 0
    for k in order:
        t = tensors[k]
        nbytes = t.numel() * t.element_size()
        head[k] = {"dtype": _st_code(t.dtype), "shape": list(t.shape), "data_offsets": [at, at + nbytes]}
        at += nbytes
    blob = json.dumps(head, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return len(blob).to_bytes(8, "little") + blob, order


def atomic_save_tensors(path: Path, tensors: Mapping[str, torch.Tensor],
                        metadata: Mapping[str, str] | None = None) -> None:
    """A safetensors file with per-tensor checksums in its metadata, written atomically from the tensors' memory."""
    data = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {**(metadata or {}), _CHECKSUM_KEY: json.dumps({k: fast_digest(v) for k, v in data.items()}, sort_keys=True)}
    head, order = _header(data, meta)

    def write(f: Any) -> None:
        f.write(head)
        for k in order:
            f.write(_bytes(data[k]))
    atomic_write_with(path, write)


def atomic_write_with(path: Path, write: Any) -> None:
    """``write(file)`` into a temporary file beside ``path``, then an atomic rename (see :func:`atomic_write_bytes`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)  # a new name (O_EXCL)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if os.environ.get("CPROBE_FSYNC", "") not in ("", "0"):  # durable writes (flushed to the disk)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory in ``parent`` (to fill, then rename into place; its name ends in :data:`TMP_SUFFIX`) with the
    permissions a plain ``mkdir`` would give (0777 minus the umask), not ``mkdtemp``'s private 0700: a cache shared on
    a machine stays readable by collaborators once the directory is renamed to its final name."""
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=TMP_SUFFIX, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(the safetensors header of ``path``, the byte offset where tensor data starts); ValueError if malformed."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("truncated header")
        size = int.from_bytes(raw, "little")
        if size > 100 * 2**20:
            raise ValueError("implausible header size")
        blob = f.read(size)
    if len(blob) != size:
        raise ValueError("truncated header")
    return json.loads(blob), 8 + size


def read_metadata(path: Path) -> dict[str, str]:
    return dict(read_header(path)[0].get("__metadata__") or {})


def written_tensors(path: Path) -> bool:
    """Whether ``path`` is a safetensors file carrying cprobe's checksums (:func:`atomic_save_tensors` wrote it)."""
    try:
        meta = read_metadata(path)
    except (OSError, ValueError):
        return False
    return _CHECKSUM_KEY in meta or _OLD_CHECKSUM_KEY in meta


def _check(meta: Mapping[str, str], path: Path) -> tuple[dict[str, str], Any] | None:
    """(expected digests, digest function) from a file's metadata, or None (logged) when it has none."""
    if _CHECKSUM_KEY in meta:
        return json.loads(meta[_CHECKSUM_KEY]), fast_digest
    if _OLD_CHECKSUM_KEY in meta:
        return json.loads(meta[_OLD_CHECKSUM_KEY]), _sha256
    log.warning("cache file %s has no checksums (written by an older cprobe); rebuilding it", path)
    return None


def load_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """Tensors from a checksummed safetensors file, or None (with a warning) if it is missing, unreadable,
    written without checksums, or its bytes no longer match them. One read into one buffer, shared by the tensors."""
    import torch

    path = Path(path)
    if not path.is_file():
        return None
    try:
        head, start = read_header(path)
        check = _check(head.get("__metadata__") or {}, path)
        if check is None:
            return None
        expected, digest = check
        buf = bytearray(path.stat().st_size - start)
        with open(path, "rb") as f:
            f.seek(start)
            if f.readinto(buf) != len(buf):
                raise ValueError("truncated data")
        out = {}
        for k, info in head.items():
            if k == "__metadata__":
                continue
            a, b = info["data_offsets"]
            dtype = getattr(torch, _ST_DTYPES[info["dtype"]])
            if b > len(buf) or a > b:
                raise ValueError("data offsets beyond the file")
            t = torch.frombuffer(buf, dtype=torch.uint8, count=b - a, offset=a) if b > a else \
                torch.empty(0, dtype=torch.uint8)
            t = t.view(dtype).reshape(info["shape"]) if b > a else torch.empty(info["shape"], dtype=dtype)
            out[k] = t
    except Exception as e:  # noqa: BLE001 - a torn or corrupt file: rebuild rather than crash
        log.warning("cache file %s is unreadable (%s); rebuilding it", path, e)
        return None
    if set(expected) != set(out) or any(digest(out[k]) != expected[k] for k in out):
        log.warning("cache file %s failed its checksum (corrupted on disk); rebuilding it", path)
        return None
    return out


def read_into(path: Path, name: str, out: torch.Tensor) -> bool:
    """Read tensor ``name`` of a checksummed safetensors file straight into ``out`` (a contiguous CPU tensor of the
    stored dtype and shape) and verify it; False (with a warning) when the file is missing, corrupt or different."""
    path = Path(path)
    try:
        head, start = read_header(path)
        info = head[name]
        check = _check(head.get("__metadata__") or {}, path)
        if check is None:
            return False
        expected, digest = check
        if info["dtype"] != _st_code(out.dtype) or list(info["shape"]) != list(out.shape) or not out.is_contiguous():
            raise ValueError(f"{name} is {info['dtype']}{info['shape']}, expected {_st_code(out.dtype)}"
                             f"{list(out.shape)}")
        a, b = info["data_offsets"]
        view = _bytes(out)
        if digest is fast_digest:  # read and hash chunk by chunk: each chunk is hashed while still in the CPU cache
            import xxhash

            h = xxhash.xxh3_128()
            with open(path, "rb", buffering=0) as f:
                f.seek(start + a)
                for c in range(0, b - a, _CHUNK):
                    part = view[c: c + _CHUNK]
                    if f.readinto(part) != len(part):
                        raise ValueError("truncated data")
                    h.update(part)
            got = h.hexdigest()
        else:
            with open(path, "rb") as f:
                f.seek(start + a)
                if b > a and f.readinto(view) != b - a:
                    raise ValueError("truncated data")
            got = digest(out)
    except FileNotFoundError:
        return False
    except Exception as e:  # noqa: BLE001 - a torn or corrupt file: rebuild rather than crash
        log.warning("cache file %s is unreadable (%s); rebuilding it", path, e)
        return False
    if got != expected.get(name):
        log.warning("cache file %s failed its checksum (corrupted on disk); rebuilding it", path)
        return False
    return True


def file_digest(path: Path, chunk: int = 8 << 20) -> str:
    """XXH3-128 of a file's bytes (streamed), prefixed ``xxh3:``."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "xxh3:" + h.hexdigest()


def _file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, names: list[str]) -> None:
    """``checksums.json`` in ``directory`` with the checksum of each named file (written last)."""
    directory = Path(directory)
    atomic_write_bytes(directory / MANIFEST,
                       json.dumps({n: file_digest(directory / n) for n in names}, indent=1, sort_keys=True).encode())


_DIGEST = re.compile(r"xxh3:[0-9a-f]{32}|[0-9a-f]{64}")


def has_manifest(directory: Path) -> bool:
    """Whether ``directory`` holds a ``checksums.json`` as :func:`write_manifest` writes it ({file name: checksum}):
    what marks a directory of files cprobe wrote, whole (checked entries)."""
    manifest = read_json(Path(directory) / MANIFEST)
    return manifest is not None and all(isinstance(v, str) and _DIGEST.fullmatch(v) and "/" not in k
                                        for k, v in manifest.items())


def verify_manifest(directory: Path) -> str | None:
    """None when every file in ``directory``'s manifest matches its checksum, else what is wrong."""
    directory = Path(directory)
    if (manifest := read_json(directory / MANIFEST)) is None:
        return "no readable checksums.json"
    for name, digest in manifest.items():
        f = directory / name
        if not f.is_file():
            return f"{name} is missing"
        if (file_digest(f) if digest.startswith("xxh3:") else _file_sha256(f)) != digest:
            return f"{name} failed its checksum"
    return None
