"""RAVEL's yardstick (Huang et al., ACL 2024): does a method's subspace of an entity's representation hold one
attribute and only that one? Cause, Isolate and their mean, the disentanglement score, per method × attribute ×
layer (docs/ravel.md).

Data: entities with several attributes and prompt templates querying each (:mod:`cprobe.data.ravel`: RAVEL's own
files by ``dataset=ravel``, or ``dataset=fact_world``, whose subjects × relations are entities × attributes, with a
tiny causal LM trained on that world, ``model=fact_neox_ravel``). Steps:

1. every prompt (entity × attribute × template) in one clean pass: the entity's last token's state at every layer
   and the model's answer, the argmax over the queried attribute's values (single tokens; a value that is not one is
   dropped); only prompts it answers right are edited or used as sources (RAVEL's filter; counted per attribute);
2. the entities split in two (``ravel.fit_share``): methods are fitted on the first part's prompts, scored on the
   other's;
3. per targeted attribute A and layer, every method's 1-D subspace, by its declared capabilities: a direction
   method fitted on the states labelled by A's value, one direction per pair of A's values (the two values the
   interchange swaps: binary, as every direction method is; ``chance_baseline``: ``random_draws`` draws,
   ``whole_vector``: the whole state swapped), a ``causal`` one (DAS) trained through the model with the interchange
   objective on A (the source's A value as the target of prompts querying A), and, with ``ravel.mdas_weight``,
   the same method again as multi-task DAS (``m<name>``: also prompts querying another attribute B, whose target
   is the base's own B, weighted); an intervention that ``exposes_direction`` (R-LACE: RAVEL's RLAP) fitted per
   value pair like a direction, its ``edit_direction()`` interchanged;
4. the interchange: on a base prompt about e querying Q, the entity token's state at the layer has its component
   along the subspace replaced by the source's (a prompt about e′ querying A; for Q = A the base's own template),
   in the sites engine's pass (:func:`~cprobe.models.multisite.edited_pass`); e′ has another value of A than e, and
   for Q ≠ A another value of Q too (else Isolate would hold trivially);
5. Cause(A) on Q = A (the answer is e′'s A), Isolate(A → B) on Q = B (the answer stays e's B), their mean
   (:mod:`cprobe.metrics.ravel`).

The long table (column ``kind``): ``score`` (method, layer, attribute A, queried Q; metric ``cause`` for Q = A,
``isolate`` otherwise), ``summary`` (method, layer, A, queried ``all``: cause, isolate over every B, disentangle;
attribute ``all``: the mean over attributes), ``accuracy`` (per attribute: the model's accuracy on every prompt,
metric ``task_accuracy``), with the pairs kept and sampled in ``n`` and ``n_candidates``.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from cprobe.errors import ConfigError, DataError
from cprobe.job import JobContext
from cprobe.methods import (Needs, build, check, declares, fallback_direction, family, is_intervention, provenance,
                            registry, unit_directions)
from cprobe.metrics import ravel as M
from cprobe.records import Derived, RecordSpec, const
from cprobe.sae.method import check_sites
from cprobe.tasks import Uses

log = logging.getLogger("cprobe")

# a fact-world member is trained here (model_sets)
USES = Uses(groups=("model", "dataset", "layers"), capabilities=("model_sets",), methods="ravel.methods")
METHODS = ("das", "probe", "mean", "lda", "pca", "random", "vanilla")
DEFAULT_DAS = {"lr": 0.01, "batch_size": 8, "epochs": 3, "warmup": 0.1, "parametrization": "orthogonal"}
POSITION = "entity"  # the edited site: the entity mention's last token


@dataclass(frozen=True)
class Config:
    """The ``ravel:`` node."""

    attributes: list[str] | None = None  # targeted and queried attributes (null: every attribute of the data)
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    mdas_weight: float | None = 1.0  # multi-task DAS: weight of the Isolate rows (null: no MDAS rows)
    fit_share: float = 0.5  # share of the entities whose prompts fit the methods (the rest are scored)
    n_pairs: int = 32  # scored base/source pairs per (targeted A, queried Q)
    n_train: int = 64  # DAS train pairs per attribute (MDAS: as many Isolate pairs again)
    das: dict = field(default_factory=lambda: dict(DEFAULT_DAS))
    probe_lam: float = 1.0  # the λ of a method tuned per model (per_model_lambda: the probe direction)
    random_draws: int = 3
    interventions: dict = field(default_factory=lambda: {"rlace": {"rank": 1, "max_steps": 500}})
    interventional_probe: dict = field(default_factory=lambda: {"name": "linear", "lrs": [0.01], "epochs": 20})
    pair_seed: int = 0  # the entity split and the sampled pairs (+ the job seed)

    def __post_init__(self) -> None:
        check(self.methods, "ravel.methods", Needs(direction=True, whole_vector=True))  # the interchange's subspace
        if not 0 < self.fit_share < 1:
            raise ValueError(f"ravel.fit_share must be in (0, 1), got {self.fit_share}")
        if self.n_pairs < 1 or self.n_train < 1 or self.random_draws < 1:
            raise ValueError("ravel.n_pairs, ravel.n_train and ravel.random_draws must be >= 1")
        if self.mdas_weight is not None and not self.mdas_weight > 0:
            raise ValueError(f"ravel.mdas_weight must be > 0 (or null: no MDAS), got {self.mdas_weight}")
        if not self.probe_lam > 0:
            raise ValueError(f"ravel.probe_lam must be > 0, got {self.probe_lam}")
        unknown = sorted(set(self.das) - set(DEFAULT_DAS))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} under ravel.das; known: {sorted(DEFAULT_DAS)}")
        if self.attributes is not None and len(set(self.attributes)) < 2:
            raise ValueError(f"ravel.attributes {list(self.attributes)}: Isolate needs two attributes or more (null: "
                             "every attribute of the data)")


def _params(config: Config, name: str) -> dict[str, Any]:
    """A method's constructor settings by its capabilities: the causal one's ``das`` budget, the λ of one tuned per
    model, an intervention's ``interventions.<name>``."""
    if is_intervention(name):
        return dict((config.interventions or {}).get(name) or {})
    if declares(name, "causal"):
        return {**DEFAULT_DAS, **config.das}
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
        except ConfigError as e:
            raise ConfigError(f"bad settings for ravel method {m!r}: {e}") from None
    if kind == "ravel":
        if job.data_root is not None:  # the files' own checks, where there is data to read
            from cprobe.data.ravel import load_ravel

            try:
                _attributes(load_ravel(keys, job.data_root), cfg)
            except DataError as e:
                raise ConfigError(str(e)) from None
    else:
        from cprobe.data.fact_world import check_world_keys

        check_world_keys(keys)
        relations = [f"R{r + 1:02d}" for r in range(keys.n_relations)]  # generate_world's relation ids
        unknown = [a for a in cfg.attributes or () if a not in relations]
        if unknown:
            raise ConfigError(f"ravel.attributes {unknown} are not relations of the fact world; it has {relations}")


def _attributes(data: Any, config: Config) -> list[str]:
    attrs = data.attributes if config.attributes is None else list(config.attributes)
    unknown = [a for a in attrs if a not in data.attributes]
    if unknown:
        raise ConfigError(f"ravel.attributes {unknown} are not attributes of {data.name}; it has {data.attributes}")
    if len(attrs) < 2:
        raise ConfigError(f"ravel.attributes {attrs}: Isolate needs two attributes or more")
    return attrs


# ----------------------------------------------------------------------------------------------- the job
@dataclass
class _Prompts:
    """Every prompt of the study with what the clean pass found."""

    items: list[Any]
    entity: np.ndarray  # (N,) entity index
    attribute: np.ndarray  # (N,) queried attribute index
    template: np.ndarray  # (N,) template index
    cand: Tensor  # (N, k) candidate token ids: the queried attribute's values (padded with the first)
    cand_value: Tensor  # (N, k) their value indices
    correct: np.ndarray  # (N,) the clean answer is the entity's value
    acts: dict[Any, Tensor]  # site -> (N, d) the entity token's states


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


def _value_ids(data: Any, attrs: Sequence[str], tok: Any, ctx: JobContext) -> dict[str, dict[str, int]]:
    """Each attribute's values that are one token (as they follow a space), with their ids; attributes left with
    fewer than two such values are refused."""
    from cprobe.models.adapter import ModelAdapter

    out = {}
    for a in attrs:
        ids = {v: ModelAdapter.word_token(tok, v) for v in data.values(a)}
        multi = sorted(v for v, i in ids.items() if i is None)
        if multi:
            ctx.warn(f"attribute {a!r}: {len(multi)} of {len(ids)} values are not one token (e.g. {multi[:3]}); "
                     "their entities are not prompted for it")
        out[a] = {v: i for v, i in ids.items() if i is not None}
        if len(out[a]) < 2:
            raise DataError(f"attribute {a!r} has {len(out[a])} single-token value(s) for this model's tokenizer; "
                            "Cause needs two")
    return out


def _prompts(adapter: Any, data: Any, attrs: Sequence[str], ids: Mapping[str, Mapping[str, int]],
             entities: Sequence[str], layers: Sequence[int], progress: bool) -> _Prompts:
    from cprobe.data.ravel import prompt_item
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.readouts import CandidateTokens
    from cprobe.models.sites import Site

    values = {a: sorted(ids[a]) for a in attrs}
    k = max(len(v) for v in values.values())
    items, ent, att, tem, cand, cval, gold = [], [], [], [], [], [], []
    for i, e in enumerate(entities):
        for j, a in enumerate(attrs):
            v = data.entities[e].get(a)
            if v not in ids[a]:
                continue
            row = [ids[a][x] for x in values[a]]
            for t, text in enumerate(data.templates[a]):
                items.append(prompt_item(e, a, t, text))
                ent.append(i)
                att.append(j)
                tem.append(t)
                cand.append(row + [row[0]] * (k - len(row)))
                cval.append(list(range(len(row))) + [0] * (k - len(row)))
                gold.append(values[a].index(v))
    if not items:
        raise DataError("no prompt left: no entity has a single-token value of the attributes")
    cand_t, cval_t = torch.tensor(cand), torch.tensor(cval)
    sites = [Site(l, "region:1") for l in layers]
    out = adapter.map(items, RegionFormatter(), read=sites, readout=CandidateTokens(cand_t),
                      desc="RAVEL prompts" if progress else None)
    pred = cval_t.gather(1, out.scores.float().argmax(1, keepdim=True)).squeeze(1)
    return _Prompts(items, np.array(ent), np.array(att), np.array(tem), cand_t, cval_t,
                    (pred == torch.tensor(gold)).numpy(), {l: out.acts[s] for l, s in zip(layers, sites)})


@dataclass
class _Pairs:
    """Interchange pairs of one targeted attribute: base and source prompt indices, the queried attribute, and the
    value indices the metrics compare (the source's A, the base's A, the base's queried value)."""

    base: np.ndarray
    source: np.ndarray
    queried: np.ndarray
    src_a: np.ndarray
    base_a: np.ndarray
    base_q: np.ndarray
    candidates: dict[int, int]  # queried -> base prompts that passed the filter


def _pairs(P: _Prompts, value: np.ndarray, a: int, pool: np.ndarray, n: int, rng: np.random.Generator,
           queried: Sequence[int]) -> _Pairs:
    """Up to ``n`` pairs per queried attribute among the entities ``pool`` (module doc, step 4), on prompts the
    model answers right (bases and sources). ``value`` (entities, attributes): value indices (−1: none)."""
    in_pool = np.isin(P.entity, pool)
    src_ok = in_pool & P.correct & (P.attribute == a)
    cols: dict[str, list[int]] = {k: [] for k in ("base", "source", "queried", "src_a", "base_a", "base_q")}
    cands = {}
    for q in queried:
        bases = np.flatnonzero(in_pool & P.correct & (P.attribute == q))
        cands[q] = len(bases)
        taken = 0
        for b in rng.permutation(bases):
            e = P.entity[b]
            if value[e, a] < 0:
                continue  # e's A is unknown (RAVEL's empty value): nothing to move
            ok = src_ok & (value[P.entity, a] != value[e, a]) & (P.entity != e)
            if q == a:
                ok &= P.template == P.template[b]
            else:
                ok &= (value[P.entity, q] != value[e, q]) & (value[P.entity, q] >= 0)
            choices = np.flatnonzero(ok)
            if len(choices) == 0:
                continue
            s = int(rng.choice(choices))
            for key, v in (("base", b), ("source", s), ("queried", q), ("src_a", value[P.entity[s], a]),
                           ("base_a", value[e, a]), ("base_q", value[e, q])):
                cols[key].append(int(v))
            taken += 1
            if taken == n:
                break
    return _Pairs(*(np.array(cols[k], dtype=np.int64) for k in cols), candidates=cands)


@dataclass
class _Job:
    """One scored subspace of (method row, targeted attribute, layer): a direction per pair of A's values
    (``table`` (V, V, d)), or None for the whole-vector swap."""

    label: str
    family: str
    a: int
    layer: int
    table: Tensor | None
    degenerate: int = 0


def _pairwise(fit: Any, X: Tensor, y: Tensor, V: int, n: int, seed: int) -> tuple[list[Tensor], int]:
    """``n`` (V, V, d) tables (a chance baseline's draws; else one): ``fit(X, z)`` on the states of each pair of values
    (z = 1 for the second) gives ``n`` unit directions (symmetric); a pair that cannot be fitted (a value without
    states, a failed fit) gets a chance direction, counted in the second value."""
    d = X.shape[1]
    tables = torch.zeros(n, V, V, d)
    bad = 0
    for i in range(V):
        for j in range(i + 1, V):
            rows = (y == i) | (y == j)
            found = None
            if bool((y == i).any()) and bool((y == j).any()):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        found = fit(X[rows].float(), (y[rows] == j).long())
                except (ValueError, IndexError, np.linalg.LinAlgError, torch.linalg.LinAlgError, DataError) as err:
                    log.debug("value pair (%d, %d): %s; a chance direction instead", i, j, err)
            if found is None:
                found, bad = [fallback_direction(d, seed + 31 * i + j)] * n, bad + 1
            for k, a in enumerate(found):
                a = a.detach().float().cpu().flatten()
                tables[k, i, j] = tables[k, j, i] = a / a.norm().clamp_min(1e-12)
    return list(tables), bad


def _fit_jobs(config: Config, P: _Prompts, value: np.ndarray, attrs: Sequence[str], layers: Sequence[int],
              fit_pool: np.ndarray, V: Sequence[int], seed: int, device: Any, probe_cache: Path | None) -> list[_Job]:
    """Every non-causal method's subspace at every (attribute, layer), fitted on the fitting entities' prompts."""
    from cprobe.probes import PROBES
    from cprobe.tasks.sites import SiteFits

    rows = np.flatnonzero(np.isin(P.entity, fit_pool))
    jobs = []
    for a, _ in enumerate(attrs):
        y = torch.from_numpy(value[P.entity[rows], a])
        for layer in layers:
            X = P.acts[layer][rows].float()
            site_seed = seed * 100_003 + 1000 * layer + a
            fits = SiteFits(probe_cache, memo={})
            for name in config.methods:
                if declares(name, "causal"):
                    continue  # trained through the model: _train_causal
                if declares(name, "whole_vector"):
                    jobs.append(_Job(name, "direction", a, layer, None))
                    continue
                n = config.random_draws if declares(name, "chance_baseline") else 1

                def fit(Xp: Tensor, z: Tensor, name: str = name) -> list[Tensor]:
                    if is_intervention(name):  # fitted where the job runs; a direction method on the CPU states
                        Xp, z = Xp.to(device or Xp.device), z.to(device or Xp.device)
                    probe = lambda: fits.probe("interventional", {"attribute": attrs[a], "layer": layer},  # noqa: E731
                                               PROBES.build(config.interventional_probe, seed=seed + 1, device=device),
                                               Xp, z)
                    return unit_directions(name, _params(config, name), Xp, z, seed, n, site_seed, device, probe, layer)
                tables, bad = _pairwise(fit, X, y, V[a], n, site_seed)
                jobs += [_Job(name, family(name), a, layer, t, bad) for t in tables]
    return jobs


def _train_causal(config: Config, adapter: Any, P: _Prompts, value: np.ndarray, attrs: Sequence[str],
                  layers: Sequence[int], fit_pool: np.ndarray, V: Sequence[int], seed: int, rng: np.random.Generator,
                  ids: Sequence[Sequence[int]]) -> list[_Job]:
    """Every causal method (DAS) per targeted attribute, at every layer at once (one batched pass,
    :class:`~cprobe.models.multisite.SitesForward`): trained on pairs of the fitting entities with the interchange
    objective on A (the target: the source's A value token), and, with ``mdas_weight``, multi-task (also pairs
    querying each B ≠ A, the target the base's B value token, those rows weighted by ``mdas_weight``). ``ids[a][v]``:
    the token of value v of attribute a; ``V[a]``: its number of values."""
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.multisite import SitesForward
    from cprobe.models.sites import Site

    causal = [m for m in config.methods if declares(m, "causal")]
    if not causal:
        return []
    jobs = []
    fmt = RegionFormatter()
    sites = [Site(l, "region:1") for l in layers]
    for a, _ in enumerate(attrs):
        others = [q for q in range(len(attrs)) if q != a]
        cause = _pairs(P, value, a, fit_pool, config.n_train, rng, [a])
        iso = _pairs(P, value, a, fit_pool, max(1, config.n_train // len(others)), rng, others)
        variants = [("", cause, None)]
        if config.mdas_weight is not None and len(iso.base):
            variants.append(("m", _cat(cause, iso), config.mdas_weight))
        for prefix, pairs, w in variants:
            if len(pairs.base) == 0:
                continue
            order = torch.from_numpy(rng.permutation(len(pairs.base)))  # Cause and Isolate rows mixed in each step
            base, src = pairs.base[order], pairs.source[order]
            is_cause = torch.from_numpy(pairs.queried[order] == a)
            target = torch.where(is_cause, torch.tensor([ids[a][v] for v in pairs.src_a[order]]),
                                 torch.tensor([ids[q][v] for q, v in zip(pairs.queried[order], pairs.base_q[order])]))
            weight = torch.where(is_cause, 1.0, float(w or 1.0))
            train = fmt([P.items[i] for i in base], adapter, torch.arange(len(base)))
            clean = adapter.clean_states(train, [min(layers)])  # every step resumes at the lowest layer
            h = torch.stack([P.acts[l][src] for l in layers]).to(adapter.device)
            n, K = len(base), len(layers)
            for name in causal:
                das = build(name, _params(config, name), seed)
                forward = SitesForward(adapter, train, torch.arange(n), sites, das.windows(n), clean)
                found = das.fit_many(forward, h, target[None].repeat(K, 1), weight=weight[None].repeat(K, 1)).cpu()
                for k, layer in enumerate(layers):
                    jobs.append(_Job(prefix + name, "direction", a, layer, found[k].expand(V[a], V[a], -1).clone()))
    return jobs


def _cat(x: _Pairs, y: _Pairs) -> _Pairs:
    return _Pairs(*(np.concatenate([getattr(x, k), getattr(y, k)])
                    for k in ("base", "source", "queried", "src_a", "base_a", "base_q")),
                  candidates={**x.candidates, **y.candidates})


def _score(adapter: Any, P: _Prompts, jobs: list[_Job], pairs: Mapping[int, _Pairs], layers: Sequence[int],
           progress: bool) -> list[np.ndarray]:
    """Each job's answers (value indices) on its attribute's eval pairs, in the sites engine's pass: row = (base
    prompt, its layer's site), the edit the 1-D interchange toward the source prompt's state (or the whole swap)."""
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.multisite import edited_pass, rowwise_dii
    from cprobe.models.readouts import CandidateTokens
    from cprobe.models.sites import Site

    sites = [Site(l, "region:1") for l in layers]
    d = adapter.hidden_size
    item, site, source, direction, whole, owner = [], [], [], [], [], []
    for j, job in enumerate(jobs):
        p = pairs[job.a]
        if len(p.base) == 0:
            continue
        item.append(torch.from_numpy(p.base))
        site.append(torch.full((len(p.base),), layers.index(job.layer)))
        source.append(P.acts[job.layer][torch.from_numpy(p.source)].float())
        direction.append(torch.zeros(len(p.base), d) if job.table is None
                         else job.table[torch.from_numpy(p.base_a), torch.from_numpy(p.src_a)])
        whole.append(torch.full((len(p.base),), job.table is None))
        owner.append(torch.full((len(p.base),), j))
    if not item:
        return [np.zeros(0, dtype=np.int64) for _ in jobs]
    item_t, site_t, src_t = torch.cat(item), torch.cat(site), torch.cat(source)
    dir_t, whole_t, owner_t = torch.cat(direction), torch.cat(whole), torch.cat(owner)
    batch = RegionFormatter()(P.items, adapter, torch.arange(len(P.items)))
    pred = torch.zeros(len(item_t), dtype=torch.long)
    dev = adapter.device

    def edits(rows: Tensor, _: Any, at: list[Site]) -> dict[Site, Any]:
        edit = rowwise_dii(src_t[rows].to(dev), dir_t[rows].to(dev), whole_t[rows].to(dev))
        return {s: edit for s in at}

    def score(rows: Tensor, out: Any) -> None:
        best = out.scores.float().cpu().argmax(1, keepdim=True)
        pred[rows] = P.cand_value[item_t[rows]].gather(1, best).squeeze(1)

    edited_pass(adapter, batch, item_t, sites, edits, score, row_site=site_t,
                readout=lambda items: CandidateTokens(P.cand[items]), clean=adapter.clean_states(batch, list(layers)),
                desc="RAVEL interchanges", progress=progress)
    return [pred[owner_t == j].numpy() for j in range(len(jobs))]


def _rows(jobs: list[_Job], preds: list[np.ndarray], pairs: Mapping[int, _Pairs], attrs: Sequence[str]
          ) -> list[dict[str, Any]]:
    """The score and summary rows; a method's several jobs at one (attribute, layer) — the chance baseline's draws —
    are pooled (the mean over draws: each has the same pairs)."""
    groups: dict[tuple[str, str, int, int], list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault((job.label, job.family, job.a, job.layer), []).append(j)
    rows = []
    for (label, fam, a, layer), js in groups.items():
        p = pairs[a]
        pred = np.concatenate([preds[j] for j in js])
        q = np.tile(p.queried, len(js))
        wanted_cause = np.tile(p.src_a, len(js))
        wanted_iso = np.tile(p.base_q, len(js))
        common = {"method": label, "family": fam, "layer": layer, "attribute": attrs[a], "draws": len(js),
                  "degenerate": sum(jobs[j].degenerate for j in js)}
        by = {}
        for qi, qname in enumerate(attrs):
            m = q == qi
            by[qi] = M.cause(pred[m], wanted_cause[m]) if qi == a else M.isolate(pred[m], wanted_iso[m])
            rows.append({**common, "kind": "score", "queried": qname, "metric": "cause" if qi == a else "isolate",
                         "value": by[qi], "n": int(m.sum() // len(js)), "n_candidates": p.candidates.get(qi, 0)})
        c = by[a]
        iso_by = [v for qi, v in by.items() if qi != a and not np.isnan(v)]
        i = float(np.mean(iso_by)) if iso_by else float("nan")
        for metric, v in (("cause", c), ("isolate", i), ("disentangle", M.disentangle(c, i))):
            rows.append({**common, "kind": "summary", "queried": "all", "metric": metric, "value": v,
                         "n": int(len(p.base))})
    summary = pd.DataFrame([r for r in rows if r["kind"] == "summary"])
    if len(summary):
        for (label, fam, layer, metric), g in summary.groupby(["method", "family", "layer", "metric"], sort=False):
            rows.append({"method": label, "family": fam, "layer": int(layer), "attribute": "all", "kind": "summary",
                         "queried": "all", "metric": metric, "value": float(g["value"].mean()), "n": int(g["n"].sum()),
                         "draws": int(g["draws"].max()), "degenerate": int(g["degenerate"].sum())})
    return rows


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    from cprobe.extract import resolve_layers
    from cprobe.probes.grid import PROBE_FITS

    data, model = _load(ctx, config)
    attrs = _attributes(data, config)
    adapter = ctx.adapter(model)
    if adapter.kind != "causal":
        raise ConfigError(f"the ravel task reads a causal LM's next token; model {adapter.name!r} is {adapter.kind!r}")
    layers = resolve_layers(ctx.cfg["layers"], adapter.n_layers)
    ids = _value_ids(data, attrs, adapter.tok, ctx)
    entities = list(data.entities)
    values = {a: sorted(ids[a]) for a in attrs}
    value = np.array([[values[a].index(data.entities[e][a]) if data.entities[e].get(a) in ids[a] else -1
                       for a in attrs] for e in entities], dtype=np.int64)
    t0 = time.perf_counter()
    P = _prompts(adapter, data, attrs, ids, entities, layers, ctx.progress)
    ctx.timings["clean_pass_s"] = time.perf_counter() - t0
    seed = config.pair_seed + ctx.seed
    rng = np.random.default_rng([seed, 46])
    order = rng.permutation(len(entities))
    n_fit = max(1, min(len(entities) - 1, round(config.fit_share * len(entities))))
    fit_pool, eval_pool = np.sort(order[:n_fit]), np.sort(order[n_fit:])
    acc_rows = [{"kind": "accuracy", "method": "", "family": "", "layer": -1, "attribute": a, "queried": a,
                 "metric": "task_accuracy", "value": float(P.correct[P.attribute == j].mean()),
                 "n": int((P.attribute == j).sum())} for j, a in enumerate(attrs)]
    for r in acc_rows:
        log.info("%s answers %s right on %.3f of %d prompts", adapter.name, r["attribute"], r["value"], r["n"])
    everything = list(range(len(attrs)))
    pairs = {a: _pairs(P, value, a, eval_pool, config.n_pairs, rng, everything) for a in everything}
    t0 = time.perf_counter()
    V = [len(values[a]) for a in attrs]
    jobs = _fit_jobs(config, P, value, attrs, layers, fit_pool, V, seed, ctx.device,
                     ctx.cache_dir(PROBE_FITS))
    ctx.timings["fit_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    jobs += _train_causal(config, adapter, P, value, attrs, layers, fit_pool, V, seed, rng,
                          [[ids[a][v] for v in values[a]] for a in attrs])
    ctx.timings["train_causal_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    preds = _score(adapter, P, jobs, pairs, layers, ctx.progress)
    ctx.timings["interchange_s"] = time.perf_counter() - t0
    table = pd.DataFrame(acc_rows + _rows(jobs, preds, pairs, attrs))
    table["model"], table["dataset"], table["position"] = adapter.name, data.name, POSITION
    table["n_fit_entities"], table["n_eval_entities"] = len(fit_pool), len(eval_pool)
    sources = {m: provenance(m) for m in config.methods}
    sources.update({f"m{m}": sources[m] for m in config.methods if declares(m, "causal")})
    table["method_source"] = [sources.get(m, "") for m in table["method"]]  # a plugin's package and version
    for col in ("draws", "degenerate", "n_candidates"):
        table[col] = table[col].fillna(0).astype(int) if col in table else 0
    return table


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """PNG: Cause, Isolate and disentanglement by layer, per method (the mean over attributes)."""
    import cprobe.plots as plots

    part = table[(table["kind"] == "summary") & (table["attribute"] == "all")]
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
    per = table[(table["kind"] == "summary") & (table["attribute"] != "all") & (table["metric"] == "cause")]
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
    family="family", slice=("kind", "attribute", "queried"),
    slice_defaults={"kind": "summary", "attribute": "all", "queried": "all"}, metric="metric", value="value", n="n",
    breakdowns=("kind", "attribute", "queried"), items=_record_items)
"""Per method × layer × attribute (× queried attribute): Cause, Isolate, disentanglement; the mean over attributes
is the whole (the leaderboard's cell, the attributes its items, as CausalGym's tasks); the model's accuracy per
attribute (``kind: accuracy``)."""
