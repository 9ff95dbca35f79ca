"""Run one CausalGym task on one model: read site activations, find directions, score 1-D DIIs.

Sites are (layer l, region r): the residual stream after block l (cprobe's layer convention: 0 =
embeddings, l = output of block l; the paper labels the same blocks 0..L−1, column ``paper_layer``)
at the last token of region r. At the last layer ``stream="block"`` (default) reads the raw block
output, as the reference (pyvene ``block_output``) does, and ``"resid"`` the state after the final
norm that HF reports. Everything goes through the model's one entry point
(:meth:`ModelAdapter.map` / :meth:`~ModelAdapter.run`): the pairs become region-aligned
:class:`~cprobe.data.items.TextItem` lists tokenized by :class:`RegionFormatter`, label scores are a
:class:`CandidateTokens` readout, and the DII is an :class:`Interchange` edit. One pass per input set
reads every site; each (site, direction) is then one batched pass over the eval set, shared by the task
and the control labels (inputs are the same; only the scored label ids differ). DAS is trained per site
and per condition (task / control), as in the reference.

Beyond the paper (``reliability=True``): at every site an oracle MLP probe is trained on the base
train activations to predict the targeted property (the task's label type, e.g. singular/plural),
and each direction's intervened eval vectors are scored by counterfactual completeness (Canby et
al. 2024, eq. 1: the oracle's probability of the source's class). The agreement templates vary no
other typed property, so there is no non-targeted property and oracle selectivity is NaN.
"""

from __future__ import annotations

import logging
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from cprobe.data.causalgym import Pair, Splits, TaskTemplate, control_pairs, label_token_ids, make_pair_splits, pair_items
from cprobe.data.items import TextItem
from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError, DataError
from cprobe.extract import resolve_layers
from cprobe.metrics.odds import iia, log_odds_ratio, task_accuracy
from cprobe.metrics.reliability import counterfactual_completeness
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Interchange, dii
from cprobe.models.formatters import RegionFormatter
from cprobe.models.readouts import CandidateTokens, Vocabulary
from cprobe.models.sites import STREAMS, Batch, Site

log = logging.getLogger("cprobe")

METHODS = ("das", "probe", "mean", "lda", "pca", "kmeans", "random")
"""The paper's seven direction methods; ``vanilla`` (whole-vector swap) may be added."""
CONDITIONS = ("task", "control")
CAPABLE_ACCURACY = 0.9
"""A task the model can do: un-intervened accuracy at least this and every label a known token."""
DEFAULT_ORACLE = {"name": "mlp", "n_layers": [1], "widths": [256], "lrs": [1e-3, 1e-2], "epochs": 8}
"""A small grid for the per-site oracle (cheap: 400 train vectors per site)."""


@dataclass(kw_only=True)
class GymSettings:
    """What to run for one task: the ``causalgym`` config node resolved against the model (per-model λ and DAS
    budget) by :func:`cprobe.tasks.causalgym.settings_from_cfg`. No defaults here: they live in one place, the
    task's :class:`cprobe.tasks.causalgym.Config` (and the experiment YAML, which a test keeps equal to it)."""

    methods: Sequence[str]
    layers: Any  # 'blocks' = 1..L (the paper's layers), 'all' = 0..L, 'last', or ints
    regions: Any  # 'label' = from the first label region on, 'all', or names / indices
    n_train: int
    n_eval: int
    train_seed: int
    eval_seed: int
    control: bool
    prepend_bos: bool
    probe_lams: Sequence[float]  # one probe per λ (C = 1/λ); two = the paper's Probe⁰ / Probe¹
    stream: str  # the last layer: the raw block output (the reference's) or "resid" (after the final norm)
    das: dict[str, Any]
    seed: int
    random_draws: int  # random: mean over this many independent directions per site (paper: 1)
    reliability: bool  # oracle-probe completeness per direction (beyond the paper)
    oracle_probe: dict[str, Any]

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m != "vanilla" and m not in DIRECTIONS]
        if bad or not self.methods:
            raise ConfigError(f"unknown causalgym method(s) {bad}; choose from {[*sorted(DIRECTIONS), 'vanilla']}")
        if self.n_train < 1 or self.n_eval < 1:
            raise ConfigError("causalgym.n_train and causalgym.n_eval must be >= 1")
        if self.random_draws < 1:
            raise ConfigError("causalgym.random_draws must be >= 1")
        if self.stream not in STREAMS:
            raise ConfigError(f"unknown causalgym.stream {self.stream!r}; choose from {list(STREAMS)}")
        for m in self.methods:
            if m != "vanilla" and DIRECTIONS.get(m).causal:  # the `das` settings configure the causal method(s)
                try:
                    DIRECTIONS.build({"name": m, **self.das}, seed=self.seed)
                except ConfigError as e:
                    raise ConfigError(f"bad causalgym.das: {e}") from None
        self.probe_lams = tuple(float(x) for x in self.probe_lams)
        if not self.probe_lams or min(self.probe_lams) <= 0:
            raise ConfigError(f"causalgym.probe_lam must be one λ > 0 or a list of them, got {list(self.probe_lams)}")


def resolve_regions(spec: Any, template: TaskTemplate) -> list[int]:
    """Region indices to intervene at: by default the paper's (first label region … last)."""
    names = template.region_names
    if spec is None or spec == "label":
        return list(range(template.first_label_region, len(names)))
    if spec == "all":
        return list(range(len(names)))
    out = []
    for r in [spec] if isinstance(spec, (int, str)) else spec:
        if isinstance(r, int) and -len(names) <= r < len(names):
            out.append(r % len(names))
        elif isinstance(r, str) and r in names:
            out.extend(i for i, n in enumerate(names) if n == r)
        else:
            raise ConfigError(f"causalgym.regions: {r!r} is not a region of {template.name}; it has {list(names)}")
    return sorted(set(out))


# ---------------------------------------------------------------------------------- forward passes


def site_of(layer: int, region: int, stream: str) -> Site:
    """The site of (layer, region): the residual stream after block ``layer`` at the region's last token."""
    return Site(layer, f"region:{region}", stream)  # type: ignore[arg-type]


def das_forward(adapter: ModelAdapter, train: Batch, rows: Tensor, site: Site) -> Callable:
    """``forward(edit, batch_idx)`` for :class:`cprobe.directions.das.DAS` over the train rows ``rows`` of
    the tokenized batch ``train``: the edited base rows' next-token log-probs (differentiable in the edit)."""
    vocab = Vocabulary()

    def forward(edit, idx: Tensor) -> Tensor:
        return adapter.run(train.select(rows[idx.cpu()]), edits={site: edit}, readout=vocab, grad=True).scores
    return forward


def is_capable(accuracy: float, unknown_labels: Sequence[str]) -> bool:
    """A task the model can do: un-intervened accuracy ≥ CAPABLE_ACCURACY and no label unknown to its tokenizer."""
    return accuracy >= CAPABLE_ACCURACY and not unknown_labels


def _fallback_direction(X: Tensor, seed: int) -> Tensor:
    """A chance-level direction for a site where a method finds none (the registry's first chance baseline)."""
    name = next(n for n in DIRECTIONS.names() if DIRECTIONS.get(n).chance_baseline)
    return build_direction(name, {}, seed).fit(X).a


def _unknown_labels(tok: Any, ids: dict[str, int]) -> list[str]:
    unk = getattr(tok, "unk_token_id", None)
    return sorted(lab for lab, i in ids.items() if unk is not None and i == unk)


def fit_oracle(X: Tensor, y: Tensor, settings: GymSettings):
    """The site's oracle probe for the targeted property (the base class), from ``settings.oracle_probe``."""
    from cprobe.probes import build_probe

    return build_probe({**settings.oracle_probe, "seed": settings.seed}).fit(X.float(), y)


def method_runs(settings: GymSettings) -> list[tuple[str, str, dict[str, Any]]]:
    """(row label, direction name, direction config) per method run; ``probe`` with two λs (the paper's
    Probe⁰ / Probe¹ for models above 70m) runs twice, as ``probe0`` and ``probe1``."""
    out = []
    for method in settings.methods:
        if method == "vanilla":
            out.append((method, method, {}))
        elif method == "probe" and len(settings.probe_lams) > 1:
            out.extend((f"probe{k}", "probe", {"lam": lam}) for k, lam in enumerate(settings.probe_lams))
        elif method == "probe":
            out.append(("probe", "probe", {"lam": settings.probe_lams[0]}))
        elif DIRECTIONS.get(method).causal:
            out.append((method, method, dict(settings.das)))
        else:
            out.append((method, method, {}))
    return out


def build_direction(name: str, params: dict[str, Any], seed: int):
    """One direction method from the registry's factory (``seed`` reaches constructors that take one)."""
    return DIRECTIONS.build({"name": name, **params}, seed=seed)


def run_gym_task(adapter: ModelAdapter, template: TaskTemplate, settings: GymSettings,
                 progress: bool = False, timings: dict[str, float] | None = None,
                 splits: Splits | None = None, directions: dict[str, Tensor] | None = None) -> list[dict[str, Any]]:
    """Long-format rows: one per (condition, method, layer, region) with AvgOdds, IIA and costs.

    ``splits`` replaces the sampled train/eval pairs (tests use it, e.g. source = base). ``directions``,
    when given, receives every learned unit direction, keyed ``<task>/<condition>/<method>/L<layer>/R<region>``
    (the ``random`` draws stacked (k, d); DAS per condition, the others under ``task``).
    """
    if adapter.kind != "causal":
        raise ConfigError(f"CausalGym needs a causal LM; model {adapter.name!r} is {adapter.kind!r}")
    if len(template.types) != 2:
        raise DataError(f"CausalGym task {template.name!r} is not binary; the methods need two classes")
    t_start = time.perf_counter()
    splits = splits or make_pair_splits(template, settings.n_train, settings.n_eval, settings.train_seed, settings.eval_seed)
    conditions = list(CONDITIONS if settings.control else CONDITIONS[:1])
    # Control (§5.2): the same inputs scored on " dog"/" give" (only the label ids change).
    by_cond = {"task": splits}
    if settings.control:
        by_cond["control"] = Splits(control_pairs(splits.train), control_pairs(splits.eval))
    ids, multi = label_token_ids(adapter.tok, [lab for sp in by_cond.values() for p in [*sp.train, *sp.eval]
                                               for lab in (p.base_label, p.source_label)])
    task_labels = {lab for p in [*splits.train, *splits.eval] for lab in (p.base_label, p.source_label)}
    unknown = _unknown_labels(adapter.tok, {lab: i for lab, i in ids.items() if lab in task_labels})
    unknown_control = _unknown_labels(adapter.tok, {lab: i for lab, i in ids.items() if lab not in task_labels})
    if unknown_control:
        log.warning("%s: control label(s) %s are unknown to %s's tokenizer; the control task (selectivity) is "
                    "vacuous there", template.name, unknown_control, adapter.name)
    if unknown:
        log.warning("%s: label(s) %s are unknown to %s's tokenizer; the task is marked not capable",
                    template.name, unknown, adapter.name)
    if multi:
        log.info("%s: label(s) %s are several tokens; their first token is scored (as the reference)",
                 template.name, list(multi))

    def label_ids(pairs: Sequence[Pair]) -> tuple[Tensor, Tensor]:
        return (torch.tensor([ids[p.base_label] for p in pairs]), torch.tensor([ids[p.source_label] for p in pairs]))

    tr_base, tr_src = pair_items(splits.train)
    ev_base, ev_src = pair_items(splits.eval)
    # One candidate readout over every condition: columns (y_b, y_s) per condition.
    cols = [t for c in conditions for t in label_ids(by_cond[c].eval)]
    ev_ids = torch.stack(cols, 1)
    tr_target = {c: label_ids(by_cond[c].train)[1] for c in conditions}
    tr_class = torch.tensor([p.base_class for p in splits.train])
    ev_class = torch.tensor([p.base_class for p in splits.eval])
    ev_src_class = torch.tensor([p.source_class for p in splits.eval])
    fmt = RegionFormatter(prepend_bos=settings.prepend_bos)
    layers = resolve_layers(settings.layers, adapter.n_layers)
    regions = resolve_regions(settings.regions, template)
    sites = {(l, r): site_of(l, r, settings.stream) for l in layers for r in regions}

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
    # Tokenized once (DAS trains on sub-batches of it); a region with no token of its own is not a site.
    train_batch = fmt(tr_base, adapter, torch.arange(len(tr_base)))

    def positions(items: Sequence[TextItem]) -> dict[str, Tensor]:
        return fmt(items, adapter, torch.arange(len(items))).positions

    pos_tr = (train_batch.positions, positions(tr_src))
    pos_ev = (positions(ev_base), positions(ev_src))

    def present(base_src: tuple[dict[str, Tensor], dict[str, Tensor]], region: int) -> Tensor:
        """Rows whose region has a token in both the base and the source."""
        return (base_src[0][f"region:{region}"] >= 0) & (base_src[1][f"region:{region}"] >= 0)

    cost: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    runs = method_runs(settings)
    task_seed = 10_000_019 * (zlib.crc32(template.name.encode()) % 1000)  # independent draws per task
    bar = tqdm(list(sites), desc=template.name, disable=not progress or None, leave=False)
    for layer, region in bar:
        site = sites[(layer, region)]
        ok_tr = present(pos_tr, region).nonzero().squeeze(1)
        ok_ev = present(pos_ev, region).nonzero().squeeze(1)
        if len(ok_tr) == 0 or len(ok_ev) == 0:
            continue  # the region is empty on one side of every pair: not a site
        X_tr, y_tr = base_tr[site][ok_tr], tr_class[ok_tr]
        X_ev, y_ev = base_ev[site][ok_ev], ev_class[ok_ev]
        hs_ev = src_ev[site][ok_ev]
        ev_items = [ev_base[i] for i in ok_ev.tolist()]
        readout = CandidateTokens(ev_ids[ok_ev])
        oracle, oracle_acc = None, float("nan")
        if settings.reliability and len(torch.unique(y_tr)) == 2:
            t_or = time.perf_counter()
            oracle = fit_oracle(X_tr, y_tr, settings)
            oracle_acc = oracle.score(X_ev, y_ev)
            cost["oracle"] = cost.get("oracle", 0.0) + time.perf_counter() - t_or
        for label, name, kwargs in runs:
            # One direction for both conditions, except DAS (trained on each condition's labels).
            # ``random`` with random_draws > 1 scores several independent directions and averages.
            dirs: dict[str, list[Tensor | None]] = {}
            probe_acc = float("nan")
            degenerate = False
            t_fit = time.perf_counter()
            site_seed = settings.seed * 100_003 + 1000 * layer + region + task_seed
            cls = None if name == "vanilla" else DIRECTIONS.get(name)
            if cls is None:  # the whole-vector swap: no direction
                dirs = {c: [None] for c in conditions}
            elif cls.causal:  # trained through the model, on each condition's labels
                for c in conditions:
                    das = build_direction(name, kwargs, settings.seed)
                    das.fit(das_forward(adapter, train_batch, ok_tr, site),
                            src_tr[site][ok_tr].to(adapter.device), tr_target[c][ok_tr])
                    dirs[c] = [das.a]
            elif cls.chance_baseline:
                draws = [build_direction(name, kwargs, site_seed + 7_919 * k).fit(X_tr).a
                         for k in range(settings.random_draws)]
                dirs = {c: draws for c in conditions}
            else:
                if cls.supervised and len(torch.unique(y_tr)) < 2:
                    continue
                try:
                    if float(X_tr.std(0).max()) <= 1e-6 * (1.0 + float(X_tr.abs().max())):
                        raise ValueError("the train activations at this site are all equal")
                    with warnings.catch_warnings():  # LDA on near-collinear activations: harmless
                        warnings.simplefilter("ignore", RuntimeWarning)
                        d = build_direction(name, kwargs, settings.seed).fit(X_tr, y_tr)
                    if hasattr(d, "score"):
                        probe_acc = d.score(X_ev, y_ev)
                    a = d.a
                except (ValueError, IndexError, np.linalg.LinAlgError) as err:
                    # Activations that do not vary with the class (e.g. embeddings of a shared word)
                    # give no direction; the DII there has (almost) no effect along any direction,
                    # so score a random one and flag the site.
                    log.debug("%s at layer %d region %d: %s; using a random direction", name, layer, region, err)
                    a, degenerate = _fallback_direction(X_tr, site_seed), True
                dirs = {c: [a] for c in conditions}
            fit_s = time.perf_counter() - t_fit
            causal = cls is not None and cls.causal
            if directions is not None:
                for c in (conditions if causal else conditions[:1]):
                    got = [x for x in dirs[c] if x is not None]
                    if got:
                        key = f"{template.name}/{c}/{label}/L{layer}/R{region}"
                        directions[key] = torch.stack([x.detach().float().cpu() for x in got]).squeeze(0)
            t_ev = time.perf_counter()
            # Per condition: a list (one per direction) of (per-item odds, IIA, per-item completeness).
            scored: dict[str, list[tuple[Tensor, float, float]]] = {c: [] for c in conditions}
            shared = not causal  # every condition uses the same directions: one forward each
            for c in conditions[:1] if shared else conditions:
                for a in dirs[c]:
                    out = adapter.map(ev_items, fmt, edits={site: Interchange(hs_ev, a)}, readout=readout).scores
                    comp = float("nan")
                    if oracle is not None:
                        h_new = hs_ev if a is None else dii(X_ev, hs_ev, a.to(X_ev.device, torch.float32))
                        p_hat = oracle.predict_proba(h_new)
                        comp = float(counterfactual_completeness(p_hat, ev_src_class[ok_ev]).mean())
                    for k, c2 in enumerate(conditions):
                        if shared or c2 == c:
                            cb, cs = clean_by[c2][0][ok_ev], clean_by[c2][1][ok_ev]
                            ob, os_ = out[:, 2 * k], out[:, 2 * k + 1]
                            scored[c2].append((log_odds_ratio(cb, cs, ob, os_), iia(ob, os_), comp))
            eval_s = time.perf_counter() - t_ev
            cost[label] = cost.get(label, 0.0) + fit_s + eval_s
            for c in conditions:
                res = scored[c]
                rows.append({
                    "cg_task": template.name, "condition": c, "method": label, "layer": layer,
                    "paper_layer": layer - 1, "stream": settings.stream,
                    "region": template.region_names[region], "region_idx": region,
                    "odds": float(np.mean([float(o.mean()) for o, _, _ in res])),
                    "odds_draw_sd": (float(np.std([float(o.mean()) for o, _, _ in res])) if len(res) > 1
                                     else float("nan")),
                    "iia": float(np.mean([i for _, i, _ in res])), "probe_accuracy": probe_acc,
                    "probe_lam": kwargs.get("lam", float("nan")), "task_accuracy": acc, "capable": capable,
                    "unknown_labels": " ".join(unknown),
                    "oracle_accuracy": oracle_acc, "completeness": float(np.mean([x for _, _, x in res])),
                    "oracle_selectivity": float("nan"),  # no non-targeted property in the templates
                    "n_train": len(ok_tr), "n_eval": len(ok_ev), "degenerate": degenerate, "n_directions": len(res),
                    "fit_s": fit_s / len(conditions), "eval_s": eval_s / len(conditions),
                })
    if timings is not None:
        timings[f"{template.name}/read_s"] = read_s
        for m, s in cost.items():
            timings[f"{template.name}/{m}_s"] = s
        timings[f"{template.name}/total_s"] = time.perf_counter() - t_start
    return rows

