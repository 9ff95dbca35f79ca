"""Everything cprobe keeps under ``$CPROBE_CACHE_DIR``: one registry of cache kinds, one checksummed scheme, one
model identity, and the sharded activation store.

**Kinds.** Every subdirectory of the cache root is a registered :class:`CacheKind` (:data:`KINDS`): code that writes
to the cache gets its directory from :func:`kind_dir`, which refuses an unregistered name, and ``cprobe cache
info/clear`` list and clear exactly these. Every file is checksummed the one way :mod:`cprobe.io` does it (XXH3 in
the safetensors metadata of tensor files; a ``checksums.json`` manifest for anything else).

**Checked entries** (:func:`checked_entry`): the one store for everything that is a directory of files — tiny
models, cloze tables, CausalGym's per-task parts in a job dir. Built once under the entry's lock, in a temporary
directory whose manifest is written last and which is then renamed into place; verified on every read.

**Model identity.** :func:`model_identity` says what determines a model's outputs without loading it, and never
holds a machine's absolute paths or file times: a moved or copied cache stays valid.

**Activations** (:class:`ActivationCache`): one entry per hash of what determines the states (model fingerprint,
dtype, the items' fingerprint, formatter and readout specs, storage dtype, :data:`CACHE_VERSION`). Inside an entry
every tensor (a site's (n, d) states, the readout's scores) is stored in fixed row ranges, one checksummed
safetensors *shard* per range (``<entry>/<tensor>/<a>-<b>.safetensors``), written as extraction goes: host memory
stays at one shard, a killed extraction resumes from its last finished shard, a layer sweep or a second probe
reuses what an earlier job extracted, and streaming fits read one shard at a time (:meth:`Entry.shards`). Jobs of
a parallel sweep asking for the same entry serialise on a file lock; the second finds the shards. A shard that
fails to load or fails its checksum is deleted and recomputed.

**Concurrency** (:func:`build_lock`). Every cached thing that is expensive to build — activation entries, tiny
models, fine-tuned classifiers, probe fits, reliability oracles and interventional probes, cloze tables — is built
under a per-entry file lock: one job builds, the others wait (logging what they wait for and who holds it) and then
read what it wrote. The lock is ``fcntl.flock`` (the ``filelock`` package) on ``<entry>.lock`` beside the entry:
exclusive across processes of one machine on any local filesystem, and across machines on NFSv4 (and NFSv3 with
lockd: Linux turns flock into POSIX locks there), GPFS/Spectrum Scale, Lustre mounted with ``-o flock`` and
BeeGFS with global file locks. Lustre's ``localflock`` makes it node-local, so two nodes may both build an entry.
Correctness never rests on the lock: every file is written to a temporary name and renamed into place (atomic on
POSIX filesystems and NFS), entries carry checksums and a manifest written last, so a reader never sees a torn
entry; without a working lock an entry may only be built twice. Where ``flock`` is refused (ENOSYS/ENOLCK) cprobe
says so once and goes on without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cprobe.errors import ConfigError, CprobeError
from cprobe.io import (MANIFEST, _ST_DTYPES, TMP_SUFFIX, atomic_save_tensors, atomic_write_bytes, file_digest,
                       has_manifest, make_temp_dir, read_header, read_into, read_json, read_metadata, verify_manifest,
                       write_json, write_manifest, written_tensors)
from cprobe.ownership import remove

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 3: sharded per-tensor files with XXH3 checksums; 2: one file per tensor, SHA-256
ACTS = "activations"
SHARD_MB = 256  # default bytes of one shard across all tensors extracted together


# ----------------------------------------------------------------------------------------------- locks
LOCK_LOG_S = 60.0  # a waiter says again that it is still waiting this often
_NO_LOCKS: set[str] = set()


@contextmanager
def build_lock(lock_path: Path | str, what: str) -> Iterator[None]:
    """Hold the file lock under which one job builds ``what`` (a cache entry) while other jobs — other processes,
    other nodes of a cluster on a shared filesystem — wait. A waiter logs what it waits for and who builds it (pid,
    host, since when), again every :data:`LOCK_LOG_S` seconds, and how long it waited; the caller then checks the
    entry again and reads it. Where the filesystem refuses locks, one warning and no lock (see the module doc)."""
    from filelock import FileLock, Timeout

    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    owner_file = Path(str(lock_path) + ".owner")
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            t0 = time.time()
            who = read_json(owner_file) or {}
            by = (f"pid {who.get('pid')} on {who.get('host')}, building since "
                  f"{time.strftime('%H:%M:%S', time.localtime(who['since']))}" if "since" in who else "another job")
            log.info("waiting for %s: %s is building it (lock %s)", what, by, lock_path)
            while True:
                try:
                    lock.acquire(timeout=LOCK_LOG_S)
                    break
                except Timeout:
                    log.info("still waiting for %s (%.0f s so far; lock %s)", what, time.time() - t0, lock_path)
            log.info("waited %.1f s for %s; reading it", time.time() - t0, what)
    except (NotImplementedError, OSError) as e:  # flock refused by the filesystem
        key = str(lock_path.parent)
        if key not in _NO_LOCKS:
            _NO_LOCKS.add(key)
            log.warning("file locks do not work in %s (%s): concurrent jobs may build the same cache entry twice "
                        "(entries are still written atomically and checksummed)", key, e)
        yield
        return
    wrote = False
    try:
        if not owner_file.exists() or _owner_record(owner_file):  # (a file of another name's is never replaced)
            with suppress(OSError):
                atomic_write_bytes(owner_file, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                           "since": time.time(), "what": what}).encode())
                wrote = True
        yield
    finally:
        if wrote:
            owner_file.unlink(missing_ok=True)
        lock.release()


def _owner_record(path: Path) -> bool:
    """Whether ``path`` is a ``<lock>.owner`` file :func:`build_lock` writes (who builds the entry, since when)."""
    who = read_json(path)
    return who is not None and {"pid", "host", "since"} <= set(who)


# ----------------------------------------------------------------------------------------------- kinds
@dataclass(frozen=True)
class CacheKind:
    """A subdirectory of the cache root: its name, what it holds, and how ``cprobe cache info`` describes an entry."""

    name: str
    description: str
    describe: Callable[[Path], str] | None = None
    files: tuple[str, ...] = ()  # plain JSON files the kind keeps beside its entries (its own names)


KINDS: dict[str, CacheKind] = {}


def register_kind(name: str, description: str, describe: Callable[[Path], str] | None = None,
                  files: tuple[str, ...] = ()) -> CacheKind:
    KINDS[name] = kind = CacheKind(name, description, describe, files)
    return kind


def kind_dir(root: Path, kind: str) -> Path:
    """``<root>/<kind>`` for a registered kind (the only way code names a cache directory)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown cache kind {kind!r}; choose from {sorted(KINDS)}")
    return Path(root) / kind


def _json(entry: Path, name: str) -> dict[str, Any]:
    return json.loads((entry / name).read_text())


def _describe_acts(entry: Path) -> str:
    meta = _json(entry, "meta.json")
    if "clean_states_layer" in meta:  # extract.cached_clean_states: one layer's full-sequence states
        return f"{meta.get('model')} clean states at layer {meta['clean_states_layer']} n={meta.get('n')}"
    tensors = sorted(p.name for p in entry.iterdir() if p.is_dir())
    return (f"{meta.get('model')} × {meta.get('dataset')} n={meta.get('n')} "
            f"{meta.get('formatter', '')} tensors={len(tensors)} shards of {meta.get('shard_rows')} rows")


def _describe_models(entry: Path) -> str:
    report = _json(entry, "training.json")
    return ", ".join(f"{k}={report[k]}" for k in ("kind", "heldout_accuracy", "dev_macro_f1") if k in report)


def _describe_finetuned(entry: Path) -> str:
    if entry.suffix != ".safetensors":
        return ""
    return ("training checkpoint " if ".partial" in entry.name else "") + read_metadata(entry).get("config", "")[:80]


def _describe_cloze(entry: Path) -> str:
    problem = verify_manifest(entry) if entry.is_dir() else "not a directory"
    meta = _json(entry, "meta.json") if (entry / "meta.json").is_file() else {}
    return f"{meta.get('model', '?')} rows={meta.get('rows', '?')}" + (f" ({problem})" if problem else "")


register_kind(ACTS, "extracted hidden states and readout scores (sharded)", _describe_acts)
register_kind("models", "self-trained tiny models (agreement grammar, fact worlds, corpora)", _describe_models)
register_kind("finetuned", "fine-tuned sequence classifiers (CEBaB, LIBERTy) and their training checkpoints",
              _describe_finetuned)
register_kind("probe_fits", "probe fits (the probing study, the reliability and CausalGym oracles and "
              "interventional probes, via_* attack probes), keyed by the activations' content, the probe config and "
              "the seed")
register_kind("cloze", "cloze prediction tables of the prompt-bias study", _describe_cloze)
register_kind("engine", "batch sizes that fit after a CUDA out-of-memory error, per model, length and GPU",
              files=("batch_limits.json",))
register_kind("sae", "sparse autoencoders trained on activations (SAELens folders), keyed by the states' content, "
              "every training setting and the recorded model and hook",
              lambda entry: ", ".join(f"{k}={v:.3g}" for k, v in _json(entry, "quality.json").items()
                                      if k in ("fvu", "l0", "dead_fraction")))
register_kind("rlace", "R-LACE games of a rank chain (warm_start): each rank's relaxed solution and kept projection, keyed "
              "by the states' content and every setting but the rank",
              lambda entry: ", ".join(f"{k}={v}" for k, v in _json(entry, "game.json").items()
                                       if k in ("rank", "steps_run", "stop_reason")))
register_kind("gguf", "GGUF checkpoints dequantised to float32 safetensors folders, keyed by the file's sha256",
              lambda entry: ", ".join(f"{k}={v}" for k, v in _json(entry, "gguf.json").items()
                                       if k in ("file", "architecture", "file_type")))

CACHE_KINDS: dict[str, str] = {k: v.description for k, v in KINDS.items()}
"""Every subdirectory of the cache root that cprobe writes, with what it holds (a view of :data:`KINDS`)."""


def cache_key(fields: Mapping[str, Any]) -> str:
    blob = json.dumps({**fields, "cache_version": CACHE_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# ----------------------------------------------------------------------------------------------- checked entries
def entry_problem(entry: Path, valid: Callable[[Path], str | None] | None = None) -> str | None:
    """None when directory ``entry`` is a complete checked entry — its ``checksums.json`` present and every file it
    lists matching its checksum — that ``valid`` (when given) accepts; else what is wrong (``"missing"``)."""
    entry = Path(entry)
    if not entry.is_dir():
        return "missing"
    problem = verify_manifest(entry)
    return valid(entry) if problem is None and valid is not None else problem


def _publish(entry: Path, build: Callable[[Path], Mapping[str, bytes] | None], checked: Sequence[str] | None) -> None:
    """Fill a temporary directory beside ``entry`` with ``build`` (it writes files there and/or returns {name:
    bytes}), write its manifest (of ``checked``, default every file), then rename it into place."""
    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(entry.parent, prefix=f".{entry.name}.tmp-")  # 0777 - umask, not mkdtemp's 0700
    try:
        for name, data in (build(tmp) or {}).items():
            (tmp / name).write_bytes(data)
        write_manifest(tmp, list(checked) if checked is not None else
                       sorted(p.name for p in tmp.iterdir() if p.is_file()))
        if entry.exists() or entry.is_symlink():
            if entry.is_symlink() or not entry.is_dir() or not has_manifest(entry):
                raise CprobeError(f"{entry} was not written by cprobe (no checksums.json of its own) and is in the "
                                  "way of a cache entry: move it elsewhere")
            shutil.rmtree(entry)  # a checked entry cprobe wrote, corrupted or built for another key
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checked_entry(entry: Path, build: Callable[[Path], Mapping[str, bytes] | None], what: str, *,
                  checked: Sequence[str] | None = None, valid: Callable[[Path], str | None] | None = None,
                  rebuild: bool = False) -> tuple[Path, bool]:
    """The one checked-store primitive: directory ``entry``, built by ``build`` once. Returns (entry, hit).

    *Checksummed*: the entry's ``checksums.json`` (of ``checked``, default every file the build wrote) is verified
    on every read; an entry that fails it, or that ``valid`` rejects (built for another key), is logged and rebuilt.
    *Atomic*: the build fills a temporary directory that is renamed into place after its manifest, so a killed or
    torn build is never read (its leftovers are removed by the next builder). *Locked*: built under the entry's
    :func:`build_lock`, so concurrent builders build it once; the others wait, then read it. ``rebuild`` builds it
    anew whatever is there (a re-run that must not reuse it)."""
    entry = Path(entry)
    if not rebuild and entry_problem(entry, valid) is None:
        return entry, True
    with build_lock(str(entry) + ".lock", what):  # (it makes the entry's parent directory)
        problem = "rebuilt on request" if rebuild else entry_problem(entry, valid)  # again: built while we waited?
        if problem is None:
            return entry, True
        if entry.exists() and not rebuild:
            log.warning("%s (%s): %s; rebuilding it", what, entry, problem)
        for stale in entry.parent.glob(f".{entry.name}.tmp-*{TMP_SUFFIX}"):  # a killed build's; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        _publish(entry, build, checked)
    return entry, False


# ----------------------------------------------------------------------------------------------- model identity
def model_identity(m: Mapping[str, Any]) -> dict[str, Any]:
    """What determines a model's outputs, from its config alone (no loading), free of absolute paths and file times.

    Hub ids by id and revision; installed packages by name, version and subdirectory; local checkpoints by the
    *contents* of their weight and config files (their ``checksums.json`` manifest when they have one, as the
    models cprobe trains do; else a digest of the files, computed once per process); plus kind, dtype and
    max_length. A checkpoint copied or moved elsewhere (a cache on another disk) has the same identity.
    """
    ident: dict[str, Any] = {k: m.get(k) for k in ("name", "source", "kind", "dtype", "max_length", "revision",
                                                   "tiny", "subdir", "gguf_file", "bos")}
    src = m.get("source", "hub")
    if src == "package" and m.get("package"):
        from importlib.metadata import PackageNotFoundError, version

        try:
            ident["package"] = (m["package"], version(str(m["package"]).replace("_", "-")))
        except PackageNotFoundError:
            ident["package"] = (m["package"], None)
    path = Path(str(m.get("path") or "")).expanduser()
    if m.get("path") and path.is_dir():
        ident["files"] = _dir_digest(path)
    elif m.get("path") and path.is_file():  # a GGUF file: its bytes
        ident["files"] = {path.name: file_digest_memo(path)}
    elif m.get("path"):
        ident["path"] = m.get("path")  # a hub id
    return ident


_DIR_DIGESTS: dict[tuple, str] = {}


def _dir_digest(path: Path) -> dict[str, str]:
    """{file name: content digest} of a checkpoint's weights, configs and tokenizer files."""
    if (manifest := read_json(path / MANIFEST)) is not None:
        return manifest
    files = sorted(p for p in path.iterdir()
                   if p.is_file() and p.suffix in (".safetensors", ".json", ".txt", ".model", ".gguf"))
    return {p.name: file_digest_memo(p) for p in files}


def file_digest_memo(path: Path) -> str:
    """:func:`cprobe.io.file_digest` of a checkpoint file, memoised in this process by its path, size and time (the
    stamp only memoises; the identity is the contents)."""
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if stamp not in _DIR_DIGESTS:
        _DIR_DIGESTS[stamp] = file_digest(path)
    return _DIR_DIGESTS[stamp]


# ----------------------------------------------------------------------------------------------- activations
class ActivationCache:
    """Per-key directory ``<root>/activations/<key>/`` with ``meta.json`` and one shard directory per tensor.

    ``dtype`` is how read states are stored: ``float32`` (default), ``bfloat16``, or ``model`` (the model's own
    dtype: a bf16 model's states take half the space and memory). ``shard_mb`` bounds one shard (all tensors
    extracted together), which is also the host memory extraction holds.
    """

    def __init__(self, root: Path, enabled: bool = True, dtype: str = "float32", shard_mb: float = SHARD_MB) -> None:
        if dtype not in ("float32", "bfloat16", "model"):
            raise ConfigError(f"cache.dtype={dtype!r}; choose from ['float32', 'bfloat16', 'model']")
        if shard_mb <= 0:
            raise ConfigError(f"cache.shard_mb must be > 0, got {shard_mb}")
        self.root = kind_dir(root, ACTS)
        self.enabled = enabled
        self.dtype = dtype
        self.shard_mb = shard_mb

    def store_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "model": model_dtype}[self.dtype]

    def entry(self, fields: Mapping[str, Any], n: int) -> Entry:
        return Entry(self.root / cache_key(fields), dict(fields), n)


class Entry:
    """One activation entry: fixed row ranges (``shard_rows`` each, set when the entry is first written), one
    checksummed file per (tensor, range)."""

    def __init__(self, path: Path, fields: dict[str, Any], n: int) -> None:
        self.dir, self.fields, self.n = Path(path), fields, n
        self.shard_rows: int | None = None
        self._load()

    def _load(self) -> None:
        meta = read_json(self.dir / "meta.json") or {}
        if meta.get("n") == self.n and isinstance(meta.get("shard_rows"), int) and meta["shard_rows"] > 0:
            self.shard_rows = meta["shard_rows"]

    @contextmanager
    def lock(self) -> Iterator[Entry]:
        """Hold the entry's file lock (parallel jobs compute it once); the row ranges are re-read inside."""
        self.dir.mkdir(parents=True, exist_ok=True)
        what = (f"the activations of {self.fields.get('model', '?')} on {self.fields.get('dataset', '?')} "
                f"({self.n} items, entry {self.dir.name})")
        with build_lock(str(self.dir) + ".lock", what):
            self._load()  # another job may have fixed the ranges while we waited
            yield self

    def init(self, shard_rows: int) -> None:
        """Fix the row ranges (kept when the entry already has them) and record the entry's fields."""
        if self.shard_rows is None:
            self.shard_rows = max(1, int(shard_rows))
            self.finish()

    def finish(self) -> None:
        write_json(self.dir / "meta.json", {**self.fields, "n": self.n, "shard_rows": self.shard_rows})

    def ranges(self) -> list[tuple[int, int]]:
        if self.shard_rows is None:
            return []
        r = self.shard_rows
        return [(a, min(a + r, self.n)) for a in range(0, self.n, r)] or [(0, 0)]

    def path(self, name: str, j: int) -> Path:
        a, b = self.ranges()[j]
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        return self.dir / safe / f"{a:010d}-{b:010d}.safetensors"

    def has(self, name: str, j: int) -> bool:
        return self.shard_rows is not None and self.path(name, j).is_file()

    def missing(self, name: str) -> list[int]:
        """Ranges of ``name`` not on disk (none when the entry has no ranges yet)."""
        return [j for j in range(len(self.ranges())) if not self.has(name, j)]

    def complete(self, name: str) -> bool:
        return self.shard_rows is not None and not self.missing(name)

    def write(self, name: str, j: int, t: Tensor) -> None:
        a, b = self.ranges()[j]
        if t.shape[0] != b - a:
            raise RuntimeError(f"shard {j} of {name} has {t.shape[0]} rows, expected {b - a}")
        atomic_save_tensors(self.path(name, j), {"t": t}, {"rows": f"{a}-{b}"})

    def _info(self, name: str, j: int) -> tuple[torch.dtype, list[int]] | None:
        try:
            head, _ = read_header(self.path(name, j))
            info = head["t"]
            return getattr(torch, _ST_DTYPES[info["dtype"]]), list(info["shape"])
        except (OSError, ValueError, KeyError):
            return None

    def read_shard(self, name: str, j: int, out: Tensor | None = None) -> Tensor | None:
        """Shard ``j`` of ``name`` (into ``out`` when given), or None after deleting a corrupt file."""
        info = self._info(name, j)
        if info is not None:
            out = torch.empty(info[1], dtype=info[0]) if out is None else out
            if read_into(self.path(name, j), "t", out):
                return out
        self.path(name, j).unlink(missing_ok=True)
        return None

    def read(self, name: str) -> Tensor | None:
        """The whole (n, ...) tensor, read shard by shard straight into one buffer; None when any shard is missing
        or corrupt (corrupt shards are deleted, so the next extraction recomputes just them)."""
        if not self.complete(name):
            return None
        first = self._info(name, 0)
        if first is None:
            self.path(name, 0).unlink(missing_ok=True)
            return None
        out = torch.empty([self.n, *first[1][1:]], dtype=first[0])
        ok = True
        for j, (a, b) in enumerate(self.ranges()):  # every shard is read: a corrupt one is deleted, not just noticed
            if self.read_shard(name, j, out[a:b]) is None:
                ok = False
        return out if ok else None

    def shards(self, names: Sequence[str]) -> Iterator[tuple[int, int, dict[str, Tensor]]]:
        """(a, b, {name: rows a..b}) range by range: what a streaming fit consumes, one shard in memory."""
        for j, (a, b) in enumerate(self.ranges()):
            got = {k: self.read_shard(k, j) for k in names}
            bad = [k for k, v in got.items() if v is None]
            if bad:
                raise RuntimeError(f"shard {a}-{b} of {bad} is missing or corrupt in {self.dir}; rerun the extraction")
            yield a, b, got  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------- listing
def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def cache_entries(root: Path) -> Iterator[tuple[str, str, int, str]]:
    """(kind, name, bytes, description) for every entry of every registered kind."""
    root = Path(root)
    for kind in KINDS.values():
        base = root / kind.name
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir()):
            if entry.name.startswith(".") or entry.suffix in (".lock", ".owner"):
                continue
            yield kind.name, entry.name, _size(entry), _describe(kind, entry)


def _describe(kind: CacheKind, entry: Path) -> str:
    if not owned(kind, entry):
        return "not written by cprobe (`cprobe cache clear` keeps it)"
    if kind.describe is None:
        return ""
    try:
        return kind.describe(entry)
    except (OSError, ValueError, KeyError):
        return "(incomplete)"


def unregistered(root: Path) -> list[str]:
    """Subdirectories of the cache root that no registered kind owns (should be none)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in KINDS)


def _activation_entry(p: Path) -> bool:
    """Whether directory ``p`` is an activation entry (:class:`Entry`): its ``meta.json`` holds the row ranges."""
    meta = read_json(p / "meta.json")
    return meta is not None and isinstance(meta.get("n"), int) and isinstance(meta.get("shard_rows"), int)


def owned(kind: CacheKind, p: Path) -> bool:
    """Whether ``p``, a child of a kind's directory, is an entry cprobe wrote, recognised by its own records: a
    directory with cprobe's ``checksums.json`` (a checked entry, built whole and renamed into place), an activation
    entry (its ``meta.json``; inside it only the checksummed shards are cprobe's), a safetensors file with cprobe's
    checksums, or a JSON file the kind names (``engine/batch_limits.json``)."""
    if p.is_symlink():
        return False
    if p.is_dir():
        return has_manifest(p) or _activation_entry(p)
    return written_tensors(p) or (p.name in kind.files and read_json(p) is not None)


def _leftover(p: Path) -> bool:
    """The temporary of a killed write or build (``….cprobe-tmp``), or a killed builder's ``<entry>.lock.owner``."""
    return p.name.endswith(TMP_SUFFIX) or (p.name.endswith(".lock.owner") and p.is_file() and not p.is_symlink()
                                           and _owner_record(p))


def _files(p: Path) -> list[Path]:
    return [f for f in p.rglob("*") if not f.is_dir() or f.is_symlink()] if p.is_dir() and not p.is_symlink() else [p]


def _clear_activations(entry: Path) -> list[Path]:
    """Remove an activation entry's own files (``meta.json``, its checksummed shards, temporaries); returns the files
    it keeps (any other)."""
    kept = []
    for p in entry.iterdir():
        if p.is_dir() and not p.is_symlink():  # one tensor's shards
            for f in p.iterdir():
                if f.name.endswith(TMP_SUFFIX) or (f.is_file() and not f.is_symlink() and written_tensors(f)):
                    remove(f)
                else:
                    kept += _files(f)
            with suppress(OSError):
                p.rmdir()
        elif p.name == "meta.json" or p.name.endswith(TMP_SUFFIX):
            remove(p)
        else:
            kept += _files(p)
    with suppress(OSError):
        entry.rmdir()
    return kept


def clear_cache(root: Path, what: str = "all") -> tuple[int, list[Path]]:
    """Delete the entries cprobe wrote (:func:`owned`) of one cache kind (or all), and the leftovers of killed builds
    beside them (locks stay: a running job may hold one); returns (how many entries were removed, the files kept:
    anything cprobe did not write is left)."""
    if what != "all" and what not in KINDS:
        raise ConfigError(f"unknown cache kind {what!r}; choose from {['all', *KINDS]}")
    kinds = list(KINDS) if what == "all" else [what]
    n, kept = 0, []
    for name in kinds:
        base = Path(root) / name
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            # a lock beside an entry (``<entry>.lock``, empty) is kept: a running job may hold it
            if child.name.endswith(".lock") and child.is_file() and not child.is_symlink() and not child.stat().st_size:
                continue
            if _leftover(child):
                remove(child)
            elif not owned(KINDS[name], child):
                kept += _files(child)
            elif child.is_dir() and not has_manifest(child):
                kept += _clear_activations(child)
                n += 1
            else:
                remove(child)
                n += 1
    return n, kept
