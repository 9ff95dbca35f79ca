"""Prompt-based probing biases (Cao et al. 2022): is a factual-probing score about the model, or about the prompt,
the subject's name and what the model happened to see?

One job probes a set of models (a zoo: ``model=fact_zoo``; any model config: ``model=...``; or the names in
``prompt_bias.models``) on one fact dataset (``dataset=fact_world``: a generated world with known exposure;
``dataset=lama``: the public LAMA layout). Steps:

1. the facts, N-M relations dropped; objects kept only when one token in every probed model's vocabulary;
2. fact-world members are trained on their own corpora (cached; :mod:`cprobe.models.zoo`);
3. the cloze runner: every relation × prompt × fact × mention query through the one model entry point
   (:class:`~cprobe.models.formatters.ClozeFormatter` + the :class:`~cprobe.models.readouts.TopK` readout), the
   top-1 token after stop-word skipping, cached per model as a long prediction table
   (``prompt_bias_predictions.parquet`` in the job dir holds every model's);
4. every analysis aggregates that table (:mod:`cprobe.metrics.prompt_bias`): P@1 per relation and prompt, the
   prompt spread (Table 1), rank instability, verbalization stability (Fig. 5), rank consistency under the
   ``original`` / ``random`` / ``backdoor`` / ``backdoor_sampled`` evaluation settings (Table 4);
5. sample disparity (Table 3, fact world only): each ``prompt_bias.disparity.base`` member continues training on
   corpora with an evidence share γ and is re-probed.

The long table (column ``kind``): ``p1`` (model, relation, prompt), ``spread`` (model, relation, metric),
``summary`` (model, metric), ``stability`` (model, relation), ``rank_instability``, ``rank_consistency`` (setting,
model or ``overall``), ``disparity`` (model, gamma; ``gamma = -1``: the base model before continued training).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError, DataError
from cprobe.job import JobContext
from cprobe.metrics import prompt_bias as M
from cprobe.plots import new_figure, save
from cprobe.records import Derived, RecordSpec
from cprobe.results import summarise

log = logging.getLogger("cprobe")

USES_LAYERS = False
MODEL_SETS = True  # reads a model zoo (source: zoo) and trains fact-world models (source: fact_world)
CACHE_VERSION = 1
DEFAULT_SETTINGS = ["original", "random", "backdoor", "backdoor_sampled"]
_DISPARITY_KEYS = {"base", "gammas", "sentences", "train", "seed"}


@dataclass(frozen=True)
class Config:
    """The ``prompt_bias:`` node."""

    models: list[str] | None = None  # model config names to probe (null: the job's `model`, or its zoo's members)
    top_k: int = 10  # tokens read per query; the prediction is the first that is not a stop word
    skip_stop_words: bool = True
    settings: list[str] = field(default_factory=lambda: list(DEFAULT_SETTINGS))
    k_prompts: int = 3  # backdoor_sampled: prompts per relation
    k_mentions: int = 2  # backdoor_sampled: mentions per subject
    n_samples: int = 1000  # rank consistency: bootstrap draws
    subset: int = 20  # rank consistency: relations per draw
    rank_seed: int = 42  # the bootstrap's seed is rank_seed + the job seed (seed=0: the paper's 42)
    diff_threshold: float = 10.0  # Table 1: relations whose best - worst prompt gap exceeds this many points
    known_min: int = 1  # fact world: a fact is "known" to a model whose corpus stated it at least this often
    disparity: dict = field(default_factory=dict)  # {base: [member names], gammas, sentences, train: {...}, seed}
    zoo: dict = field(default_factory=dict)  # {corpus: {...}, train: {...}}: overrides for every fact-world member


@dataclass(frozen=True)
class Disparity:
    base: tuple[str, ...] = ()
    gammas: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    sentences: int = 10_000
    train: Mapping[str, Any] = field(default_factory=dict)  # TinyTrainConfig overrides for continued training
    seed: int = 1


def disparity_config(node: Mapping[str, Any]) -> Disparity:
    node = dict(node or {})
    unknown = sorted(set(node) - _DISPARITY_KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} under prompt_bias.disparity; known: {sorted(_DISPARITY_KEYS)}")
    d = Disparity(base=tuple(node.get("base") or ()), gammas=tuple(float(g) for g in node.get("gammas",
                  Disparity.gammas)), sentences=int(node.get("sentences", Disparity.sentences)),
                  train=dict(node.get("train") or {}), seed=int(node.get("seed", 1)))
    if any(not 0.0 <= g <= 1.0 for g in d.gammas) or (d.base and not d.gammas):
        raise ConfigError(f"prompt_bias.disparity.gammas must be a non-empty list in [0, 1], got {list(d.gammas)}")
    if d.sentences < 1:
        raise ConfigError(f"prompt_bias.disparity.sentences must be >= 1, got {d.sentences}")
    return d


def with_zoo_overrides(ms: Sequence[Mapping[str, Any]], zoo: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every fact-world member with ``prompt_bias.zoo``'s corpus / train keys laid over its own (checked)."""
    from cprobe.models.zoo import fact_settings

    zoo = dict(zoo or {})
    unknown = sorted(set(zoo) - {"corpus", "train"})
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} under prompt_bias.zoo; known: ['corpus', 'train']")
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
    if kind == "lama":
        from cprobe.data.lama import read_relations
        from cprobe.paths import data_dir

        configured = (job.cfg.get("paths") or {}).get("data_dir")
        root = Path(configured) if configured else data_dir()
        try:
            records = read_relations(keys, root)
        except DataError as e:
            raise ConfigError(str(e)) from None
        n_relations = len([r for r in records if r.get("type") not in keys.drop_types
                           and (keys.relations is None or r["relation"] in keys.relations)])
    else:
        from cprobe.data.fact_world import check_world_keys

        check_world_keys(keys)
        n_relations = keys.n_relations
    ms = with_zoo_overrides(members(job.keys.model or {}, cfg.models), cfg.zoo)
    fact = [m["name"] for m in ms if m.get("source") == "fact_world"]
    if fact and kind != "fact_world":
        raise ConfigError(f"model(s) {fact} are trained on a fact world; they need dataset=fact_world")
    for s in cfg.settings:
        M.check_setting(s)
    if cfg.top_k < 1 or cfg.k_prompts < 1 or cfg.k_mentions < 1 or cfg.n_samples < 1 or cfg.known_min < 1:
        raise ConfigError("prompt_bias.top_k, k_prompts, k_mentions, n_samples and known_min must be >= 1")
    if len(ms) > 1 and cfg.settings and not 1 <= cfg.subset <= n_relations:
        raise ConfigError(f"prompt_bias.subset must be in [1, {n_relations}] (the dataset's relations), got "
                          f"{cfg.subset}")
    d = disparity_config(cfg.disparity)
    bad = [b for b in d.base if b not in fact]
    if bad and kind == "fact_world":  # on LAMA, Table 3 is not run (continued pre-training: docs/prompt_bias.md)
        raise ConfigError(f"prompt_bias.disparity.base {bad}: each must be a fact-world member of the zoo; choose "
                          f"from {fact}")
    try:
        TinyTrainConfig(**d.train)
    except TypeError as e:
        raise ConfigError(f"bad prompt_bias.disparity.train: {e}") from None


# ----------------------------------------------------------------------------------------------- cloze runner
def stop_ids(tokenizer: Any, ids: Sequence[int]) -> set[int]:
    """The ids among ``ids`` to skip: English stop words (scikit-learn's list), punctuation-only and special tokens."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    special = set(tokenizer.all_special_ids)
    out = set()
    for i in ids:
        text = tokenizer.decode([int(i)]).strip().lower()
        if int(i) in special or not any(ch.isalnum() for ch in text) or text in ENGLISH_STOP_WORDS:
            out.add(int(i))
    return out


def cloze_predictions(adapter: Any, items: Sequence[Any], top_k: int, skip_stop_words: bool,
                      desc: str | None = None) -> pd.DataFrame:
    """One row per query: the top-1 token (after skipping stop words when asked; the raw top-1 when all ``top_k`` are
    stop words) and whether it matches the gold object (case-insensitive, as the public code for MLMs)."""
    from cprobe.models.formatters import ClozeFormatter
    from cprobe.models.readouts import TopK

    top = adapter.map(list(items), ClozeFormatter(), readout=TopK(top_k), desc=desc).scores
    ids = top.numpy() if top is not None else np.zeros((0, top_k), dtype=np.int64)
    skip = stop_ids(adapter.tok, np.unique(ids)) if skip_stop_words else set()
    ok = ~np.isin(ids, list(skip)) if skip else np.ones_like(ids, dtype=bool)
    first = np.where(ok.any(1), ok.argmax(1), 0)
    chosen = ids[np.arange(len(ids)), first]
    text = {int(i): adapter.tok.decode([int(i)]).strip() for i in np.unique(chosen)}
    pred = [text[int(i)] for i in chosen]
    meta = pd.DataFrame([dict(it.meta) for it in items])
    gold = [it.outcome for it in items]
    return meta.assign(gold=gold, prediction=pred,
                       correct=[p.lower() == g.lower() for p, g in zip(pred, gold)])


def _identity(m: Mapping[str, Any]) -> dict[str, Any]:
    """What determines a model's predictions (its cache identity); local checkpoints add their weights' size/mtime."""
    ident = {k: m.get(k) for k in ("name", "source", "path", "package", "subdir", "kind", "revision", "dtype", "tiny",
                                   "max_length")}
    path = Path(str(m.get("path") or "")).expanduser()
    if m.get("path") and path.is_dir():
        ident["files"] = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()
                                if p.suffix in (".safetensors", ".json"))
    return ident


def cached_predictions(ctx: JobContext, m: Mapping[str, Any], items: Sequence[Any], config: Config,
                       items_key: str) -> tuple[pd.DataFrame, bool]:
    """The model's prediction table from the cache (checksummed parquet), or computed and cached."""
    from cprobe.io import atomic_write_bytes

    key = hashlib.sha256(json.dumps({"model": _identity(m), "items": items_key, "top_k": config.top_k,
                                     "skip": config.skip_stop_words, "version": CACHE_VERSION},
                                    sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = ctx.cache_root / "cloze" / f"{key}.parquet"
    digest = path.with_suffix(".sha256")
    enabled = bool(ctx.cfg.get("cache", {}).get("enabled", True))
    if enabled and path.is_file() and digest.is_file():
        blob = path.read_bytes()
        if hashlib.sha256(blob).hexdigest() == digest.read_text().strip():
            return pd.read_parquet(io.BytesIO(blob)), True
        log.warning("cloze cache %s fails its checksum; recomputing", path)
    adapter = ctx.adapter(m)
    frame = cloze_predictions(adapter, items, config.top_k, config.skip_stop_words,
                              desc=f"cloze {m['name']}" if ctx.progress else None)
    if enabled:
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        atomic_write_bytes(path, buf.getvalue())
        atomic_write_bytes(digest, hashlib.sha256(buf.getvalue()).hexdigest().encode())
    return frame, False


# ----------------------------------------------------------------------------------------------- the job
def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.data.items import fingerprint
    from cprobe.data.lama import FactData, object_last, queries, single_token_filter
    from cprobe.data.registry import load_dataset
    from cprobe.models.load import load_tokenizer
    from cprobe.models.zoo import fact_model_dir, members, resolved

    cfg = ctx.cfg
    data = load_dataset(cfg["dataset"], ctx.data_root)
    if not isinstance(data, FactData):
        raise ConfigError("the prompt_bias task needs a fact dataset (dataset=fact_world or dataset=lama)")
    ms = with_zoo_overrides(members(cfg["model"], config.models), config.zoo)
    spec = {m["name"]: m for m in ms}
    full = None
    if data.world is not None:  # corpora are sampled over the whole world (max_examples subsamples the probes)
        from cprobe.data.fact_world import generate_world

        full = generate_world(data.world.keys, data.name)
    probed: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for m in ms:  # fact-world members: trained on their corpora first (cached)
        if m.get("source") == "fact_world":
            if full is None:
                raise ConfigError(f"model {m['name']!r} is trained on a fact world; it needs dataset=fact_world")
            probed.append(resolved(m, fact_model_dir(m, full, ctx.cache_root, ctx.progress)))
        else:
            probed.append(dict(m))
    ctx.timings["zoo_s"] = time.perf_counter() - t0
    tokenizers = {m["name"]: load_tokenizer(m, ctx.cache_root, ctx.progress, ctx.data_root) for m in probed}
    data = single_token_filter(data, tokenizers)
    for note in data.notes:
        ctx.warn(note)
    if any(m.get("kind") == "causal" for m in probed):
        late = [f"{r.id}/{i}" for r in data.relations.values() for i, p in enumerate(r.prompts) if not object_last(p)]
        if late:
            ctx.warn(f"{len(late)} prompt(s) have words after [Y] (e.g. {late[:3]}); a causal LM reads them cut "
                     "before [Y], so it sees a shorter query than a masked LM")
    items = queries(data)
    items_key = fingerprint(items)
    frames = []
    t0 = time.perf_counter()
    for m in probed:
        frame, hit = cached_predictions(ctx, m, items, config, items_key)
        frames.append(frame.assign(model=m["name"]))
        log.info("%s: %d cloze predictions (%s)", m["name"], len(frame), "cached" if hit else "computed")
    ctx.timings["cloze_s"] = time.perf_counter() - t0
    pred = pd.concat(frames, ignore_index=True)
    _write_parquet(pred, ctx.out_dir / "prompt_bias_predictions.parquet")
    rows = analyse(pred, config, [m["name"] for m in probed], ctx, seed=config.rank_seed + ctx.seed)
    if full is not None:
        rows += _knowledge_rows(full, data, [spec[m["name"]] for m in probed], config.known_min)
        d = disparity_config(config.disparity)
        if d.base:
            t0 = time.perf_counter()
            rows += _disparity(ctx, full, data, spec, d, config, probed)
            ctx.timings["disparity_s"] = time.perf_counter() - t0
    table = pd.DataFrame(rows)
    for col, fill in (("relation", ""), ("metric", ""), ("setting", ""), ("prompt", -1), ("gamma", np.nan)):
        if col not in table:
            table[col] = fill
        table[col] = table[col].fillna(fill)
    table["prompt"] = table["prompt"].astype(int)
    table["dataset"] = data.name
    return table


def analyse(pred: pd.DataFrame, config: Config, models: Sequence[str], ctx: JobContext | None = None,
            seed: int = 42) -> list[dict]:
    """Every metric row from the prediction table (``seed``: the bootstrap's; the job uses ``rank_seed + seed``)."""
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
    cube = M.cubes(pred)
    relations = list(dict.fromkeys(pred["relation"]))
    rng = np.random.default_rng(seed)
    for r in t1.itertuples():
        for k in ("lama_p1", "worst_p1", "best_p1", "std", "diff", "diff_gt10_share"):
            rows.append({"kind": "summary", "model": r.model, "metric": k, "value": float(getattr(r, k)),
                         "n": int(r.relations)})
        rows.append({"kind": "summary", "model": r.model, "metric": "verbalization_stability",
                     "value": float(mean_stab.get(r.model, np.nan)), "n": int(r.relations)})
        rows.append({"kind": "summary", "model": r.model, "metric": "p1_backdoor", "n": int(r.relations),
                     "value": float(np.mean([M.relation_score(cube[(r.model, rel)], "backdoor", rng)
                                             for rel in relations]))})
    if len(models) > 1:
        rows.append({"kind": "rank_instability", "model": "all", "metric": "rank_instability",
                     "value": M.rank_instability(p1), "n": len(relations)})
        if config.subset > len(relations):
            raise DataError(f"prompt_bias.subset={config.subset} but only {len(relations)} relations are left after "
                            "filtering; lower it")
        for setting in config.settings:
            t0 = time.perf_counter()
            orders = M.bootstrap_orderings(cube, list(models), relations, setting, config.n_samples, config.subset,
                                           seed, config.k_prompts, config.k_mentions)
            per_model, overall = M.consistency(orders)
            rows += [{"kind": "rank_consistency", "setting": setting, "model": m, "value": float(v),
                      "n": config.n_samples} for m, v in zip(models, per_model)]
            rows.append({"kind": "rank_consistency", "setting": setting, "model": "overall", "value": overall,
                         "n": config.n_samples})
            if ctx is not None:
                ctx.timings[f"rank_{setting}_s"] = time.perf_counter() - t0
    elif ctx is not None:
        ctx.warn("one model probed: rank instability and rank consistency need at least two (a zoo, or "
                 "prompt_bias.models=[...])")
    return rows


def _knowledge_rows(full: Any, data: Any, ms: Sequence[Mapping[str, Any]], known_min: int) -> list[dict]:
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
        rows.append({"kind": "summary", "model": m["name"], "metric": "true_knowledge",
                     "value": 100.0 * float((counts >= known_min).mean()), "n": len(probed)})
        rows.append({"kind": "summary", "model": m["name"], "metric": "mean_exposure", "value": float(counts.mean()),
                     "n": len(probed)})
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
    for name in d.base:
        m = spec[name]
        corpus, train = fact_settings(m)
        base_dir = Path(by_name[name]["path"])
        cont = {**m, "fact_world": {**m["fact_world"], "train": {**asdict(train), **d.train}}}
        for gamma in d.gammas:
            c = replace(corpus, sentences=d.sentences, gamma=gamma, seed=d.seed)
            path = fact_model_dir(cont, full, ctx.cache_root, ctx.progress, corpus=c, init_from=base_dir)
            rm = {**resolved(m, path), "name": f"{name}+γ{gamma:g}"}
            frame, _ = cached_predictions(ctx, rm, items, config, key)
            p = float(frame.groupby("relation")["correct"].mean().mean() * 100)
            rows.append({"kind": "disparity", "model": name, "gamma": gamma, "value": p, "n": len(frame)})
        frame, _ = cached_predictions(ctx, by_name[name], items, config, key)
        base = float(frame.groupby("relation")["correct"].mean().mean() * 100)
        rows.append({"kind": "disparity", "model": name, "gamma": -1.0, "value": base, "n": len(items)})
    return rows


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    from cprobe.io import atomic_write_bytes

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


# ----------------------------------------------------------------------------------------------- report
def _cell(m: float, s: float, n: int) -> str:
    if np.isnan(m):
        return "nan"
    return f"{m:.2f}" if n <= 1 else f"{m:.2f} ({s:.2f})"


TABLE1 = {"lama_p1": "LAMA P@1", "worst_p1": "Worst P@1", "best_p1": "Best P@1", "std": "Std",
          "diff_gt10_share": "% rel. diff>10", "verbalization_stability": "Verb. stability",
          "p1_backdoor": "P@1 (backdoor)", "true_knowledge": "True knowledge %"}


def table1(table: pd.DataFrame) -> pd.DataFrame:
    """Table 1 (+ Fig. 5's mean stability, the backdoor P@1 and, on the fact world, the true knowledge): rows models,
    cells ``mean (std)`` over seeds."""
    s = summarise(table, "summary", ["dataset", "model", "metric"])
    if s.empty:
        return s
    s = s[s["metric"].isin(list(TABLE1))]
    s = s.assign(cell=[_cell(a, b, n) for a, b, n in zip(s["mean"], s["std"], s["seeds"])])
    idx = [k for k in ("config_id", "dataset", "model") if k in s.columns]
    wide = s.pivot_table(index=idx, columns="metric", values="cell", aggfunc="first", sort=False)
    wide = wide[[k for k in TABLE1 if k in wide.columns]].rename(columns=TABLE1)
    return wide.reset_index()


def table3(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3: rows γ (and ``None``: the base model), columns base models, cells P@1 with the original prompt."""
    s = summarise(table, "disparity", ["dataset", "model", "gamma"])
    if s.empty:
        return s
    s = s.assign(cell=[_cell(a, b, n) for a, b, n in zip(s["mean"], s["std"], s["seeds"])],
                 row=["None" if g < 0 else f"{100 * g:g}%" for g in s["gamma"]])
    order = [*[f"{100 * g:g}%" for g in sorted(x for x in s["gamma"].unique() if x >= 0)], "None"]
    wide = s.pivot_table(index="row", columns="model", values="cell", aggfunc="first", sort=False).reindex(order)
    return wide.rename_axis("γ (evidence share)").reset_index()


def table4(table: pd.DataFrame) -> pd.DataFrame:
    """Table 4: rows models and ``Overall Rank``, columns evaluation settings, cells rank consistency (%)."""
    s = summarise(table, "rank_consistency", ["dataset", "model", "setting"])
    if s.empty:
        return s
    s = s.assign(cell=[_cell(a, b, n) for a, b, n in zip(s["mean"], s["std"], s["seeds"])])
    idx = [k for k in ("config_id", "dataset", "model") if k in s.columns]
    wide = s.pivot_table(index=idx, columns="setting", values="cell", aggfunc="first", sort=False).reset_index()
    settings = [x for x in DEFAULT_SETTINGS if x in wide.columns] + [x for x in wide.columns
                                                                    if x not in DEFAULT_SETTINGS and x not in idx]
    wide["model"] = wide["model"].replace({"overall": "Overall Rank"})
    know = summarise(table, "summary", ["dataset", "model", "metric"])
    know = know[know["metric"] == "true_knowledge"]
    if not know.empty:
        on = [k for k in idx if k in know.columns]
        wide = wide.merge(know[[*on, "mean"]].rename(columns={"mean": "true_knowledge"}), on=on, how="left")
        settings.append("true_knowledge")
    return wide[[*idx, *settings]]


def report(table: pd.DataFrame, out_dir: Any) -> None:
    from cprobe.results import write_table

    if "kind" not in table:
        return
    tab = table.copy()
    write_table(table1(tab), out_dir / "prompt_bias_table1")
    t3 = table3(tab)
    if not t3.empty:
        write_table(t3, out_dir / "prompt_bias_table3")
    t4 = table4(tab)
    if not t4.empty:
        write_table(t4, out_dir / "prompt_bias_table4")
    write_table(summarise(tab, "spread", ["dataset", "model", "relation", "metric"]),
                out_dir / "prompt_bias_relations")
    write_table(summarise(tab, "rank_instability", ["dataset"]), out_dir / "prompt_bias_rank_instability")
    _plot_prompts(tab, out_dir)
    _plot_stability(tab, out_dir)


def _plot_prompts(tab: pd.DataFrame, out_dir: Any) -> None:
    """Fig. 3 as box plots: per model, one box per relation of its P@1 over the relation's prompts (mean over seeds),
    the original prompt marked."""
    p = tab[tab["kind"] == "p1"]
    if p.empty:
        return
    p = p.groupby(["model", "relation", "prompt"], sort=False)["value"].mean().reset_index()
    models = list(dict.fromkeys(p["model"]))
    relations = list(dict.fromkeys(p["relation"]))
    fig, axes = new_figure(len(models), width=max(4.0, 0.28 * len(relations) + 1.5), height=3.2)
    for ax, model in zip(axes, models):
        g = p[p["model"] == model]
        data = [g.loc[g["relation"] == r, "value"].to_numpy() for r in relations]
        ax.boxplot(data, showfliers=True)
        orig = [g.loc[(g["relation"] == r) & (g["prompt"] == 0), "value"] for r in relations]
        ax.scatter(np.arange(1, len(relations) + 1), [o.iloc[0] if len(o) else np.nan for o in orig], marker="x",
                   color="tab:red", s=14, label="original prompt", zorder=3)
        ax.set_xticks(np.arange(1, len(relations) + 1), relations, rotation=90, fontsize=6)
        ax.set_ylim(-2, 102)
        ax.set_ylabel("P@1 over prompts", fontsize=8)
        ax.set_title(str(model), fontsize=9)
    axes[0].legend(fontsize=7)
    save(fig, out_dir / "prompt_bias_prompts.png")


def _plot_stability(tab: pd.DataFrame, out_dir: Any) -> None:
    """Fig. 5: verbalization stability over relations, one box per model."""
    s = tab[tab["kind"] == "stability"]
    if s.empty:
        return
    s = s.groupby(["model", "relation"], sort=False)["value"].mean().reset_index()
    models = list(dict.fromkeys(s["model"]))
    fig, (ax,) = new_figure(1, width=max(4.0, 0.9 * len(models) + 1.5), height=3.4)
    ax.boxplot([s.loc[s["model"] == m, "value"].to_numpy() for m in models])
    ax.set_xticks(np.arange(1, len(models) + 1), models, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(-2, 102)
    ax.set_ylabel("verbalization stability (%)", fontsize=8)
    ax.set_title("Predictions unchanged across subject mentions, per relation", fontsize=9)
    save(fig, out_dir / "prompt_bias_stability.png")


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


def _record_items(table: pd.DataFrame, records: pd.DataFrame, out_dir: Path | None) -> pd.DataFrame:
    """The relations are the items of the means over relations (Table 1's columns)."""
    from cprobe.records import breakdown_items

    return breakdown_items(records, [*_SPREAD.values(), "verbalization_stability"], "relation")


RECORDS = RecordSpec(
    dataset="dataset", model=Derived(lambda t: ["" if m in ("all", "overall") else m for m in t["model"]]),
    method="setting", family=Derived(lambda t: ["evaluation" if s else "" for s in t["setting"]]),
    setting=Derived(lambda t: [{} if pd.isna(g) else {"gamma": g} for g in t["gamma"]]),
    slice=("relation", "prompt"), slice_defaults={"relation": "", "prompt": -1}, metric=Derived(_metric),
    value="value", n="n", breakdowns=("relation", "prompt"), items=_record_items)
"""Every row as a record (:mod:`cprobe.records`): the evaluation setting (original / random / backdoor) is the
method of rank consistency, γ the setting of sample disparity; model ``""``: all models."""
