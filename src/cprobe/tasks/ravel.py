"""RAVEL's yardstick (Huang et al., ACL 2024): does a method's subspace of an entity's representation hold one
attribute and only that one? Cause, Isolate and their mean, the disentanglement score, per method × attribute ×
layer × source kind (docs/ravel.md).

Data: entities with several attributes, prompt templates querying each, RAVEL's splits and Wikipedia contexts
(:mod:`cprobe.data.ravel`: RAVEL's own files by ``dataset=ravel``, or ``dataset=fact_world``, whose subjects ×
relations are entities × attributes, with a tiny causal LM trained on that world, ``model=fact_neox_ravel``). Steps:

1. the parts (:mod:`cprobe.tasks.ravel_plan`): RAVEL's entity or context split (``ravel.split``), sampled
   (``ravel.entities``, ``ravel.templates``), each value's tokens as the model writes them after each template;
2. one clean pass (:func:`cprobe.tasks.ravel_fit.clean_pass`): the entity token's state at every layer of every
   prompt and Wikipedia context, and, on the scored prompts, the model's answer by RAVEL's rule (its first
   ``answer_tokens`` tokens, greedy); only prompts it answers right are bases (RAVEL's filter; the accuracy per
   attribute and template style is a row of its own);
3. the pairs per (targeted A, queried Q, source kind) (:func:`cprobe.tasks.ravel_plan.pairs`);
4. every method's subspace per A and layer by its declared capabilities (:mod:`cprobe.tasks.ravel_fit`);
5. the interchanges in the sites engine's pass, each scored by the match of the greedy tokens with the wanted label:
   Cause(A) on Q = A (e′'s A), Isolate(A → B) on Q = B (e's own B) (:mod:`cprobe.metrics.ravel`).

The long table (column ``kind``): ``score`` (method, layer, attribute A, queried Q, source kind; metric ``cause`` for
Q = A, ``isolate`` otherwise), ``summary`` (queried ``all``: cause, isolate over every B, disentangle, per source kind
and over the kinds, ``source: all``; attribute ``all``: the mean over the attributes where both Cause and Isolate are
defined, named in ``attributes``), ``accuracy`` (per attribute and template ``style``: metric ``task_accuracy``), with
the pairs kept and sampled in ``n`` and ``n_candidates``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError, DataError, InputRefused
from cprobe.job import JobContext
from cprobe.methods import Needs, build, check, declares, is_intervention, provenance, registry
from cprobe.metrics import ravel as M
from cprobe.records import Derived, RecordSpec, const
from cprobe.sae.method import check_sites
from cprobe.tasks import Uses
from cprobe.tasks.ravel_plan import BALANCE, KINDS, REFERENCE_KINDS

log = logging.getLogger("cprobe")

# a fact-world member is trained here (model_sets)
USES = Uses(groups=("model", "dataset", "layers"), capabilities=("model_sets",), methods="ravel.methods")
METHODS = ("das", "probe", "mean", "lda", "pca", "random", "vanilla")
DEFAULT_DAS = {"lr": 0.01, "batch_size": 8, "epochs": 3, "warmup": 0.1, "parametrization": "orthogonal", "k": 1}
SPLITS = ("entity", "context")
EVAL_SPLITS = ("test", "val")
POSITION = "entity"  # the edited site: the entity mention's last token


@dataclass(frozen=True)
class Config:
    """The ``ravel:`` node."""

    attributes: list[str] | None = None  # targeted and queried attributes (null: every attribute of the data)
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    mdas_weight: float | None = 1.0  # multi-task DAS: weight of the Isolate rows (null: no MDAS rows)
    split: str = "entity"  # RAVEL's entity split or its context split (drawn where the data has no split file)
    eval_split: str = "test"  # the held-out part scored: test or val
    sources: list[str] | None = None  # source kinds (null: the reference's three the data has)
    answer_tokens: int = 3  # the label's tokens the match reads (RAVEL's max_new_tokens)
    entities: int | None = 32  # at most this many entities per part (seeded; null: all)
    templates: int | None = 2  # at most this many templates per attribute per part (seeded; null: all)
    context_entities: int = 2  # entities filling one Wikipedia context about no particular entity
    fit_share: float = 0.5  # share of the entities (templates) that fit, where the data has no split file
    n_pairs: int = 6  # scored base/source pairs per (targeted A, queried Q, source kind)
    n_train: int = 64  # DAS train pairs per attribute (MDAS: as many Isolate pairs again)
    das: dict = field(default_factory=lambda: dict(DEFAULT_DAS))
    probe_lam: float = 1.0  # the λ of a method tuned per model (per_model_lambda: the probe direction)
    random_draws: int = 3
    interventions: dict = field(default_factory=lambda: {"rlace": {"rank": 1, "max_steps": 500}})
    features: dict = field(default_factory=dict)  # settings of the methods that give features, by name
    interventional_probe: dict = field(default_factory=lambda: {"name": "linear", "lrs": [0.01], "epochs": 20})
    pair_seed: int = 0  # the drawn parts and the sampled pairs (+ the job seed)

    def __post_init__(self) -> None:
        check(self.methods, "ravel.methods", Needs(direction=True, whole_vector=True, features=True))
        if not 0 < self.fit_share < 1:
            raise ValueError(f"ravel.fit_share must be in (0, 1), got {self.fit_share}")
        if self.n_pairs < 1 or self.n_train < 1 or self.random_draws < 1 or self.answer_tokens < 1:
            raise ValueError("ravel.n_pairs, ravel.n_train, ravel.random_draws and ravel.answer_tokens must be >= 1")
        for key in ("entities", "templates", "context_entities"):
            v = getattr(self, key)
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise ValueError(f"ravel.{key} must be an integer >= 1{'' if key == 'context_entities' else ' or null'}"
                                 f", got {v!r}")
        if self.split not in SPLITS:
            raise ValueError(f"ravel.split must be one of {list(SPLITS)}, got {self.split!r}")
        if self.eval_split not in EVAL_SPLITS:
            raise ValueError(f"ravel.eval_split must be one of {list(EVAL_SPLITS)}, got {self.eval_split!r}")
        if self.sources is not None:
            bad = [k for k in self.sources if k not in KINDS]
            if bad or not self.sources or len(set(self.sources)) != len(self.sources):
                raise ValueError(f"ravel.sources {list(self.sources)}: list source kinds from {list(KINDS)}, each "
                                 "once (null: the reference's three the data has)")
        if self.mdas_weight is not None and not self.mdas_weight > 0:
            raise ValueError(f"ravel.mdas_weight must be > 0 (or null: no MDAS), got {self.mdas_weight}")
        if not self.probe_lam > 0:
            raise ValueError(f"ravel.probe_lam must be > 0, got {self.probe_lam}")
        unknown = sorted(set(self.das) - set(DEFAULT_DAS))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} under ravel.das; known: {sorted(DEFAULT_DAS)}")
        from cprobe.methods import method_names

        odd = sorted(m for m in self.features if m not in method_names() or is_intervention(m)
                     or not declares(m, "features"))
        if odd:
            raise ValueError(f"ravel.features sets {odd}, which are not methods that give features (capability "
                             "features, e.g. sae_features)")
        if self.attributes is not None and len(set(self.attributes)) < 2:
            raise ValueError(f"ravel.attributes {list(self.attributes)}: Isolate needs two attributes or more (null: "
                             "every attribute of the data)")


def _params(config: Config, name: str, layer: int | None = None) -> dict[str, Any]:
    """A method's constructor settings by its capabilities: the causal one's ``das`` budget (``k``: the subspace's
    dimension), the λ of one tuned per model, an intervention's ``interventions.<name>``, a features method's
    ``features.<name>``."""
    if is_intervention(name):
        return dict((config.interventions or {}).get(name) or {})
    if declares(name, "causal"):
        return {**DEFAULT_DAS, **config.das}
    if declares(name, "features"):
        return dict((config.features or {}).get(name) or {})
    return {"lam": config.probe_lam} if declares(name, "per_model_lambda") else {}


def validate(job: Any) -> None:
    from cprobe.data.registry import split_config
    from cprobe.models.load import parse_model_config

    cfg: Config = job.task_cfg
    ds = job.keys.dataset or {}
    _, _, keys = split_config(ds)
    kind = ds.get("type", ds.get("name"))
    if kind not in ("ravel", "fact_world"):
        raise ConfigError("the ravel task needs entities with attributes: dataset=ravel (RAVEL's files) or "
                          "dataset=fact_world")
    mc = parse_model_config(job.keys.model or {})
    if mc.source == "zoo":
        raise ConfigError(f"model {mc.name!r} is a model zoo; the ravel task probes one model (e.g. "
                          "model=fact_neox_ravel)")
    if mc.source == "fact_world" and kind != "fact_world":
        raise ConfigError(f"model {mc.name!r} is trained on a fact world; it needs dataset=fact_world")
    if mc.kind not in ("causal", "auto"):
        raise ConfigError(f"the ravel task reads a causal LM's next token; model {mc.name!r} is {mc.kind!r}")
    for m in cfg.methods:  # a bad setting fails before any model loads
        try:
            build(m, _params(cfg, m), seed=0)
            check_sites(registry(m).get(m), _params(cfg, m), job.keys.layers, mc.name)
        except (ConfigError, ValueError, TypeError) as e:
            raise ConfigError(f"bad settings for ravel method {m!r}: {e}") from None
    if kind == "ravel":
        if job.data_root is not None:  # the files' own checks, where there is data to read
            from cprobe.data.ravel import load_ravel

            try:
                data = load_ravel(keys, job.data_root)
                _attributes(data, cfg)
                _kinds(cfg, data)
            except DataError as e:
                raise ConfigError(str(e)) from None
    else:
        from cprobe.data.fact_world import check_world_keys

        check_world_keys(keys)
        relations = [f"R{r + 1:02d}" for r in range(keys.n_relations)]  # generate_world's relation ids
        unknown = [a for a in cfg.attributes or () if a not in relations]
        if unknown:
            raise ConfigError(f"ravel.attributes {unknown} are not relations of the fact world; it has {relations}")
        if "wikipedia" in (cfg.sources or ()):
            raise ConfigError("ravel.sources lists wikipedia, but the fact world has no Wikipedia contexts; drop it")


def _attributes(data: Any, config: Config) -> list[str]:
    attrs = data.attributes if config.attributes is None else list(config.attributes)
    unknown = [a for a in attrs if a not in data.attributes]
    if unknown:
        raise ConfigError(f"ravel.attributes {unknown} are not attributes of {data.name}; it has {data.attributes}")
    if len(attrs) < 2:
        raise ConfigError(f"ravel.attributes {attrs}: Isolate needs two attributes or more")
    return attrs


def _kinds(config: Config, data: Any) -> list[str]:
    """The source kinds of the run: the listed ones, or the reference's three the data has (Wikipedia contexts only
    where it has them); a listed ``wikipedia`` without RAVEL's file of contexts is refused in one line."""
    if config.sources is None:
        return [k for k in REFERENCE_KINDS if k != "wikipedia" or data.contexts]
    if "wikipedia" in config.sources and not data.contexts:
        where = data.files.get("contexts", "")
        raise DataError(f"ravel.sources lists wikipedia, but {where or data.name} is missing (RAVEL's Wikipedia "
                        "contexts); add the file or drop wikipedia")
    return list(config.sources)


# ----------------------------------------------------------------------------------------------- the job
def _load(ctx: JobContext, config: Config) -> tuple[Any, dict[str, Any]]:
    """(RavelData, the model config to load): a fact-world member trained on the job's world first."""
    from cprobe.data.lama import FactData
    from cprobe.data.ravel import from_fact_world

    cfg = ctx.cfg
    data = ctx.dataset()
    model = dict(cfg["model"])
    if isinstance(data, FactData):
        if model.get("source") == "fact_world":
            from cprobe.data.fact_world import generate_world
            from cprobe.models.zoo import fact_model_dir, resolved

            full = generate_world(data.world.keys, data.name)  # the model's corpus is the whole world's
            t0 = time.perf_counter()
            model = resolved(model, fact_model_dir(model, full, ctx.cache_root, ctx.progress))
            ctx.timings["train_model_s"] = time.perf_counter() - t0
        data = from_fact_world(data, config.attributes)
    for note in data.notes:
        ctx.warn(note)
    return data, model


def _accuracy(P: Any, data: Any, attrs: Sequence[str], greedy: np.ndarray, labels: Any) -> list[dict[str, Any]]:
    """The model's accuracy per attribute on the scored prompts, and per template style (``json``: the value follows
    with no space; ``text``). An attribute whose values never occur among the model's answers — no scored prompt's
    first answer token (greedy: the model's own) begins any of its values after that template — is refused in one
    line: the model does not answer it in its vocabulary at all (a model that answers with the wrong value does, and
    the attribute is kept)."""
    from cprobe.data.ravel import template_style

    rows = []
    for a, attr in enumerate(attrs):
        asked = np.flatnonzero(P.answered & P.scored & (P.attribute == a))
        style = np.array([template_style(data.templates[attr][t]) for t in P.template[asked]], dtype=object)
        for name in ("all", "json", "text"):
            m = np.ones(len(asked), dtype=bool) if name == "all" else style == name
            if name != "all" and not m.any():
                continue
            rows.append({"kind": "accuracy", "method": "", "family": "", "layer": -1, "attribute": attr,
                         "queried": attr, "style": name, "metric": "task_accuracy",
                         "value": float(P.correct[asked[m]].mean()) if m.any() else float("nan"), "n": int(m.sum())})
        n_values = len(data.values(attr))
        starts = [{labels[a, t, v][0] for v in range(n_values)} for t in P.template[asked]]
        if not any(int(greedy[i, 0]) in first for i, first in zip(asked, starts)):
            raise InputRefused(f"attribute {attr!r}: none of its {n_values} values occurs among the model's answers "
                               f"on {len(asked)} scored prompts (its first answer token, greedy, begins none of them): "
                               "drop it (ravel.attributes) or use a model that knows it")
    return rows


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.extract import resolve_layers
    from cprobe.probes.grid import PROBE_FITS
    from cprobe.tasks import ravel_fit as F
    from cprobe.tasks import ravel_plan as plan

    data, model = _load(ctx, config)
    attrs = _attributes(data, config)
    kinds = _kinds(config, data)
    adapter = ctx.adapter(model)
    if adapter.kind != "causal":
        raise ConfigError(f"the ravel task reads a causal LM's next token; model {adapter.name!r} is {adapter.kind!r}")
    layers = resolve_layers(ctx.cfg["layers"], adapter.n_layers)
    names = list(data.entities)
    values = [data.values(a) for a in attrs]
    value = np.array([[values[a].index(data.entities[e][attr]) if attr in data.entities[e] else -1
                       for a, attr in enumerate(attrs)] for e in names], dtype=np.int64)
    seed = config.pair_seed + ctx.seed
    rng = np.random.default_rng([seed, 46])
    if config.split == "entity" and data.entity_split is None:
        ctx.warn(f"{data.name} has no entity split file: the entities are split by ravel.fit_share, seeded")
    fit, ev = plan.parts(data, attrs, config.split, config.eval_split, config.fit_share, config.entities,
                         config.templates, rng)
    temps = {a: sorted(set(fit.templates[a]) | set(ev.templates[a])) for a in range(len(attrs))}
    labels = plan.Labels(data, attrs, values, config.answer_tokens, adapter.tok, temps)
    if labels.alone:
        ctx.warn(f"{labels.alone} (template, value) label(s) tokenised alone: the prompt's own tokens changed when "
                 "the value was added")
    causal = any(declares(m, "causal") for m in config.methods)
    feats = any(declares(m, "features") for m in config.methods)
    contexts_for = (("scored",) if "wikipedia" in kinds else ()) + (("fit",) if feats or (causal and "wikipedia" in
                                                                                         kinds) else ())
    P = plan.prompt_rows(data, attrs, value, fit, ev, config.context_entities, rng, contexts_for)
    t0 = time.perf_counter()
    greedy = F.clean_pass(adapter, P, labels, value, layers, P.scored | (P.fit & causal), ctx.progress)
    ctx.timings["clean_pass_s"] = time.perf_counter() - t0
    acc_rows = _accuracy(P, data, attrs, greedy, labels)
    for r in acc_rows:
        if r["style"] == "all":
            log.info("%s answers %s right on %.3f of %d prompts", adapter.name, r["attribute"], r["value"], r["n"])
    everything = list(range(len(attrs)))
    balance = BALANCE[config.split]
    scored = {a: plan.pairs(P, value, labels, a, everything, kinds, "scored", config.n_pairs, rng, balance)
              for a in everything}
    n_rows = sum(len(p) for p in scored.values())
    log.info("RAVEL plan: %d prompts answered, %d states read (prompts and contexts), %d scored pairs per method row "
             "and layer (%d entities fit, %d scored)", int((P.answered).sum()), int((~P.answered).sum()), n_rows,
             len(fit.entities), len(ev.entities))
    params = lambda name, layer: _params(config, name, layer)  # noqa: E731
    t0 = time.perf_counter()
    jobs = F.fit_jobs(config, P, value, attrs, layers, scored, seed, ctx.device, ctx.cache_dir(PROBE_FITS), params,
                      adapter.name)
    ctx.timings["fit_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    train = {}
    if causal:
        for a in everything:
            others = [q for q in everything if q != a]
            train[a] = (plan.pairs(P, value, labels, a, [a], kinds, "fit", config.n_train, rng, balance),
                        plan.pairs(P, value, labels, a, others, kinds, "fit",
                                   max(1, config.n_train // (len(others) * len(kinds))), rng, balance))
    jobs += F.train_causal(config, adapter, P, labels, attrs, layers, train, seed, rng, params)
    ctx.timings["train_causal_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hits = F.score(adapter, P, labels, jobs, scored, layers, ctx.progress)
    ctx.timings["interchange_s"] = time.perf_counter() - t0
    table = pd.DataFrame(acc_rows + _rows(jobs, hits, scored, attrs))
    table["model"], table["dataset"], table["position"] = adapter.name, data.name, POSITION
    table["n_fit_entities"], table["n_eval_entities"] = len(fit.entities), len(ev.entities)
    table["split"] = f"{config.split}:{config.eval_split}"
    sources = {m: provenance(m) for m in config.methods}
    sources.update({f"m{m}": sources[m] for m in config.methods if declares(m, "causal")})
    table["method_source"] = [sources.get(m, "") for m in table["method"]]  # a plugin's package and version
    for col in ("draws", "degenerate", "n_candidates"):
        table[col] = table[col].fillna(0).astype(int) if col in table else 0
    for col, default in (("source", "all"), ("style", "all"), ("attributes", "")):
        table[col] = table[col].fillna(default) if col in table else default
    return table


def _rows(jobs: Sequence[Any], hits: Sequence[np.ndarray], pairs: Mapping[int, Any], attrs: Sequence[str]
          ) -> list[dict[str, Any]]:
    """The score and summary rows; a method's draws at one (attribute, layer) are pooled (each has the same pairs)."""
    rows = []
    for job, hit in zip(jobs, hits):
        p = pairs[job.a]
        q, kind = np.tile(p.queried, job.draws), np.tile(p.kind, job.draws)
        common = {"method": job.label, "family": job.family, "layer": job.layer, "attribute": attrs[job.a],
                  "draws": job.draws, "degenerate": job.degenerate, **job.info}
        per_kind = {}
        for k in sorted(set(p.kind.tolist()) | {kk for (_, kk) in p.candidates}):
            by = {}
            for qi, qname in enumerate(attrs):
                m = (q == qi) & (kind == k)
                share = float(hit[m].mean()) if m.any() else float("nan")
                by[qi] = share
                rows.append({**common, "kind": "score", "queried": qname, "source": KINDS[k],
                             "metric": "cause" if qi == job.a else "isolate", "value": share,
                             "n": int(m.sum() // job.draws), "n_candidates": p.candidates.get((qi, k), 0)})
            iso = [v for qi, v in by.items() if qi != job.a and not np.isnan(v)]
            per_kind[KINDS[k]] = (by[job.a], float(np.mean(iso)) if iso else float("nan"),
                                  int((kind == k).sum() // job.draws))
        c_all = [c for c, _, _ in per_kind.values() if not np.isnan(c)]
        i_all = [i for _, i, _ in per_kind.values() if not np.isnan(i)]
        per_kind["all"] = (float(np.mean(c_all)) if c_all else float("nan"),
                           float(np.mean(i_all)) if i_all else float("nan"), int(len(p)))
        for source, (c, i, n) in per_kind.items():
            for metric, v in (("cause", c), ("isolate", i), ("disentangle", M.disentangle(c, i))):
                rows.append({**common, "kind": "summary", "queried": "all", "source": source, "metric": metric,
                             "value": v, "n": n})
    summary = pd.DataFrame([r for r in rows if r["kind"] == "summary"])
    if len(summary):
        rows += _over_attributes(summary)
    return rows


def _over_attributes(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """``attribute: all`` rows per (method, layer, source): the mean over the attributes where both Cause and Isolate
    are defined (the same attributes for the three metrics), named in ``attributes``."""
    out = []
    keys = ["method", "family", "layer", "source"]
    # the rows there are (NaN values kept), not every combination of their keys: a method can miss an attribute (DAS
    # gets no training pair where the model answers none right)
    wide = summary.set_index([*keys, "attribute", "metric"])["value"].unstack("metric")
    n = summary[summary["metric"] == "cause"].set_index([*keys, "attribute"])["n"]
    extra = summary.groupby([*keys, "attribute"])[["draws", "degenerate"]].max()
    for key, g in wide.groupby(level=keys, sort=False):
        ok = g[g["cause"].notna() & g["isolate"].notna()]
        names = sorted(ok.index.get_level_values("attribute"))
        base = dict(zip(keys, key))
        for metric in ("cause", "isolate", "disentangle"):
            out.append({**base, "layer": int(base["layer"]), "attribute": "all", "kind": "summary", "queried": "all",
                        "metric": metric, "value": float(ok[metric].mean()) if len(ok) else float("nan"),
                        "n": int(n.loc[ok.index].sum()) if len(ok) else 0, "attributes": ",".join(names),
                        "draws": int(extra.loc[g.index, "draws"].max()),
                        "degenerate": int(extra.loc[g.index, "degenerate"].sum())})
    return out


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """PNG: Cause, Isolate and disentanglement by layer, per method (the mean over attributes)."""
    import cprobe.plots as plots

    source = table["source"] if "source" in table else "all"
    part = table[(table["kind"] == "summary") & (table["attribute"] == "all") & (source == "all")]
    if part.empty:
        return
    metrics = ["cause", "isolate", "disentangle"]
    fig, axes = plots.new_figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        for method, g in part[part["metric"] == metric].groupby("method"):
            g = g.sort_values("layer")
            ax.plot(g["layer"], g["value"], marker="o", label=method)
        ax.set(title=metric, xlabel="layer (0 = embeddings)", ylabel="share of edits", ylim=(-0.02, 1.02))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    attrs = sorted(set(table.loc[table["kind"] == "accuracy", "attribute"]))
    per = table[(table["kind"] == "summary") & (table["attribute"] != "all") & (table["metric"] == "cause")
                & (source == "all")]
    plots.caption(fig, "RAVEL: Cause, Isolate and their mean by layer (mean over attributes)", property=attrs,
                  model=table["model"], data=table.get("dataset", "?"),
                  n=f"{plots.values(per['n'])} pairs per attribute", seed=table.get("seed"))
    plots.save(fig, out_dir / "ravel_by_layer.png")


# ----------------------------------------------------------------------------------------------- records
def _record_items(table: pd.DataFrame, records: pd.DataFrame, values: pd.DataFrame | None) -> pd.DataFrame:
    from cprobe.records import breakdown_items

    return breakdown_items(records, ["cause", "isolate", "disentangle"], "attribute")


RECORDS = RecordSpec(
    dataset="dataset", model="model", layer=Derived(lambda t: t["layer"].where(t["layer"] >= 0)),
    read_layer=Derived(lambda t: t["layer"].where(t["layer"] >= 0)), position=const(POSITION), method="method",
    family="family", slice=("kind", "attribute", "queried", "source", "style"),
    slice_defaults={"kind": "summary", "attribute": "all", "queried": "all", "source": "all", "style": "all"},
    metric="metric", value="value", n="n", breakdowns=("kind", "attribute", "queried", "source", "style"),
    items=_record_items)
"""Per method × layer × attribute (× queried attribute × source kind): Cause, Isolate, disentanglement; the mean over
the kinds and the attributes is the whole (the leaderboard's cell, the attributes its items, as CausalGym's tasks);
the model's accuracy per attribute and template style (``kind: accuracy``)."""
