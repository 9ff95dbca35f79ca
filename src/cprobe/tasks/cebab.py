"""CEBaB (Abraham et al. 2022): how well do concept-based explainers estimate a real classifier's causal concept
effects, judged against human-written counterfactual edits?

One job = one explained model (a pretrained encoder fine-tuned on the chosen train split for the 2/3/5-way
task, cached), one seed. It writes a long table (column ``kind``):

- ``classifier``: the explained model's macro-F1 / accuracy on dev and test (Table 8), and the concept (aspect)
  classifier's macro-F1 when an explainer needs predicted concept labels;
- ``pairs`` / ``ate``: edit-pair counts and the data's empirical ATE per aspect × direction (Tables 3c/3d/7);
- ``cace`` / ``acace``: the model's CaCE per aspect × direction on the argmax class (Table 4) and ACaCE per aspect;
- ``icace_error``: ICaCE-Error per explainer × distance, overall (``aspect = all``), per aspect, and per aspect ×
  ordered direction (Table 10, Fig. 2);
- ``explainer``: diagnostics an explainer reports (ConceptSHAP completeness, Approx fallbacks, and for the removal
  explainers a fresh cross-validated probe's accuracy for the removed concept before and after).

``cebab_pair_effects.parquet`` beside it keeps every evaluation pair: the model's distributions on both texts, the
true ICaCE and each explainer's estimate (vectors over classes), for analyses beyond the tables.

``report`` (per job and over a sweep) turns it into Table-10-style ``mean (std)`` tables over seeds and bar charts.
Everything runs through the core: items (:mod:`cprobe.data.cebab`), the one model entry point
(:meth:`ModelAdapter.map` via :func:`cprobe.models.classifier.classify`), the explainer registry and
:mod:`cprobe.metrics.icace`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from cprobe.data.cebab import (
    ASPECTS,
    DIRECTIONS,
    TASKS,
    VALUES,
    CebabData,
    aspect_label,
    direction_name,
    edit_pairs,
    encode_rating,
    labelled,
    pair_frame,
)
from cprobe.data.items import TextItem
from cprobe.errors import ConfigError, DataError
from cprobe.job import JobContext
from cprobe.metrics.icace import DISTANCES, acace, distance, icace_error
from cprobe.models.classifier import finetune_config
from cprobe.plots import new_figure, save
from cprobe.progress import track
from cprobe.records import Derived, RecordSpec, const
from cprobe.results import summarise

log = logging.getLogger("cprobe")

USES_LAYERS = False
DEFAULT_EXPLAINERS = ["random", "approx", "conexp", "s_learner", "tcav", "conceptshap", "inlp", "leace"]


@dataclass(frozen=True)
class Config:
    """The ``cebab:`` node."""

    task: Literal["2way", "3way", "5way"] = "5way"
    eval_split: Literal["dev", "test"] = "test"
    aspects: list[str] = field(default_factory=lambda: list(ASPECTS))
    explainers: list[str] = field(default_factory=lambda: list(DEFAULT_EXPLAINERS))
    explainer: dict = field(default_factory=dict)  # per-explainer settings: {name: {key: value}}
    distances: list[str] = field(default_factory=lambda: ["l2", "cosine", "normdiff"])
    finetune: dict = field(default_factory=dict)  # the explained model (cprobe.models.classifier.FinetuneConfig)
    concept_model: dict = field(default_factory=dict)  # the aspect classifier (same keys)
    max_pairs: int | None = None  # subsample the evaluation pairs (smoke tests)


def validate(job: Any) -> None:
    from cprobe.explainers.base import check_explainers

    cfg: Config = job.task_cfg
    if cfg.task not in TASKS:
        raise ConfigError(f"unknown CEBaB task {cfg.task!r}; choose from {sorted(TASKS)}")
    bad = [a for a in cfg.aspects if a not in ASPECTS]
    if len(set(cfg.aspects)) != len(cfg.aspects):
        raise ConfigError(f"cebab.aspects lists an aspect twice: {list(cfg.aspects)}")
    if bad or not cfg.aspects:
        raise ConfigError(f"unknown aspect(s) {bad or '[] (none given)'}; choose from {list(ASPECTS)}")
    check_explainers(cfg.explainers, cfg.explainer, "cebab")
    for d in cfg.distances:
        distance(d)
    if not cfg.distances:
        raise ConfigError(f"cebab.distances is empty; choose from {sorted(DISTANCES)}")
    defaults = (job.keys.model or {}).get("finetune")
    finetune_config(cfg.finetune, "cebab.finetune", defaults)
    finetune_config(cfg.concept_model, "cebab.concept_model", defaults)
    ds = job.keys.dataset or {}
    if ds.get("type", ds.get("name")) != "cebab":
        raise ConfigError("the cebab task needs dataset=cebab")
    if cfg.max_pairs is not None and cfg.max_pairs < 1:
        raise ConfigError(f"cebab.max_pairs must be >= 1 (or null for all), got {cfg.max_pairs}")


# ----------------------------------------------------------------------------------------------- the job
def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.data.registry import load_dataset
    from cprobe.explainers import EXPLAINERS, ExplainedModel, Observed
    from cprobe.explainers.base import TrainingRegime

    cfg, seed = ctx.cfg, ctx.seed
    data = load_dataset(cfg["dataset"], ctx.data_root)
    if not isinstance(data, CebabData):
        raise ConfigError("the cebab task needs dataset=cebab")
    k = TASKS[config.task]
    for note in data.notes:
        ctx.warn(note)
    train_items, y_train = labelled(data.splits["train"], config.task)
    pairs = task_pairs(data.splits[config.eval_split], config.task, config.aspects)
    if config.max_pairs is not None and len(pairs) > config.max_pairs:  # the same pairs for every seed
        keep = sorted(np.random.default_rng(0).choice(len(pairs), config.max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
    if not pairs:
        raise DataError(f"no edit pairs for aspects {config.aspects} in the {config.eval_split} split")
    explainer_classes = [EXPLAINERS.get(n) for n in config.explainers]
    ft = finetune_config(config.finetune, "cebab.finetune", cfg["model"].get("finetune"))

    # the explained model: the encoder fine-tuned with a classification head (cached)
    from cprobe.models.classifier import classify, finetuned_classifier

    encoder = ctx.adapter({**cfg["model"], "kind": "encoder"})
    t0 = time.perf_counter()
    clf, cached = finetuned_classifier(encoder, train_items, torch.tensor(y_train), 1, k, ft, seed,
                                       ctx.cache_root / "finetuned", f"cebab-{config.task}", ctx.progress)
    ctx.timings["finetune_s" if not cached else "load_finetuned_s"] = time.perf_counter() - t0
    log.info("explained model %s (%s)", clf.name, "cached" if cached else "fine-tuned now")

    # φ and N(φ) of every text the study touches, one pass each
    texts: dict[str, TextItem] = {}
    for it in (*train_items, *data.splits["dev"], *data.splits["test"]):
        texts.setdefault(it.id, it)
    items = list(texts.values())
    index = {it.id: i for i, it in enumerate(items)}
    t0 = time.perf_counter()
    reps, logp = classify(clf, items, ft.max_length, desc="classify" if ctx.progress else None)
    probs = logp.exp().double().numpy()
    ctx.timings["classify_s"] = time.perf_counter() - t0

    rows: list[dict[str, Any]] = []
    from cprobe.job import config_hash

    setting = {"cebab": {key: v for key, v in asdict(config).items() if key != "task"}, "model": cfg["model"],
               "dataset": cfg["dataset"]}  # everything but the task and the seed: sweeps over it stay apart
    common = {"model": encoder.name, "cebab_task": config.task, "config_id": config_hash(setting)[:8],
              "train_variant": cfg["dataset"].get("train", "exclusive"), "eval_split": config.eval_split}
    for split in ("dev", "test"):
        its, y = labelled(data.splits[split], config.task)
        pred = probs[[index[it.id] for it in its]].argmax(1)
        rows += _classifier_rows(common, "explained", split, np.asarray(y), pred, k)

    # predicted concept labels, when an explainer needs them
    predicted = None
    if any(c.needs_predicted_concepts for c in explainer_classes):
        predicted = _predict_concepts(ctx, encoder, data, items, config, seed, common, rows)

    # the data's and the model's effects
    pf = pair_frame(pairs)
    base_idx = np.array([index[p.base.id] for p in pairs])
    cf_idx = np.array([index[p.source.id] for p in pairs])
    true = probs[cf_idx] - probs[base_idx]
    rows += _data_effect_rows(common, pf, config.task, config.aspects)
    rows += _cace_rows(common, pf, probs[base_idx].argmax(1), probs[cf_idx].argmax(1), config.aspects)

    # explainers
    everything = Observed(texts=[it.text for it in items], probs=probs, reps=reps,
                          concepts=[{a: it.concepts.get(a, "") for a in config.aspects} for it in items],
                          predicted=predicted, groups=[str(it.meta.get("original_id", it.id)) for it in items])
    train_obs = everything.take([index[it.id] for it in train_items])
    train_obs.labels = np.asarray(y_train)
    queries = pair_queries(pairs, everything, index)
    model = ExplainedModel(clf.model.head.eval(), k, tuple(config.aspects), VALUES, "unknown",
                           TrainingRegime(clf, ft.max_length, seed))
    per_pair = pf[["pair", "aspect", "c", "c_prime", "direction", "sign"]].copy()
    per_pair["base_probs"], per_pair["cf_probs"] = list(probs[base_idx]), list(probs[cf_idx])
    per_pair["icace"] = list(true)
    for name in track(config.explainers, "explainers", ctx.progress):
        t0 = time.perf_counter()
        ex = EXPLAINERS.build({"name": name, **dict(config.explainer.get(name) or {})}, seed=seed,
                              device=ctx.device)
        try:
            est = ex.fit(model, train_obs).explain(queries)
        except DataError as e:  # e.g. a concept value no training text has: this explainer has no estimate
            ctx.warn(f"explainer {name} skipped: {e}")
            continue
        ctx.timings[f"explainer_{name}_s"] = time.perf_counter() - t0
        per_pair[f"estimate_{name}"] = list(est)
        for dist in config.distances:
            err = icace_error(true, est, dist)
            rows += _error_rows(common, name, dist, pf, err)
        rows += _explainer_info(common, name, ex)
    _write_pairs(per_pair, ctx.out_dir / "cebab_pair_effects.parquet")
    table = pd.DataFrame(rows)
    for col in ("explainer", "distance", "aspect", "direction", "split", "metric"):
        if col not in table:
            table[col] = ""
        table[col] = table[col].fillna("")
    return table


def task_pairs(items: Sequence[TextItem], task: str, aspects: Sequence[str]):
    """The split's edit pairs on ``aspects`` whose two texts both have a class under ``task`` (the public code
    drops unlabelled rows — 3★ for 2-way, "no majority" — before it builds pairs)."""
    return [p for p in edit_pairs(items) if p.intervened[0] in aspects
            and encode_rating(p.base.outcome, task) is not None and encode_rating(p.source.outcome, task) is not None]


def pair_queries(pairs: Sequence[Any], everything: Any, index: dict[str, int]) -> Any:
    """The explainers' view of the pairs: the base text only (its φ, prediction and *predicted* concept labels —
    never gold labels, never the counterfactual: the public code's leakage guard) and the intervention."""
    from cprobe.explainers import Queries

    base = everything.take([index[p.base.id] for p in pairs])
    base.concepts = None
    changes = [next(iter(p.changes.items())) for p in pairs]
    return Queries(base, [a for a, _ in changes], [c for _, (c, _) in changes], [c2 for _, (_, c2) in changes])


def _write_pairs(frame: pd.DataFrame, path: Path) -> None:
    """Every evaluation pair with the model's two distributions, the true ICaCE and each explainer's estimate."""
    import io

    from cprobe.io import atomic_write_bytes

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def _classifier_rows(common: dict, which: str, split: str, y: np.ndarray, pred: np.ndarray, k: int,
                     aspect: str = "all") -> list[dict]:
    from sklearn.metrics import f1_score

    f1 = f1_score(y, pred, average="macro", labels=list(range(k)), zero_division=0)
    acc = float((y == pred).mean()) if len(y) else float("nan")
    base = {**common, "kind": "classifier", "explainer": which, "split": split, "aspect": aspect, "n": len(y)}
    return [{**base, "metric": "macro_f1", "value": float(f1)}, {**base, "metric": "accuracy", "value": acc}]


def _predict_concepts(ctx: JobContext, encoder, data: CebabData, items: list[TextItem], config: Config, seed: int,
                      common: dict, rows: list[dict]) -> list[dict[str, str]]:
    """Fine-tune (or load) the aspect classifier on the train split's texts and predict every text's labels."""
    from cprobe.models.classifier import IGNORE, classify, finetuned_classifier

    aspects = list(config.aspects)
    train = list(data.splits["train"])
    targets = torch.tensor([[aspect_label(it, a) if aspect_label(it, a) is not None else IGNORE for a in aspects]
                            for it in train])
    cm = finetune_config(config.concept_model, "cebab.concept_model", ctx.cfg["model"].get("finetune"))
    t0 = time.perf_counter()
    clf, cached = finetuned_classifier(encoder, train, targets, len(aspects), len(VALUES), cm, seed,
                                       ctx.cache_root / "finetuned", "cebab-concepts", ctx.progress)
    _, logp = classify(clf, items, cm.max_length, desc="concept labels" if ctx.progress else None)
    ctx.timings["concept_model_s"] = time.perf_counter() - t0
    pred = logp.reshape(len(items), len(aspects), len(VALUES)).argmax(-1).numpy()
    out = [{a: VALUES[pred[i, j]] for j, a in enumerate(aspects)} for i in range(len(items))]
    index = {it.id: i for i, it in enumerate(items)}
    for split in ("dev", "test"):
        for j, a in enumerate(aspects):
            gold = [(index[it.id], aspect_label(it, a)) for it in data.splits[split] if aspect_label(it, a) is not None]
            if gold:
                idx, y = zip(*gold)
                rows += _classifier_rows(common, "concepts", split, np.asarray(y), pred[list(idx), j], len(VALUES), a)
    return out


def _data_effect_rows(common: dict, pf: pd.DataFrame, task: str, aspects: Sequence[str]) -> list[dict]:
    """Pair counts and the empirical ATE (eq. 5 averaged) per aspect × canonical direction, from human labels."""
    rb = pf["base_rating"].map(lambda r: encode_rating(r, task))
    rc = pf["cf_rating"].map(lambda r: encode_rating(r, task))
    ok = rb.notna() & rc.notna()
    signed = pf["sign"] * (rc.astype(float) - rb.astype(float))
    out = []
    for a in aspects:
        for c, c2 in DIRECTIONS:
            d = direction_name(c, c2)
            m = (pf["aspect"] == a) & (pf["direction"] == d)
            base = {**common, "aspect": a, "direction": d}
            out.append({**base, "kind": "pairs", "metric": "pairs", "value": float(m.sum()), "n": int(m.sum())})
            mm = m & ok
            out.append({**base, "kind": "ate", "metric": "ate", "value": float(signed[mm].mean()) if mm.any()
                        else float("nan"), "n": int(mm.sum())})
    return out


def _cace_rows(common: dict, pf: pd.DataFrame, pred_base: np.ndarray, pred_cf: np.ndarray,
               aspects: Sequence[str]) -> list[dict]:
    """The model's CaCE on the argmax class (the paper's Table 4) per aspect × direction, and ACaCE per aspect."""
    signed = pf["sign"].to_numpy() * (pred_cf - pred_base).astype(float)
    out = []
    for a in aspects:
        caces = []
        for c, c2 in DIRECTIONS:
            d = direction_name(c, c2)
            m = ((pf["aspect"] == a) & (pf["direction"] == d)).to_numpy()
            v = float(signed[m].mean()) if m.any() else float("nan")
            if m.any():
                caces.append(v)
            out.append({**common, "kind": "cace", "metric": "cace", "aspect": a, "direction": d, "value": v,
                        "n": int(m.sum())})
        out.append({**common, "kind": "acace", "metric": "acace", "aspect": a, "direction": "all",
                    "value": acace(caces) if caces else float("nan"), "n": len(caces)})
    return out


def _error_rows(common: dict, name: str, dist: str, pf: pd.DataFrame, err: np.ndarray) -> list[dict]:
    base = {**common, "kind": "icace_error", "explainer": name, "distance": dist, "metric": "icace_error"}
    out = [{**base, "aspect": "all", "direction": "all", "value": float(err.mean()), "n": len(err)}]
    ordered = [direction_name(c, c2) for c, c2 in zip(pf["c"], pf["c_prime"])]
    frame = pd.DataFrame({"aspect": pf["aspect"], "direction": ordered, "err": err})
    for a, g in frame.groupby("aspect", sort=False):
        out.append({**base, "aspect": a, "direction": "all", "value": float(g["err"].mean()), "n": len(g)})
        for d, gd in g.groupby("direction", sort=True):
            out.append({**base, "aspect": a, "direction": d, "value": float(gd["err"].mean()), "n": len(gd)})
    return out


def _explainer_info(common: dict, name: str, ex: Any) -> list[dict]:
    base = {**common, "kind": "explainer", "explainer": name, "aspect": "all", "direction": "all", "n": 0}
    out = []
    if hasattr(ex, "completeness_"):
        out.append({**base, "metric": "completeness", "value": float(ex.completeness_)})
    for k, v in getattr(ex, "fallbacks_", {}).items():
        out.append({**base, "metric": f"fallback_{k}", "value": float(v)})
    for concept, (before, after) in getattr(ex, "leftover_", {}).items():  # a fresh probe for the removed concept
        out.append({**base, "aspect": concept, "metric": "concept_probe_before", "value": before})
        out.append({**base, "aspect": concept, "metric": "concept_probe_after", "value": after})
    if hasattr(ex, "control_"):
        ctx_concepts = ", ".join(f"{k}: {v}" for k, v in ex.control_.items())
        log.info("causalm control concepts: %s", ctx_concepts)
    return out


# ----------------------------------------------------------------------------------------------- report
GROUP = ["model", "cebab_task", "train_variant", "eval_split"]


def _cell(m: float, s: float) -> str:
    return "nan" if np.isnan(m) else f"{m:.2f} ({s:.2f})"


def error_table(table: pd.DataFrame) -> pd.DataFrame:
    """Table 10 layout: rows (model, task, distance), columns explainers, cells ``mean (std)`` over seeds."""
    s = summarise(table[(table["aspect"] == "all")], "icace_error", [*GROUP, "distance", "explainer"])
    if s.empty:
        return s
    s["cell"] = [_cell(m, sd) for m, sd in zip(s["mean"], s["std"])]
    order = list(dict.fromkeys(s["explainer"]))
    idx = [k for k in s.columns if k in ("config_id", *GROUP, "distance")]
    wide = s.pivot_table(index=idx, columns="explainer", values="cell", aggfunc="first", sort=False)
    return wide[order].reset_index()


def report(table: pd.DataFrame, out_dir: Path) -> None:
    from cprobe.results import write_table

    if "kind" not in table:
        return
    tab = table.copy()
    write_table(error_table(tab), out_dir / "cebab_icace_error")
    write_table(summarise(tab, "icace_error", [*GROUP, "explainer", "distance", "aspect", "direction"]),
                out_dir / "cebab_icace_error_long")
    for kind, keys in (("ate", ["cebab_task", "eval_split", "aspect", "direction"]),
                       ("pairs", ["eval_split", "aspect", "direction"]),
                       ("cace", [*GROUP, "aspect", "direction"]), ("acace", [*GROUP, "aspect"]),
                       ("classifier", [*GROUP, "explainer", "split", "aspect", "metric"]),
                       ("explainer", [*GROUP, "explainer", "aspect", "metric"])):
        s = summarise(tab, kind, keys)
        if kind in ("ate", "cace", "pairs") and not s.empty:  # the paper's layout: aspect rows × direction columns
            idx = [k for k in s.columns if k in ("config_id", *keys) and k != "direction"]
            wide = s.pivot_table(index=idx, columns="direction", values="mean", sort=False).reset_index()
            cols = [direction_name(c, c2) for c, c2 in DIRECTIONS]
            s = wide[[*idx, *[c for c in cols if c in wide]]]
        write_table(s, out_dir / f"cebab_{kind}")
    _plot(tab, out_dir)


def _plot(tab: pd.DataFrame, out_dir: Path) -> None:
    """Fig. 2: ICaCE-Error per explainer, per aspect and overall, one panel per distance, error bars = std."""
    s = summarise(tab[tab["direction"] == "all"], "icace_error", [*GROUP, "distance", "aspect", "explainer"])
    if s.empty:
        return
    by = [k for k in ("config_id", *GROUP) if k in s.columns]
    for key, g in s.groupby(by, sort=False):
        dists = list(dict.fromkeys(g["distance"]))
        explainers = list(dict.fromkeys(g["explainer"]))
        aspects = [a for a in (*ASPECTS, "all") if a in set(g["aspect"])]
        fig, axes = new_figure(len(dists), width=5.5, height=3.8)
        w = 0.8 / len(explainers)
        for ax, dist in zip(axes, dists):
            gd = g[g["distance"] == dist]
            for j, ex in enumerate(explainers):
                ge = gd[gd["explainer"] == ex].set_index("aspect").reindex(aspects)
                ax.bar(np.arange(len(aspects)) + (j - (len(explainers) - 1) / 2) * w, ge["mean"], w,
                       yerr=ge["std"], capsize=2, label=ex)
            ax.set_xticks(np.arange(len(aspects)), aspects, fontsize=9)
            ax.set_title(f"ICaCE-Error ({dist}), lower is better", fontsize=10)
            ax.tick_params(labelsize=9)
            ax.grid(axis="y", alpha=0.3)
        axes[0].legend(fontsize=9, ncols=2)
        cid = key[0] if len(key) > 4 else None
        model, task, variant, split = key[-4:]
        fig.suptitle(f"CEBaB {task} · {model} · train {variant} · {split} pairs" + (f" · {cid}" if cid else ""),
                     fontsize=10)
        save(fig, out_dir / (f"cebab_icace_error_{model}_{task}" + (f"_{cid}" if cid else "") + ".png"))


# ----------------------------------------------------------------------------------------------- records
_ROW_METRIC = {"pairs": "edit_pairs", "ate": "ate", "cace": "cace", "acace": "acace"}
_RENAMED = {"completeness": "conceptshap_completeness"}


def _metric(t: pd.DataFrame) -> list[str]:
    """Each row's registered metric: ICaCE-Error per distance, the classifier's and explainers' metrics by name
    (ConceptSHAP's completeness renamed), the data's and the model's effects by row kind."""
    return [f"icace_error_{d}" if k == "icace_error" else _ROW_METRIC.get(k, _RENAMED.get(m, m))
            for k, m, d in zip(t["kind"], t["metric"], t["distance"])]


def _family(t: pd.DataFrame) -> list[str]:
    return ["classifier" if k == "classifier" else "explainer" if e else "" for k, e in zip(t["kind"], t["explainer"])]


def _record_items(table: pd.DataFrame, records: pd.DataFrame, out_dir: Path | None) -> pd.DataFrame | None:
    """Per evaluation pair, each explainer's ICaCE-Error for every distance (from ``cebab_pair_effects.parquet``):
    the items of the overall ICaCE-Error records."""
    from cprobe.records import item_rows

    path = None if out_dir is None else Path(out_dir) / "cebab_pair_effects.parquet"
    if path is None or not path.is_file():
        return None
    pairs = pd.read_parquet(path)
    true = np.stack(pairs["icace"])
    whole = records[(records["slice"] == "{}") & records["metric"].str.startswith("icace_error_")]
    frames = []
    for name, recs in whole.groupby("method", sort=False):
        col = f"estimate_{name}"
        if col not in pairs:
            continue
        est = np.stack(pairs[col])
        values = {m: icace_error(true, est, m.removeprefix("icace_error_")) for m in recs["metric"]}
        frames.append(item_rows(recs, values, pairs["pair"]))
    return pd.concat(frames, ignore_index=True) if frames else None


RECORDS = RecordSpec(
    dataset=const("cebab"), model="model", method="explainer", family=Derived(_family),
    setting=("cebab_task", "train_variant", "eval_split"), slice=("split", "aspect", "direction"),
    slice_defaults={"split": "", "aspect": "all", "direction": "all"}, metric=Derived(_metric), value="value", n="n",
    breakdowns=("split", "aspect", "direction"), items=_record_items)
"""Every row as a record (:mod:`cprobe.records`): the explainer is the method (the classifiers' rows: ``explained``
/ ``concepts``, family ``classifier``); the evaluation pairs are the items of the overall ICaCE-Errors."""
