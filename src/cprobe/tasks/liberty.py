"""LIBERTy (Toker et al. 2026): concept-based explainers scored against *structural* counterfactuals from an SCM.

One job = one benchmark (``dataset=liberty_cv|liberty_violence|liberty_disease``: an SCM, its texts and exact
counterfactuals, :mod:`cprobe.data.liberty`), one explained model (a pretrained encoder fine-tuned on the train
split to predict the label, cached; f(x) = its softmax), one seed. It writes a long table (column ``kind``):

- ``classifier``: the explained model's accuracy / macro-F1 on the test split; the concept classifier's accuracy
  per concept on the test split when an explainer needs it;
- ``ed``: ICaCE error distance per explainer and distance (``l2``, ``cosine``, ``normdiff``) and their ``mean`` —
  the paper's reported ED (Def. 3, averaged over changes);
- ``of``: local order-faithfulness per explainer (Def. 4);
- ``importance``: global concept importance per concept, gold (``explainer = gold``, from true effects) and per
  explainer (from its estimates); ``global_of``: each explainer's concordance with the gold ranking (Table 16);
- ``sensitivity``: Σ|ICaCE| per concept of the explained model, beside the SCM's Monte-Carlo "True Effect"
  (``explainer = scm``; not defined when the label is the SCM's root) (Table 17).

``liberty_pair_effects.parquet`` keeps every pair: f on both texts, the true ICaCE and each estimate.
``report`` writes Tables 1/15 (ED/OF), 16 (global OF), 17 (sensitivity), 2 (top-3 concepts) as ``mean (std)`` over
seeds, a bar chart of global OF per explainer and a sensitivity heat-map.

The explained model, the explainers' inputs (embedding spaces, the concept classifier) and the explainer runs are the
concept-effect engine's (:mod:`cprobe.tasks.effects`, shared with CEBaB: dispatch on declared capabilities); this
module supplies the benchmark (items and structural pairs from the dataset registry, concept values coded as value
indices), the SCM's true effects, the metrics (:mod:`cprobe.metrics.liberty`) and the report. Explainers that model
removal only are refused on an SCM without a ``null_value``; benchmarks below :data:`MIN_SIZES` are refused and
below :data:`WARN_SIZES` warned about.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cprobe.data.items import TextItem
from cprobe.errors import ConfigError, DataError
from cprobe.job import JobContext
from cprobe.tasks import Uses
from cprobe.metrics import liberty as M
from cprobe.metrics.registry import outside_metrics
import cprobe.plots as plots
from cprobe.paths import safe_name
from cprobe.plots import new_figure, save
from cprobe.records import Derived, RecordSpec
from cprobe.results import summarise
from cprobe.tasks.effects import EffectConfig, EffectStudy, classifier_rows, diagnostics, effect_values, \
    explainer_sources, finite_table, run_effects, subsample_pairs, validate_effects

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "dataset"))  # the explained encoder and the SCM / texts; no layers, probes or splits
DEFAULT_EXPLAINERS = ["random", "approx", "convecs", "st_match", "pt_match", "ft_match", "tcav", "conceptshap"]
"""Runnable on every SCM; the removal-only LEACE is added where the SCM declares a null value (liberty_disease)."""


MIN_SIZES = {"explainer": 30, "test": 10, "train": 30}
"""Below these a LIBERTy job is refused: D_M texts (a matching pool, the concept classifier's training set), test
texts (the counterfactuals' bases), the explained model's training texts."""
WARN_SIZES = {"explainer": 200, "test": 50, "train": 300}
"""Below these a job runs with a loud, recorded warning (the paper: D_M 500, D_f 1,500, 311–439 test texts)."""
_SPLIT_NAMES = {"explainer": "D_M (dataset.n_explainer)", "test": "test texts (dataset.n_test)",
                "train": "D_f, the explained model's training texts (dataset.n_explained)"}


def size_problems(sizes: dict[str, int]) -> tuple[str | None, list[str]]:
    """(why the split sizes are refused or None, the warnings) for a LIBERTy benchmark (MIN_SIZES, WARN_SIZES)."""
    for split, n in sizes.items():
        if n < MIN_SIZES[split]:
            return (f"{_SPLIT_NAMES[split]} has {n} texts, below the minimum of {MIN_SIZES[split]} a LIBERTy job "
                    f"needs (the paper: D_M 500, D_f 1,500, 311-439 test texts)"), []
    return None, [f"{_SPLIT_NAMES[split]} has only {n} texts (fewer than {WARN_SIZES[split]}): explainer scores on "
                  "so small a benchmark are unreliable" for split, n in sizes.items() if n < WARN_SIZES[split]]


@dataclass(frozen=True)
class Config(EffectConfig):
    """The ``liberty:`` node (the keys every concept-effect study shares: :class:`EffectConfig`)."""

    concepts: list[str] | None = None  # the concepts to intervene on / explain (null: every non-label variable)
    explainers: list[str] = field(default_factory=lambda: list(DEFAULT_EXPLAINERS))
    mc_samples: int = 200_000  # Monte-Carlo units for the SCM's true effects
    max_pool: int | None = None  # D_M (the explainers' pool, the concept classifier's texts): at most this many


def pool_texts(data: Any, config: Config) -> list[TextItem]:
    """D_M as the job uses it: all of the benchmark's, or ``max_pool`` of them drawn once with seed 0 (order kept)."""
    return subsample_pairs(data.splits["explainer"], config.max_pool)


def validate(job: Any) -> None:
    from cprobe.data.liberty import LibertyKeys
    from cprobe.data.registry import split_config
    from cprobe.data.scm import SCM

    cfg: Config = job.task_cfg
    ds = job.keys.dataset or {}
    if ds.get("type", ds.get("name")) != "liberty":
        raise ConfigError("the liberty task needs a LIBERTy dataset (dataset=liberty_cv|liberty_violence|"
                          "liberty_disease)")
    _, _, keys = split_config(ds)
    assert isinstance(keys, LibertyKeys)
    scm = SCM.load(keys.scm)
    if keys.texts:  # the user's file: it must exist (it is read and checked against the SCM when the job starts)
        path = Path(keys.texts).expanduser()
        if not path.is_absolute() and not path.exists() and job.data_root is not None:
            path = job.data_root / path
        if job.data_root is not None and not path.is_file():
            raise ConfigError(f"dataset.texts: {keys.texts} not found (relative paths: the current directory, then "
                              f"the data dir {job.data_root})")
    else:  # the text node: known, and its phrase bank complete; the benchmark big enough to score on
        from cprobe.data.realiser import build_realiser

        build_realiser(keys.realiser, scm)
        n_test = keys.n_test or max(1, round(keys.test_share * keys.n_explained))
        why, _ = size_problems({"explainer": keys.n_explainer, "test": n_test,
                                "train": keys.n_explained - (0 if keys.n_test else n_test)})
        if why:
            raise ConfigError(why)
    concepts = cfg.concepts if cfg.concepts is not None else list(scm.concepts)
    bad = [c for c in concepts if c not in scm.concepts]
    if bad or not concepts:
        raise ConfigError(f"unknown concept(s) {bad or '[] (none given)'} of SCM {scm.name}; choose from "
                          f"{list(scm.concepts)}")
    if len(set(concepts)) != len(concepts):
        raise ConfigError(f"liberty.concepts lists a concept twice: {concepts}")
    if scm.null_value is not None:
        null_index(scm, concepts, scm.null_value)
    validate_effects(job, "liberty", concepts, removal_supported=scm.null_value is not None)
    if cfg.mc_samples < 1000:
        raise ConfigError(f"liberty.mc_samples must be >= 1000, got {cfg.mc_samples}")
    if cfg.max_pairs is not None and cfg.max_pairs < 2:
        raise ConfigError(f"liberty.max_pairs must be >= 2 (or null for all), got {cfg.max_pairs}")
    if cfg.max_pool is not None and cfg.max_pool < MIN_SIZES["explainer"]:
        raise ConfigError(f"liberty.max_pool must be >= {MIN_SIZES['explainer']} (or null for all), got {cfg.max_pool}")


# ----------------------------------------------------------------------------------------------- the job
def study(data: Any, config: Config) -> EffectStudy:
    """LIBERTy's part of a concept-effect job: the explained model's training split, the test texts, D_M and the
    counterfactuals, concept values coded as value indices (``"0"``, ``"1"``, ...; the null value's index where the
    SCM declares one), and the concept classifier trained on D_M."""
    scm = data.scm
    concepts = list(config.concepts if config.concepts is not None else scm.concepts)
    label = scm.variables[scm.label]
    pairs = subsample_pairs([p for p in data.pairs if p.intervened[0] in concepts], config.max_pairs)
    if not pairs:
        raise DataError(f"no counterfactual pairs on concepts {concepts}")
    train_items = list(data.splits["train"])
    explainer = pool_texts(data, config)
    texts: dict[str, TextItem] = {}
    for it in (*data.splits["test"], *explainer, *(p.source for p in pairs)):
        texts.setdefault(it.id, it)
    items = list(texts.values())
    index = {it.id: i for i, it in enumerate(items)}
    pool = [index[it.id] for it in explainer]
    sizes = [len(scm.variables[c].values) for c in concepts]
    values = tuple(str(i) for i in range(max(sizes)))  # explainers see value indices ("0", "1", ...)
    code = {c: {v: str(i) for i, v in enumerate(scm.variables[c].values)} for c in concepts}
    null = scm.null_value
    changes = [next(iter(p.changes.items())) for p in pairs]
    columns = pd.DataFrame({"pair": [p.id for p in pairs], "example": [p.base.id for p in pairs],
                            "concept": [c for c, _ in changes], "change": [f"{c}: {v}→{v2}" for c, (v, v2) in changes]})
    concept_train = explainer
    targets = torch.tensor([[scm.variables[c].values.index(it.concepts[c]) for c in concepts] for it in concept_train])
    return EffectStudy(
        name="liberty", model_cache=f"liberty-{scm.name}", train=train_items,
        y_train=[label.values.index(it.outcome) for it in train_items], n_classes=len(label.values), texts=items,
        pool=pool, pool_labels=[label.values.index(items[i].outcome) for i in pool], pairs=pairs,
        pair_columns=columns, concepts=tuple(concepts), values=values,
        null_value="0" if null is None else str(null_index(scm, concepts, null)),
        code=lambda it: {c: code[c][it.concepts[c]] for c in concepts}, change_code=lambda c, v: code[c][v],
        group=lambda it: str(it.meta.get("unit", it.id)), concept_train=concept_train, concept_targets=targets,
        concept_sizes=sizes, concept_cache=f"liberty-{scm.name}-concepts", removal_supported=null is not None)


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.data.liberty import LibertyData
    from cprobe.data.scm import true_effects
    from cprobe.job import config_hash

    cfg = ctx.cfg
    data = ctx.dataset()
    if not isinstance(data, LibertyData):
        raise ConfigError("the liberty task needs a LIBERTy dataset (dataset=liberty_cv|...)")
    why, warnings = size_problems({"explainer": len(pool_texts(data, config)), "test": len(data.splits["test"]),
                                   "train": len(data.splits["train"])})
    if why:  # a file of the user's own texts (generated benchmarks are checked in validation)
        raise DataError(why)
    for w in warnings:
        ctx.warn(w)
    scm = data.scm
    spec = study(data, config)
    res = run_effects(ctx, spec, config)
    concepts, k = list(spec.concepts), spec.n_classes
    label = scm.variables[scm.label]

    setting = {"liberty": asdict(config), "model": cfg["model"], "dataset": cfg["dataset"]}
    common = {"model": res.encoder.name, "scm": scm.name, "config_id": config_hash(setting)[:8]}
    rows: list[dict[str, Any]] = []
    test = list(data.splits["test"])
    rows += classifier_rows(common, "explained", np.array([label.values.index(it.outcome) for it in test]),
                            res.probs[[res.index[it.id] for it in test]].argmax(1), k, split="test",
                            concept=scm.label)
    if res.concept_pred is not None:  # the concept classifier on the test texts it labelled
        rows_test = [res.index[it.id] for it in test if res.concept_pred[res.index[it.id], 0] >= 0]
        for j, c in enumerate(concepts):
            gold = np.array([scm.variables[c].values.index(spec.texts[i].concepts[c]) for i in rows_test])
            rows += classifier_rows(common, "concepts", gold, res.concept_pred[rows_test, j], spec.concept_sizes[j],
                                    split="test", concept=c)

    true = res.true
    concept_of = list(spec.pair_columns["concept"])
    change = list(spec.pair_columns["change"])
    example = list(spec.pair_columns["example"])
    gold = M.importance(true, concept_of, change)
    rows += _importance_rows(common, "gold", gold, concepts)
    sens = M.sensitivity(true, concept_of)
    rows += [{**common, "kind": "sensitivity", "explainer": "model", "concept": c, "value": sens[c],
              "n": concept_of.count(c)} for c in concepts if c in sens]
    if any(scm.label in scm.descendants(c) for c in concepts):  # no true effect when the label is the root
        t0 = time.perf_counter()
        effects = true_effects(scm, config.mc_samples, seed=0)
        ctx.timings["true_effects_s"] = time.perf_counter() - t0
        rows += [{**common, "kind": "sensitivity", "explainer": "scm", "concept": c, "value": effects[c],
                  "n": config.mc_samples} for c in concepts]
    extra = outside_metrics(cfg, "effect")
    for name, est in res.estimates.items():
        rows += _score_rows(common, name, true, est, example, change, concept_of, config.distances,
                            {c: gold[c] for c in concepts if c in gold})
        for m in extra:  # the config's outside metrics: the mean over pairs, overall and per concept
            v = effect_values(m, true, est)
            rows.append({**common, "kind": "metric", "explainer": name, "concept": "all", "metric": m.name,
                         "value": _mean(v), "n": len(v)})
            for c in concepts:
                sel = np.asarray([x == c for x in concept_of])
                if sel.any():
                    rows.append({**common, "kind": "metric", "explainer": name, "concept": c, "metric": m.name,
                                 "value": _mean(v[sel]), "n": int(sel.sum())})
        for metric, concept, v in diagnostics(res.explainers[name]):
            rows.append({**common, "kind": "explainer", "explainer": name, "metric": metric, "value": v,
                         "n": len(spec.pairs), **({"concept": concept} if concept else {})})
    table = finite_table(rows, ("explainer", "distance", "concept", "metric", "split"))
    table["method_source"] = explainer_sources(table["explainer"])
    return table


def _mean(v: np.ndarray) -> float:
    ok = ~np.isnan(v)
    return float(v[ok].mean()) if ok.any() else float("nan")


def null_index(scm: Any, concepts: Sequence[str], null: str) -> int:
    """The one value index of ``null`` in every concept (a ConfigError when it is not at one index everywhere)."""
    idx = {scm.variables[c].values.index(null) for c in concepts if null in scm.variables[c].values}
    if len(idx) != 1:
        raise ConfigError(f"SCM {scm.name}: null_value {null!r} must be a value of every concept, at one index")
    return idx.pop()


def _importance_rows(common: dict, name: str, scores: Mapping[str, float], concepts: Sequence[str]) -> list[dict]:
    """Rows in the SCM's concept order (tables and figures keep it)."""
    return [{**common, "kind": "importance", "explainer": name, "concept": c, "value": scores[c], "n": 0}
            for c in concepts if c in scores]


def _score_rows(common: dict, name: str, true: np.ndarray, est: np.ndarray, example: list[str], change: list[str],
                concept: list[str], distances: Sequence[str], gold: Mapping[str, float]) -> list[dict]:
    base = {**common, "explainer": name, "concept": "all", "n": len(true)}
    out, eds = [], []
    for d in distances:
        ed = M.error_distance(true, est, change, d)
        eds.append(ed)
        out.append({**base, "kind": "ed", "distance": d, "metric": "ed", "value": ed})
    out.append({**base, "kind": "ed", "distance": "mean", "metric": "ed", "value": float(np.mean(eds))})
    out.append({**base, "kind": "of", "metric": "of", "value": M.order_faithfulness(true, est, example, change)})
    imp = M.importance(est, concept, change)
    out += _importance_rows(common, name, imp, list(gold))
    out.append({**base, "kind": "global_of", "metric": "global_of", "value": M.global_order_faithfulness(gold, imp)})
    return out


# ----------------------------------------------------------------------------------------------- report
GROUP = ["scm", "model"]


def _wide(s: pd.DataFrame, cell: pd.Series) -> pd.DataFrame:
    """Rows explainers, one column per (config, SCM, model), the given cells."""
    cols = [k for k in s.columns if k in ("config_id", *GROUP)]
    frame = s.assign(cell=list(cell), column=[" · ".join(str(r[k]) for k in cols) for _, r in s.iterrows()])
    return frame.pivot_table(index="explainer", columns="column", values="cell", aggfunc="first",
                             sort=False).reset_index()


def local_table(table: pd.DataFrame) -> pd.DataFrame:
    """Tables 1 / 15: rows explainers, one ``ED / OF`` column per (SCM, model), cells ``.ED/.OF`` (means)."""
    ed = summarise(table[table["distance"] == "mean"], "ed", [*GROUP, "explainer"])
    of = summarise(table, "of", [*GROUP, "explainer"])
    if ed.empty:
        return ed
    keys = [k for k in ed.columns if k in ("config_id", *GROUP, "explainer")]
    merged = ed.merge(of, on=keys, suffixes=("_ed", "_of"), how="left")
    return _wide(merged, pd.Series([f"{a:.2f} / {b:.2f}" for a, b in zip(merged["mean_ed"], merged["mean_of"])]))


def report(table: pd.DataFrame, out_dir: Any) -> None:
    from cprobe.results import write_table

    if "kind" not in table:
        return
    tab = table.copy()
    write_table(local_table(tab), out_dir / "liberty_local")
    write_table(summarise(tab, "ed", [*GROUP, "explainer", "distance"]), out_dir / "liberty_ed")
    write_table(summarise(tab, "of", [*GROUP, "explainer"]), out_dir / "liberty_of")
    g = summarise(tab, "global_of", [*GROUP, "explainer"])
    # Table 16: rows explainers, one column per (SCM, model), cells the mean global OF (over seeds)
    write_table(g if g.empty else _wide(g, g["mean"].round(3)), out_dir / "liberty_global_of")
    write_table(g, out_dir / "liberty_global_of_long")
    sens = summarise(tab, "sensitivity", [*GROUP, "explainer", "concept"])
    if not sens.empty:
        idx = [k for k in sens.columns if k in ("config_id", *GROUP, "explainer")]
        wide = sens.pivot_table(index=idx, columns="concept", values="mean", sort=False).reset_index()
        write_table(wide, out_dir / "liberty_sensitivity")
    imp = summarise(tab, "importance", [*GROUP, "explainer", "concept"])
    if not imp.empty:
        by = [k for k in imp.columns if k in ("config_id", *GROUP, "explainer")]
        top = [{**dict(zip(by, key)), "top3": ", ".join(M.top(dict(zip(gi["concept"], gi["mean"]))))}
               for key, gi in imp.groupby(by, sort=False)]
        write_table(pd.DataFrame(top), out_dir / "liberty_top3")
        write_table(imp, out_dir / "liberty_importance")
    write_table(summarise(tab, "classifier", [*GROUP, "explainer", "concept", "metric"]),
                out_dir / "liberty_classifier")
    write_table(summarise(tab, "explainer", [*GROUP, "explainer", "concept", "metric"]), out_dir / "liberty_explainer")
    _plot_global_of(g, out_dir, tab)
    _plot_sensitivity(sens, out_dir, tab)


def _caption(fig: Any, shows: str, tab: pd.DataFrame) -> None:
    """What every LIBERTy figure names: the concepts, the explained model(s), the benchmark (SCM), n (structural
    counterfactual pairs) and the seed(s)."""
    concepts = (list(tab.loc[tab["kind"].isin(["sensitivity", "importance"]), "concept"].dropna().unique())
                if "concept" in tab else [])
    scored = tab[tab["kind"].isin(["ed", "of"])] if "n" in tab else tab.iloc[:0]
    plots.caption(fig, shows, property=concepts or "the SCM's concepts", model=tab["model"],
                  data=[f"LIBERTy {s}" for s in tab["scm"].unique()],
                  n=plots.counts(plots.values(scored["n"]) if len(scored) else "?", "counterfactual pairs"),
                  seed=tab.get("seed"))


def _plot_global_of(g: pd.DataFrame, out_dir: Any, tab: pd.DataFrame) -> None:
    """Fig. 3: global order-faithfulness per explainer (error bars: std over seeds), one panel per (SCM, model)."""
    if g.empty:
        return
    by = [k for k in ("config_id", *GROUP) if k in g.columns]
    groups = list(g.groupby(by, sort=False))
    fig, axes = new_figure(len(groups), width=5.0, height=3.6)
    for ax, (key, gi) in zip(axes, groups):
        ax.bar(np.arange(len(gi)), gi["mean"], yerr=gi["std"], capsize=2, color="tab:blue")
        ax.set_xticks(np.arange(len(gi)), gi["explainer"], rotation=45, ha="right", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_title(" · ".join(map(str, key if isinstance(key, tuple) else (key,))), fontsize=9)
        ax.set_ylabel("global OF (higher is better)", fontsize=8)
    _caption(fig, "LIBERTy global order-faithfulness per explainer (error bars: std over seeds)", tab)
    save(fig, out_dir / "liberty_global_of.png")


def _plot_sensitivity(sens: pd.DataFrame, out_dir: Any, tab: pd.DataFrame) -> None:
    """Sensitivity heat-map (Table 17): rows = the explained models and the SCM's true effect, columns = concepts."""
    if sens.empty:
        return
    for scm, gs in sens.groupby("scm", sort=False):
        gs = gs.assign(row=[("True effect (SCM)" if e == "scm" else m) for e, m in zip(gs["explainer"], gs["model"])])
        wide = gs.pivot_table(index="row", columns="concept", values="mean", aggfunc="mean", sort=False)
        fig, (ax,) = new_figure(1, width=1.1 * wide.shape[1] + 2.5, height=0.5 * wide.shape[0] + 1.8)
        im = ax.imshow(wide.to_numpy(), cmap="viridis", vmin=0, vmax=max(float(np.nanmax(wide.to_numpy())), 1e-9))
        ax.set_xticks(np.arange(wide.shape[1]), wide.columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(np.arange(wide.shape[0]), wide.index, fontsize=8)
        for (i, j), v in np.ndenumerate(wide.to_numpy()):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < wide.to_numpy().max()
                    * 0.6 else "black")
        fig.colorbar(im, ax=ax, fraction=0.04)
        _caption(fig, f"LIBERTy {scm}: sensitivity Σ|ICaCE| per concept", tab[tab["scm"] == scm])
        save(fig, out_dir / f"liberty_sensitivity_{safe_name(scm)}.png")


# ----------------------------------------------------------------------------------------------- records
_REFERENCES = ("gold", "scm", "model")  # importance from true effects, the SCM's true effect, the model's sensitivity


def _metric(t: pd.DataFrame) -> list[str]:
    """Each row's registered metric: ED per distance (``ed``: their mean, the paper's), OF, global OF, importance,
    sensitivity (the SCM's row: its true effect), the classifiers' and explainers' metrics by name."""
    out = []
    for k, m, d, e in zip(t["kind"], t["metric"], t["distance"], t["explainer"]):
        if k == "ed":
            out.append("ed" if d == "mean" else f"ed_{d}")
        elif k == "sensitivity":
            out.append("true_effect" if e == "scm" else "sensitivity")
        elif k in ("classifier", "explainer", "metric"):  # by name (the config's outside metrics: theirs)
            out.append({"completeness": "conceptshap_completeness"}.get(m, m))
        else:
            out.append(k)
    return out


def _family(t: pd.DataFrame) -> list[str]:
    return ["classifier" if k == "classifier" else "reference" if e in _REFERENCES else "explainer"
            for k, e in zip(t["kind"], t["explainer"])]


RECORDS = RecordSpec(
    dataset="scm", model="model", method="explainer", family=Derived(_family), slice=("split", "concept"),
    slice_defaults={"split": "", "concept": "all"}, metric=Derived(_metric), value="value", n="n",
    breakdowns=("split", "concept"))
"""Every row as a record (:mod:`cprobe.records`); the dataset is the SCM, the explainer the method (``gold``,
``scm``, ``model``: the references, family ``reference``)."""
