"""Dataset + model adapter -> hidden states at the requested layers (cached) and the model's task score."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from cprobe.cache import ActivationCache
from cprobe.data.base import Dataset
from cprobe.errors import ConfigError, DataError
from cprobe.models.adapter import ModelAdapter
from cprobe.models.load import fingerprint

log = logging.getLogger(__name__)


@dataclass
class Extraction:
    dataset: Dataset  # examples kept (verb forms single tokens of the model's vocabulary)
    acts: dict[int, Tensor]  # layer -> (n, d) float32
    cand_logits: Tensor | None  # (n, 2): logits of (correct, wrong) at the prediction position; None without LM head
    candidates: list[tuple[int, int]]  # token ids of (correct, wrong) per example
    dropped: int
    cache_hit: bool
    seconds: float

    @property
    def task_accuracy(self) -> float | None:
        return task_accuracy(self.cand_logits)


def task_accuracy(cand_logits: Tensor | None) -> float | None:
    """Share of items where the model prefers the correct verb: P(correct) > P(wrong)."""
    if cand_logits is None:
        return None
    return (cand_logits[:, 0] > cand_logits[:, 1]).float().mean().item()


def resolve_layers(spec: str | int | Sequence[int], n_layers: int) -> list[int]:
    """'all' -> 0..L, 'last' -> [L], ints (negative counts from the end: -1 = L)."""
    if spec == "all":
        return list(range(n_layers + 1))
    if spec == "last":
        return [n_layers]
    items = [spec] if isinstance(spec, int) else list(spec)
    try:
        out = sorted({int(l) + (n_layers + 1 if int(l) < 0 else 0) for l in items})
    except (TypeError, ValueError):
        raise ConfigError(f"layers={spec!r}: use 'all', 'last', an int or a list of ints") from None
    bad = [l for l in out if not 0 <= l <= n_layers]
    if bad:
        raise ConfigError(f"layers={spec!r} out of range: this model has layers 0 (embeddings) … {n_layers}")
    return out


def filter_single_token(adapter: ModelAdapter, ds: Dataset) -> tuple[Dataset, list[tuple[int, int]], int]:
    """Keep items whose correct and wrong verbs are single tokens; count the rest."""
    if adapter.kind == "encoder":
        return ds, [(0, 0)] * len(ds), 0
    keep, cands = [], []
    for i, e in enumerate(ds.examples):
        c, w = adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)
        if c is not None and w is not None and c != w:
            keep.append(i)
            cands.append((c, w))
    dropped = len(ds) - len(keep)
    if dropped:
        log.info("%s: dropped %d/%d items whose verb forms are not single tokens of %s",
                 ds.name, dropped, len(ds), adapter.name)
    if not keep:
        raise DataError(f"no item of {ds.name!r} has single-token verb forms in {adapter.name!r}'s vocabulary")
    return (ds if not dropped else ds.subset(keep)), cands, dropped


def extract(adapter: ModelAdapter, ds: Dataset, layers: Sequence[int], position: str,
            cache: ActivationCache, progress: bool = True) -> Extraction:
    t0 = time.perf_counter()
    ds, cands, dropped = filter_single_token(adapter, ds)
    layers = adapter.check_layers(layers)
    fields = {"model": adapter.name, "weights": fingerprint(adapter), "dtype": str(adapter.dtype),
              "dataset": ds.name, "data": ds.fingerprint(), "position": position, "kind": adapter.kind,
              "max_length": adapter.max_length}
    want = adapter.kind != "encoder"

    def compute(missing: list[int]):
        return adapter.read(ds.examples, missing, position, cands if want else None,
                            desc="extract" if progress else None)

    acts, scores, hit = cache.get_or_compute(fields, layers, len(ds), compute, want_scores=want)
    log.info("activations for %s × %s (%d items, layers %s): %s in %.1fs", adapter.name, ds.name, len(ds),
             layers, "cache hit" if hit else "extracted", time.perf_counter() - t0)
    return Extraction(ds, acts, scores if want else None, cands, dropped, hit, time.perf_counter() - t0)
