"""Prompt-based probing biases (Cao et al. 2022): is a factual-probing score about the model, or about the prompt,
the subject's name and what the model happened to see?

One job probes a set of models (a zoo: ``model=fact_zoo``; any model config: ``model=...``; or the names in
``prompt_bias.models``) on one fact dataset (``dataset=fact_world``: a generated world with known exposure;
``dataset=lama``: the public LAMA layout). Steps:

1. the facts, N-M relations dropped; objects kept only when one token in every probed model's vocabulary;
2. fact-world members are trained on their own corpora (cached; :mod:`cprobe.models.zoo`) — and, for each
   ``prompt_bias.controls`` entry, a control zoo: the same members on corpora with the control's overrides (the
   experiment's ``no_preference``: no planted prompt or name preference);
3. the cloze runner (:mod:`cprobe.tasks.prompt_bias_cloze`): every relation × prompt × fact × mention query through
   the one model entry point (:class:`~cprobe.models.formatters.ClozeFormatter` + the
   :class:`~cprobe.models.readouts.TopK` readout); the top-k tokens are cached per model, the prediction is the first
   that is not a stop word (the public code's list and exact matching by default; :func:`choose_predictions`);
   ``prompt_bias_predictions.parquet`` in the job dir holds every model's;
4. every analysis aggregates that table, per model set (:mod:`cprobe.metrics.prompt_bias`): P@1 per relation and
   prompt, the prompt spread (Table 1), rank instability, verbalization stability (Fig. 5), rank consistency under
   the ``original`` / ``random`` / ``backdoor`` / ``backdoor_sampled`` evaluation settings on one shared set of
   relation draws, with the ties and the closest pair beside it (Table 4);
5. sample disparity (Table 3, fact world only): each ``prompt_bias.disparity.base`` member continues training on
   corpora with an evidence share γ and is re-probed.

The long table (column ``kind``; column ``variant``: ``main`` or a control's name): ``p1`` (model, relation, prompt),
``spread`` (model, relation, metric), ``summary`` (model, metric), ``stability`` (model, relation),
``rank_instability`` (model: which models are ranked), ``rank_consistency`` (setting, model or ``overall``),
``rank_ties`` (setting, model or ``any``: % of draws tied), ``rank_pairs`` (setting, model ``a|b``, metric ``gap`` /
``tied`` / ``flips``), ``disparity`` (model, gamma; ``gamma = -1``: the base model before continued training).
Its tables and figures: :mod:`cprobe.tasks.prompt_bias_report`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError, DataError
from cprobe.io import write_parquet
from cprobe.job import JobContext
from cprobe.tasks import Uses
from cprobe.metrics import prompt_bias as M
from cprobe.records import Derived, RecordSpec
from cprobe.tasks.prompt_bias_cloze import (REFERENCE_STOP_WORDS, cached_predictions, choose_predictions,  # noqa: F401
                                            cloze_predictions, stop_words)
from cprobe.tasks.prompt_bias_report import (DEFAULT_SETTINGS, MAIN, _plot_prompts, pair_table, report,  # noqa: F401
                                             table1, table3, table4, ties_table)

log = logging.getLogger("cprobe")

USES = Uses(groups=("model", "dataset"), capabilities=("model_sets",))  # a zoo (or one model) and a fact dataset
SUBSET_SHARE = 20 / 32  # the paper draws 20 of its 32 relations per run


@dataclass(frozen=True)
class Disparity:
    """``prompt_bias.disparity``: Table 3's continued training (``base`` members, evidence shares ``gammas``)."""

    base: tuple[str, ...] | None = ()  # fact-world members to continue training (null = none)
    gammas: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    sentences: int = 10_000
    train: dict = field(default_factory=dict)  # TinyTrainConfig overrides for continued training
    seed: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", tuple(self.base or ()))
        if any(not 0.0 <= g <= 1.0 for g in self.gammas) or (self.base and not self.gammas):
            raise ValueError(f"prompt_bias.disparity.gammas must be a non-empty list in [0, 1], got {list(self.gammas)}")
        if self.sentences < 1:
            raise ValueError(f"prompt_bias.disparity.sentences must be >= 1, got {self.sentences}")


@dataclass(frozen=True)
class Config:
    """The ``prompt_bias:`` node."""

    models: list[str] | None = None  # model config names to probe (null: the job's `model`, or its zoo's members)
    top_k: int = 10  # tokens read per query; the prediction is the first that is not a stop word
    skip_stop_words: bool = True  # the public code's --ignore-stop-words (on by default there too)
    stop_words: Literal["reference", "sklearn"] = "reference"  # which list (module docstring of the cloze runner)
    skip_non_words: bool = False  # also skip punctuation-only and special tokens (not in the public code)
    case_sensitive: bool = True  # exact match with the gold object, as the public code; false: ignore case
    settings: list[str] = field(default_factory=lambda: list(DEFAULT_SETTINGS))
    k_prompts: int = 3  # backdoor_sampled: prompts per relation
    k_mentions: int = 2  # backdoor_sampled: mentions per subject
    n_samples: int = 1000  # rank consistency: bootstrap draws
    subset: int | None = None  # relations per draw; null: the paper's share (20 of 32) of the relations probed
    rank_seed: int = 42  # the bootstrap's seed is rank_seed + the job seed (seed=0: the paper's 42)
    instability_models: int | list[str] | None = 4  # rank instability: k (mean over k-model subsets), names, or all
    diff_threshold: float = 10.0  # Table 1: relations whose best - worst prompt gap exceeds this many points
    known_min: int = 1  # fact world: a fact is "known" to a model whose corpus stated it at least this often
    controls: dict[str, dict] | None = field(default_factory=dict)  # fact world: {name: corpus overrides}; null: none
    disparity: Disparity = field(default_factory=lambda: Disparity())  # Table 3 (typed: parse checks it)
    zoo: dict = field(default_factory=dict)  # {corpus: {...}, train: {...}}: overrides for every fact-world member


def with_zoo_overrides(ms: Sequence[Mapping[str, Any]], zoo: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every fact-world member with ``prompt_bias.zoo``'s corpus / train keys laid over its own (checked; a null
    value keeps the member's own — the experiment lists every key as null, so ``prompt_bias.zoo.train.steps=3000``
    needs no ``+``)."""
    from cprobe.models.zoo import fact_settings

    zoo = dict(zoo or {})
    unknown = sorted(set(zoo) - {"corpus", "train"})
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} under prompt_bias.zoo; known: ['corpus', 'train']")
    for k in ("corpus", "train"):
        node = zoo.get(k)
        if node is not None and not isinstance(node, Mapping):
            raise ConfigError(f"prompt_bias.zoo.{k} must be a mapping, got {node!r}")
        zoo[k] = {key: v for key, v in dict(node or {}).items() if v is not None}
    zoo = {k: v for k, v in zoo.items() if v}
    out = []
    for m in ms:
        m = dict(m)
        if m.get("source") == "fact_world" and zoo:
            node = dict(m.get("fact_world") or {})
            m["fact_world"] = {**node, **{k: {**dict(node.get(k) or {}), **dict(zoo.get(k) or {})}
                                          for k in ("corpus", "train")}}
            fact_settings(m)
        out.append(m)
    return out


def with_controls(ms: Sequence[Mapping[str, Any]], controls: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The probed model sets: ``main`` (the zoo as configured) and one per control — the same members, each
    fact-world member's corpus with the control's overrides (e.g. ``no_preference``: ``prompt_skew: 0, alias_skew:
    0``), so the control differs from the study in exactly those corpus keys (checked)."""
    out = {MAIN: [dict(m) for m in ms]}
    for name, corpus in dict(controls or {}).items():
        if name == MAIN:
            raise ConfigError(f"prompt_bias.controls: {MAIN!r} names the study's own zoo; pick another name")
        if not isinstance(corpus, Mapping) or not corpus:
            raise ConfigError(f"prompt_bias.controls.{name} must be a non-empty mapping of corpus keys (e.g. "
                              "{prompt_skew: 0.0, alias_skew: 0.0}), got " + repr(corpus))
        try:
            out[str(name)] = with_zoo_overrides(ms, {"corpus": dict(corpus)})
        except ConfigError as e:
            raise ConfigError(f"prompt_bias.controls.{name}: {e}") from None
    return out


def subset_size(config: Config, n_relations: int) -> int:
    """Relations per bootstrap draw: ``subset``, or (null) the paper's share — 20 of 32 — of those probed (≥ 1)."""
    if config.subset is not None:
        return config.subset
    return max(1, min(n_relations, round(SUBSET_SHARE * n_relations)))


def validate(job: Any) -> None:
    from cprobe.data.registry import split_config
    from cprobe.models.tiny import TinyTrainConfig
    from cprobe.models.zoo import members

    cfg: Config = job.task_cfg
    ds = job.keys.dataset or {}
    kind = ds.get("type", ds.get("name"))
    if kind not in ("lama", "fact_world"):
        raise ConfigError("the prompt_bias task needs a fact dataset (dataset=fact_world or dataset=lama)")
    _, _, keys = split_config(ds)
    n_relations = None
    if kind == "lama" and job.data_root is not None:
        from cprobe.data.lama import read_relations

        try:
            records = read_relations(keys, job.data_root)
        except DataError as e:
            raise ConfigError(str(e)) from None
        kept = [r for r in records if r.get("type") not in keys.drop_types
                and (keys.relations is None or r["relation"] in keys.relations)]
        if not kept:
            raise ConfigError(f"no relation left to probe: the {len(records)} in {keys.relations_file} are all of a "
                              f"dropped type (dataset.drop_types={list(keys.drop_types)}) or not in dataset.relations")
        n_relations = len(kept)
    else:
        from cprobe.data.fact_world import check_world_keys

        check_world_keys(keys)
        n_relations = keys.n_relations
    ms = with_zoo_overrides(members(job.keys.model or {}, cfg.models), cfg.zoo)
    fact = [m["name"] for m in ms if m.get("source") == "fact_world"]
    if fact and kind != "fact_world":
        raise ConfigError(f"model(s) {fact} are trained on a fact world; they need dataset=fact_world")
    if kind == "fact_world":
        with_controls(ms, cfg.controls)
    for s in cfg.settings:
        M.check_setting(s)
    if cfg.top_k < 1 or cfg.k_prompts < 1 or cfg.k_mentions < 1 or cfg.n_samples < 1 or cfg.known_min < 1:
        raise ConfigError("prompt_bias.top_k, k_prompts, k_mentions, n_samples and known_min must be >= 1")
    if len(ms) > 1 and cfg.settings and cfg.subset is not None and not 1 <= cfg.subset <= n_relations:
        raise ConfigError(f"prompt_bias.subset must be in [1, {n_relations}] (the dataset's relations), got "
                          f"{cfg.subset}; or null: the paper's share (20 of 32) of the relations probed")
    names = [m["name"] for m in ms]
    if isinstance(cfg.instability_models, int) and cfg.instability_models < 2:
        raise ConfigError(f"prompt_bias.instability_models must be >= 2 (models per ranking), a list of probed "
                          f"models, or null (all of them); got {cfg.instability_models}")
    if isinstance(cfg.instability_models, list):
        unknown = [n for n in cfg.instability_models if n not in names]
        if unknown or len(set(cfg.instability_models)) < 2:
            raise ConfigError(f"prompt_bias.instability_models {cfg.instability_models}: name at least two distinct "
                              f"probed models; choose from {names}")
    d = cfg.disparity
    bad = [b for b in d.base if b not in fact]
    if bad and kind == "fact_world":  # on LAMA, Table 3 is not run (continued pre-training: docs/prompt_bias.md)
        raise ConfigError(f"prompt_bias.disparity.base {bad}: each must be a fact-world member of the zoo; choose "
                          f"from {fact}")
    try:
        TinyTrainConfig(**d.train)
    except TypeError as e:
        raise ConfigError(f"bad prompt_bias.disparity.train: {e}") from None


# ----------------------------------------------------------------------------------------------- the job
def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.data.items import fingerprint
    from cprobe.data.lama import FactData, object_last, queries, single_token_filter
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.load import load_tokenizer
    from cprobe.models.zoo import fact_model_dir, members, resolved

    cfg = ctx.cfg
    data = ctx.dataset()
    if not isinstance(data, FactData):
        raise ConfigError("the prompt_bias task needs a fact dataset (dataset=fact_world or dataset=lama)")
    ms = with_zoo_overrides(members(cfg["model"], config.models), config.zoo)
    full = None
    if data.world is not None:  # corpora are sampled over the whole world (max_examples subsamples the probes)
        from cprobe.data.fact_world import generate_world

        full = generate_world(data.world.keys, data.name)
    # the study's zoo and, on a fact world, one zoo per control (the same members on corpora without, e.g., the
    # planted prompt and name preferences)
    variants = with_controls(ms, config.controls) if full is not None else {MAIN: [dict(m) for m in ms]}
    spec = {m["name"]: m for m in variants[MAIN]}
    probed: dict[str, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    for variant, vms in variants.items():  # fact-world members: trained on their corpora first (cached)
        for m in vms:
            if m.get("source") == "fact_world" and full is None:
                raise ConfigError(f"model {m['name']!r} is trained on a fact world; it needs dataset=fact_world")
        probed[variant] = [resolved(m, fact_model_dir(m, full, ctx.cache_root, ctx.progress))
                           if m.get("source") == "fact_world" else dict(m) for m in vms]
    ctx.timings["zoo_s"] = time.perf_counter() - t0
    tokenizers = {f"{v}/{m['name']}" if v != MAIN else m["name"]: load_tokenizer(m, ctx.cache_root, ctx.progress,
                                                                                 ctx.data_root)
                  for v, vms in probed.items() for m in vms}
    data = single_token_filter(data, tokenizers, ModelAdapter.word_token)
    for note in data.notes:
        ctx.warn(note)
    if any(m.get("kind") == "causal" for m in probed[MAIN]):
        late = [f"{r.id}/{i}" for r in data.relations.values() for i, p in enumerate(r.prompts) if not object_last(p)]
        if late:
            ctx.warn(f"{len(late)} prompt(s) have words after [Y] (e.g. {late[:3]}); a causal LM reads them cut "
                     "before [Y], so it sees a shorter query than a masked LM")
    items = queries(data)
    items_key = fingerprint(items)
    frames = []
    t0 = time.perf_counter()
    for variant, vms in probed.items():
        for m in vms:
            frame, hit = cached_predictions(ctx, m, items, config, items_key)
            frames.append(choose_predictions(frame, config).assign(model=m["name"], variant=variant))
            log.info("%s%s: %d cloze predictions (%s)", m["name"], "" if variant == MAIN else f" ({variant})",
                     len(frame), "cached" if hit else "computed")
    ctx.timings["cloze_s"] = time.perf_counter() - t0
    pred = pd.concat(frames, ignore_index=True)
    write_parquet(pred, ctx.out_dir / "prompt_bias_predictions.parquet")
    rows: list[dict] = []
    for variant, vms in probed.items():
        rows += analyse(pred[pred["variant"] == variant], config, [m["name"] for m in vms], ctx,
                        seed=config.rank_seed + ctx.seed, variant=variant)
    if full is not None:
        for variant, vms in variants.items():
            rows += _knowledge_rows(full, data, vms, config.known_min, variant)
        d = config.disparity
        if d.base:
            t0 = time.perf_counter()
            rows += _disparity(ctx, full, data, spec, d, config, probed[MAIN])
            ctx.timings["disparity_s"] = time.perf_counter() - t0
    table = pd.DataFrame(rows)
    for col, fill in (("relation", ""), ("metric", ""), ("setting", ""), ("prompt", -1), ("gamma", np.nan),
                      ("variant", MAIN)):
        table[col] = table[col].fillna(fill) if col in table else fill
    table["prompt"] = table["prompt"].astype(int)
    table["dataset"] = data.name
    return table


def analyse(pred: pd.DataFrame, config: Config, models: Sequence[str], ctx: JobContext | None = None,
            seed: int = 42, variant: str = MAIN) -> list[dict]:
    """Every metric row of one model set (``variant``) from its prediction table (``seed``: the bootstrap's; the job
    uses ``rank_seed + seed``)."""
    rows: list[dict[str, Any]] = []
    p1 = M.precision_at_1(pred)
    rows += [{"kind": "p1", "model": r.model, "relation": r.relation, "prompt": int(r.prompt), "value": r.p1,
              "n": int(r.n)} for r in p1.itertuples()]
    spread = M.prompt_spread(p1)
    for r in spread.itertuples():
        rows += [{"kind": "spread", "model": r.model, "relation": r.relation, "metric": k, "value": float(getattr(r, k)),
                  "n": int(r.prompts)} for k in ("original", "worst", "best", "std", "diff")]
    t1 = M.table1(spread, config.diff_threshold)
    stab = M.verbalization_stability(pred)
    rows += [{"kind": "stability", "model": r.model, "relation": r.relation, "value": r.stability,
              "n": int(r.subjects)} for r in stab.itertuples()]
    mean_stab = stab.groupby("model")["stability"].mean()
    st = M.stack(pred, list(models))
    backdoor = dict(zip(st.models, M.relation_scores(st, "backdoor").mean(axis=1)))
    for r in t1.itertuples():
        for k in ("lama_p1", "worst_p1", "best_p1", "std", "diff", "diff_gt10_share"):
            rows.append({"kind": "summary", "model": r.model, "metric": k, "value": float(getattr(r, k)),
                         "n": int(r.relations)})
        rows.append({"kind": "summary", "model": r.model, "metric": "verbalization_stability",
                     "value": float(mean_stab.get(r.model, np.nan)), "n": int(r.relations)})
        rows.append({"kind": "summary", "model": r.model, "metric": "p1_backdoor", "n": int(r.relations),
                     "value": float(backdoor[r.model])})
    relations = st.relations
    if len(models) > 1:
        rows += _instability_rows(p1, config, models, len(relations))
        subset = subset_size(config, len(relations))
        if subset > len(relations):
            raise DataError(f"prompt_bias.subset={subset} but only {len(relations)} relations are left after "
                            "filtering; lower it (or null: the paper's share of the relations probed)")
        picks = M.draw_subsets(len(relations), subset, config.n_samples, seed)  # one set of draws for every setting
        for setting in config.settings:
            t0 = time.perf_counter()
            scores = M.bootstrap_scores(st, setting, picks, seed, config.k_prompts, config.k_mentions)
            per_model, overall = M.consistency(M.orderings(scores))
            base = {"setting": setting, "n": config.n_samples}
            rows += [{"kind": "rank_consistency", **base, "model": m, "value": float(v)}
                     for m, v in zip(models, per_model)]
            rows.append({"kind": "rank_consistency", **base, "model": "overall", "value": overall})
            tied, any_tie = M.ties(scores)
            rows += [{"kind": "rank_ties", **base, "model": m, "value": float(v)} for m, v in zip(models, tied)]
            rows.append({"kind": "rank_ties", **base, "model": "any", "value": any_tie})
            for r in M.pair_stats(scores, list(models)).itertuples():
                rows += [{"kind": "rank_pairs", **base, "model": f"{r.model_a}|{r.model_b}", "metric": k,
                          "value": float(getattr(r, k))} for k in ("gap", "tied", "flips")]
            if ctx is not None:
                ctx.timings[f"rank_{setting}{'' if variant == MAIN else '_' + variant}_s"] = time.perf_counter() - t0
    elif ctx is not None:
        ctx.warn("one model probed: rank instability and rank consistency need at least two (a zoo, or "
                 "prompt_bias.models=[...])")
    return [{**r, "variant": variant} for r in rows]


def _instability_rows(p1: pd.DataFrame, config: Config, models: Sequence[str], n_relations: int) -> list[dict]:
    """Rank instability of every probed model and of the configured ranking (``instability_models``: k models, the
    mean over every k-model subset — the paper ranks 4 —, or the named models)."""
    rows = [{"kind": "rank_instability", "model": f"all {len(models)}", "metric": "rank_instability",
             "value": M.rank_instability(p1, list(models)), "n": n_relations}]
    choice = config.instability_models
    if isinstance(choice, int) and choice < len(models):
        value, subsets = M.rank_instability_k(p1, choice)
        rows.append({"kind": "rank_instability", "model": f"{choice} of {len(models)} (mean over {subsets} sets)",
                     "metric": "rank_instability", "value": value, "n": n_relations})
    elif isinstance(choice, list):
        named = [m for m in choice if m in models]
        rows.append({"kind": "rank_instability", "model": ", ".join(named), "metric": "rank_instability",
                     "value": M.rank_instability(p1, named), "n": n_relations})
    return rows


def _knowledge_rows(full: Any, data: Any, ms: Sequence[Mapping[str, Any]], known_min: int,
                    variant: str = MAIN) -> list[dict]:
    """Fact world: each fact-world model's true knowledge — the share (%) of the probed facts its corpus stated at
    least ``known_min`` times (and the facts' mean exposure)."""
    from cprobe.data.fact_world import sample_corpus
    from cprobe.models.zoo import fact_settings

    index = {(f.relation, f.subject): i for i, f in enumerate(full.facts)}
    probed = [index[(f.relation, f.subject)] for f in data.facts]
    rows = []
    for m in ms:
        if m.get("source") != "fact_world":
            continue
        spec, _ = fact_settings(m)
        counts = sample_corpus(full, spec).fact_counts[probed]
        base = {"kind": "summary", "model": m["name"], "n": len(probed), "variant": variant}
        rows.append({**base, "metric": "true_knowledge", "value": 100.0 * float((counts >= known_min).mean())})
        rows.append({**base, "metric": "mean_exposure", "value": float(counts.mean())})
    return rows


def _disparity(ctx: JobContext, full: Any, data: Any, spec: Mapping[str, Mapping[str, Any]], d: Disparity, config: Config,
               probed: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Table 3: each base member continues training on ``d.sentences``-sentence corpora with evidence share γ (its
    own linguistic preferences kept), then is re-probed with the original prompt and default mentions."""
    from dataclasses import replace

    from cprobe.data.items import fingerprint
    from cprobe.data.lama import queries
    from cprobe.models.zoo import fact_model_dir, fact_settings, resolved

    items = queries(data, prompts="original", mentions="default")
    key = fingerprint(items)
    rows = []
    by_name = {m["name"]: m for m in probed}

    def p1(m: Mapping[str, Any]) -> tuple[float, int]:
        frame, _ = cached_predictions(ctx, m, items, config, key)
        frame = choose_predictions(frame, config)
        return float(frame.groupby("relation")["correct"].mean().mean() * 100), len(frame)

    for name in d.base:
        m = spec[name]
        corpus, train = fact_settings(m)
        base_dir = Path(by_name[name]["path"])
        cont = {**m, "fact_world": {**m["fact_world"], "train": {**asdict(train), **d.train}}}
        for gamma in d.gammas:
            c = replace(corpus, sentences=d.sentences, gamma=gamma, seed=d.seed)
            path = fact_model_dir(cont, full, ctx.cache_root, ctx.progress, corpus=c, init_from=base_dir)
            value, n = p1({**resolved(m, path), "name": f"{name}+γ{gamma:g}"})
            rows.append({"kind": "disparity", "model": name, "gamma": gamma, "value": value, "n": n})
        value, n = p1(by_name[name])
        rows.append({"kind": "disparity", "model": name, "gamma": -1.0, "value": value, "n": n})
    return rows


# ----------------------------------------------------------------------------------------------- records
_SPREAD = {"original": "lama_p1", "worst": "worst_p1", "best": "best_p1", "std": "prompt_std", "diff": "prompt_diff"}
_SUMMARY = {"std": "prompt_std", "diff": "prompt_diff", "diff_gt10_share": "prompt_diff_gt10_share"}
_KIND = {"p1": "p_at_1", "stability": "verbalization_stability", "rank_instability": "rank_instability",
         "rank_consistency": "rank_consistency", "disparity": "disparity_p1"}


def _metric(t: pd.DataFrame) -> list[str]:
    """Each row's registered metric: a relation's prompt spread and the summary's means over relations share their
    names (``lama_p1`` per relation and averaged), Table 1's ``std``/``diff`` named for what they spread over."""
    return [_SPREAD.get(m, m) if k == "spread" else _SUMMARY.get(m, m) if k == "summary"
            else _KIND.get(k, f"{k}_{m}" if m else k) for k, m in zip(t["kind"], t["metric"])]


def _record_items(table: pd.DataFrame, records: pd.DataFrame, values: pd.DataFrame | None) -> pd.DataFrame:
    """The relations are the items of the means over relations (Table 1's columns)."""
    from cprobe.records import breakdown_items

    return breakdown_items(records, [*_SPREAD.values(), "verbalization_stability"], "relation")


RECORDS = RecordSpec(
    dataset="dataset", model=Derived(lambda t: ["" if m in ("all", "overall") else m for m in t["model"]]),
    method="setting", family=Derived(lambda t: ["evaluation" if s else "" for s in t["setting"]]),
    setting=Derived(lambda t: [{**({} if pd.isna(g) else {"gamma": g}), **({} if v == MAIN else {"variant": v})}
                               for g, v in zip(t["gamma"], t["variant"] if "variant" in t else [MAIN] * len(t))]),
    slice=("relation", "prompt"), slice_defaults={"relation": "", "prompt": -1}, metric=Derived(_metric),
    value="value", n="n", breakdowns=("relation", "prompt"), items=_record_items)
"""Every row as a record (:mod:`cprobe.records`): the evaluation setting (original / random / backdoor) is the
method of rank consistency, γ the setting of sample disparity; a control zoo's rows carry ``variant`` in their
setting (its models share the main zoo's names); model ``""``: all models."""
