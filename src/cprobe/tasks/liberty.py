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

Everything runs through the core: items and pairs from the dataset registry, the one model entry point
(:meth:`ModelAdapter.map`), the fine-tuning of :mod:`cprobe.models.classifier`, the explainer registry (dispatch on
declared capabilities) and :mod:`cprobe.metrics.liberty` / :mod:`cprobe.metrics.icace`.
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
from cprobe.metrics import liberty as M
from cprobe.metrics.icace import DISTANCES, distance
from cprobe.models.classifier import finetune_config
from cprobe.models.load import named_model_config
from cprobe.plots import new_figure, save
from cprobe.progress import track
from cprobe.records import Derived, RecordSpec
from cprobe.results import summarise

log = logging.getLogger("cprobe")

USES_LAYERS = False
DEFAULT_EXPLAINERS = ["random", "approx", "convecs", "st_match", "pt_match", "ft_match", "leace", "tcav",
                      "conceptshap"]


@dataclass(frozen=True)
class Config:
    """The ``liberty:`` node."""

    concepts: list[str] | None = None  # the concepts to intervene on / explain (null: every non-label variable)
    explainers: list[str] = field(default_factory=lambda: list(DEFAULT_EXPLAINERS))
    explainer: dict = field(default_factory=dict)  # per-explainer settings: {name: {key: value}}
    distances: list[str] = field(default_factory=lambda: ["l2", "cosine", "normdiff"])
    finetune: dict = field(default_factory=dict)  # the explained model (cprobe.models.classifier.FinetuneConfig)
    concept_model: dict = field(default_factory=dict)  # the concept classifier (same keys)
    st_model: str = "minilm_l6"  # the sentence-transformer of st_match (a model config name)
    mc_samples: int = 200_000  # Monte-Carlo units for the SCM's true effects
    max_pairs: int | None = None  # subsample the counterfactual pairs (smoke tests)


def validate(job: Any) -> None:
    from cprobe.data.liberty import LibertyKeys
    from cprobe.data.registry import split_config
    from cprobe.data.scm import SCM
    from cprobe.explainers import EXPLAINERS
    from cprobe.explainers.base import check_explainers
    from cprobe.paths import data_dir

    cfg: Config = job.task_cfg
    ds = job.keys.dataset or {}
    if ds.get("type", ds.get("name")) != "liberty":
        raise ConfigError("the liberty task needs a LIBERTy dataset (dataset=liberty_cv|liberty_violence|"
                          "liberty_disease)")
    _, _, keys = split_config(ds)
    assert isinstance(keys, LibertyKeys)
    scm = SCM.load(keys.scm)
    if keys.texts:  # the user's file: it must exist (it is read and checked against the SCM when the job starts)
        configured = (job.cfg.get("paths") or {}).get("data_dir")
        root = Path(configured) if configured else data_dir()
        path = Path(keys.texts).expanduser()
        if not path.is_absolute() and not path.exists():
            path = root / path
        if not path.is_file():
            raise ConfigError(f"dataset.texts: {keys.texts} not found (relative paths: the current directory, then "
                              f"the data dir {root})")
    else:  # the text node: known, and its phrase bank complete
        from cprobe.data.realiser import build_realiser

        build_realiser(keys.realiser, scm)
    concepts = cfg.concepts if cfg.concepts is not None else list(scm.concepts)
    bad = [c for c in concepts if c not in scm.concepts]
    if bad or not concepts:
        raise ConfigError(f"unknown concept(s) {bad or '[] (none given)'} of SCM {scm.name}; choose from "
                          f"{list(scm.concepts)}")
    if len(set(concepts)) != len(concepts):
        raise ConfigError(f"liberty.concepts lists a concept twice: {concepts}")
    check_explainers(cfg.explainers, cfg.explainer, "liberty")
    if not cfg.distances:
        raise ConfigError(f"liberty.distances is empty; choose from {sorted(DISTANCES)}")
    for d in cfg.distances:
        distance(d)
    defaults = (job.keys.model or {}).get("finetune")
    finetune_config(cfg.finetune, "liberty.finetune", defaults)
    finetune_config(cfg.concept_model, "liberty.concept_model", defaults)
    if cfg.mc_samples < 1000:
        raise ConfigError(f"liberty.mc_samples must be >= 1000, got {cfg.mc_samples}")
    if cfg.max_pairs is not None and cfg.max_pairs < 2:
        raise ConfigError(f"liberty.max_pairs must be >= 2 (or null for all), got {cfg.max_pairs}")
    if any(EXPLAINERS.get(n).embedding_space == "st" for n in cfg.explainers):
        named_model_config(cfg.st_model, "liberty.st_model")


# ----------------------------------------------------------------------------------------------- the job
def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.data.liberty import LibertyData
    from cprobe.data.registry import load_dataset
    from cprobe.data.scm import true_effects
    from cprobe.explainers import EXPLAINERS, ExplainedModel, Observed
    from cprobe.explainers.base import TrainingRegime
    from cprobe.models.classifier import finetuned_classifier

    cfg, seed = ctx.cfg, ctx.seed
    data = load_dataset(cfg["dataset"], ctx.data_root)
    if not isinstance(data, LibertyData):
        raise ConfigError("the liberty task needs a LIBERTy dataset (dataset=liberty_cv|...)")
    for note in data.notes:
        ctx.warn(note)
    scm = data.scm
    concepts = list(config.concepts if config.concepts is not None else scm.concepts)
    label = scm.variables[scm.label]
    k = len(label.values)
    pairs = [p for p in data.pairs if p.intervened[0] in concepts]
    if config.max_pairs is not None and len(pairs) > config.max_pairs:  # the same pairs for every seed
        keep = sorted(np.random.default_rng(0).choice(len(pairs), config.max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
    if not pairs:
        raise DataError(f"no counterfactual pairs on concepts {concepts}")
    explainer_classes = {n: EXPLAINERS.get(n) for n in config.explainers}
    ft = finetune_config(config.finetune, "liberty.finetune", cfg["model"].get("finetune"))

    # the explained model: the encoder fine-tuned on the train split to predict the label (cached)
    train_items = list(data.splits["train"])
    y_train = torch.tensor([label.values.index(it.outcome) for it in train_items])
    encoder = ctx.adapter({**cfg["model"], "kind": "encoder"})
    t0 = time.perf_counter()
    clf, cached = finetuned_classifier(encoder, train_items, y_train, 1, k, ft, seed, ctx.cache_root / "finetuned",
                                       f"liberty-{scm.name}", ctx.progress)
    ctx.timings["finetune_s" if not cached else "load_finetuned_s"] = time.perf_counter() - t0

    # f and φ of every text the study touches, one pass
    texts: dict[str, TextItem] = {}
    for it in (*data.splits["test"], *data.splits["explainer"], *(p.source for p in pairs)):
        texts.setdefault(it.id, it)
    items = list(texts.values())
    index = {it.id: i for i, it in enumerate(items)}
    t0 = time.perf_counter()
    from cprobe.models.classifier import classify_reading, phi_site
    from cprobe.models.sites import MEAN, Site

    phi, pooled = phi_site(clf), Site(clf.n_layers, MEAN)
    acts, logp = classify_reading(clf, items, [phi, pooled], ft.max_length, desc="classify" if ctx.progress else None)
    reps = acts[phi]  # φ: what the head reads (TCAV, ConceptSHAP, LEACE, ...)
    probs = logp.exp().double().numpy()
    ctx.timings["classify_s"] = time.perf_counter() - t0

    from cprobe.job import config_hash

    setting = {"liberty": asdict(config), "model": cfg["model"], "dataset": cfg["dataset"]}
    common = {"model": encoder.name, "scm": scm.name, "config_id": config_hash(setting)[:8]}
    rows: list[dict[str, Any]] = []
    test = list(data.splits["test"])
    rows += _classifier_rows(common, "explained", scm.label,
                             np.array([label.values.index(it.outcome) for it in test]),
                             probs[[index[it.id] for it in test]].argmax(1), k)

    # the explainers' inputs, computed only where a declared capability asks for them
    pool = [index[it.id] for it in data.splits["explainer"]]
    base_idx = np.array([index[p.base.id] for p in pairs])
    cf_idx = np.array([index[p.source.id] for p in pairs])
    needed = sorted({c.embedding_space for c in explainer_classes.values() if c.embedding_space})
    rows_needed = sorted(set(pool) | set(base_idx.tolist()))
    embeddings = _embeddings(ctx, needed, items, rows_needed, acts[pooled], encoder, ft.max_length, config.st_model)
    concept_probs = predicted = None
    if any(c.needs_predicted_concepts or c.needs_concept_probs for c in explainer_classes.values()):
        predicted, concept_probs = _concept_classifier(ctx, encoder, data, items, rows_needed, concepts, config,
                                                       seed, common, rows)

    max_values = max(len(scm.variables[c].values) for c in concepts)
    values = tuple(str(i) for i in range(max_values))  # explainers see value indices ("0", "1", ...)
    code = {c: {v: str(i) for i, v in enumerate(scm.variables[c].values)} for c in concepts}
    everything = Observed(texts=[it.text for it in items], probs=probs, reps=reps,
                          concepts=[{c: code[c][it.concepts[c]] for c in concepts} for it in items],
                          predicted=predicted, groups=[str(it.meta.get("unit", it.id)) for it in items],
                          embeddings=embeddings, concept_probs=concept_probs)
    train_obs = everything.take(pool)
    train_obs.labels = np.array([label.values.index(items[i].outcome) for i in pool])
    queries = pair_queries(pairs, everything, index, code)
    changes = [next(iter(p.changes.items())) for p in pairs]
    null = scm.null_value
    model = ExplainedModel(clf.model.head.eval(), k, tuple(concepts), values,
                           "0" if null is None else str(_null_index(scm, concepts, null)),
                           TrainingRegime(clf, ft.max_length, seed))

    true = probs[cf_idx] - probs[base_idx]
    concept_of = [c for c, _ in changes]
    change = [f"{c}: {v}→{v2}" for c, (v, v2) in changes]
    example = [p.base.id for p in pairs]
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

    per_pair = pd.DataFrame({"pair": [p.id for p in pairs], "example": example, "concept": concept_of,
                             "change": change})
    per_pair["base_probs"], per_pair["cf_probs"], per_pair["icace"] = list(probs[base_idx]), list(probs[cf_idx]), \
        list(true)
    for name in track(config.explainers, "explainers", ctx.progress):
        cls = explainer_classes[name]
        if cls.removal_only and null is None:
            ctx.warn(f"explainer {name} skipped: it models removal only, and SCM {scm.name} has no null value "
                     "(set null_value: in the SCM file where value 0 means absent)")
            continue
        t0 = time.perf_counter()
        ex = EXPLAINERS.build({"name": name, **dict(config.explainer.get(name) or {})}, seed=seed,
                              device=ctx.device)
        try:
            est = ex.fit(model, train_obs).explain(queries)
        except DataError as e:
            ctx.warn(f"explainer {name} skipped: {e}")
            continue
        ctx.timings[f"explainer_{name}_s"] = time.perf_counter() - t0
        per_pair[f"estimate_{name}"] = list(est)
        rows += _score_rows(common, name, true, est, example, change, concept_of, config.distances,
                            {c: gold[c] for c in concepts if c in gold})
        for key, v in getattr(ex, "fallbacks_", {}).items():
            rows.append({**common, "kind": "explainer", "explainer": name, "metric": f"fallback_{key}",
                         "value": float(v), "n": len(pairs)})
    _write_pairs(per_pair, ctx.out_dir / "liberty_pair_effects.parquet")
    table = pd.DataFrame(rows)
    for col in ("explainer", "distance", "concept", "metric", "split"):
        if col not in table:
            table[col] = ""
        table[col] = table[col].fillna("")
    return table


def pair_queries(pairs: Sequence[Any], everything: Any, index: Mapping[str, int],
                 code: Mapping[str, Mapping[str, str]]) -> Any:
    """The explainers' view of the pairs: the base text only (its f, φ, embeddings and *predicted* concepts — never
    its gold labels, never anything of the counterfactual) and the change ``(C, c, c′)`` as value indices."""
    from cprobe.explainers import Queries

    base = everything.take([index[p.base.id] for p in pairs])
    base.concepts = None
    base.labels = None
    changes = [next(iter(p.changes.items())) for p in pairs]
    return Queries(base, [c for c, _ in changes], [code[c][v] for c, (v, _) in changes],
                   [code[c][v2] for c, (_, v2) in changes])


def _null_index(scm: Any, concepts: Sequence[str], null: str) -> int:
    idx = {scm.variables[c].values.index(null) for c in concepts if null in scm.variables[c].values}
    if len(idx) != 1:
        raise ConfigError(f"SCM {scm.name}: null_value {null!r} must be a value of every concept, at one index")
    return idx.pop()


def _embeddings(ctx: JobContext, spaces: Sequence[str], items: list[TextItem], rows: list[int],
                ft_pooled: torch.Tensor, encoder: Any, max_length: int,
                st_model: str) -> dict[str, torch.Tensor] | None:
    """The named embedding spaces the matching explainers declared, every one mean-pooled over the last layer as in
    the paper (rows outside ``rows`` stay zero): ``ft`` the fine-tuned encoder (read in the classification pass),
    ``pt`` the pre-trained one, ``st`` the sentence-transformer."""
    from cprobe.models.formatters import ClassificationFormatter
    from cprobe.models.sites import MEAN, Site

    if not spaces:
        return None
    out: dict[str, torch.Tensor] = {}
    sub = [items[i] for i in rows]
    idx = torch.tensor(rows, dtype=torch.long)
    for space in spaces:
        t0 = time.perf_counter()
        if space == "ft":  # the fine-tuned encoder
            out[space] = ft_pooled
            continue
        if space == "pt":  # the pre-trained encoder
            adapter = encoder
            site = Site(adapter.n_layers, MEAN)
        elif space == "st":  # a sentence-transformer
            adapter = ctx.adapter({**named_model_config(st_model, "liberty.st_model"), "kind": "encoder"})
            site = Site(adapter.n_layers, MEAN)
        else:
            raise ConfigError(f"unknown embedding space {space!r}; choose from ['ft', 'pt', 'st']")
        acts = adapter.map(sub, ClassificationFormatter(max_length), read=[site],
                           desc=f"embed ({space})" if ctx.progress else None).acts[site]
        full = torch.zeros(len(items), acts.shape[1])
        full[idx] = acts
        out[space] = full
        ctx.timings[f"embed_{space}_s"] = time.perf_counter() - t0
    return out


def _concept_classifier(ctx: JobContext, encoder: Any, data: Any, items: list[TextItem], rows: list[int],
                        concepts: list[str], config: Config, seed: int, common: dict,
                        out_rows: list[dict]) -> tuple[list[dict[str, str]], dict[str, np.ndarray]]:
    """Fine-tune (or load) one multi-task concept classifier on D_M; every needed text's predicted value index per
    concept and the concatenated predicted distributions (ConVecs)."""
    from cprobe.models.classifier import classify, finetuned_classifier

    scm = data.scm
    sizes = [len(scm.variables[c].values) for c in concepts]
    width = max(sizes)
    pool = list(data.splits["explainer"])
    targets = torch.tensor([[scm.variables[c].values.index(it.concepts[c]) for c in concepts] for it in pool])
    cm = finetune_config(config.concept_model, "liberty.concept_model", ctx.cfg["model"].get("finetune"))
    t0 = time.perf_counter()
    clf, _ = finetuned_classifier(encoder, pool, targets, len(concepts), width, cm, seed, ctx.cache_root / "finetuned",
                                  f"liberty-{scm.name}-concepts", ctx.progress)
    sub = [items[i] for i in rows]
    _, logp = classify(clf, sub, cm.max_length, desc="concept labels" if ctx.progress else None)
    ctx.timings["concept_model_s"] = time.perf_counter() - t0
    logits = logp.reshape(len(sub), len(concepts), width).clone()
    for j, m in enumerate(sizes):
        logits[:, j, m:] = -torch.inf  # a concept's missing values are never predicted
    dist = logits.softmax(-1).double().numpy()
    pred = dist.argmax(-1)
    predicted: list[dict[str, str]] = [{} for _ in items]
    cprobs = {c: np.zeros((len(items), m)) for c, m in zip(concepts, sizes)}
    for r, i in enumerate(rows):
        predicted[i] = {c: str(pred[r, j]) for j, c in enumerate(concepts)}
        for j, (c, m) in enumerate(zip(concepts, sizes)):
            cprobs[c][i] = dist[r, j, :m]
    test_ids = {it.id for it in data.splits["test"]}
    test_rows = [r for r, i in enumerate(rows) if items[i].id in test_ids]
    for j, c in enumerate(concepts):
        gold = np.array([scm.variables[c].values.index(items[rows[r]].concepts[c]) for r in test_rows])
        out_rows += _classifier_rows(common, "concepts", c, gold, pred[test_rows, j], sizes[j])
    return predicted, cprobs


def _classifier_rows(common: dict, which: str, concept: str, y: np.ndarray, pred: np.ndarray, k: int) -> list[dict]:
    from sklearn.metrics import f1_score

    f1 = f1_score(y, pred, average="macro", labels=list(range(k)), zero_division=0)
    base = {**common, "kind": "classifier", "explainer": which, "split": "test", "concept": concept, "n": len(y)}
    return [{**base, "metric": "macro_f1", "value": float(f1)},
            {**base, "metric": "accuracy", "value": float((y == pred).mean()) if len(y) else float("nan")}]


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


def _write_pairs(frame: pd.DataFrame, path: Any) -> None:
    import io

    from cprobe.io import atomic_write_bytes

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


# ----------------------------------------------------------------------------------------------- report
GROUP = ["scm", "model"]


def _wide(s: pd.DataFrame, cell: pd.Series) -> pd.DataFrame:
    """Rows explainers, one column per (config, SCM, model), the given cells."""
    cols = [k for k in s.columns if k in ("config_id", *GROUP)]
    frame = s.assign(cell=list(cell), column=[" · ".join(str(r[k]) for k in cols) for _, r in s.iterrows()])
    return frame.pivot_table(index="explainer", columns="column", values="cell", aggfunc="first",
                             sort=False).reset_index()


def global_of_table(table: pd.DataFrame) -> pd.DataFrame:
    """Table 16: rows explainers, one column per (SCM, model), cells the mean global OF (over seeds)."""
    g = summarise(table, "global_of", [*GROUP, "explainer"])
    return g if g.empty else _wide(g, g["mean"].round(3))


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
    write_table(global_of_table(tab), out_dir / "liberty_global_of")
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
    _plot_global_of(g, out_dir)
    _plot_sensitivity(sens, out_dir)


def _plot_global_of(g: pd.DataFrame, out_dir: Any) -> None:
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
    save(fig, out_dir / "liberty_global_of.png")


def _plot_sensitivity(sens: pd.DataFrame, out_dir: Any) -> None:
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
        ax.set_title(f"LIBERTy {scm}: sensitivity Σ|ICaCE| per concept", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04)
        save(fig, out_dir / f"liberty_sensitivity_{scm}.png")


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
        elif k in ("classifier", "explainer"):
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
