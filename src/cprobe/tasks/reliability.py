"""The reliability study (Canby et al. 2024): intervene on Z_c, score completeness, selectivity,
reliability against oracle probes, and ΔTask Acc by feeding the intervened states back.

One job = one intervention at one hyperparameter setting (a sweep runs a grid). With ``reliability.read_layers`` the
edit at layer l is scored by oracles trained on clean states at every read layer l′ ≥ l, reading the states of the same
edited forward pass (one row per l′); with ``reliability.sites`` the intervention is fitted and applied at several sites
at once (``mode: simultaneous``, each fitted on clean states) or one after another (``mode: sequential``, each refitted
on the states the upstream edits produce). Fitting at the sites and the edited pass are the sites engine's
(:mod:`cprobe.tasks.sites`, :func:`cprobe.models.multisite.edited_pass`); the scoring itself is the pure
:func:`cprobe.metrics.reliability.score_intervention`. Its tables and figures: :mod:`cprobe.tasks.reliability_report`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from cprobe.metrics.baselines import majority_baseline
from cprobe.metrics.registry import compute, outside_metrics
from cprobe.data.registry import check_properties, pairs_refusal
from cprobe.data.splits import make_splits
from cprobe.errors import ConfigError, DataError
from cprobe.extract import cached_clean_states, check_layers_spec, extract, resolve_layers, task_accuracy
from cprobe.interventions import INTERVENTIONS, Intervention, apply, needs_goal
from cprobe.io import write_parquet
from cprobe.job import JobContext
from cprobe.tasks import SHARED_GROUPS, TaskResult, Uses
from cprobe.models.load import fingerprint, resolve_device
from cprobe.metrics.reliability import counterfactual_targets, oracle_informative, score_intervention
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply, EditSpec, Replace
from cprobe.models.formatters import AgreementFormatter, check_word_position
from cprobe.models.multisite import edited_pass
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from cprobe.probes import Probe
from cprobe.probes.grid import PROBE_FITS
from cprobe.records import Derived, RecordSpec, canonical, item_rows
from cprobe.sae.method import at_site, check_sites
from cprobe.sae.quality import HELD_OUT, held_out
from cprobe.tasks.reliability_report import read_layer_heatmap, read_layer_table, report, table1  # noqa: F401
from cprobe.tasks.sites import SiteFits, fit_sites, minimal_pair_training

log = logging.getLogger("cprobe")

USES = Uses(groups=SHARED_GROUPS, methods="intervention")


@dataclass(frozen=True)
class EditSite:
    """One entry of ``reliability.sites``: where the intervention is fitted and applied (a bare int is a layer at the
    study's ``position``)."""

    layer: int  # 0 = embeddings … L; negative counts from the end (-1 = L)
    position: str | None = None  # target | first | word:<i>; null: the study's `position`


@dataclass(frozen=True)
class Config:
    """The ``reliability:`` node."""

    target: str = "z_c"
    others: list[str] = field(default_factory=lambda: ["z_e"])
    oracle_probe: str = "mlp"  # a key of `probe` (probe=all has linear and mlp)
    interventional_probe: str = "mlp"  # the probe gradient attacks attack (never the oracle object)
    cache_probes: bool = True  # fitted oracle/interventional probes also cached on disk (CPROBE_CACHE_DIR)
    chance_margin: float = 0.02  # an oracle within this of its majority rate is flagged "at chance"
    # Downstream read layers: null = score the states at the edited layer only (one row per job, as before);
    # `all` = every l′ ≥ l; an int or a list of layers (each ≥ the shallowest edited layer). One row per l′.
    read_layers: str | int | list[int] | None = None
    # Multi-site edits: null = one site, `layers` at `position`; else a list of layers (ints) or {layer, position}
    # entries, all edited in one forward pass (`layers` is then not read).
    sites: list[int | EditSite] | None = None
    # How several sites are fitted: simultaneous = each on clean states; sequential = site by site (in layer order)
    # on the states produced by the edits already fitted upstream (erasers only).
    mode: Literal["simultaneous", "sequential"] = "simultaneous"


def validate(job: Any) -> None:
    rc: Config = job.task_cfg
    if job.keys.intervention is None:
        raise ConfigError(f"the reliability task needs an intervention: intervention=<one of {INTERVENTIONS.names()}>")
    icfg = dict(job.keys.intervention)
    hparam = icfg.pop("hparam", None)
    if hparam is not None and hparam not in icfg:
        raise ConfigError(f"intervention.hparam={hparam!r} is not a key of the intervention config {sorted(icfg)}")
    method = INTERVENTIONS.build(icfg, seed=job.keys.seed)
    if method.needs_model and job.keys.dataset is not None:
        why = pairs_refusal(job.keys.dataset, rc.target)
        if why:
            raise ConfigError(f"intervention {icfg['name']!r} is trained through the model on minimal pairs that "
                              f"flip {rc.target!r}: {why}")
    _validate_sites(rc, method, job.keys.layers)
    check_sites(type(method), icfg, job.keys.layers if rc.sites is None else [_site_key(s)[0] for s in rc.sites])
    if rc.target in rc.others:
        raise ConfigError(f"reliability.others must not contain the target {rc.target!r}")
    if not rc.others:
        raise ConfigError("reliability.others is empty: selectivity needs at least one non-targeted property")
    for role in ("oracle_probe", "interventional_probe"):
        name = getattr(rc, role)
        if name not in (job.keys.probe or {}):
            raise ConfigError(f"reliability.{role}={name!r} is not configured; probe= has "
                              f"{sorted(job.keys.probe or {})} (use probe=all)")
    if job.keys.dataset is None or job.keys.split is None:
        raise ConfigError("the reliability task needs dataset= and split= (e.g. split=reliability)")
    check_properties(job.keys.dataset, [rc.target, *rc.others], "reliability.target/others")
    fractions = job.keys.split.get("fractions", {})
    if any(s not in fractions for s in ("oracle", "intervention", "test")):
        raise ConfigError(f"the reliability task needs oracle/intervention/test splits; split.fractions has "
                          f"{list(fractions)}")


def _validate_sites(rc: Config, method: Intervention, layers_spec: Any) -> None:
    """The model-independent checks of ``read_layers``, ``sites`` and ``mode`` (before any model loads); read layers
    before the first edit are refused where no model is needed to tell (non-negative layer numbers; `last` and
    negative layers are checked once the model's depth is known)."""
    spec = rc.read_layers
    if isinstance(spec, str) and spec != "all":
        raise ConfigError(f"reliability.read_layers={spec!r}: use null (the edited layer), 'all' (every layer from "
                          "the edited one on), an int or a list of ints")
    if spec is not None and spec != "all":
        check_layers_spec(spec)
    if rc.sites is not None:
        if not rc.sites:
            raise ConfigError("reliability.sites=[] edits nothing; give layers (e.g. [2, 3]) or null for `layers`")
        keys = [_site_key(s) for s in rc.sites]
        for _, pos in keys:
            if pos is not None:
                check_word_position(pos)
        dup = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if dup:
            raise ConfigError(f"reliability.sites lists {dup} more than once")
        if len(rc.sites) > 1 and method.needs_model:
            raise ConfigError(f"{type(method).__name__} is trained through the model at one site; reliability.sites "
                              "edits several at once: give one site (or use reliability.read_layers alone)")
    if rc.mode == "sequential" and method.kind != "nullifying":  # with one site both modes are the same edit
        raise ConfigError(f"reliability.mode=sequential refits an eraser on the states the upstream erasures "
                          f"produce; {type(method).__name__} is {method.kind}: use mode=simultaneous")
    if spec is None or spec == "all":
        return
    reads = [spec] if isinstance(spec, int) else list(spec)
    edited = [_site_key(s)[0] for s in rc.sites] if rc.sites is not None else (
        [layers_spec] if isinstance(layers_spec, int) and not isinstance(layers_spec, bool) else [])
    if not edited or any(l < 0 for l in [*edited, *reads]):
        return
    read_layers(sorted(reads), edited, max([*edited, *reads]))


def _site_key(s: int | EditSite) -> tuple[int, str | None]:
    return (s, None) if isinstance(s, int) else (s.layer, s.position)


def edit_sites(rc: Config, layers_spec: Any, position: str, n_layers: int) -> list[Site]:
    """Where the intervention goes: ``reliability.sites`` (sorted by layer, stable), else the one layer of ``layers``
    at ``position``."""
    if rc.sites is None:
        layers = resolve_layers(layers_spec, n_layers)
        if len(layers) != 1:
            raise ConfigError(f"the reliability task takes one layer per job (got {layers}); sweep layers with -m, "
                              "or set reliability.sites to edit several at once")
        return [Site(layers[0], position)]
    out = []
    for s in rc.sites:
        layer, pos = _site_key(s)
        (l,) = resolve_layers(layer, n_layers)
        out.append(Site(l, pos or position))
    if len(set(out)) != len(out):
        raise ConfigError(f"reliability.sites names one site twice once layers are resolved: {out}")
    return sorted(out, key=lambda s: s.layer)


def read_layers(spec: Any, edited: Sequence[int], n_layers: int) -> list[int]:
    """The layers l′ whose states the oracles read: null → the deepest edited layer; ``all`` → every l′ from the
    deepest edited layer to the last; a list → those (each at or after the shallowest edited layer, since nothing
    before it sees an edit)."""
    deepest, shallowest = max(edited), min(edited)
    if spec is None:
        return [deepest]
    if spec == "all":
        return list(range(deepest, n_layers + 1))
    out = resolve_layers(spec, n_layers)
    early = [l for l in out if l < shallowest]
    if early:
        raise ConfigError(f"reliability.read_layers={spec!r}: layer(s) {early} come before the edit at layer "
                          f"{shallowest} and cannot see it; use layers >= {shallowest} or 'all'")
    return out


def _train_oracles(ctx: JobContext, config: Config, values: Mapping[str, list], labels: Mapping[str, Tensor],
                   splits: Mapping[str, Any], X: Tensor, role: Mapping[str, Any], fits: SiteFits,
                   dev: str, where: str) -> tuple[dict[str, Probe], dict[str, Any]]:
    """One oracle per property on the oracle split's clean states ``X`` (rows where it is defined), scored on the test
    split: (oracles, their accuracies / majority rates / informative flags); where each came from in ``fits``."""
    oracles: dict[str, Probe] = {}
    info: dict[str, Any] = {}
    te = splits["test"]
    pc = ctx.cfg["probe"][config.oracle_probe]
    for p in values:
        idx = splits["oracle"][labels[p][splits["oracle"]].numpy() >= 0]
        oracles[p] = fits.probe(f"oracle_{p}", role, ctx.probe(pc), X[idx].to(dev), labels[p][idx].to(dev))
        ok = labels[p][te] >= 0
        acc = oracles[p].score(X[te][ok], labels[p][te][ok])
        majority = majority_baseline(labels[p][idx], labels[p][te][ok])
        informative = oracle_informative(acc, majority, config.chance_margin)
        info.update({f"oracle_acc_{p}": acc, f"oracle_majority_{p}": majority, f"oracle_informative_{p}": informative})
        if not informative:
            ctx.warn(f"the {p} oracle is at chance on {where} (accuracy {acc:.3f} vs majority {majority:.3f}): "
                     f"{'completeness' if p == config.target else 'selectivity'} is not meaningful")
    return oracles, info


OUTSIDE = "metric_"
"""Table columns ``metric_<name>`` hold the outside metrics of the config's ``metrics:`` (``edit`` inputs)."""


def edit_metrics(metrics: Sequence[Any], before: Tensor, after: Tensor, z: Tensor, z_goal: Tensor | None,
                 per_item: dict[str, Tensor]) -> dict[str, float]:
    """Each outside metric on the scored test rows (states before / after the edit, the targeted property, the goal
    class): its mean as ``metric_<name>``, its per-item values into ``per_item`` (the leaderboard's bootstrap)."""
    out = {}
    for m in metrics:
        v = compute(m, before=before.float(), after=after.float(), z=z.long(),
                    z_target=None if z_goal is None else z_goal.long())
        per_item[f"{OUTSIDE}{m.name}"] = torch.from_numpy(v)
        out[f"{OUTSIDE}{m.name}"] = float(v[~np.isnan(v)].mean()) if (~np.isnan(v)).any() else float("nan")
    return out


def _labels(cfg: Mapping[str, Any], config: Config, data: Any, seed: int
            ) -> tuple[dict[str, Any], dict[str, list], dict[str, Tensor]]:
    """The splits, each property's values and integer labels (−1 = none); one-line errors for what cannot be scored."""
    target, others = config.target, list(config.others)
    for p in (target, *others):
        if p not in data.properties:
            raise ConfigError(f"property {p!r} not in dataset {data.name!r}; it has {list(data.properties)}")
    splits = make_splits(data, cfg["split"], seed)
    values = {p: data.values(p) for p in (target, *others)}
    for p, v in values.items():
        if len(v) < 2:
            raise DataError(f"property {p!r} has {len(v)} value(s) other than 'none' in {data.name!r} ({v}); "
                            "the reliability study needs two or more")
    labels = {p: torch.from_numpy(data.labels(p, values[p])) for p in values}
    if (labels[target][splits["test"]] < 0).any():
        raise ConfigError(f"the target {target!r} must be defined for every item (some are {target}=none)")
    return splits, values, labels


def fit_diagnostics(m: Any) -> dict[str, Any]:
    """What a fitted method says of its own fit, as ``fit_*`` columns: an iterative fit's steps, convergence and why it
    stopped (R-LACE's ``stop_reason``: eps / plateau / cap / none), an attack's probe accuracy. (An SAE method's quality
    is measured on the test split: :func:`cprobe.sae.quality.held_out`.)"""
    return {f"fit_{a}": getattr(m, a) for a in ("steps_run", "converged", "stop_reason", "probe_accuracy")
            if hasattr(m, a)}


def _site_name(s: Site, position: str) -> str:
    return str(s.layer) if s.position == position else f"{s.layer}@{s.position}"


@dataclass
class _Scene:
    """What every step of one job reads: the job, its model, the states at every position, labels and splits."""

    ctx: JobContext
    config: Config
    adapter: ModelAdapter
    exs: dict[str, Any]  # position -> its extraction
    position: str
    splits: dict[str, Any]
    values: dict[str, list]
    labels: dict[str, Tensor]
    dev: str
    cache_dir: Path | None

    @property
    def data(self) -> Any:
        return self.exs[self.position].dataset

    def role(self, layer: int, position: str) -> dict[str, Any]:
        a = self.adapter  # what a probe fitted on clean states at (layer, position) depends on beyond its data
        return {"acts": [a.name, fingerprint(a), str(a.dtype), self.data.fingerprint(), layer, position],
                "seed": self.ctx.seed, "split": self.ctx.cfg["split"]}


@dataclass
class _Edited:
    """The scored test rows (``rows`` of the test split, items, goals), their edited states per read layer, the task
    accuracies before and after, timings."""

    rows: Tensor
    items: Any
    z_goal: Tensor | None
    states: dict[int, Tensor]
    acc_before: float | None
    acc_after: float | None
    t_apply: float
    t_task: float


def _scene(ctx: JobContext, config: Config, adapter: ModelAdapter, ds: Any, sites: list[Site],
           reads: list[int]) -> _Scene:
    position = ctx.cfg["position"]
    by_pos: dict[str, set[int]] = {position: set(reads)}
    for s in sites:
        by_pos.setdefault(s.position, set()).add(s.layer)
    exs = {pos: extract(adapter, ds, sorted(ls), pos, ctx.cache, progress=ctx.progress) for pos, ls in by_pos.items()}
    for reason, n in exs[position].dropped.items():
        ctx.warn(f"dropped {n} of {len(ds)} items: {reason}")
    splits, values, labels = _labels(ctx.cfg, config, exs[position].dataset, ctx.seed)
    return _Scene(ctx, config, adapter, exs, position, splits, values, labels,
                  str(resolve_device(ctx.device or "auto")), ctx.cache_dir(PROBE_FITS) if config.cache_probes else None)


def _fit(sc: _Scene, sites: list[Site], oracles: Sequence[Probe], fits: SiteFits) -> dict[Site, Intervention]:
    """The intervention at each site (:func:`cprobe.tasks.sites.fit_sites`)."""
    ctx, config, data, inter = sc.ctx, sc.config, sc.data, sc.splits["intervention"]
    icfg = {k: v for k, v in ctx.cfg["intervention"].items() if k != "hparam"}
    z_inter = sc.labels[config.target][inter]

    def fit_at(s: Site, X_fit: Tensor, upstream: Sequence[Site]) -> Intervention:
        role = sc.role(s.layer, s.position)
        if upstream:  # refitted on edited states: its interventional probe (if any) is keyed by the edits too
            role = {**role, "after": [[u.layer, u.position] for u in upstream], "intervention": icfg}
        through = None if upstream else (lambda: minimal_pair_training(
            sc.adapter, data, sc.exs[s.position], inter, s.layer, s.position, config.target, ctx.cfg["dataset"],
            ctx.data_root, ctx.progress))
        method = INTERVENTIONS.build(at_site(INTERVENTIONS.get(icfg["name"]), icfg, s.layer), seed=ctx.seed,
                                     device=ctx.device)
        return fits.fit(method, X_fit.to(sc.dev), z_inter.to(sc.dev), role,
                        lambda: ctx.probe(ctx.cfg["probe"][config.interventional_probe]), through,
                        "" if len(sites) == 1 else f"@{_site_name(s, sc.position)}", oracles)

    fmt = AgreementFormatter(tuple(dict.fromkeys([sc.position, *(s.position for s in sites)])))
    return fit_sites(sc.adapter, [data.examples[i] for i in inter], fmt, sites,
                     {s: sc.exs[s.position].acts[s.layer].float()[inter] for s in sites}, fit_at, config.mode,
                     progress=ctx.progress)


def _edit(sc: _Scene, sites: list[Site], fitted: Mapping[Site, Intervention], reads: list[int]) -> _Edited:
    """One forward over the scored test items (:func:`cprobe.models.multisite.edited_pass`): every site edited,
    every read layer read, the task output scored."""
    t0 = time.perf_counter()
    ex, te, target = sc.exs[sc.position], sc.splits["test"], sc.config.target
    if needs_goal(next(iter(fitted.values()))):
        rows, z_goal = counterfactual_targets(sc.labels[target][te], len(sc.values[target]))
    else:
        rows, z_goal = torch.arange(len(te)), None
    items = te[rows.numpy()]
    edits: dict[Site, EditSpec] = {s: Apply(m, z_goal) for s, m in fitted.items()}
    if len(sites) == 1:  # one site: the transform of its extracted states, written (Replace)
        (s,) = sites
        X_site = sc.exs[s.position].acts[s.layer].float()[items].to(sc.dev)
        edits = {s: Replace(apply(fitted[s], X_site, None if z_goal is None else z_goal.to(sc.dev)).float().cpu())}
    t_apply, t0 = time.perf_counter() - t0, time.perf_counter()
    readout = CandidateTokens(ex.candidates[items]) if ex.scores is not None else None
    fmt = AgreementFormatter(tuple(dict.fromkeys([sc.position, *(s.position for s in sites)])))
    n, read = len(items), [Site(l, sc.position) for l in reads]
    batch = fmt.encode([sc.data.examples[i] for i in items], sc.adapter).batch(torch.arange(n))
    states = {l: torch.zeros(n, sc.adapter.hidden_size) for l in reads}
    scores = torch.zeros(n, 0 if readout is None else ex.candidates.shape[1])

    def score(r: Tensor, out: Any) -> None:
        for s in read:
            states[s.layer][r] = out.acts[s].float().cpu()
        if readout is not None:
            scores[r] = out.scores.float().cpu()

    edited_pass(sc.adapter, batch, torch.arange(n), sites, lambda r, sub, at: {
        s: e.bind(sub.rows) for s, e in edits.items()}, score, read=read, readout=lambda _: readout,
        clean=cached_clean_states(sc.adapter, batch, min(s.layer for s in sites), sc.ctx.cache),
        progress=sc.ctx.progress)
    acc = (None, None) if readout is None else (task_accuracy(ex.scores[items]), task_accuracy(scores))
    return _Edited(rows, items, z_goal, states, *acc, t_apply, time.perf_counter() - t0)


def run(ctx: JobContext, config: Config) -> TaskResult:
    """The study's one run path: edit at the job's sites (one or several) and score the states read at every read
    layer l′ in the same forward pass, with oracles trained on clean states at l′. One row per l′ (one schema, whatever
    the job edits and reads); ΔTask from the same pass's output."""
    t_job = time.perf_counter()
    cfg, position = ctx.cfg, ctx.cfg["position"]
    adapter = ctx.adapter(cfg["model"])
    ds = ctx.dataset()
    sites = edit_sites(config, cfg["layers"], position, adapter.n_layers)
    reads = read_layers(config.read_layers, [s.layer for s in sites], adapter.n_layers)
    sc = _scene(ctx, config, adapter, ds, sites, reads)
    ex, data, target, others = sc.exs[position], sc.data, config.target, list(config.others)
    te, inter, labels = sc.splits["test"], sc.splits["intervention"], sc.labels
    # Oracles at every read layer, on clean states (the same cache keys as a job edited at that layer).
    t0 = time.perf_counter()
    o_fits = {l: SiteFits(sc.cache_dir) for l in reads}
    got = {l: _train_oracles(ctx, config, sc.values, labels, sc.splits, ex.acts[l].float(), sc.role(l, position),
                             o_fits[l], sc.dev, f"{adapter.name} layer {l}") for l in reads}
    oracles, o_info = {l: g[0] for l, g in got.items()}, {l: g[1] for l, g in got.items()}
    t_oracle, t0 = time.perf_counter() - t0, time.perf_counter()
    fits = SiteFits(sc.cache_dir)
    fitted = _fit(sc, sites, [o for per in oracles.values() for o in per.values()], fits)
    t_fit = time.perf_counter() - t0
    ed = _edit(sc, sites, fitted, reads)
    icfg = cfg["intervention"]
    name, hparam, m = icfg["name"], icfg.get("hparam"), fitted[sites[0]]
    hval = icfg.get(hparam) if hparam else None
    site_names = ",".join(_site_name(s, position) for s in sites)
    sae_quality = held_out(m, sc.exs[sites[0].position].acts[sites[0].layer].float()[te])  # {} without an SAE
    rows_out = []
    per_layer: dict[int, dict[str, Tensor]] = {}
    for l in reads:
        X_orig, X_edit = ex.acts[l].float()[ed.items], ed.states[l]
        per_layer[l] = {}
        scores = score_intervention(oracles[l], target, others, X_orig, X_edit, ed.z_goal,
                                    {p: labels[p][te][ed.rows] >= 0 for p in others}, ed.acc_before, ed.acc_after,
                                    per_layer[l])
        scores.update(edit_metrics(outside_metrics(cfg, "edit"), X_orig, X_edit, labels[target][te][ed.rows],
                                   ed.z_goal, per_layer[l]))
        edited_acc = {f"oracle_acc_edited_{p}": oracles[l][p].score(X_edit[labels[p][ed.items] >= 0],
                                                                    labels[p][ed.items][labels[p][ed.items] >= 0])
                      for p in (target, *others)}
        rows_out.append({
            "model": adapter.name, "dataset": data.name, "dataset_source": data.source,
            "layer": max(s.layer for s in sites), "read_layer": l, "sites": site_names, "target": target,
            "mode": config.mode if len(sites) > 1 else "single", "position": position, "method": name,
            "kind": m.kind, "hparam": hparam, "hparam_value": None if hval is None else float(hval), **scores,
            **edited_acc, "selectivity_valid": all(o_info[l][f"oracle_informative_{p}"] for p in others),
            **o_info[l], "oracle_probe": config.oracle_probe,
            "n_test": len(te), "n_scored": len(ed.rows), "n_oracle": len(sc.splits["oracle"]),
            "n_intervention": len(inter), "device": sc.dev,
            "probe_source": ",".join(f"{k_}={v}" for k_, v in {**o_fits[l].sources, **fits.sources}.items()),
            "method_source": INTERVENTIONS.provenance(name).text,
            **fit_diagnostics(m), **sae_quality,
            "oracle_s": t_oracle, "fit_s": t_fit, "apply_s": ed.t_apply, "task_s": ed.t_task,
            "job_s": time.perf_counter() - t_job,
        })
        log.info("%s%s sites %s (%s) read at %d: C=%.3f S=%.3f R=%.3f acc(%s)=%.3f ΔTask=%s", name,
                 f" {hparam}={hval}" if hparam else "", site_names, config.mode, l, scores["completeness"],
                 scores["selectivity"], scores["reliability"], target, edited_acc[f"oracle_acc_edited_{target}"],
                 scores.get("delta_task_acc"))
    per = _write_items(ctx.out_dir / ITEMS_FILE, ed.items, ed.z_goal, per_layer)
    return TaskResult(pd.DataFrame(rows_out), per)


# ----------------------------------------------------------------------------------------------- records
ITEMS_FILE = "reliability_items.parquet"
"""Per scored test row (and goal value): its completeness and selectivity, the items of C and S."""


def _write_items(path: Path, test_rows: Any, z_goal: Tensor | None, per_item: dict[int, dict[str, Tensor]]
                 ) -> pd.DataFrame:
    """``per_item``: the per-row scores per read layer l′; returns the frame written (the records' per-item values)."""
    items = [str(int(i)) for i in test_rows] if z_goal is None else \
        [f"{int(i)}>{int(z)}" for i, z in zip(test_rows, z_goal.tolist())]
    frame = pd.concat([pd.DataFrame({"read_layer": l, "item": items, **{k: v.numpy() for k, v in part.items()}})
                       for l, part in per_item.items()], ignore_index=True)
    write_parquet(frame, path)
    return frame


def _record_items(table: pd.DataFrame, records: pd.DataFrame, per: pd.DataFrame | None) -> pd.DataFrame | None:
    """The test rows of C and S (``per``: the frame the run returns, also written as ``reliability_items.parquet``):
    the items of the whole-set completeness and selectivity records, and of each non-targeted property's selectivity
    (slice ``property``; NaN where it does not apply, so its record's ``n`` counts the rows it does). With read
    layers, each l′'s records get that l′'s rows."""
    if per is None:
        return None
    props = sorted(c[len("selectivity_"):] for c in per.columns if c.startswith("selectivity_"))
    outside = {c.removeprefix(OUTSIDE): c for c in per.columns if c.startswith(OUTSIDE)}
    metric, sl = records["metric"], records["slice"]
    whole = records[(sl == "{}") & metric.isin(["oracle_completeness", "oracle_selectivity", *outside])]
    by_prop = {p: records[(metric == "oracle_selectivity") & (sl == canonical({"property": p}))] for p in props}
    parts = []
    for l, g in per.groupby("read_layer"):
        def at(r: pd.DataFrame) -> pd.DataFrame:
            return r[r["read_layer"] == l]

        parts.append(item_rows(at(whole), {"oracle_completeness": g["completeness"].to_numpy(),
                                           "oracle_selectivity": g["selectivity"].to_numpy(),
                                           **{m: g[c].to_numpy() for m, c in outside.items()}}, g["item"]))
        for p in props:
            parts.append(item_rows(at(by_prop[p]), {"oracle_selectivity": g[f"selectivity_{p}"].to_numpy()},
                                   g["item"]))
    parts = [x for x in parts if len(x)]
    return pd.concat(parts, ignore_index=True) if parts else None


def _setting(t: pd.DataFrame) -> list[dict]:
    """The swept hyperparameter ({} for LEACE) and the oracle probe the scores are read with; for a multi-site edit
    also its sites and mode."""
    n = len(t)
    return [{**({h: v} if isinstance(h, str) and h else {}), "oracle": o,
             **({"sites": str(s), "mode": str(m)} if isinstance(m, str) and m not in ("single", "") else {})}
            for h, v, o, s, m in zip(t["hparam"], t["hparam_value"], t.get("oracle_probe", [""] * n),
                                     t.get("sites", [None] * n), t.get("mode", [None] * n))]


def _read_layer(t: pd.DataFrame) -> pd.Series:
    """The layer the oracles read: ``read_layer`` (downstream reads), else the edited layer."""
    return t["read_layer"].fillna(t["layer"]) if "read_layer" in t.columns else t["layer"]


RECORDS = RecordSpec(
    dataset="dataset", model="model", layer="layer", read_layer=Derived(_read_layer), position="position",
    method="method", family="kind", setting=Derived(_setting),
    metrics={"completeness": "oracle_completeness", "selectivity": "oracle_selectivity", "reliability": "reliability",
             "task_acc_before": "task_accuracy", "task_acc_after": "intervened_task_accuracy",
             "delta_task_acc": "delta_task_accuracy", **{c: c for c in HELD_OUT}},
    patterns={r"selectivity_(?!valid$)(.+)": ("oracle_selectivity", "property"),
              r"oracle_acc_edited_(.+)": ("edited_oracle_accuracy", "property"),
              r"oracle_acc_(?!edited_)(.+)": ("oracle_accuracy", "property"), r"oracle_majority_(.+)": ("oracle_majority", "property")},
    n={"oracle_accuracy": "n_test", "oracle_majority": "n_test", "*": "n_scored", **{c: "sae_n" for c in HELD_OUT}},
    breakdowns=("property",), items=_record_items, items_file=ITEMS_FILE, outside_metrics=OUTSIDE,
    where_defined=HELD_OUT)
"""Completeness, selectivity (overall and per non-targeted property: slice ``property``), reliability, ΔTask Acc and
the oracles' accuracies as records (:mod:`cprobe.records`); ``kind`` is the method family."""
