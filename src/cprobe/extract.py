"""Items + model -> hidden states at the requested sites (cached) and the readout's scores.

:func:`extract_sites` is the general path (any item family, formatter, sites and readout);
:func:`extract` is the agreement studies' use of it: the [MASK] / last-prefix-token state at each layer and
the logits of the (correct, wrong) verb forms (from those two rows of the head: :mod:`cprobe.models.head`), whose
comparison is the model's task accuracy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from cprobe.cache import ActivationCache, Entry
from cprobe.data.base import Dataset
from cprobe.errors import ConfigError, DataError
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import AgreementFormatter, Formatter
from cprobe.models.load import fingerprint
from cprobe.models.readouts import CandidateTokens, Readout, task_accuracy
from cprobe.models.resume import DEVICE_BUDGET, CleanStates
from cprobe.models.sites import Batch, Site

log = logging.getLogger(__name__)

SCORES = "scores"


class Activations:
    """Extracted tensors by name (site keys and ``scores``), held in memory or as the shards of a cache entry.

    :meth:`load` materialises one (n, ...) tensor; :meth:`shards` yields ``(a, b, {name: rows a..b})`` with one shard
    in memory at a time — what streaming fits consume (:func:`fit_streaming`).
    """

    def __init__(self, n: int, entry: Entry | None = None, tensors: dict[str, Tensor] | None = None) -> None:
        self.n, self.entry, self.tensors = n, entry, tensors or {}

    def get(self, name: str) -> Tensor | None:
        """The whole tensor, or None when a shard is missing or corrupt (corrupt shards are deleted)."""
        if name in self.tensors:
            return self.tensors[name]
        assert self.entry is not None
        return self.entry.read(name)

    def load(self, name: str) -> Tensor:
        t = self.get(name)
        if t is None:
            raise RuntimeError(f"{name} is missing or corrupt in {self.entry.dir}; rerun the extraction")
        return t

    def shards(self, names: Sequence[str]) -> Iterator[tuple[int, int, dict[str, Tensor]]]:
        if self.entry is None:
            yield 0, self.n, {k: self.tensors[k] for k in names}
            return
        yield from self.entry.shards(names)


def _fields(adapter: ModelAdapter, items_fingerprint: str, dataset_name: str, formatter: Formatter,
            readout: Readout | None, store: torch.dtype) -> dict[str, Any]:
    f = {"model": adapter.name, "weights": fingerprint(adapter), "dtype": str(adapter.dtype),
         "dataset": dataset_name, "data": items_fingerprint, "formatter": formatter.spec(),
         "readout": readout.spec() if readout is not None else None, "kind": adapter.kind,
         "max_length": adapter.max_length}
    if store != torch.float32:
        f["store_dtype"] = str(store)
    if adapter.bos is not None:  # a causal LM's start token (model.bos): other tokens, other states
        f["bos"] = adapter.bos
    return f


def extract_stream(adapter: ModelAdapter, items: Sequence[Any], items_fingerprint: str, dataset_name: str,
                   formatter: Formatter, sites: Sequence[Site], readout: Readout | None, cache: ActivationCache,
                   progress: bool = True, desc: str = "extract") -> tuple[Activations, bool]:
    """The states at ``sites`` (and the readout's scores, name ``scores``) of ``items``, as :class:`Activations`,
    and whether the cache had them all. Only what the cache lacks is computed, in one pass over the model per
    missing shard, written shard by shard as extraction goes (host memory: one shard); an extraction killed
    midway resumes from its last finished shard."""
    store = cache.store_dtype(adapter.dtype)
    names = [s.key for s in sites] + ([SCORES] if readout is not None else [])
    by_key = {s.key: s for s in sites}
    n = len(items)
    if not cache.enabled or n == 0:
        out = adapter.map(items, formatter, read=list(sites), readout=readout,
                          desc=desc if progress else None, dtype=store)
        tensors = {s.key: out.acts[s] for s in sites}
        if out.scores is not None:
            tensors[SCORES] = out.scores
        return Activations(n, tensors=tensors), False
    entry = cache.entry(_fields(adapter, items_fingerprint, dataset_name, formatter, readout, store), n)
    with entry.lock():
        if entry.shard_rows is None:  # a new entry: shards of about cache.shard_mb across the tensors extracted now
            row = sum(adapter.hidden_size * store.itemsize for _ in sites) + (256 if readout is not None else 0)
            entry.init(max(1, int(cache.shard_mb * 2**20) // max(row, 1)))
        todo: dict[int, list[str]] = {}
        for k in names:
            for j in entry.missing(k):
                todo.setdefault(j, []).append(k)
        hit = not todo
        groups: dict[tuple[str, ...], list[int]] = {}
        for j, ks in sorted(todo.items()):
            groups.setdefault(tuple(ks), []).append(j)
        for ks, shards in groups.items():
            _extract_shards(adapter, items, formatter, [by_key[k] for k in ks if k in by_key],
                            readout if SCORES in ks else None, entry, shards, store, progress, desc)
        if not hit:
            entry.finish()
    return Activations(n, entry=entry), hit


def _extract_shards(adapter: ModelAdapter, items: Sequence[Any], formatter: Formatter, sites: list[Site],
                    readout: Readout | None, entry: Entry, shards: list[int], store: torch.dtype,
                    progress: bool, desc: str = "extract") -> None:
    """One pass of the engine over the rows of ``shards``, each shard written as soon as its rows are done."""
    ranges = entry.ranges()
    windows = [ranges[j] for j in shards]
    bufs: dict[int, dict[str, Tensor]] = {}
    filled: dict[int, int] = {}
    for chunk in adapter.stream(items, formatter, sites, readout=readout, windows=windows, dtype=store,
                                desc=desc if progress else None):
        a, b = windows[chunk.window]
        buf = bufs.get(chunk.window)
        if buf is None:
            buf = bufs[chunk.window] = {s.key: torch.empty(b - a, *chunk.acts[s].shape[1:], dtype=store)
                                        for s in sites}
            if chunk.scores is not None:
                buf[SCORES] = torch.empty(b - a, *chunk.scores.shape[1:], dtype=chunk.scores.dtype)
        local = chunk.rows - a
        for s in sites:
            buf[s.key][local] = chunk.acts[s]
        if chunk.scores is not None:
            buf[SCORES][local] = chunk.scores
        filled[chunk.window] = filled.get(chunk.window, 0) + len(chunk.rows)
        if filled[chunk.window] == b - a:  # the shard is complete: write it and let it go
            for k, t in bufs.pop(chunk.window).items():
                entry.write(k, shards[chunk.window], t)


def extract_sites(adapter: ModelAdapter, items: Sequence[Any], items_fingerprint: str, dataset_name: str,
                  formatter: Formatter, sites: Sequence[Site], readout: Readout | None, cache: ActivationCache,
                  progress: bool = True, desc: str = "extract") -> tuple[dict[Site, Tensor], Tensor | None, bool]:
    """({site: (n, d)} in the cache's storage dtype (float32 by default), readout scores or None, cache hit) for
    ``items``, computing only what the cache lacks (:func:`extract_stream`, then each tensor read whole)."""
    names = [s.key for s in sites] + ([SCORES] if readout is not None else [])
    for attempt in range(2):  # a shard found corrupt while reading is deleted, then recomputed alone
        acts, hit = extract_stream(adapter, items, items_fingerprint, dataset_name, formatter, sites, readout, cache,
                                   progress, desc)
        got = {k: acts.get(k) for k in names if k != SCORES or acts.entry is not None or SCORES in acts.tensors}
        if all(v is not None for v in got.values()):
            return {s: got[s.key] for s in sites}, got.get(SCORES), hit and attempt == 0
    raise RuntimeError(f"the activation cache under {cache.root} keeps failing its checksums; check the disk")


CLEAN_STATES_BUDGET = 2 << 30
"""Bytes of full-sequence clean states kept as one cache entry at most; past it the edited pass runs in full."""


def cached_clean_states(adapter: ModelAdapter, batch: Batch, layer: int, cache: ActivationCache) -> CleanStates | None:
    """The clean full-sequence states (N, T, d) of ``batch``'s rows at ``layer`` (a block output), for an edited pass
    over these items to resume from (:mod:`cprobe.models.resume`), as an activation-cache entry: a sweep's jobs that
    edit the same items at or above ``layer`` (another method, another hyperparameter) compute blocks 1 … ``layer``
    once between them, the first job paying one stopped pass for it. Keyed by the model's name and weights, its
    dtype, the layer and the token ids and attention mask (:meth:`CleanStates.take` checks them again per batch).

    None — the pass runs in full — when passes cannot resume (:attr:`ModelAdapter.can_resume`, layer 0), the cache is
    off (one pass would cost what the full forward does) or the states would pass :data:`CLEAN_STATES_BUDGET`."""
    import hashlib
    import json

    from cprobe.cache import cache_key, checked_entry
    from cprobe.io import atomic_save_tensors, load_tensors

    n, width = batch.input_ids.shape
    size = n * width * adapter.hidden_size * adapter.dtype.itemsize
    if not (adapter.can_resume and layer >= 1 and cache.enabled and n):
        return None
    if size > CLEAN_STATES_BUDGET:
        log.info("edited pass runs in full: the clean states of %d items at layer %d would take %.1f GiB", n, layer,
                 size / 2**30)
        return None
    ids, mask = batch.input_ids.cpu(), batch.attention_mask.cpu()
    tokens = hashlib.sha256(ids.numpy().tobytes() + mask.numpy().tobytes() + str(tuple(ids.shape)).encode())
    fields = {"model": adapter.name, "weights": fingerprint(adapter), "dtype": str(adapter.dtype), "kind": adapter.kind,
              "clean_states_layer": layer, "tokens": tokens.hexdigest()[:20]}

    def build(tmp: Any) -> dict[str, bytes]:
        states = adapter.clean_states(batch, [layer]).states[layer]
        atomic_save_tensors(tmp / "states.safetensors", {"states": states, "input_ids": ids, "attention_mask": mask})
        return {"meta.json": json.dumps({**fields, "dataset": f"clean states at layer {layer}", "n": n}).encode()}

    entry, _ = checked_entry(cache.root / f"clean-{cache_key(fields)}", build,
                             f"the clean states of {adapter.name} at layer {layer} ({n} items)")
    got = load_tensors(entry / "states.safetensors")
    if got is None:  # torn after its manifest was checked: the next job rebuilds it
        return None
    return CleanStates(adapter.name, got["input_ids"], got["attention_mask"],
                       {layer: got["states"].to(adapter.device if size <= DEVICE_BUDGET else "cpu")})


def fit_streaming(estimator: Any, acts: Activations, name: str, labels: Tensor, rows: Tensor | None = None) -> Any:
    """Fit an estimator that merges batches (``update(X, z)``: LEACE, mean difference) from the shards of ``name``,
    one shard in memory at a time; ``rows`` (a boolean mask over all n rows, or indices) restricts the fit."""
    if not callable(getattr(estimator, "update", None)):
        raise ConfigError(f"{type(estimator).__name__} cannot fit from a stream (it has no update(X, z))")
    mask = None
    if rows is not None:
        mask = torch.zeros(acts.n, dtype=torch.bool)
        mask[rows] = True
    for a, b, got in acts.shards([name]):
        X, z = got[name], labels[a:b]
        if mask is not None:
            keep = mask[a:b]
            X, z = X[keep], z[keep]
        if len(X):
            estimator.update(X, z)
    return estimator


@dataclass
class Extraction:
    """The agreement items a model can be scored on, their hidden states and verb-form scores."""

    dataset: Dataset  # items kept (verb forms single tokens of the model's vocabulary, input within its positions)
    acts: dict[int, Tensor]  # layer -> (n, d) float32
    scores: Tensor | None  # (n, 2) logits of (correct, wrong) at the prediction position; None without LM head
    candidates: Tensor  # (n, 2) token ids of (correct, wrong)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> items dropped
    cache_hit: bool = False
    seconds: float = 0.0

    @property
    def task_accuracy(self) -> float | None:
        return task_accuracy(self.scores)

    @property
    def n_dropped(self) -> int:
        return sum(self.dropped.values())


def resolve_layers(spec: str | int | Sequence[int], n_layers: int) -> list[int]:
    """'all' -> 0..L, 'last' -> [L], 'blocks' -> 1..L (block outputs), ints (negative counts from the end: -1 = L)."""
    named = {"all": range(n_layers + 1), "last": [n_layers], "blocks": range(1, n_layers + 1)}
    if isinstance(spec, str) and spec in named:
        return list(named[spec])
    items = [spec] if isinstance(spec, int) and not isinstance(spec, bool) else spec
    if isinstance(items, str) or not isinstance(items, Sequence) or any(isinstance(x, bool) for x in items):
        raise ConfigError(f"layers={spec!r}: use 'all', 'blocks', 'last', an int or a list of ints")
    if not items:
        raise ConfigError("layers=[] selects no layer; use 'all', 'last', an int or a non-empty list")
    try:
        out = sorted({int(l) + (n_layers + 1 if int(l) < 0 else 0) for l in items})
    except (TypeError, ValueError):
        raise ConfigError(f"layers={spec!r}: use 'all', 'blocks', 'last', an int or a list of ints") from None
    bad = [l for l in out if not 0 <= l <= n_layers]
    if bad:
        raise ConfigError(f"layers={spec!r} out of range: this model has layers 0 (embeddings) … {n_layers}")
    return out


def check_layers_spec(spec: Any) -> None:
    """Model-independent checks of a ``layers`` value (syntax, non-empty)."""
    resolve_layers(spec, 10_000)


def agreement_items(adapter: ModelAdapter, ds: Dataset) -> tuple[Dataset, Tensor, dict[str, int]]:
    """Keep the items the model can be scored on: verb forms that are single tokens of its vocabulary (for
    models with an LM head) and inputs that fit its positions. Returns (kept, candidate ids (n, 2), drops)."""
    keep, cands = [], []
    n_tok = n_long = 0
    texts = [" ".join(AgreementFormatter.words(e, adapter)[0]) for e in ds.examples]
    lengths = adapter.token_lengths(texts)
    for i, e in enumerate(ds.examples):
        if lengths[i] > adapter.max_length:
            n_long += 1
            continue
        if adapter.kind == "encoder":
            pair = (0, 0)
        else:
            pair = (adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong))
            if None in pair or pair[0] == pair[1]:
                n_tok += 1
                continue
        keep.append(i)
        cands.append(pair)
    dropped = {k: v for k, v in (("verb forms not single tokens", n_tok),
                                 (f"longer than the model's {adapter.max_length} positions", n_long)) if v}
    for reason, k in dropped.items():
        log.warning("%s: dropped %d/%d items (%s) for %s", ds.name, k, len(ds), reason, adapter.name)
    if not keep:
        raise DataError(f"no item of {ds.name!r} can be scored by {adapter.name!r} ({'; '.join(dropped)})")
    kept = ds if len(keep) == len(ds) else ds.subset(keep)
    return kept, torch.tensor(cands, dtype=torch.long).reshape(-1, 2), dropped


def extract(adapter: ModelAdapter, ds: Dataset, layers: Sequence[int], position: str,
            cache: ActivationCache, progress: bool = True) -> Extraction:
    t0 = time.perf_counter()
    ds, cands, dropped = agreement_items(adapter, ds)
    layers = adapter.check_layers(layers)
    sites = [Site(l, position) for l in layers]
    readout = CandidateTokens(cands) if adapter.kind != "encoder" else None
    acts, scores, hit = extract_sites(adapter, ds.examples, ds.fingerprint(), ds.name,
                                      AgreementFormatter((position,)), sites, readout, cache, progress)
    seconds = time.perf_counter() - t0
    log.info("activations for %s × %s (%d items, layers %s): %s in %.1fs", adapter.name, ds.name, len(ds),
             layers, "cache hit" if hit else "extracted", seconds)
    return Extraction(ds, {s.layer: acts[s] for s in sites}, scores, cands, dropped, hit, seconds)
