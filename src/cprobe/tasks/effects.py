"""The concept-effect engine shared by the CEBaB and LIBERTy studies.

A concept-effect study explains a *fine-tuned classifier* f = softmax N(φ(x)) with concept-based explainers and
scores them against counterfactual pairs (x, x̃) whose true individual effect is ICaCE = f(x̃) − f(x). What
differs between studies is the data (human edits vs structural counterfactuals), how concept values are coded for
the explainers, the metrics and the report; what they share is everything in between, done here once:

1. fine-tune (or load from the cache) the explained model on the study's training texts (:func:`finetuned_classifier`);
2. classify every text the study touches in one pass: f(x) and φ(x) (and the mean-pooled last layer when an
   explainer matches in the fine-tuned space);
3. build the explainers' inputs **from their declared capabilities** (:mod:`cprobe.explainers.base`): the embedding
   spaces the matching explainers declare (``ft``, ``pt``, ``st``), the concept classifier's labels and
   distributions (``needs_predicted_concepts``, ``needs_concept_probs``), the training regime (``needs_training``);
4. fit every explainer on the study's pool and explain the pairs, under one error policy: a :class:`DataError`
   (the data cannot support the explainer, e.g. no training text has a value) skips that explainer with a
   recorded warning; anything else fails the job;
5. write ``<study>_pair_effects.parquet``: every pair's f on both texts, the true ICaCE and each estimate.

Before any model loads, :func:`validate_effects` refuses — with the reason — every explainer the study cannot run
(:func:`refusal`: a removal-only explainer where no concept value means "absent", ConVecs with a single concept),
so every registered explainer either runs in both studies or is refused by both at validation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from cprobe.cache import ActivationCache, kind_dir
from cprobe.data.items import CounterfactualPair, TextItem, fingerprint
from cprobe.errors import ConfigError, CprobeError, DataError
from cprobe.explainers import EXPLAINERS, ExplainedModel, Observed, Queries
from cprobe.explainers.base import TrainingRegime, check_explainers
from cprobe.io import write_parquet
from cprobe.job import JobContext
from cprobe.metrics.icace import DISTANCES, distance
from cprobe.models.classifier import finetune_config, finetuned_classifier, phi_of, phi_site
from cprobe.models.formatters import ClassificationFormatter
from cprobe.models.readouts import ClassHead
from cprobe.models.sites import MEAN, Site
from cprobe.paths import group_config
from cprobe.probes.grid import PROBE_FITS
from cprobe.progress import track

log = logging.getLogger("cprobe")

from cprobe.explainers.base import EMBEDDING_SPACES as SPACES  # noqa: E402
"""Embedding spaces the engine computes for the matching explainers (``Explainer.embedding_space``)."""
DEFAULT_ST_MODEL = "minilm_l6"


@dataclass(frozen=True)
class EffectConfig:
    """Keys every concept-effect study's node holds (``cebab:``, ``liberty:``); studies add their own."""

    explainers: list[str] = field(default_factory=lambda: ["random"])
    explainer: dict = field(default_factory=dict)  # per-explainer settings: {name: {key: value}}
    distances: list[str] = field(default_factory=lambda: ["l2", "cosine", "normdiff"])
    finetune: dict = field(default_factory=dict)  # the explained model (cprobe.models.classifier.FinetuneConfig)
    concept_model: dict = field(default_factory=dict)  # the concept classifier (same keys)
    st_model: str = DEFAULT_ST_MODEL  # the sentence-transformer of st_match (a model config name)
    max_pairs: int | None = None  # subsample the evaluation pairs (smoke tests)


@dataclass
class EffectStudy:
    """What a study supplies to the engine: its texts, pairs and value coding (everything else is the engine's).

    ``texts`` lists every text the study touches, once (f and φ are computed for each in one pass; the order is
    kept, so results do not depend on anything but the list). Concept values reach the explainers *coded*:
    ``code(item)`` gives a text's gold concept labels, ``change_code(concept, value)`` a pair's c and c′, both in
    ``values`` (a missing label is any string not in ``values``).
    """

    name: str  # the study ("cebab", "liberty"): the per-pair file's name and the config node
    model_cache: str  # cache name of the explained model (e.g. "cebab-5way")
    train: Sequence[TextItem]  # the explained model's training texts
    y_train: Sequence[int]  # their classes
    n_classes: int
    texts: Sequence[TextItem]
    pool: Sequence[int]  # rows of ``texts`` the explainers fit on
    pool_labels: Sequence[int]  # their gold classes (the task's labels)
    pairs: Sequence[CounterfactualPair]
    pair_columns: pd.DataFrame  # one row per pair: the study's key columns of the per-pair file
    concepts: tuple[str, ...]
    values: tuple[str, ...]  # coded concept values, class-index order
    null_value: str  # the coded value TCAV / ConceptSHAP read as "not mentioned"
    code: Callable[[TextItem], dict[str, str]]
    change_code: Callable[[str, str], str]
    group: Callable[[TextItem], str]  # the unit a text belongs to (a text never stands in for its own unit)
    concept_train: Sequence[TextItem]  # the concept classifier's training texts
    concept_targets: torch.Tensor  # (n, len(concepts)) value indices, IGNORE where unlabelled
    concept_sizes: Sequence[int]  # number of values per concept
    concept_cache: str  # cache name of the concept classifier
    concept_rows: Sequence[int] | None = None  # rows to label with it (None: the pool and the pairs' bases)
    removal_supported: bool = True  # whether ``null_value`` really means "absent" (removal-only explainers)


@dataclass
class EffectRun:
    """What the engine computed, for the study's tables."""

    encoder: Any  # the pre-trained encoder (ModelAdapter)
    classifier: Any  # the fine-tuned explained model (a ``classifier`` ModelAdapter)
    index: dict[str, int]  # text id → row of ``study.texts``
    probs: np.ndarray  # (n, K) f of every text
    base_idx: np.ndarray  # rows of the pairs' bases
    cf_idx: np.ndarray  # rows of the pairs' counterfactuals
    true: np.ndarray  # (n_pairs, K) ICaCE
    concept_pred: np.ndarray | None  # (n, len(concepts)) predicted value indices (−1: not predicted), or None
    estimates: dict[str, np.ndarray]  # explainer → (n_pairs, K), in config order (skipped ones absent)
    explainers: dict[str, Any]  # the fitted explainers
    per_pair: pd.DataFrame  # what the per-pair file holds


# ----------------------------------------------------------------------------------------------- validation
def refusal(cls: type, concepts: Sequence[str], removal_supported: bool, where: str) -> str | None:
    """Why a study cannot run explainer class ``cls`` (None when it can), from its declared capabilities."""
    name = getattr(cls, "name", cls.__name__)
    if getattr(cls, "removal_only", False) and not removal_supported:
        return (f"explainer {name!r} models concept removal only (c′ = absent), and no concept value of this {where} "
                "study means absent (LIBERTy: set null_value: in the SCM file)")
    need = int(getattr(cls, "min_concepts", 1))
    if len(concepts) < need:
        return (f"explainer {name!r} needs at least {need} concepts, {where} has {len(concepts)} "
                f"({list(concepts)})")
    return None


def validate_effects(job: Any, where: str, concepts: Sequence[str], removal_supported: bool = True) -> None:
    """The shared keys of a concept-effect study's node, one-line errors before any model loads: known explainers
    with valid settings that the study can run, distances, every fine-tuning number, the sentence-transformer."""
    cfg: EffectConfig = job.task_cfg
    check_explainers(cfg.explainers, cfg.explainer, where)
    if len(set(cfg.explainers)) != len(cfg.explainers):
        raise ConfigError(f"{where}.explainers lists an explainer twice: {list(cfg.explainers)}")
    for name in cfg.explainers:
        why = refusal(EXPLAINERS.get(name), concepts, removal_supported, where)
        if why:
            raise ConfigError(f"{where}.explainers: {why}; remove it from the list")
    if not cfg.distances:
        raise ConfigError(f"{where}.distances is empty; choose from {sorted(DISTANCES)}")
    for d in cfg.distances:
        distance(d)
    defaults = (job.keys.model or {}).get("finetune")
    finetune_config(cfg.finetune, f"{where}.finetune", defaults)
    finetune_config(cfg.concept_model, f"{where}.concept_model", defaults)
    if any(EXPLAINERS.get(n).embedding_space == "st" for n in cfg.explainers):
        group_config("model", cfg.st_model, f"{where}.st_model")


def effect_values(metric: Any, true: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """An outside effect metric per pair (checked: one finite value per pair, in its range)."""
    from cprobe.metrics.registry import compute

    return compute(metric, true=np.asarray(true, dtype=np.float64), estimate=np.asarray(estimate, dtype=np.float64))


def explainer_sources(names: Sequence[Any]) -> list[str]:
    """Where each row's explainer came from (built-in, a plugin's package and version, an import path); ``""`` for
    rows that name no explainer (the classifiers, the references, the data)."""
    cache: dict[str, str] = {}
    out = []
    for n in names:
        n = "" if n is None else str(n)
        if n not in cache:
            try:
                cache[n] = EXPLAINERS.provenance(n).text if n else ""
            except CprobeError:
                cache[n] = ""
        out.append(cache[n])
    return out


def subsample_pairs(pairs: Sequence[Any], max_pairs: int | None) -> list[Any]:
    """At most ``max_pairs`` of the pairs, drawn once with seed 0 (the same pairs for every job seed), order kept."""
    pairs = list(pairs)
    if max_pairs is not None and len(pairs) > max_pairs:
        keep = sorted(np.random.default_rng(0).choice(len(pairs), max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
    return pairs


# ----------------------------------------------------------------------------------------------- the engine
def run_effects(ctx: JobContext, study: EffectStudy, config: EffectConfig) -> EffectRun:
    """Fine-tune and classify the explained model, build the explainers' inputs, run them, write the per-pair
    file (module doc)."""
    cfg, seed = ctx.cfg, ctx.seed
    where = study.name
    classes = {n: EXPLAINERS.get(n) for n in config.explainers}
    ft = finetune_config(config.finetune, f"{where}.finetune", cfg["model"].get("finetune"))

    # the explained model: the encoder fine-tuned with a classification head (cached)
    encoder = ctx.adapter({**cfg["model"], "kind": "encoder"})
    t0 = time.perf_counter()
    clf, cached = finetuned_classifier(encoder, list(study.train), torch.tensor(list(study.y_train)), 1,
                                       study.n_classes, ft, seed, kind_dir(ctx.cache_root, "finetuned"), study.model_cache,
                                       ctx.progress)
    ctx.timings["finetune_s" if not cached else "load_finetuned_s"] = time.perf_counter() - t0
    log.info("explained model %s (%s)", clf.name, "cached" if cached else "fine-tuned now")

    # f and φ of every text the study touches, one pass (and the mean-pooled last layer for the ft space)
    items = list(study.texts)
    index = {it.id: i for i, it in enumerate(items)}
    spaces = sorted({c.embedding_space for c in classes.values() if c.embedding_space})
    bad = [s for s in spaces if s not in SPACES]
    if bad:
        raise ConfigError(f"unknown embedding space {bad[0]!r}; choose from {list(SPACES)}")
    phi, pooled = phi_site(clf), Site(clf.n_layers, MEAN)
    t0 = time.perf_counter()
    acts, logp = read_texts(ctx, clf, items, [phi, pooled] if "ft" in spaces else [phi], ft.max_length,
                            ClassHead(), "classify")
    reps = phi_of(clf, acts[phi])  # φ: what the head reads (TCAV, ConceptSHAP, INLP, LEACE, ...)
    probs = logp.exp().double().numpy()
    ctx.timings["classify_s"] = time.perf_counter() - t0

    pool = list(study.pool)
    base_idx = np.array([index[p.base.id] for p in study.pairs], dtype=np.int64)
    cf_idx = np.array([index[p.source.id] for p in study.pairs], dtype=np.int64)
    needed = sorted(set(pool) | set(base_idx.tolist()))  # the rows explainers see

    # the explainers' inputs, computed only where a declared capability asks for them
    embeddings = _embeddings(ctx, spaces, items, needed, acts.get(pooled), encoder, ft.max_length, config.st_model,
                             where)
    predicted = concept_probs = concept_pred = None
    if any(c.needs_predicted_concepts or c.needs_concept_probs for c in classes.values()):
        rows = needed if study.concept_rows is None else list(study.concept_rows)
        predicted, concept_probs, concept_pred = _concept_classifier(ctx, encoder, study, config, items, rows)

    everything = Observed(texts=[it.text for it in items], probs=probs, reps=reps,
                          concepts=[study.code(it) for it in items], predicted=predicted,
                          groups=[study.group(it) for it in items], embeddings=embeddings,
                          concept_probs=concept_probs)
    train = everything.take(pool)
    train.labels = np.asarray(list(study.pool_labels))
    queries = pair_queries(study.pairs, everything, index, study.change_code)
    model = ExplainedModel(clf.model.head.eval(), study.n_classes, tuple(study.concepts), tuple(study.values),
                           study.null_value, TrainingRegime(clf, ft.max_length, seed))

    true = probs[cf_idx] - probs[base_idx]
    per_pair = study.pair_columns.copy()
    per_pair["base_probs"], per_pair["cf_probs"], per_pair["icace"] = list(probs[base_idx]), list(probs[cf_idx]), \
        list(true)
    estimates: dict[str, np.ndarray] = {}
    fitted: dict[str, Any] = {}
    for name in track(config.explainers, "explainers", ctx.progress):
        why = refusal(classes[name], study.concepts, study.removal_supported, where)
        if why:  # validation refuses these; a study calling the engine directly gets a warning
            ctx.warn(f"explainer {name} skipped: {why}")
            continue
        t0 = time.perf_counter()
        ex = EXPLAINERS.build({"name": name, **dict(config.explainer.get(name) or {})}, seed=seed,
                              device=ctx.device, probe_cache=ctx.cache_dir(PROBE_FITS))
        try:
            est = ex.fit(model, train).explain(queries)
        except DataError as e:  # e.g. a concept value no training text has: this explainer has no estimate
            ctx.warn(f"explainer {name} skipped: {e}")
            continue
        ctx.timings[f"explainer_{name}_s"] = time.perf_counter() - t0
        per_pair[f"estimate_{name}"] = list(est)
        estimates[name], fitted[name] = est, ex
    write_parquet(per_pair, ctx.out_dir / f"{study.name}_pair_effects.parquet")
    return EffectRun(encoder, clf, index, probs, base_idx, cf_idx, true, concept_pred, estimates, fitted, per_pair)


def pair_queries(pairs: Sequence[CounterfactualPair], everything: Any, index: Mapping[str, int],
                 change_code: Callable[[str, str], str] = lambda _c, v: v) -> Any:
    """The explainers' view of the pairs: the base text only (its f, φ, embeddings and *predicted* concepts — never
    its gold labels, never anything of the counterfactual: the public code's leakage guard) and the change
    ``(C, c, c′)``, coded."""
    base = everything.take([index[p.base.id] for p in pairs])
    base.concepts = None
    base.labels = None
    changes = [next(iter(p.changes.items())) for p in pairs]
    return Queries(base, [c for c, _ in changes], [change_code(c, v) for c, (v, _) in changes],
                   [change_code(c, v2) for c, (_, v2) in changes])


def read_texts(ctx: JobContext, adapter: Any, items: Sequence[TextItem], sites: Sequence[Any], max_length: int | None,
               readout: Any, what: str) -> tuple[dict[Any, torch.Tensor], torch.Tensor | None]:
    """({site: (n, d) float32}, readout scores or None) of a classifier or encoder over ``items``, in one pass per
    batch — through the activation cache (:func:`cprobe.extract.extract_sites`, float32 whatever ``cache.dtype``: the
    explainers see the states the model computed), so a rerun of the study (another explainer, another metric) reads
    the fine-tuned model's outputs back instead of running it again. The key is the model's name and weights, the
    texts, the formatter (``max_length``) and the readout."""
    from cprobe.extract import extract_sites

    c = ctx.cache
    cache = ActivationCache(ctx.cache_root, enabled=c.enabled, shard_mb=c.shard_mb)
    acts, scores, _ = extract_sites(adapter, list(items), fingerprint(items), "texts",
                                    ClassificationFormatter(max_length), list(sites), readout, cache, ctx.progress, what)
    return acts, scores


def _embeddings(ctx: JobContext, spaces: Sequence[str], items: list[TextItem], rows: list[int],
                ft_pooled: torch.Tensor | None, encoder: Any, max_length: int, st_model: str,
                where: str) -> dict[str, torch.Tensor] | None:
    """The named embedding spaces the matching explainers declared, every one mean-pooled over the last layer as in
    LIBERTy (rows outside ``rows`` stay zero): ``ft`` the fine-tuned encoder (read in the classification pass),
    ``pt`` the pre-trained one, ``st`` the sentence-transformer."""
    if not spaces:
        return None
    out: dict[str, torch.Tensor] = {}
    sub = [items[i] for i in rows]
    idx = torch.tensor(rows, dtype=torch.long)
    for space in spaces:
        t0 = time.perf_counter()
        if space == "ft":  # the fine-tuned encoder
            assert ft_pooled is not None
            out[space] = ft_pooled
            continue
        if space == "pt":  # the pre-trained encoder
            adapter = encoder
        else:  # a sentence-transformer
            adapter = ctx.adapter({**group_config("model", st_model, f"{where}.st_model"), "kind": "encoder"})
        site = Site(adapter.n_layers, MEAN)
        acts = read_texts(ctx, adapter, sub, [site], max_length, None, f"embed ({space})")[0][site]
        full = torch.zeros(len(items), acts.shape[1])
        full[idx] = acts
        out[space] = full
        ctx.timings[f"embed_{space}_s"] = time.perf_counter() - t0
    return out


def _concept_classifier(ctx: JobContext, encoder: Any, study: EffectStudy, config: EffectConfig,
                        items: list[TextItem], rows: list[int]
                        ) -> tuple[list[dict[str, str]], dict[str, np.ndarray], np.ndarray]:
    """Fine-tune (or load) one multi-task concept classifier on ``study.concept_train`` and label ``rows``: every
    text's predicted (coded) value per concept, the per-concept predicted distributions (ConVecs; a concept's
    impossible values masked) and the predicted value indices (−1 for rows not labelled)."""
    concepts, sizes = list(study.concepts), list(study.concept_sizes)
    width = max(sizes)
    cm = finetune_config(config.concept_model, f"{study.name}.concept_model", ctx.cfg["model"].get("finetune"))
    t0 = time.perf_counter()
    clf, _ = finetuned_classifier(encoder, list(study.concept_train), study.concept_targets, len(concepts), width, cm,
                                  ctx.seed, kind_dir(ctx.cache_root, "finetuned"), study.concept_cache, ctx.progress)
    sub = [items[i] for i in rows]
    _, logp = read_texts(ctx, clf, sub, [], cm.max_length, ClassHead(), "concept labels")
    ctx.timings["concept_model_s"] = time.perf_counter() - t0
    logits = logp.reshape(len(sub), len(concepts), width).clone()
    for j, m in enumerate(sizes):
        logits[:, j, m:] = -torch.inf  # a concept's missing values are never predicted
    dist = logits.softmax(-1).double().numpy()
    pred = dist.argmax(-1)
    predicted: list[dict[str, str]] = [{} for _ in items]
    cprobs = {c: np.zeros((len(items), m)) for c, m in zip(concepts, sizes)}
    out = np.full((len(items), len(concepts)), -1, dtype=np.int64)
    for r, i in enumerate(rows):
        predicted[i] = {c: study.values[pred[r, j]] for j, c in enumerate(concepts)}
        out[i] = pred[r]
        for j, (c, m) in enumerate(zip(concepts, sizes)):
            cprobs[c][i] = dist[r, j, :m]
    return predicted, cprobs, out


# ----------------------------------------------------------------------------------------------- shared rows
def classifier_rows(common: Mapping[str, Any], which: str, y: np.ndarray, pred: np.ndarray, k: int,
                    **keys: Any) -> list[dict]:
    """Macro-F1 and accuracy rows (``kind = classifier``) of predictions ``pred`` against gold ``y`` over k classes."""
    from sklearn.metrics import f1_score

    f1 = f1_score(y, pred, average="macro", labels=list(range(k)), zero_division=0)
    acc = float((y == pred).mean()) if len(y) else float("nan")
    base = {**common, "kind": "classifier", "explainer": which, **keys, "n": len(y)}
    return [{**base, "metric": "macro_f1", "value": float(f1)}, {**base, "metric": "accuracy", "value": acc}]


def diagnostics(ex: Any) -> list[tuple[str, str | None, float]]:
    """What a fitted explainer reports about itself, as (metric, concept or None, value): ConceptSHAP's completeness,
    the matching explainers' fallback counts, and for the removal explainers a fresh probe's accuracy for the removed
    concept before and after the removal and its majority rate (``leftover_``)."""
    out: list[tuple[str, str | None, float]] = \
        [("completeness", None, float(ex.completeness_))] if hasattr(ex, "completeness_") else []
    out += [(f"fallback_{key}", None, float(v)) for key, v in getattr(ex, "fallbacks_", {}).items()]
    out += [(f"concept_probe_{name}", concept, float(v)) for concept, values in getattr(ex, "leftover_", {}).items()
            for name, v in zip(("before", "after", "majority"), values)]
    if hasattr(ex, "control_"):
        log.info("%s control concepts: %s", ex.name, ", ".join(f"{k}: {v}" for k, v in ex.control_.items()))
    return out


def finite_table(rows: list[dict], text_columns: Sequence[str]) -> pd.DataFrame:
    """The long table with every text column present (empty where a row has none)."""
    table = pd.DataFrame(rows)
    for col in text_columns:
        table[col] = table[col].fillna("") if col in table else ""
    return table

