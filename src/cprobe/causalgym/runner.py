"""Run one CausalGym task on one model: read site activations, find directions, score 1-D DIIs.

Sites are (layer l, region r): the residual stream ``hidden_states[l]`` (adapter convention:
0 = embeddings, l = output of block l) at the last token of region r. The intervention writes
the base row's site vector and the prediction is read at the base's last token. One forward pass
reads every layer at every region; each (site, direction) is then one batched forward over the
eval set, shared by the task and the control labels (inputs are the same; only the scored label
ids differ). DAS is trained per site and per condition (task / control), as in the reference.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from cprobe.models.edits import dii, dii_edit, vanilla_edit
from cprobe.causalgym.templates import (
    Splits,
    TaskTemplate,
    TokenizedPairs,
    control_pairs,
    make_splits,
    tokenize_pairs,
)
from cprobe.directions import DIRECTIONS
from cprobe.errors import ConfigError, DataError
from cprobe.extract import resolve_layers
from cprobe.metrics.odds import iia, log_odds_ratio, task_accuracy
from cprobe.metrics.reliability import counterfactual_completeness
from cprobe.models.adapter import Encoded, ModelAdapter

log = logging.getLogger("cprobe")

METHODS = ("das", "probe", "mean", "lda", "pca", "kmeans", "random")
"""The paper's seven direction methods; ``vanilla`` (whole-vector swap) may be added."""
CONDITIONS = ("task", "control")
DEFAULT_ORACLE = {"name": "mlp", "n_layers": [1], "widths": [256], "lrs": [1e-3, 1e-2], "epochs": 8}
"""A small grid for the per-site oracle (cheap: 400 train vectors per site)."""


@dataclass
class GymSettings:
    """What to run for one task (built from the ``causalgym`` config node)."""

    methods: Sequence[str] = (*METHODS, "vanilla")
    layers: Any = "blocks"  # 'blocks' = 1..L (the paper's layers), 'all' = 0..L, 'last', or ints
    regions: Any = "label"  # 'label' = from the first label region on, 'all', or names / indices
    n_train: int = 200
    n_eval: int = 50
    train_seed: int = 42
    eval_seed: int = 1
    control: bool = True
    prepend_bos: bool = True
    probe_lam: float = 10.0
    das: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    random_draws: int = 1  # random: mean over this many independent directions per site (paper: 1)
    reliability: bool = False  # oracle-probe completeness per direction (beyond the paper)
    oracle_probe: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_ORACLE))

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m != "vanilla" and m not in DIRECTIONS]
        if bad or not self.methods:
            raise ConfigError(f"unknown causalgym method(s) {bad}; choose from {[*sorted(DIRECTIONS), 'vanilla']}")
        if self.n_train < 1 or self.n_eval < 1:
            raise ConfigError("causalgym.n_train and causalgym.n_eval must be >= 1")
        if self.random_draws < 1:
            raise ConfigError("causalgym.random_draws must be >= 1")


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


def _chunks(n: int, size: int) -> Iterable[slice]:
    for s in range(0, n, size):
        yield slice(s, min(s + size, n))


def _trim(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    width = int(mask.sum(1).max())
    return ids[:, :width], mask[:, :width]


def _gather(logp: Tensor, labels: Sequence[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    dev = logp.device
    return [(logp.gather(1, yb.to(dev)[:, None]).squeeze(1).cpu(), logp.gather(1, ys.to(dev)[:, None]).squeeze(1).cpu())
            for yb, ys in labels]


@torch.inference_mode()
def read_sites(adapter: ModelAdapter, ids: Tensor, mask: Tensor, pos: Tensor, last: Tensor, layers: Sequence[int],
               labels: Sequence[tuple[Tensor, Tensor]] = ()) -> tuple[dict[int, Tensor], list[tuple[Tensor, Tensor]]]:
    """Hidden states (n, R, d) (float32, CPU) at every region's last token for ``layers``, in one pass.

    Rows whose region is empty (pos −1) get zeros there. Also returns the clean next-token
    log-probs at ``last`` gathered for each (y_b ids, y_s ids) pair in ``labels``.
    """
    n, R = pos.shape
    acts = {l: torch.zeros(n, R, adapter.hidden_size) for l in layers}
    outs: list[list[tuple[Tensor, Tensor]]] = []
    for sl in _chunks(n, adapter.batch_size):
        i, m = _trim(ids[sl], mask[sl])
        res = adapter.model(input_ids=i.to(adapter.device), attention_mask=m.to(adapter.device), output_hidden_states=True)
        p = pos[sl].clamp(min=0).to(adapter.device)
        rows = torch.arange(p.shape[0], device=adapter.device)[:, None]
        for l in layers:
            acts[l][sl] = res.hidden_states[l][rows, p].float().cpu()
        rows1 = torch.arange(p.shape[0], device=adapter.device)
        logp = res.logits[rows1, last[sl].to(adapter.device)].float().log_softmax(-1)
        outs.append(_gather(logp, [(yb[sl], ys[sl]) for yb, ys in labels]))
    for l in layers:
        acts[l][pos < 0] = 0.0
    merged = [(torch.cat([o[k][0] for o in outs]), torch.cat([o[k][1] for o in outs])) for k in range(len(labels))]
    return acts, merged


def intervene(adapter: ModelAdapter, ids: Tensor, mask: Tensor, site: Tensor, last: Tensor, layer: int,
              h_source: Tensor, a: Tensor | None, labels: Sequence[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    """Log-probs of each label pair after the 1-D DII along ``a`` (``None``: vanilla swap) at ``site``."""
    outs = []
    with torch.inference_mode():
        for sl in _chunks(ids.shape[0], adapter.batch_size):
            i, m = _trim(ids[sl], mask[sl])
            hs = h_source[sl].to(adapter.device)
            edit = vanilla_edit(hs) if a is None else dii_edit(hs, a.to(adapter.device))
            logp = adapter.forward_with_edit(Encoded(i, m, site[sl], last[sl]), layer, edit)
            outs.append(_gather(logp, [(yb[sl], ys[sl]) for yb, ys in labels]))
    return [(torch.cat([o[k][0] for o in outs]), torch.cat([o[k][1] for o in outs])) for k in range(len(labels))]


def das_forward(adapter: ModelAdapter, tp: TokenizedPairs, rows: Tensor, region: int, layer: int) -> Callable:
    """``forward(edit, batch_idx)`` for :class:`cprobe.directions.das.DAS` over train rows ``rows``."""
    def forward(edit, idx: Tensor) -> Tensor:
        r = rows[idx.cpu()]
        i, m = _trim(tp.base_ids[r], tp.base_mask[r])
        return adapter.forward_with_edit(Encoded(i, m, tp.base_pos[r, region], tp.base_last[r]), layer, edit)
    return forward


# ---------------------------------------------------------------------------------- one task


def _check_labels(tok: Any, tp: TokenizedPairs, what: str) -> None:
    unk = getattr(tok, "unk_token_id", None)
    if unk is not None and bool(((tp.base_label_ids == unk) | (tp.source_label_ids == unk)).any()):
        log.warning("%s: some labels are unknown to the tokenizer (map to %s); their odds are meaningless",
                    what, tok.unk_token)


def fit_oracle(X: Tensor, y: Tensor, settings: GymSettings):
    """The site's oracle probe for the targeted property (the base class), from ``settings.oracle_probe``."""
    from cprobe.probes import build_probe

    return build_probe({**settings.oracle_probe, "seed": settings.seed}).fit(X.float(), y)


def _build_direction(method: str, settings: GymSettings, site_seed: int):
    cls = DIRECTIONS.get(method)
    if method == "das":
        return cls(**{"seed": settings.seed, **settings.das})
    if method == "probe":
        return cls(lam=settings.probe_lam, seed=settings.seed)
    if method in ("kmeans",):
        return cls(seed=settings.seed)
    if method == "random":
        return cls(seed=site_seed)
    return cls()


def run_gym_task(adapter: ModelAdapter, template: TaskTemplate, settings: GymSettings,
                 progress: bool = False, timings: dict[str, float] | None = None,
                 splits: Splits | None = None) -> list[dict[str, Any]]:
    """Long-format rows: one per (condition, method, layer, region) with AvgOdds, IIA and costs.

    ``splits`` replaces the sampled train/eval pairs (tests use it, e.g. source = base).
    """
    if adapter.kind != "causal":
        raise ConfigError(f"CausalGym needs a causal LM; model {adapter.name!r} is {adapter.kind!r}")
    if len(template.types) != 2:
        raise DataError(f"CausalGym task {template.name!r} is not binary; the methods need two classes")
    t_start = time.perf_counter()
    splits = splits or make_splits(template, settings.n_train, settings.n_eval, settings.train_seed, settings.eval_seed)
    tr = tokenize_pairs(adapter.tok, splits.train, prepend_bos=settings.prepend_bos)
    ev = tokenize_pairs(adapter.tok, splits.eval, prepend_bos=settings.prepend_bos)
    _check_labels(adapter.tok, ev, template.name)
    conditions = list(CONDITIONS if settings.control else CONDITIONS[:1])
    # Control: the same inputs with " dog"/" give" labels (only the label ids change).
    ev_labels = {"task": (ev.base_label_ids, ev.source_label_ids)}
    tr_target = {"task": tr.source_label_ids}
    if settings.control:
        ev_c = tokenize_pairs(adapter.tok, control_pairs(splits.eval), prepend_bos=settings.prepend_bos)
        tr_c = tokenize_pairs(adapter.tok, control_pairs(splits.train), prepend_bos=settings.prepend_bos)
        _check_labels(adapter.tok, ev_c, f"{template.name} (control)")
        ev_labels["control"] = (ev_c.base_label_ids, ev_c.source_label_ids)
        tr_target["control"] = tr_c.source_label_ids
    labels = [ev_labels[c] for c in conditions]
    layers = resolve_layers(settings.layers, adapter.n_layers)
    regions = resolve_regions(settings.regions, template)

    t0 = time.perf_counter()
    base_tr, _ = read_sites(adapter, tr.base_ids, tr.base_mask, tr.base_pos, tr.base_last, layers)
    src_tr, _ = read_sites(adapter, tr.source_ids, tr.source_mask, tr.source_pos, tr.source_last, layers)
    base_ev, clean = read_sites(adapter, ev.base_ids, ev.base_mask, ev.base_pos, ev.base_last, layers, labels)
    src_ev, _ = read_sites(adapter, ev.source_ids, ev.source_mask, ev.source_pos, ev.source_last, layers)
    read_s = time.perf_counter() - t0
    clean_by = dict(zip(conditions, clean))
    acc = task_accuracy(*clean_by["task"])
    log.info("%s on %s: task accuracy %.3f (%d eval items)", adapter.name, template.name, acc, len(ev))

    cost: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    sites = [(l, r) for l in layers for r in regions]
    bar = tqdm(sites, desc=template.name, disable=not progress or None, leave=False)
    for layer, region in bar:
        ok_tr = ((tr.base_pos[:, region] >= 0) & (tr.source_pos[:, region] >= 0)).nonzero().squeeze(1)
        ok_ev = ((ev.base_pos[:, region] >= 0) & (ev.source_pos[:, region] >= 0)).nonzero().squeeze(1)
        if len(ok_tr) == 0 or len(ok_ev) == 0:
            continue  # the region is empty on one side of every pair: not a site
        X_tr, y_tr = base_tr[layer][ok_tr, region], tr.base_class[ok_tr]
        X_ev, y_ev = base_ev[layer][ok_ev, region], ev.base_class[ok_ev]
        hs_ev = src_ev[layer][ok_ev, region]
        ev_args = (ev.base_ids[ok_ev], ev.base_mask[ok_ev], ev.base_pos[ok_ev, region], ev.base_last[ok_ev], layer, hs_ev)
        site_labels = [(yb[ok_ev], ys[ok_ev]) for yb, ys in labels]
        oracle, oracle_acc = None, float("nan")
        if settings.reliability and len(torch.unique(y_tr)) == 2:
            t_or = time.perf_counter()
            oracle = fit_oracle(X_tr, y_tr, settings)
            oracle_acc = oracle.score(X_ev, y_ev)
            cost["oracle"] = cost.get("oracle", 0.0) + time.perf_counter() - t_or
        for method in settings.methods:
            # One direction for both conditions, except DAS (trained on each condition's labels).
            # ``random`` with random_draws > 1 scores several independent directions and averages.
            dirs: dict[str, list[Tensor | None]] = {}
            probe_acc = float("nan")
            degenerate = False
            t_fit = time.perf_counter()
            if method == "vanilla":
                dirs = {c: [None] for c in conditions}
            elif method == "das":
                for c in conditions:
                    das = _build_direction("das", settings, 0)
                    fwd = das_forward(adapter, tr, ok_tr, region, layer)
                    das.fit(fwd, src_tr[layer][ok_tr, region].to(adapter.device), tr_target[c][ok_tr])
                    dirs[c] = [das.a]
            elif method == "random":
                site_seed = settings.seed * 100_003 + 1000 * layer + region
                draws = [DIRECTIONS.get("random")(seed=site_seed + 7_919 * k).fit(X_tr).a
                         for k in range(settings.random_draws)]
                dirs = {c: draws for c in conditions}
            else:
                if method in ("probe", "mean", "lda") and len(torch.unique(y_tr)) < 2:
                    continue
                site_seed = settings.seed * 100_003 + 1000 * layer + region
                try:
                    if float(X_tr.std(0).max()) <= 1e-6 * (1.0 + float(X_tr.abs().max())):
                        raise ValueError("the train activations at this site are all equal")
                    with warnings.catch_warnings():  # LDA on near-collinear activations: harmless
                        warnings.simplefilter("ignore", RuntimeWarning)
                        d = _build_direction(method, settings, site_seed).fit(X_tr, y_tr)
                    if hasattr(d, "score"):
                        probe_acc = d.score(X_ev, y_ev)
                    a = d.a
                except (ValueError, IndexError, np.linalg.LinAlgError) as err:
                    # Activations that do not vary with the class (e.g. embeddings of a shared word)
                    # give no direction; the DII there has (almost) no effect along any direction,
                    # so score a random one and flag the site.
                    log.debug("%s at layer %d region %d: %s; using a random direction", method, layer, region, err)
                    a, degenerate = DIRECTIONS.get("random")(seed=site_seed).fit(X_tr).a, True
                dirs = {c: [a] for c in conditions}
            fit_s = time.perf_counter() - t_fit
            t_ev = time.perf_counter()
            # Per condition: a list (one per direction) of (per-item odds, IIA, per-item completeness).
            scored: dict[str, list[tuple[Tensor, float, float]]] = {c: [] for c in conditions}
            shared = method != "das"  # every condition uses the same directions: one forward each
            for c in conditions[:1] if shared else conditions:
                for a in dirs[c]:
                    out = intervene(adapter, *ev_args, a, site_labels)
                    comp = float("nan")
                    if oracle is not None:
                        h_new = hs_ev if a is None else dii(X_ev, hs_ev, a.to(X_ev.device, torch.float32))
                        p_hat = oracle.predict_proba(h_new)
                        comp = float(counterfactual_completeness(p_hat, ev.source_class[ok_ev]).mean())
                    for k, c2 in enumerate(conditions):
                        if shared or c2 == c:
                            cb, cs = clean_by[c2][0][ok_ev], clean_by[c2][1][ok_ev]
                            scored[c2].append((log_odds_ratio(cb, cs, *out[k]), iia(*out[k]), comp))
            eval_s = time.perf_counter() - t_ev
            cost[method] = cost.get(method, 0.0) + fit_s + eval_s
            for c in conditions:
                res = scored[c]
                rows.append({
                    "cg_task": template.name, "condition": c, "method": method, "layer": layer,
                    "region": template.region_names[region], "region_idx": region,
                    "odds": float(np.mean([float(o.mean()) for o, _, _ in res])),
                    "odds_draw_sd": (float(np.std([float(o.mean()) for o, _, _ in res])) if len(res) > 1
                                     else float("nan")),
                    "iia": float(np.mean([i for _, i, _ in res])), "probe_accuracy": probe_acc, "task_accuracy": acc,
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
