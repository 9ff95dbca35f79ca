"""The prompt-bias study's cloze runner: every query through the one model entry point
(:class:`~cprobe.models.formatters.ClozeFormatter` + the :class:`~cprobe.models.readouts.TopK` readout), the top-k
tokens cached per model (cache kind ``cloze``, a checked entry), and the prediction chosen among them afterwards
(stop words, non-words, case), so a change of those reruns no model. ``config`` is the study's
:class:`cprobe.tasks.prompt_bias.Config`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError
from cprobe.io import parquet_bytes
from cprobe.job import JobContext

CACHE_VERSION = 3  # 2: checksummed directories keyed by the model's content identity; 3: they hold the top-k tokens
# The public code's stop words (causalEval utils/constant.py): NLTK's English list and the pieces of contractions.
# Matched exactly (case-sensitive) against the decoded, stripped token, as there.
REFERENCE_STOP_WORDS = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers herself it
its itself they them their theirs themselves what which who whom this that these those am is are was were be been
being have has had having do does did doing a an the and but if or because as until while of at by for with about
against between into through during before after above below to from up down in out on off over under again further
then once here there when where why how all any both each few more most other some such no nor not only own same so
than too very s t can will just don should now d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma
mightn mustn needn shan shouldn wasn weren won wouldn 'll 're 've n't 's 'd 'm '' ``
""".split())


def stop_words(name: str) -> tuple[frozenset[str], bool]:
    """(words, case_sensitive) of a stop-word list: ``reference`` (the public code's 162, exact match) or ``sklearn``
    (scikit-learn's 318 English words, lower-cased match: it holds possible objects such as 'system', 'fire', 'us',
    which can then never be predicted)."""
    if name == "reference":
        return REFERENCE_STOP_WORDS, True
    if name == "sklearn":
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

        return frozenset(ENGLISH_STOP_WORDS), False
    raise ConfigError(f"unknown stop-word list {name!r}; choose from ['reference', 'sklearn']")


def cloze_predictions(adapter: Any, items: Sequence[Any], top_k: int, desc: str | None = None) -> pd.DataFrame:
    """One row per query: the query's indices, the gold object, its ``top_k`` tokens best first (``top``: decoded and
    stripped, as the public code) and which of them are not words (``non_word``: special or punctuation-only
    tokens). Which token is the prediction is decided later (:func:`choose_predictions`), so a change of stop words
    or matching reruns no model."""
    from cprobe.models.formatters import ClozeFormatter
    from cprobe.models.readouts import TopK

    top = adapter.map(list(items), ClozeFormatter(), readout=TopK(top_k), desc=desc).scores
    ids = top.numpy() if top is not None else np.zeros((0, top_k), dtype=np.int64)
    special = set(adapter.tok.all_special_ids)
    text = {int(i): adapter.tok.decode([int(i)]).strip() for i in np.unique(ids)}
    non_word = {i: i in special or not any(ch.isalnum() for ch in t) for i, t in text.items()}
    meta = pd.DataFrame([dict(it.meta) for it in items])
    return meta.assign(gold=[it.outcome for it in items], top=[[text[int(i)] for i in row] for row in ids],
                       non_word=[[non_word[int(i)] for i in row] for row in ids])


def choose_predictions(frame: pd.DataFrame, config: Any) -> pd.DataFrame:
    """``frame`` (:func:`cloze_predictions`) with ``prediction`` and ``correct``, as the public code: the first of the
    top-k tokens that is not a stop word (when every one is, the last of them); correct when it equals the gold
    object (case-sensitive unless ``case_sensitive`` is false). ``skip_non_words`` also skips special and
    punctuation-only tokens."""
    if frame.empty:
        return frame.assign(prediction=pd.Series(dtype=str), correct=pd.Series(dtype=bool))
    top = np.array(frame["top"].tolist(), dtype=object)
    skip = np.zeros(top.shape, dtype=bool)
    if config.skip_stop_words:
        words, exact = stop_words(config.stop_words)
        skip |= np.isin(top, [w for w in np.unique(top) if (w if exact else w.lower()) in words])
    if config.skip_non_words:
        skip |= np.array(frame["non_word"].tolist(), dtype=bool)
    keep = ~skip
    first = np.where(keep.any(1), keep.argmax(1), top.shape[1] - 1)
    pred = top[np.arange(len(top)), first].astype(str)
    gold = frame["gold"].to_numpy(str)
    correct = pred == gold if config.case_sensitive else np.char.lower(pred) == np.char.lower(gold)
    return frame.assign(prediction=pred, correct=correct)


def cached_predictions(ctx: JobContext, m: Mapping[str, Any], items: Sequence[Any], config: Any,
                       items_key: str) -> tuple[pd.DataFrame, bool]:
    """The model's prediction table from the cache (kind ``cloze``: a checked entry holding a parquet, keyed by the
    model's content identity, so a moved or copied cache stays valid), or computed (and cached when caching is on)."""
    from cprobe.cache import cache_key, checked_entry, model_identity

    def compute() -> pd.DataFrame:
        return cloze_predictions(ctx.adapter(m), items, config.top_k,
                                 desc=f"cloze {m['name']}" if ctx.progress else None)

    cloze_dir = ctx.cache_dir("cloze")
    if cloze_dir is None:
        return compute(), False
    key = cache_key({"model": model_identity(m), "items": items_key, "top_k": config.top_k,
                     "skip": config.skip_stop_words, "version": CACHE_VERSION})
    built: list[pd.DataFrame] = []

    def build(_: Path) -> dict[str, bytes]:
        built.append(compute())
        return {"predictions.parquet": parquet_bytes(built[0]),
                "meta.json": json.dumps({"model": m.get("name"), "rows": len(built[0])}).encode()}

    entry, hit = checked_entry(cloze_dir / key, build, f"the cloze predictions of {m.get('name')}")
    return (built[0], False) if built else (pd.read_parquet(entry / "predictions.parquet"), hit)
