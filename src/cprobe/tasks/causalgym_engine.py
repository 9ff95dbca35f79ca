"""CausalGym's engine: one task on one model — read site activations, find directions, score 1-D DIIs (the settings:
:mod:`cprobe.tasks.causalgym_settings`).

Sites are (layer l, region r): the residual stream after block l (cprobe's layer convention: 0 = embeddings, l =
output of block l; the paper labels the same blocks 0..L−1, column ``paper_layer``) at the last token of region r.
At the last layer ``stream="block"`` (default) reads the raw block output, as the reference (pyvene
``block_output``) does, and ``"resid"`` the state after the final norm that HF reports. Everything goes through the
model's one entry point (:meth:`ModelAdapter.map` / :meth:`~ModelAdapter.run`): the pairs become region-aligned
:class:`~cprobe.data.items.TextItem` lists tokenized by :class:`RegionFormatter`, label scores are a
:class:`CandidateTokens` readout, and the DII is an edit at the site.

Order of work for one task: one pass per input set reads every site; every site's directions and interventions are
fitted (:func:`_fit_site`, interventions through :class:`cprobe.tasks.sites.SiteFits`); every causal direction (DAS,
per site and condition) is trained, many sites per batched pass (:class:`~cprobe.models.multisite.SitesForward`);
every (site, direction or edit) is scored in the sites engine's pass (:func:`~cprobe.models.multisite.edited_pass`)
with this study's callback: odds, IIA, an eraser's erasure, completeness. What a method needs is read from its declared
capabilities, never from its name; a rank-1 intervention's direction also runs as a DII (``<name>_dir``).

Beyond the paper (``reliability=True``): at every site an oracle MLP probe is trained on the base train activations
to predict the targeted property (the task's label type, e.g. singular/plural), and each direction's intervened eval
vectors are scored by counterfactual completeness (Canby et al. 2024, eq. 1: the oracle's probability of the source's
class). The agreement templates vary no other typed property, so there is no non-targeted property and oracle
selectivity is NaN.
"""

from __future__ import annotations

import logging
import time
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cprobe.data.causalgym import Pair, Splits, TaskTemplate, control_pairs, label_token_ids, make_pair_splits, pair_items
from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError, DataError
from cprobe.extract import resolve_layers
from cprobe.interventions import INTERVENTIONS, apply, needs_goal
from cprobe.methods import build, fallback_direction, unit_directions
from cprobe.metrics.odds import erased_fraction, erasure, iia, log_odds_ratio, task_accuracy
from cprobe.metrics.reliability import completeness
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import dii
from cprobe.models.formatters import RegionFormatter
from cprobe.models.multisite import SitesForward, edited_pass, rowwise_dii
from cprobe.models.readouts import CandidateTokens
from cprobe.models.resume import at_last
from cprobe.models.sites import Batch, Site
from cprobe.progress import Progress, track
from cprobe.tasks.causalgym_settings import CAPABLE_ACCURACY, CONDITIONS, Config, MethodRun, method_runs, resolve_regions
from cprobe.tasks.sites import SiteFits

log = logging.getLogger("cprobe")
NAN = float("nan")

def oracle_probe(config: Mapping[str, Any], seed: int, device: str | None = None) -> Any:
    """A site's probe from its config (the oracle's, or the interventional probe's), with the job's seed and device;
    fitted through :class:`cprobe.tasks.sites.SiteFits` (the content-keyed, file-locked probe-fit cache)."""
    from cprobe.probes import PROBES

    return PROBES.build(config, seed=seed, device=device)


def is_capable(accuracy: float, unknown_labels: Sequence[str]) -> bool:
    """A task the model can do: un-intervened accuracy ≥ CAPABLE_ACCURACY and no label unknown to its tokenizer."""
    return accuracy >= CAPABLE_ACCURACY and not unknown_labels


def site_of(layer: int, region: int, stream: str) -> Site:
    """The site of (layer, region): the residual stream after block ``layer`` at the region's last token."""
    return Site(layer, f"region:{region}", stream)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- one task


@dataclass
class _Run:
    """What one method run at one site found and how it scored."""

    run: MethodRun
    causal: bool
    dirs: dict[str, list[Tensor | None]]  # per condition (shared runs: the same list)
    probe_acc: float = float("nan")
    degenerate: bool = False
    fit_s: float = 0.0
    eval_s: float = 0.0
    scored: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    edit: str = "dii"  # dii | vanilla (whole-vector swap) | counterfactual | nullifying (an intervention's own edit)
    edited: Tensor | None = None  # an intervention's edited eval states at the site (n_eval rows of ok_ev, d)


@dataclass
class _SitePlan:
    layer: int
    region: int
    site: Site
    ok_tr: Tensor
    ok_ev: Tensor
    oracle: Any = None
    oracle_acc: float = float("nan")
    runs: list[_Run] = field(default_factory=list)


def _intervene(run: MethodRun, fits: SiteFits, X_tr: Tensor, y_tr: Tensor, X_ev: Tensor, z_source: Tensor,
               config: Config, conditions: list[str], seed: int, site_seed: int, device: str | None, layer: int,
               region: int) -> list[_Run]:
    """An intervention at one site, fitted by :meth:`SiteFits.fit` on the base train states and labels (needs_probe:
    the site's interventional probe, ``causalgym.interventional_probe`` or the oracle's config with seed + 1), applied
    to the base eval states (counterfactual: z′ = the source's class); the edited states go into the eval run at the
    site (:func:`_score`). A fitted edit of one direction (exposes_direction) also runs as a DII, ``<label>_dir``."""
    cls = INTERVENTIONS.get(run.name)
    dev = device or X_tr.device
    t0 = time.perf_counter()
    a: Tensor | None = None
    degenerate = False
    # the edit's kind is the instance's (a direction intervention takes kind=nullifying), never the class default
    inter = build(run.name, run.params, seed, device, layer)
    try:
        if float(X_tr.std(0).max()) <= 1e-6 * (1.0 + float(X_tr.abs().max())):
            raise ValueError("the train activations at this site are all equal")
        with warnings.catch_warnings():  # e.g. INLP stopping early: the fit is still usable
            warnings.simplefilter("ignore", UserWarning)
            fits.fit(inter, X_tr.float().to(dev), y_tr.to(dev), {}, lambda: oracle_probe(
                config.interventional_probe or config.oracle_probe, seed + 1, device))
        edited = apply(inter, X_ev.float().to(dev), z_source.to(dev) if needs_goal(inter) else None).float().cpu()
        if cls.exposes_direction and config.intervention_directions:
            a = inter.edit_direction()
            a = None if a is None else (a / a.norm()).float().cpu()
    except (ValueError, IndexError, np.linalg.LinAlgError, DataError, ConfigError, torch.linalg.LinAlgError) as err:
        # as for the direction methods: activations that do not vary with the class give nothing to fit; the site
        # keeps its state (odds 0) and is flagged
        log.debug("%s at layer %d region %d: %s; no edit there", run.label, layer, region, err)
        edited, degenerate = X_ev.float().clone(), True
    fit_s = time.perf_counter() - t0
    out = [_Run(run, False, {c: [None] for c in conditions}, degenerate=degenerate, fit_s=fit_s, edit=inter.kind,
                edited=edited)]
    if cls.exposes_direction and config.intervention_directions:
        if a is None and degenerate:
            a = fallback_direction(X_tr.shape[-1], site_seed)
        if a is None:
            log.info("%s at layer %d region %d edits more than one direction: its %s_dir row there is NaN",
                     run.label, layer, region, run.label)
        out.append(_Run(MethodRun(f"{run.label}_dir", run.name, run.params, intervention=True), False,
                        {c: [] if a is None else [a] for c in conditions}, degenerate=degenerate))
    return out


def _label_ids(adapter: ModelAdapter, template: TaskTemplate, by_cond: Mapping[str, Splits]
               ) -> tuple[dict[str, int], list[str]]:
    """Every label's token id (a multi-token label's first, as the reference) and the task's labels unknown to the
    tokenizer (the task is then not capable), each logged."""
    ids, multi = label_token_ids(adapter.tok, [lab for sp in by_cond.values() for p in [*sp.train, *sp.eval]
                                               for lab in (p.base_label, p.source_label)])
    task = {lab for p in [*by_cond["task"].train, *by_cond["task"].eval] for lab in (p.base_label, p.source_label)}
    unk = getattr(adapter.tok, "unk_token_id", None)
    unknown_all = sorted(lab for lab, i in ids.items() if unk is not None and i == unk)
    unknown = [lab for lab in unknown_all if lab in task]
    unknown_control = [lab for lab in unknown_all if lab not in task]
    if unknown_control:
        log.warning("%s: control label(s) %s are unknown to %s's tokenizer; the control task (selectivity) is "
                    "vacuous there", template.name, unknown_control, adapter.name)
    if unknown:
        log.warning("%s: label(s) %s are unknown to %s's tokenizer; the task is marked not capable",
                    template.name, unknown, adapter.name)
    if multi:
        log.info("%s: label(s) %s are several tokens; their first token is scored (as the reference)",
                 template.name, list(multi))
    return ids, unknown


def _fit_site(plan: _SitePlan, runs: list[MethodRun], X_tr: Tensor, y_tr: Tensor, X_ev: Tensor, y_ev: Tensor,
              z_source: Tensor, config: Config, conditions: list[str], seed: int, site_seed: int,
              device: str | None, probe_cache: Path | None, cost: dict[str, float]) -> None:
    """The site's oracle (``reliability``) and every method's direction or intervention, into ``plan`` (causal ones
    later: :func:`_train_causal`). The site's :class:`SiteFits` memo trains its interventional probe once."""
    fits = SiteFits(probe_cache, memo={})
    if config.reliability and len(torch.unique(y_tr)) == 2:
        t_or = time.perf_counter()
        plan.oracle = fits.probe("oracle", {}, oracle_probe(config.oracle_probe, seed, device), X_tr.float(), y_tr)
        plan.oracle_acc = plan.oracle.score(X_ev, y_ev)
        cost["oracle"] = cost.get("oracle", 0.0) + time.perf_counter() - t_or
    layer, region = plan.layer, plan.region
    for run in runs:
        if run.intervention:
            if len(torch.unique(y_tr)) == 2:  # every intervention is fitted on the two classes
                plan.runs.extend(_intervene(run, fits, X_tr, y_tr, X_ev, z_source, config, conditions, seed,
                                            site_seed, device, layer, region))
            continue
        cls = DIRECTIONS.get(run.name)
        t_fit = time.perf_counter()
        if cls.causal:  # trained through the model, on each condition's labels (below, many sites at once)
            plan.runs.append(_Run(run, True, {c: [None] for c in conditions}))
        elif cls.whole_vector:  # the whole-vector swap: no direction
            plan.runs.append(_Run(run, False, {c: [None] for c in conditions}, edit="vanilla"))
        elif cls.chance_baseline:  # several independent draws per site, averaged
            draws = unit_directions(run.name, run.params, X_tr, y_tr, seed, config.random_draws, site_seed)
            plan.runs.append(_Run(run, False, {c: draws for c in conditions}, fit_s=time.perf_counter() - t_fit))
        elif not cls.supervised or len(torch.unique(y_tr)) == 2:
            probe_acc, degenerate = float("nan"), False
            try:
                if float(X_tr.std(0).max()) <= 1e-6 * (1.0 + float(X_tr.abs().max())):
                    raise ValueError("the train activations at this site are all equal")
                with warnings.catch_warnings():  # LDA on near-collinear activations: harmless
                    warnings.simplefilter("ignore", RuntimeWarning)
                    d = build(run.name, run.params, seed).fit(X_tr, y_tr)
                if hasattr(d, "score"):
                    probe_acc = d.score(X_ev, y_ev)
                a = d.a
            except (ValueError, IndexError, np.linalg.LinAlgError) as err:
                # Activations that do not vary with the class (e.g. embeddings of a shared word) give no
                # direction; the DII there has (almost) no effect along any direction, so score a random one and
                # flag the site.
                log.debug("%s at layer %d region %d: %s; using a random direction", run.name, layer, region, err)
                a, degenerate = fallback_direction(X_tr.shape[-1], site_seed), True
            plan.runs.append(_Run(run, False, {c: [a] for c in conditions}, probe_acc, degenerate,
                                  fit_s=time.perf_counter() - t_fit))


def run_gym_task(adapter: ModelAdapter, template: TaskTemplate, config: Config, layers: Any = "blocks", *,
                 seed: int = 0, device: str | None = None, progress: bool = False,
                 timings: dict[str, float] | None = None, splits: Splits | None = None,
                 directions: dict[str, Tensor] | None = None, probe_cache: Path | None = None) -> list[dict[str, Any]]:
    """Long-format rows: one per (condition, method, layer, region) with AvgOdds, IIA and costs.

    ``config`` is resolved for the model (:meth:`Config.resolve`); ``layers`` and ``seed`` are the job's, ``device``
    the job's device for the oracle probes (None: where the activations are). ``splits`` replaces the sampled
    train/eval pairs (tests use it, e.g. source = base). ``directions``, when given, receives every learned unit
    direction, keyed ``<task>/<condition>/<method>/L<layer>/R<region>`` (the ``random`` draws stacked (k, d); causal
    methods per condition, the others under ``task``). ``probe_cache``: the probe-fit cache directory the oracle and
    interventional probes fit through (None: fitted here).
    """
    if adapter.kind != "causal":
        raise ConfigError(f"CausalGym needs a causal LM; model {adapter.name!r} is {adapter.kind!r}")
    if len(template.types) != 2:
        raise DataError(f"CausalGym task {template.name!r} is not binary; the methods need two classes")
    if not config.resolved:
        config = config.resolve({"name": adapter.name})
    t_start = time.perf_counter()
    splits = splits or make_pair_splits(template, config.n_train, config.n_eval, config.train_seed, config.eval_seed)
    conditions = list(CONDITIONS if config.control else CONDITIONS[:1])
    # Control (§5.2): the same inputs scored on " dog"/" give" (only the label ids change).
    by_cond = {"task": splits}
    if config.control:
        by_cond["control"] = Splits(control_pairs(splits.train), control_pairs(splits.eval))
    ids, unknown = _label_ids(adapter, template, by_cond)

    def label_ids(pairs: Sequence[Pair]) -> tuple[Tensor, Tensor]:
        return (torch.tensor([ids[p.base_label] for p in pairs]), torch.tensor([ids[p.source_label] for p in pairs]))

    tr_base, tr_src = pair_items(splits.train)
    ev_base, ev_src = pair_items(splits.eval)
    # One candidate readout over every condition: columns (y_b, y_s) per condition.
    ev_ids = torch.stack([t for c in conditions for t in label_ids(by_cond[c].eval)], 1)
    tr_target = {c: label_ids(by_cond[c].train)[1] for c in conditions}
    tr_class = torch.tensor([p.base_class for p in splits.train])
    ev_class = torch.tensor([p.base_class for p in splits.eval])
    ev_src_class = torch.tensor([p.source_class for p in splits.eval])
    fmt = RegionFormatter()
    regions = resolve_regions(config.regions, template)
    sites = {(l, r): site_of(l, r, config.stream) for l in resolve_layers(layers, adapter.n_layers) for r in regions}

    t0 = time.perf_counter()
    read = list(sites.values())
    base_tr = adapter.map(tr_base, fmt, read=read).acts
    src_tr = adapter.map(tr_src, fmt, read=read).acts
    base_ev_out = adapter.map(ev_base, fmt, read=read, readout=CandidateTokens(ev_ids))
    base_ev, clean_scores = base_ev_out.acts, base_ev_out.scores
    src_ev = adapter.map(ev_src, fmt, read=read).acts
    read_s = time.perf_counter() - t0
    clean_by = {c: (clean_scores[:, 2 * k], clean_scores[:, 2 * k + 1]) for k, c in enumerate(conditions)}
    acc = task_accuracy(*clean_by["task"])
    capable = is_capable(acc, unknown)
    log.info("%s on %s: task accuracy %.3f (%d eval items)%s", adapter.name, template.name, acc, len(ev_base),
             "" if capable else " — not capable")
    # Tokenized once: DAS trains on sub-batches of the train bases, the DIIs are scored on the eval bases.
    train_batch = fmt(tr_base, adapter, torch.arange(len(tr_base)))
    eval_batch = fmt(ev_base, adapter, torch.arange(len(ev_base)))
    pos_tr = (train_batch.positions, fmt(tr_src, adapter, torch.arange(len(tr_src))).positions)
    pos_ev = (eval_batch.positions, fmt(ev_src, adapter, torch.arange(len(ev_src))).positions)

    def present(base_src: tuple[dict[str, Tensor], dict[str, Tensor]], region: int) -> Tensor:
        """Rows whose region has a token in both the base and the source."""
        return (base_src[0][f"region:{region}"] >= 0) & (base_src[1][f"region:{region}"] >= 0)

    cost: dict[str, float] = {}
    runs = method_runs(config)
    task_seed = 10_000_019 * (zlib.crc32(template.name.encode()) % 1000)  # independent draws per task

    # 1. Per site: the oracle and every direction fitted from the site's activations.
    plans: list[_SitePlan] = []
    for (layer, region), site in track(sites.items(), f"{template.name}: fit at each site", progress):
        ok_tr = present(pos_tr, region).nonzero().squeeze(1)
        ok_ev = present(pos_ev, region).nonzero().squeeze(1)
        if len(ok_tr) == 0 or len(ok_ev) == 0:
            continue  # the region is empty on one side of every pair: not a site
        plans.append(_SitePlan(layer, region, site, ok_tr, ok_ev))
        _fit_site(plans[-1], runs, base_tr[site][ok_tr], tr_class[ok_tr], base_ev[site][ok_ev], ev_class[ok_ev],
                  ev_src_class[ok_ev], config, conditions, seed, seed * 100_003 + 1000 * layer + region + task_seed,
                  device, probe_cache, cost)

    # 2. Causal directions: every (site, condition) is its own problem; those sharing their train rows train together.
    _train_causal(adapter, plans, conditions, train_batch, src_tr, tr_target, config, seed, progress, template.name)

    # 3. Score every (site, direction) on the eval set, many per forward.
    t_ev = time.perf_counter()
    _score(adapter, plans, conditions, eval_batch, base_ev, src_ev, ev_ids, clean_by, ev_src_class, progress,
           template.name, read_layers=config.read_layers, stream=config.stream)
    rows = _rows(template, config, plans, conditions, time.perf_counter() - t_ev, cost, directions,
                 {"task_accuracy": acc, "capable": capable, "unknown_labels": " ".join(unknown)})
    if timings is not None:
        timings.update({f"{template.name}/read_s": read_s, **{f"{template.name}/{m}_s": s for m, s in cost.items()},
                        f"{template.name}/total_s": time.perf_counter() - t_start})
    return rows


def _rows(template: TaskTemplate, config: Config, plans: list[_SitePlan], conditions: list[str], eval_s: float,
          cost: dict[str, float], directions: dict[str, Tensor] | None, task: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (condition, method run, site): mean odds, IIA, erasure, completeness over the run's directions and
    the ``task``'s columns; each run's eval time share into ``cost``, every learned direction into ``directions``."""
    n_scored = sum(len(r.dirs[c]) for p in plans for r in p.runs for c in (conditions if r.causal else conditions[:1]))
    rows: list[dict[str, Any]] = []
    read_layers_of = sorted({p.layer for p in plans})
    for plan in plans:
        for r in plan.runs:
            label = r.run.label
            n_dirs = sum(len(r.dirs[c]) for c in (conditions if r.causal else conditions[:1]))
            r.eval_s = eval_s * n_dirs / max(1, n_scored)
            cost[label] = cost.get(label, 0.0) + r.fit_s + r.eval_s
            for c in (conditions if r.causal else conditions[:1]) if directions is not None else ():
                got = [x.detach().float().cpu() for x in r.dirs[c] if x is not None]
                if got:
                    key = f"{template.name}/{c}/{label}/L{plan.layer}/R{plan.region}"
                    directions[key] = torch.stack(got).squeeze(0)
            for c in conditions:
                res = r.scored[c]

                def mean(key: str) -> float:  # over the run's directions (the random draws); NaN where it has none
                    vals = [float(x[key].mean()) if isinstance(x[key], Tensor) else x[key] for x in res]
                    return float(np.mean(vals)) if vals else NAN

                row = {
                    "cg_task": template.name, "condition": c, "method": label, "layer": plan.layer,
                    "paper_layer": plan.layer - 1, "stream": config.stream,
                    "region": template.region_names[plan.region], "region_idx": plan.region, "edit": r.edit,
                    "odds": mean("odds"),
                    "odds_draw_sd": float(np.std([float(x["odds"].mean()) for x in res])) if len(res) > 1 else NAN,
                    "iia": mean("iia"), "erasure": mean("erasure"), "erased_fraction": mean("erased_fraction"),
                    "probe_accuracy": r.probe_acc, "probe_lam": r.run.params.get("lam", NAN), **task,
                    "oracle_accuracy": plan.oracle_acc, "completeness": mean("completeness"),
                    "oracle_selectivity": NAN,  # no non-targeted property in the templates
                    "n_train": len(plan.ok_tr), "n_eval": len(plan.ok_ev), "degenerate": r.degenerate,
                    "n_directions": len(res), "fit_s": r.fit_s / len(conditions), "eval_s": r.eval_s / len(conditions),
                }
                if config.read_layers:  # the oracle at l' >= layer reading the pass edited here (NaN below layer)
                    row.update({f"completeness_l{lr}": float(np.mean([x["read"].get(lr, np.nan) for x in res]))
                                if res else NAN for lr in read_layers_of})
                rows.append(row)
    return rows


def _train_causal(adapter: ModelAdapter, plans: list[_SitePlan], conditions: list[str], train_batch: Batch,
                  src_tr: dict[Site, Tensor], tr_target: dict[str, Tensor], config: Config, seed: int,
                  progress: bool, name: str) -> None:
    """Train every causal direction (one per site, run and condition), in batched passes of sites that share their
    train rows and settings; the directions land in each run's ``dirs``."""
    jobs: dict[tuple[str, bytes], list[tuple[_SitePlan, _Run, str]]] = {}
    for plan in plans:
        for r in plan.runs:
            if r.causal:
                for c in conditions:
                    jobs.setdefault((r.run.label, plan.ok_tr.numpy().tobytes()), []).append((plan, r, c))
    if not jobs:
        return
    per_pass = config.sites_per_pass or max(1, adapter.batch_size // int(config.das.batch_size or 1))
    # the train items' clean states at each pass's lowest layer: every step of the pass resumes there
    lows = {min(p.site.layer for p, _, _ in g[s:s + per_pass])
            for g in jobs.values() for s in range(0, len(g), per_pass)}
    # a pass whose sites are all at its rows' last token runs that token alone above its layer (models/resume.py)
    kv = adapter.can_kv_resume and any(
        at_last(train_batch.select(g[s][0].ok_tr), [p.site for p, _, _ in g[s:s + per_pass]])
        for g in jobs.values() for s in range(0, len(g), per_pass))
    clean = adapter.clean_states(train_batch, sorted(lows), kv=kv)
    total = sum(len(j) for j in jobs.values())
    bar = Progress(f"{name}: DAS", total=total, bars=progress)
    for group in jobs.values():
        for start in range(0, len(group), per_pass):
            part = group[start:start + per_pass]
            plan0, run0, _ = part[0]
            t0 = time.perf_counter()
            das = build(run0.run.name, run0.run.params, seed)
            rows = plan0.ok_tr
            forward = SitesForward(adapter, train_batch, rows, [p.site for p, _, _ in part], das.windows(len(rows)),
                                   clean)
            h_source = torch.stack([src_tr[p.site][rows] for p, _, _ in part]).to(adapter.device)
            target = torch.stack([tr_target[c][rows] for _, _, c in part])
            found = das.fit_many(forward, h_source, target).cpu()
            seconds = time.perf_counter() - t0
            for k, (_, r, c) in enumerate(part):
                r.dirs[c] = [found[k]]
                r.fit_s += seconds / len(part)
            bar.update(len(part))
    bar.close()


def _score(adapter: ModelAdapter, plans: list[_SitePlan], conditions: list[str], eval_batch: Batch,
           base_ev: dict[Site, Tensor], src_ev: dict[Site, Tensor], ev_ids: Tensor,
           clean_by: dict[str, tuple[Tensor, Tensor]], ev_src_class: Tensor, progress: bool, name: str,
           read_layers: bool = False, stream: str = "block") -> None:
    """Every (site, run, direction or edit) scored on its eval rows, into each run's ``scored``: rows of (eval item,
    its site's edit) in the sites engine's pass (:func:`edited_pass`; a DII's row carries its source vector and
    direction, an intervention's its edited state), this study's callback scoring the log odds-ratio, IIA, an
    eraser's erasure and, with ``read_layers``, the clean oracle of (l′ ≥ l, region) on the states read there."""
    # One job per edit to score: the conditions it is scored under (a shared direction: all at once).
    jobs: list[tuple[_SitePlan, _Run, Tensor | None, list[str]]] = []
    for plan in plans:
        for r in plan.runs:
            r.scored = {c: [] for c in conditions}
            for c in (conditions if r.causal else conditions[:1]):
                for a in r.dirs[c]:
                    jobs.append((plan, r, a, [c] if r.causal else conditions))
    if not jobs:
        return
    site_list = list(dict.fromkeys(p.site for p, _, _, _ in jobs))
    d = adapter.hidden_size
    job_site = torch.tensor([site_list.index(p.site) for p, _, _, _ in jobs])
    job_dir = torch.stack([torch.zeros(d) if a is None else a.detach().float().cpu() for _, _, a, _ in jobs])
    job_whole = torch.tensor([a is None for _, _, a, _ in jobs])
    job_of_row = torch.cat([torch.full((len(p.ok_ev),), j) for j, (p, _, _, _) in enumerate(jobs)])
    item_of_row = torch.cat([p.ok_ev for p, _, _, _ in jobs])
    # an intervention's rows take its edited states instead of the source's (row_edit: index into edit_store, or -1)
    edited = [r.edited for _, r, _, _ in jobs if r.edited is not None]
    edit_store = torch.cat(edited) if edited else torch.zeros(0, d)
    has_edit = torch.cat([torch.full((len(p.ok_ev),), r.edited is not None) for p, r, _, _ in jobs])
    row_edit_t = torch.where(has_edit, has_edit.cumsum(0) - 1, -1)
    length = eval_batch.attention_mask.sum(1)
    # rows edited at their item's last token (the last region of a causal LM's prefix) get passes of their own, which
    # run that token alone above the edited layer over the prefix's clean key/value cache (models/resume.py); reads
    # at every region (read_layers) are not last-token passes
    table = torch.stack([eval_batch.positions[s.position] for s in site_list])  # (sites, N)
    last_row = (table[job_site[job_of_row], item_of_row] == length[item_of_row] - 1) & (not read_layers) \
        & adapter.can_kv_resume
    order = torch.argsort(-(length[item_of_row] + last_row * (int(length.max()) + 1)), stable=True)  # by length
    src_all = torch.stack([src_ev[s] for s in site_list])  # (sites, N, d)
    scores = torch.zeros(len(item_of_row), ev_ids.shape[1])
    # downstream reads: per row, the oracle's completeness at every layer l' >= its edited layer (NaN elsewhere)
    by_site = {(p.layer, p.region): p for p in plans}
    layers = sorted({p.layer for p in plans})
    readers = [(k, by_site[lr, rg]) for k, lr in enumerate(layers) for rg in sorted({p.region for p in plans})
               if (lr, rg) in by_site and by_site[lr, rg].oracle is not None] if read_layers else []
    read_sites = [site_of(p.layer, p.region, stream) for _, p in readers]
    read_comp = torch.full((len(item_of_row), len(layers)), float("nan"))
    row_layer = torch.tensor([p.layer for p, _, _, _ in jobs])[job_of_row]
    row_region = torch.tensor([p.region for p, _, _, _ in jobs])[job_of_row]
    row_null = torch.tensor([r.edit == "nullifying" for _, r, _, _ in jobs])[job_of_row]
    clean = adapter.clean_states(eval_batch, [s.layer for s in site_list],  # each pass resumes at its lowest layer
                                 kv=bool(last_row.any()))
    dev = adapter.device

    def edits(rows: Tensor, _: Batch, at: list[Site]) -> dict[Site, Any]:
        jr, items = job_of_row[rows], item_of_row[rows]
        source = src_all[job_site[jr], items]
        mine = row_edit_t[rows]
        if bool((mine >= 0).any()):
            source[mine >= 0] = edit_store[mine[mine >= 0]]
        edit = rowwise_dii(source.to(dev), job_dir[jr].to(dev), job_whole[jr].to(dev))
        return {s: edit for s in at}

    def score(rows: Tensor, out: Any) -> None:
        items = item_of_row[rows]
        scores[rows] = out.scores.float().cpu()
        for (k, plan), s in zip(readers, read_sites):
            take = ((row_region[rows] == plan.region) & (row_layer[rows] <= plan.layer)).nonzero().squeeze(1)
            if len(take) == 0:
                continue
            p_hat = plan.oracle.predict_proba(out.acts[s][take.to(dev)].float()).float().cpu()
            read_comp[rows[take], k] = completeness(p_hat, ev_src_class[items[take]], row_null[rows][take])

    edited_pass(adapter, eval_batch, item_of_row, site_list, edits, score, row_site=job_site[job_of_row],
                read=read_sites, readout=lambda items: CandidateTokens(ev_ids[items]), clean=clean, order=order,
                desc=f"{name}: edited passes", progress=progress)
    _keep_scores(jobs, scores, read_comp if readers else None, layers, base_ev, src_ev, clean_by, conditions,
                 ev_src_class)


def _keep_scores(jobs: list[tuple[_SitePlan, _Run, Tensor | None, list[str]]], scores: Tensor,
                 read_comp: Tensor | None, layers: list[int], base_ev: dict[Site, Tensor], src_ev: dict[Site, Tensor],
                 clean_by: dict[str, tuple[Tensor, Tensor]], conditions: list[str], ev_src_class: Tensor) -> None:
    """Each job's rows of the edited pass (``scores``; ``read_comp``: read layers' completeness) as its scores under
    its conditions, into its run's ``scored``, with the oracle's completeness at the site itself."""
    first = 0
    for plan, r, a, conds in jobs:
        n = len(plan.ok_ev)
        out, first = scores[first:first + n], first + n
        comp = float("nan")
        if plan.oracle is not None:
            X_ev, hs_ev = base_ev[plan.site][plan.ok_ev], src_ev[plan.site][plan.ok_ev]
            h_new = r.edited if r.edited is not None else hs_ev if a is None else dii(
                X_ev, hs_ev, a.to(X_ev.device, torch.float32))
            comp = float(completeness(plan.oracle.predict_proba(h_new), ev_src_class[plan.ok_ev],
                                      r.edit == "nullifying").mean())
        by_layer = {} if read_comp is None else {lr: float(read_comp[first - n:first, k].mean())
                                                 for k, lr in enumerate(layers) if lr >= plan.layer}
        null = r.edit == "nullifying"
        for k, c in enumerate(conditions):
            if c in conds:
                cb, cs = clean_by[c][0][plan.ok_ev], clean_by[c][1][plan.ok_ev]
                ob, os_ = out[:, 2 * k], out[:, 2 * k + 1]
                r.scored[c].append({
                    "odds": log_odds_ratio(cb, cs, ob, os_), "iia": iia(ob, os_), "completeness": comp,
                    "erasure": float(erasure(cb, cs, ob, os_).mean()) if null else float("nan"),
                    "erased_fraction": erased_fraction(cb, cs, ob, os_) if null else float("nan"),
                    "read": by_layer})
