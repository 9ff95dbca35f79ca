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
- ``explainer``: diagnostics an explainer reports (ConceptSHAP completeness, Approx / matching fallbacks, and for
  the removal explainers a fresh probe's accuracy for the removed concept before and after, on rows the eraser never
  saw, and the majority rate).

``cebab_pair_effects.parquet`` beside it keeps every evaluation pair: the model's distributions on both texts, the
true ICaCE and each explainer's estimate (vectors over classes), for analyses beyond the tables.

``report`` (per job and over a sweep) turns it into Table-10-style ``mean (std)`` tables over seeds and bar charts.
The explained model, the explainers' inputs and the explainer runs are the concept-effect engine's
(:mod:`cprobe.tasks.effects`, shared with LIBERTy); this module supplies the data (:mod:`cprobe.data.cebab`: items,
edit pairs, aspect labels as they are), the metrics (:mod:`cprobe.metrics.icace`) and the report.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from cprobe.data.cebab import (
    ASPECTS,
    VALUE_CHANGES,
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
from cprobe.metrics.icace import acace, icace_error
from cprobe.metrics.registry import outside_metrics
import cprobe.plots as plots
from cprobe.paths import safe_name
from cprobe.plots import new_figure, save
from cprobe.records import Derived, RecordSpec, const
from cprobe.results import summarise
from cprobe.tasks import TaskResult, Uses
from cprobe.tasks.effects import (EffectConfig, EffectStudy, classifier_rows, diagnostics, effect_values,
                                  explainer_sources, finite_table, run_effects, subsample_pairs, validate_effects)

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "dataset"))  # the explained encoder and the CEBaB data; no layers, probes or splits
DEFAULT_EXPLAINERS = ["random", "approx", "conexp", "s_learner", "tcav", "conceptshap", "inlp", "leace"]


@dataclass(frozen=True)
class Config(EffectConfig):
    """The ``cebab:`` node (the keys every concept-effect study shares: :class:`EffectConfig`)."""

    task: Literal["2way", "3way", "5way"] = "5way"
    eval_split: Literal["dev", "test"] = "test"
    aspects: list[str] = field(default_factory=lambda: list(ASPECTS))
    explainers: list[str] = field(default_factory=lambda: list(DEFAULT_EXPLAINERS))
    max_scored_texts: int | None = None  # the classifier tables' dev / test texts: at most this many per split


def scored(data: CebabData, split: str, config: Config) -> list[TextItem]:
    """The texts of ``split`` the classifier tables score: all, or ``max_scored_texts`` of them drawn once with seed 0
    (order kept; the evaluation pairs' own texts are classified whatever it says)."""
    return subsample_pairs(data.splits[split], config.max_scored_texts)


def validate(job: Any) -> None:
    cfg: Config = job.task_cfg
    if cfg.task not in TASKS:
        raise ConfigError(f"unknown CEBaB task {cfg.task!r}; choose from {sorted(TASKS)}")
    bad = [a for a in cfg.aspects if a not in ASPECTS]
    if len(set(cfg.aspects)) != len(cfg.aspects):
        raise ConfigError(f"cebab.aspects lists an aspect twice: {list(cfg.aspects)}")
    if bad or not cfg.aspects:
        raise ConfigError(f"unknown aspect(s) {bad or '[] (none given)'}; choose from {list(ASPECTS)}")
    validate_effects(job, "cebab", cfg.aspects)
    ds = job.keys.dataset or {}
    if ds.get("type", ds.get("name")) != "cebab":
        raise ConfigError("the cebab task needs dataset=cebab")
    for key in ("max_pairs", "max_scored_texts"):
        if getattr(cfg, key) is not None and getattr(cfg, key) < 1:
            raise ConfigError(f"cebab.{key} must be >= 1 (or null for all), got {getattr(cfg, key)}")


# ----------------------------------------------------------------------------------------------- the job
def study(data: CebabData, config: Config) -> EffectStudy:
    """CEBaB's part of a concept-effect job: the explained model's training texts (those with a class under the
    task), every text of train and the dev and test texts the tables score (:func:`scored`), the edit pairs of the
    evaluation split and their texts, aspect labels as they are (``Negative|Positive|unknown``; ``""`` and
    ``no majority`` are missing), and the aspect classifier's targets."""
    from cprobe.models.classifier import IGNORE

    train_items, y_train = labelled(data.splits["train"], config.task)
    pairs = subsample_pairs(task_pairs(data.splits[config.eval_split], config.task, config.aspects), config.max_pairs)
    if not pairs:
        raise DataError(f"no edit pairs for aspects {config.aspects} in the {config.eval_split} split")
    texts: dict[str, TextItem] = {}
    for it in (*train_items, *scored(data, "dev", config), *scored(data, "test", config),
               *(t for p in pairs for t in (p.base, p.source))):
        texts.setdefault(it.id, it)
    items = list(texts.values())
    index = {it.id: i for i, it in enumerate(items)}
    aspects = tuple(config.aspects)
    concept_train = list(data.splits["train"])
    targets = torch.tensor([[aspect_label(it, a) if aspect_label(it, a) is not None else IGNORE for a in aspects]
                            for it in concept_train])
    pf = pair_frame(pairs)
    return EffectStudy(
        name="cebab", model_cache=f"cebab-{config.task}", train=train_items, y_train=y_train,
        n_classes=TASKS[config.task], texts=items, pool=[index[it.id] for it in train_items], pool_labels=y_train,
        pairs=pairs, pair_columns=pf[["pair", "aspect", "c", "c_prime", "direction", "sign"]].copy(),
        concepts=aspects, values=VALUES, null_value="unknown",
        code=lambda it: {a: it.concepts.get(a, "") for a in aspects}, change_code=lambda _a, v: v,
        group=lambda it: str(it.meta.get("original_id", it.id)), concept_train=concept_train,
        concept_targets=targets, concept_sizes=[len(VALUES)] * len(aspects), concept_cache="cebab-concepts",
        concept_rows=range(len(items)))


def run(ctx: JobContext, config: Config) -> TaskResult:
    from cprobe.job import config_hash

    cfg = ctx.cfg
    data = ctx.dataset()
    if not isinstance(data, CebabData):
        raise ConfigError("the cebab task needs dataset=cebab")
    k = TASKS[config.task]
    spec = study(data, config)
    res = run_effects(ctx, spec, config)

    setting = {"cebab": {key: v for key, v in asdict(config).items() if key != "task"}, "model": cfg["model"],
               "dataset": cfg["dataset"]}  # everything but the task and the seed: sweeps over it stay apart
    common = {"model": res.encoder.name, "cebab_task": config.task, "config_id": config_hash(setting)[:8],
              "train_variant": cfg["dataset"].get("train", "exclusive"), "eval_split": config.eval_split}
    rows: list[dict[str, Any]] = []
    for split in ("dev", "test"):
        its, y = labelled(scored(data, split, config), config.task)
        pred = res.probs[[res.index[it.id] for it in its]].argmax(1)
        rows += classifier_rows(common, "explained", np.asarray(y), pred, k, split=split, aspect="all")
    if res.concept_pred is not None:  # the aspect classifier's Table 8 rows, when an explainer needed it
        for split in ("dev", "test"):
            for j, a in enumerate(config.aspects):
                gold = [(res.index[it.id], aspect_label(it, a)) for it in scored(data, split, config)
                        if aspect_label(it, a) is not None]
                if gold:
                    idx, y = zip(*gold)
                    rows += classifier_rows(common, "concepts", np.asarray(y), res.concept_pred[list(idx), j],
                                            len(VALUES), split=split, aspect=a)

    # the data's and the model's effects
    pf = pair_frame(spec.pairs)
    rows += _data_effect_rows(common, pf, config.task, config.aspects)
    rows += _cace_rows(common, pf, res.probs[res.base_idx].argmax(1), res.probs[res.cf_idx].argmax(1), config.aspects)
    extra = outside_metrics(cfg, "effect")
    for name, est in res.estimates.items():
        for dist in config.distances:
            rows += _error_rows(common, name, dist, pf, icace_error(res.true, est, dist))
        for m in extra:  # the config's outside metrics, per pair as ICaCE-Error is
            rows += _error_rows(common, name, "", pf, effect_values(m, res.true, est), kind="metric", metric=m.name)
        info = {**common, "kind": "explainer", "explainer": name, "aspect": "all", "direction": "all", "n": 0}
        rows += [{**info, **({"aspect": concept} if concept else {}), "metric": metric, "value": value}
                 for metric, concept, value in diagnostics(res.explainers[name])]
    table = finite_table(rows, ("explainer", "distance", "aspect", "direction", "split", "metric"))
    table["method_source"] = explainer_sources(table["explainer"])
    return TaskResult(table, res.per_pair)


def task_pairs(items: Sequence[TextItem], task: str, aspects: Sequence[str]):
    """The split's edit pairs on ``aspects`` whose two texts both have a class under ``task`` (the public code
    drops unlabelled rows — 3★ for 2-way, "no majority" — before it builds pairs)."""
    return [p for p in edit_pairs(items) if p.intervened[0] in aspects
            and encode_rating(p.base.outcome, task) is not None and encode_rating(p.source.outcome, task) is not None]


def _data_effect_rows(common: dict, pf: pd.DataFrame, task: str, aspects: Sequence[str]) -> list[dict]:
    """Pair counts and the empirical ATE (eq. 5 averaged) per aspect × canonical direction, from human labels."""
    rb = pf["base_rating"].map(lambda r: encode_rating(r, task))
    rc = pf["cf_rating"].map(lambda r: encode_rating(r, task))
    ok = rb.notna() & rc.notna()
    signed = pf["sign"] * (rc.astype(float) - rb.astype(float))
    out = []
    for a in aspects:
        for c, c2 in VALUE_CHANGES:
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
        for c, c2 in VALUE_CHANGES:
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


def _error_rows(common: dict, name: str, dist: str, pf: pd.DataFrame, err: np.ndarray, kind: str = "icace_error",
                metric: str = "icace_error") -> list[dict]:
    base = {**common, "kind": kind, "explainer": name, "distance": dist, "metric": metric}
    out = [{**base, "aspect": "all", "direction": "all", "value": float(err.mean()), "n": len(err)}]
    ordered = [direction_name(c, c2) for c, c2 in zip(pf["c"], pf["c_prime"])]
    frame = pd.DataFrame({"aspect": pf["aspect"], "direction": ordered, "err": err})
    for a, g in frame.groupby("aspect", sort=False):
        out.append({**base, "aspect": a, "direction": "all", "value": float(g["err"].mean()), "n": len(g)})
        for d, gd in g.groupby("direction", sort=True):
            out.append({**base, "aspect": a, "direction": d, "value": float(gd["err"].mean()), "n": len(gd)})
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
            cols = [direction_name(c, c2) for c, c2 in VALUE_CHANGES]
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
        rows = tab[(tab["model"] == model) & (tab["cebab_task"] == task) & (tab["kind"] == "icace_error")
                   & (tab["aspect"] == "all") & (tab["direction"] == "all")]
        plots.caption(fig, f"CEBaB ICaCE-Error per explainer ({task} sentiment), lower is better; bars: mean ± std "
                      "over seeds", property=[a for a in aspects if a != "all"] or "the aspects together", model=model,
                      data=f"CEBaB, train {variant}, {split} edit pairs", n=plots.counts(plots.values(rows["n"]),
                                                                                       "pairs"),
                      seed=rows.get("seed"), note=cid or "")
        save(fig, out_dir / (safe_name(f"cebab_icace_error_{model}_{task}" + (f"_{cid}" if cid else "")) + ".png"))


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


def _record_items(table: pd.DataFrame, records: pd.DataFrame, pairs: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per evaluation pair, each explainer's ICaCE-Error for every distance (``pairs``: the per-pair frame the run
    returns, also written as ``cebab_pair_effects.parquet``): the items of the overall ICaCE-Error records."""
    from cprobe.records import item_rows

    if pairs is None:
        return None
    true = np.stack(pairs["icace"])
    from cprobe.metrics.registry import METRICS

    outside = {m for m in records["metric"] if m in METRICS and METRICS[m].inputs == "effect"}
    whole = records[(records["slice"] == "{}") & (records["metric"].str.startswith("icace_error_")
                                                  | records["metric"].isin(outside))]
    frames = []
    for name, recs in whole.groupby("method", sort=False):
        col = f"estimate_{name}"
        if col not in pairs:
            continue
        est = np.stack(pairs[col])
        values = {m: effect_values(METRICS[m], true, est) if m in outside else
                  icace_error(true, est, m.removeprefix("icace_error_")) for m in recs["metric"]}
        frames.append(item_rows(recs, values, pairs["pair"]))
    return pd.concat(frames, ignore_index=True) if frames else None


RECORDS = RecordSpec(
    dataset=const("cebab"), model="model", method="explainer", family=Derived(_family),
    setting=("cebab_task", "train_variant", "eval_split"), slice=("split", "aspect", "direction"),
    slice_defaults={"split": "", "aspect": "all", "direction": "all"}, metric=Derived(_metric), value="value", n="n",
    breakdowns=("split", "aspect", "direction"), items=_record_items, items_file="cebab_pair_effects.parquet")
"""Every row as a record (:mod:`cprobe.records`): the explainer is the method (the classifiers' rows: ``explained``
/ ``concepts``, family ``classifier``); the evaluation pairs are the items of the overall ICaCE-Errors."""
