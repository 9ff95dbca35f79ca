"""The host side of the engine: tokenised item lists, batch plans, prefetching and the CUDA OOM back-off.

- :class:`Encoded`: an item list tokenised once (ragged token ids, one flat tensor + offsets) with every named
  position found by tensor ops (:func:`last_tokens`); :meth:`Encoded.batch` pads any subset of rows into a
  :class:`~cprobe.models.sites.Batch` with a few vectorised gathers, no per-item Python.
- :func:`plan_batches`: rows sorted by token length (longest first, stable), cut into batches of at most
  ``batch_size`` rows and, when a token budget is set, at most ``batch_tokens`` padded tokens (rows × width).
- :class:`Prefetcher`: builds the next batches on a background thread (into pinned memory when the target is a
  CUDA device) so the accelerator never waits for the host; the copy to the device is non-blocking.
- :class:`BatchLimits`: the padded-token size that fitted after a CUDA out-of-memory error, per (model, dtype,
  max_length, device, mode), remembered for the process and persisted in the cache (kind ``engine``) so the next
  job of a sweep starts at a size that fits.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cprobe.io import atomic_write_bytes, read_json
from cprobe.models.sites import Batch

log = logging.getLogger(__name__)

_NO_SPAN = torch.iinfo(torch.int64).max // 4  # start of a padding span: no token ever falls in it


# ----------------------------------------------------------------------------------------------- positions
def last_tokens(offsets: Tensor, mask: Tensor, starts: Tensor, ends: Tensor) -> Tensor:
    """Index of the last token of each character span, or −1, for a padded batch (all tensor ops).

    ``offsets`` (n, T, 2) the tokens' character offsets, ``mask`` (n, T) real tokens, ``starts``/``ends`` (n, W) the
    spans of each row, sorted and disjoint (pad a row's unused spans with :func:`span_tensors`). A token belongs to the
    span holding its last character (special and padding tokens, with empty offsets, to none); a span's position is
    the last token that belongs to it. Returns (n, W) int64.
    """
    n, T = mask.shape
    W = starts.shape[1]
    if W == 0 or T == 0:
        return torch.full((n, W), -1, dtype=torch.long)
    s, e = offsets[..., 0].long(), offsets[..., 1].long()
    real = mask.bool() & (e > s)
    idx = torch.searchsorted(starts.contiguous(), (e - 1).contiguous(), right=True) - 1  # last span starting <= e-1
    ok = real & (idx >= 0)
    idx = idx.clamp(min=0)
    ok &= s < ends.gather(1, idx)
    t = torch.arange(T).expand(n, T)
    out = torch.full((n, W + 1), -1, dtype=torch.long)
    out.scatter_reduce_(1, torch.where(ok, idx, W), torch.where(ok, t, -1), "amax")
    return out[:, :W]


def span_tensors(spans: Sequence[Sequence[tuple[int, int]]]) -> tuple[Tensor, Tensor, Tensor]:
    """(starts (n, W), ends (n, W), counts (n,)) from per-row span lists, unused spans padded so they match nothing."""
    counts = torch.tensor([len(s) for s in spans], dtype=torch.long)
    W = int(counts.max()) if len(spans) else 0
    flat = torch.tensor([x for row in spans for span in row for x in span], dtype=torch.long).reshape(-1, 2)
    starts = torch.full((len(spans), W), _NO_SPAN, dtype=torch.long)
    ends = torch.full((len(spans), W), _NO_SPAN, dtype=torch.long)
    valid = torch.arange(W)[None, :] < counts[:, None]
    starts[valid], ends[valid] = flat[:, 0], flat[:, 1]
    return starts, ends, counts


# ----------------------------------------------------------------------------------------------- encoded lists
@dataclass
class Encoded:
    """A tokenised item list: ragged token ids (``ids`` flat, row i at ``offsets[i]:offsets[i]+lengths[i]``) and,
    per named position, each row's token index (−1: absent)."""

    ids: Tensor
    offsets: Tensor
    lengths: Tensor
    positions: dict[str, Tensor]
    pad_id: int
    pred: str | None = None

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @classmethod
    def from_padded(cls, input_ids: Tensor, mask: Tensor, positions: dict[str, Tensor], pad_id: int,
                    pred: str | None) -> Encoded:
        """From a right-padded (n, T) batch (what a tokenizer returns)."""
        lengths = mask.sum(1).long()
        offsets = torch.zeros(len(lengths), dtype=torch.long)
        if len(lengths) > 1:
            offsets[1:] = lengths.cumsum(0)[:-1]
        return cls(input_ids[mask.bool()].long(), offsets, lengths, {k: v.long() for k, v in positions.items()},
                   int(pad_id), pred)

    @classmethod
    def cat(cls, parts: Sequence[Encoded]) -> Encoded:
        """One list from consecutive parts (positions missing from a part are −1 there)."""
        if len(parts) == 1:
            return parts[0]
        names = list(dict.fromkeys(k for p in parts for k in p.positions))
        lengths = torch.cat([p.lengths for p in parts])
        offsets = torch.zeros(len(lengths), dtype=torch.long)
        if len(lengths) > 1:
            offsets[1:] = lengths.cumsum(0)[:-1]
        pos = {k: torch.cat([p.positions.get(k, torch.full((len(p),), -1, dtype=torch.long)) for p in parts])
               for k in names}
        return cls(torch.cat([p.ids for p in parts]), offsets, lengths, pos, parts[0].pad_id, parts[0].pred)

    def batch(self, idx: Tensor, rows: Tensor | None = None) -> Batch:
        """Rows ``idx`` (indices into this list) right-padded to their longest; ``rows`` are their indices in the
        caller's full item list (default ``idx``)."""
        idx = idx.long()
        lengths = self.lengths[idx]
        width = int(lengths.max()) if len(idx) else 0
        cols = torch.arange(width)
        mask = cols[None, :] < lengths[:, None]
        gather = (self.offsets[idx, None] + cols[None, :]).clamp(max=max(len(self.ids) - 1, 0))
        ids = torch.where(mask, self.ids[gather], self.pad_id) if len(self.ids) else \
            torch.full((len(idx), width), self.pad_id, dtype=torch.long)
        return Batch(ids, mask.long(), {k: v[idx] for k, v in self.positions.items()},
                     idx if rows is None else rows, pred=self.pred)


# ----------------------------------------------------------------------------------------------- planning
def plan_batches(lengths: Tensor, batch_size: int, batch_tokens: int | None = None) -> list[Tensor]:
    """Row indices of each batch: longest rows first (ties in input order), at most ``batch_size`` rows and at most
    ``batch_tokens`` padded tokens (rows × the batch's longest row; a single longer row gets a batch of its own)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(lengths)
    if n == 0:
        return []
    order = torch.sort(lengths.long(), descending=True, stable=True).indices
    if batch_tokens is None:
        return list(order.split(batch_size))
    widths = lengths.long()[order].tolist()
    out, i = [], 0
    while i < n:
        take = max(1, min(batch_size, batch_tokens // max(widths[i], 1), n - i))
        out.append(order[i: i + take])
        i += take
    return out


# ----------------------------------------------------------------------------------------------- prefetching
class Prefetcher:
    """Iterate ``source`` with the next ``depth`` items produced on a background thread.

    Items are ``(tag, Batch)`` pairs; with ``pin`` the batch's tensors are pinned (page-locked) there, so the copy to a
    CUDA device can be non-blocking. An exception raised by ``source`` is re-raised in the consumer; :meth:`close`
    (or leaving the loop early and dropping the iterator) stops the thread.
    """

    def __init__(self, source: Iterable[tuple[Any, Batch]], depth: int = 2, pin: bool = False) -> None:
        self.source, self.depth, self.pin = source, max(1, depth), pin
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _pinned(self, b: Batch) -> Batch:
        if not self.pin:
            return b
        return Batch(b.input_ids.pin_memory(), b.attention_mask.pin_memory(),
                     {k: v.pin_memory() for k, v in b.positions.items()}, b.rows, b.pred,
                     {k: v.pin_memory() for k, v in b.extra.items()})

    def __iter__(self) -> Iterator[tuple[Any, Batch]]:
        q: queue.Queue = queue.Queue(self.depth)
        stop = self._stop
        end = object()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for tag, batch in self.source:
                    if not put((tag, self._pinned(batch))):
                        return
                put(end)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(_Raised(e))

        self._thread = threading.Thread(target=work, name="cprobe-prefetch", daemon=True)
        self._thread.start()
        try:
            while True:
                item = q.get()
                if item is end:
                    return
                if isinstance(item, _Raised):
                    raise item.error
                yield item
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(5)


@dataclass
class _Raised:
    error: BaseException


# ----------------------------------------------------------------------------------------------- OOM back-off
def is_oom(e: BaseException) -> bool:
    """A device out-of-memory error (CUDA's, or any accelerator's that torch reports the same way)."""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def device_label(device: torch.device) -> str:
    """A device's identity for remembered limits: the GPU's name and memory (a shared cache may serve several
    machines), or ``cpu``."""
    if device.type == "cuda":
        i = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(i)
        return f"cuda:{p.name}:{p.total_memory // 2**20}MiB"
    return device.type


_LIMITS: dict[str, int] = {}  # process-wide: key -> padded tokens that fit


class BatchLimits:
    """Padded-token batch sizes known to fit, per key; kept for the process and, with ``path``, in a JSON file
    (the cache's ``engine`` kind) shared by every job of a sweep."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else None

    def _stored(self) -> dict:
        """The limits persisted at ``path`` ({} without a file, or when it is unreadable)."""
        return (read_json(self.path) if self.path is not None else None) or {}

    def get(self, key: str) -> int | None:
        if key not in _LIMITS:
            v = self._stored().get(key)
            if isinstance(v, int) and v > 0:
                _LIMITS[key] = v
        return _LIMITS.get(key)

    def set(self, key: str, tokens: int) -> None:
        tokens = max(1, int(tokens))
        _LIMITS[key] = min(tokens, _LIMITS.get(key, tokens))
        if self.path is None:
            return
        from filelock import FileLock

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.path) + ".lock"):
                known = self._stored()
                known[key] = min(_LIMITS[key], int(known.get(key, _LIMITS[key])))
                atomic_write_bytes(self.path, json.dumps(known, indent=1, sort_keys=True).encode())
        except OSError as e:  # a read-only cache: the limit still holds for this process
            log.debug("could not persist batch limit %s: %s", key, e)
