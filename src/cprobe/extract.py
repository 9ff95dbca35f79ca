"""Items + model -> hidden states at the requested sites (cached) and the readout's scores.

:func:`extract_sites` is the general path (any item family, formatter, sites and readout);
:func:`extract` is the agreement studies' use of it: the [MASK] / last-prefix-token state at each layer and
the log-probabilities of the (correct, wrong) verb forms, whose comparison is the model's task accuracy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from cprobe.cache import ActivationCache
from cprobe.data.base import Dataset
from cprobe.errors import ConfigError, DataError
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import AgreementFormatter, Formatter
from cprobe.models.load import fingerprint
from cprobe.models.readouts import CandidateTokens, Readout, task_accuracy
from cprobe.models.sites import Site

log = logging.getLogger(__name__)

SCORES = "scores"


def extract_sites(adapter: ModelAdapter, items: Sequence[Any], items_fingerprint: str, dataset_name: str,
                  formatter: Formatter, sites: Sequence[Site], readout: Readout | None, cache: ActivationCache,
                  progress: bool = True) -> tuple[dict[Site, Tensor], Tensor | None, bool]:
    """({site: (n, d) float32}, readout scores or None, cache hit) for ``items``, computing only what the
    cache lacks (one pass over the model for all missing sites and the scores)."""
    fields = {"model": adapter.name, "weights": fingerprint(adapter), "dtype": str(adapter.dtype),
              "dataset": dataset_name, "data": items_fingerprint, "formatter": formatter.spec(),
              "readout": readout.spec() if readout is not None else None, "kind": adapter.kind,
              "max_length": adapter.max_length}
    names = [s.key for s in sites] + ([SCORES] if readout is not None else [])
    by_key = {s.key: s for s in sites}

    def compute(missing: list[str]) -> dict[str, Tensor]:
        want = [by_key[k] for k in missing if k in by_key]
        out = adapter.map(items, formatter, read=want, readout=readout if SCORES in missing else None,
                          desc="extract" if progress else None)
        new = {s.key: out.acts[s] for s in want}
        if out.scores is not None:
            new[SCORES] = out.scores
        return new

    got, hit = cache.get_or_compute(fields, names, len(items), compute)
    return {s: got[s.key] for s in sites}, got.get(SCORES), hit


@dataclass
class Extraction:
    """The agreement items a model can be scored on, their hidden states and verb-form scores."""

    dataset: Dataset  # items kept (verb forms single tokens of the model's vocabulary, input within its positions)
    acts: dict[int, Tensor]  # layer -> (n, d) float32
    scores: Tensor | None  # (n, 2) log-probs of (correct, wrong) at the prediction position; None without LM head
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
    if spec == "all":
        return list(range(n_layers + 1))
    if spec == "last":
        return [n_layers]
    if spec == "blocks":
        return list(range(1, n_layers + 1))
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
    lengths = [len(ids) for ids in adapter.tok(texts, add_special_tokens=True)["input_ids"]]
    for i, e in enumerate(ds.examples):
        if lengths[i] > adapter.max_length:
            n_long += 1
            continue
        if adapter.kind == "encoder":
            keep.append(i)
            cands.append((0, 0))
            continue
        c, w = adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)
        if c is None or w is None or c == w:
            n_tok += 1
            continue
        keep.append(i)
        cands.append((c, w))
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
