"""RAVEL's passes and fits (:mod:`cprobe.tasks.ravel`): the clean pass (the entity token's states, and the model's
answer read by teacher forcing), every method's subspace per (targeted attribute, layer), and the interchanges in the
sites engine's pass, each scored by RAVEL's match rule.

**The answer** (the reference's rule, generation and string check, in one forward): a prompt is run with a label
appended — its value's first ``n`` tokens as they follow the template
(:class:`~cprobe.models.formatters.ContinuationFormatter`) — and the model's most probable token read at each label
position (:class:`~cprobe.models.readouts.GreedyTokens`). Greedy decoding writes the label's tokens exactly when each
of those is the label's next token, so :func:`cprobe.metrics.ravel.matches` on them is the reference's check of
``n`` generated tokens, with no decoding loop (``tests/unit/test_ravel_answer.py`` pins both on a model).

**The subspaces** (a :class:`_Job` per method row, attribute A and layer), by declared capabilities:

- a direction method (and a chance baseline's draws, and an intervention that exposes its direction): one direction
  per pair of A's values (v, v′) that a scored pair swaps, fitted on the fitting part's prompts whose entity's A is v
  or v′ (z = 1 for v′); a pair whose two entities share A's value (an Isolate pair: RAVEL does not ask the values of A
  to differ there) gets that value's direction against the others. A value with no fitting state gets a chance
  direction (``degenerate``);
- ``whole_vector``: the whole state swapped;
- ``causal`` (DAS; with ``mdas_weight`` also multi-task DAS, ``m<name>``): one subspace per attribute, trained through
  the model on the fitting part's pairs (every source kind) with the interchange objective on the wanted label, its
  log-probability teacher-forced over its tokens (the reference's loss reads the label's tokens too), a k-dimensional
  one where DAS's ``k`` > 1 (:class:`~cprobe.models.featurizers.Subspace`);
- ``features`` (RAVEL's SAE method): the fitted method is a featurizer; its SAE is trained on the fitting part's
  Wikipedia contexts (the entity token's states), its features chosen on the fitting prompts labelled by A's value.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cprobe.errors import DataError
from cprobe.methods import (build, declares, direction_of, fallback_direction, family, featurizer, fitted,
                             is_intervention)
from cprobe.sae.quality import HELD_OUT, held_out
from cprobe.metrics import ravel as M
from cprobe.tasks.ravel_plan import CONTEXT, Labels, Pairs, Prompts

log = logging.getLogger("cprobe")

ENTITY_SITE = "region:1"  # the entity mention's last token (cprobe.data.ravel.REGIONS)


def _answers(n: int) -> list[str]:
    from cprobe.models.formatters import ANSWER

    return [ANSWER.format(j) for j in range(n)]


def with_label(item: Any, tokens: Sequence[int]) -> Any:
    """``item`` carrying the label ``tokens`` (−1 padding dropped) as its continuation."""
    return replace(item, meta={**item.meta, "continuation": tuple(int(t) for t in tokens if t >= 0)})


# ----------------------------------------------------------------------------------------------- the clean pass
def clean_pass(adapter: Any, P: Prompts, labels: Labels, value: np.ndarray, layers: Sequence[int], answer: np.ndarray,
               progress: bool) -> np.ndarray:
    """Fill ``P.acts`` (every row's entity-token state at every layer) and, for the prompts in ``answer``,
    ``P.answered`` and ``P.correct`` (the model writes the entity's value: its label). Returns the greedy tokens
    (N, n) of the answered rows (−1 elsewhere)."""
    from cprobe.models.formatters import ContinuationFormatter, RegionFormatter
    from cprobe.models.readouts import GreedyTokens
    from cprobe.models.sites import Site

    n = labels.n
    sites = [Site(l, ENTITY_SITE) for l in layers]
    d = adapter.hidden_size
    acts = {l: torch.zeros(len(P.items), d) for l in layers}
    greedy = np.full((len(P.items), n), -1, dtype=np.int64)
    asked = np.flatnonzero(answer & (P.attribute != CONTEXT))
    if len(asked):
        want = np.array([labels[P.attribute[i], P.template[i], value[P.entity[i], P.attribute[i]]] for i in asked])
        items = [with_label(P.items[i], want[j]) for j, i in enumerate(asked)]
        out = adapter.map(items, ContinuationFormatter(RegionFormatter(), n), read=sites,
                          readout=GreedyTokens(_answers(n)), desc="RAVEL prompts" if progress else None)
        got = out.scores.cpu().numpy()
        greedy[asked] = got
        P.answered[asked] = True
        P.correct[asked] = M.matches(got, want)
        for l, s in zip(layers, sites):
            acts[l][torch.from_numpy(asked)] = out.acts[s].float()
    rest = np.setdiff1d(np.arange(len(P.items)), asked)
    if len(rest):
        out = adapter.map([P.items[i] for i in rest], RegionFormatter(), read=sites,
                          desc="RAVEL states" if progress else None)
        for l, s in zip(layers, sites):
            acts[l][torch.from_numpy(rest)] = out.acts[s].float()
    P.acts = acts
    return greedy


# ----------------------------------------------------------------------------------------------- the fits
@dataclass
class Job:
    """One scored subspace of (method row, targeted attribute, layer): per-pair directions (``pairwise``: (i, j) with
    i <= j -> (draws, d) unit rows), a featurizer (``featurizer``: DAS's subspace, the SAE's latents), or the whole
    state (``whole``)."""

    label: str
    family: str
    a: int
    layer: int
    pairwise: dict[tuple[int, int], Tensor] | None = None
    featurizer: Any = None
    whole: bool = False
    degenerate: int = 0
    draws: int = 1
    info: dict[str, Any] = field(default_factory=dict)


def _pair_fits(fit: Any, X: Tensor, y: Tensor, wanted: Sequence[tuple[int, int]], n: int, d: int, seed: int
               ) -> tuple[dict[tuple[int, int], Tensor], int]:
    """``fit(X, z)`` -> ``n`` unit directions, on the states of each wanted pair of values (i < j: z = 1 for j; i = j:
    value i against the others); a pair that cannot be fitted gets a chance direction (counted)."""
    out, bad = {}, 0
    for i, j in wanted:
        rows = (y == i) | (y == j) if i != j else torch.ones_like(y, dtype=torch.bool)
        z = (y[rows] == j).long() if i != j else (y == i).long()
        found = None
        if bool((z == 0).any()) and bool((z == 1).any()):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    found = fit(X[rows].float(), z)
            except (ValueError, IndexError, np.linalg.LinAlgError, torch.linalg.LinAlgError, DataError) as err:
                log.debug("value pair (%d, %d): %s; a chance direction instead", i, j, err)
        if found is None:
            found, bad = [fallback_direction(d, seed + 31 * i + j)] * n, bad + 1
        rows_ = torch.stack([a.detach().float().cpu().flatten() for a in found])
        out[i, j] = rows_ / rows_.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return out, bad


def fit_jobs(config: Any, P: Prompts, value: np.ndarray, attrs: Sequence[str], layers: Sequence[int],
             scored: Mapping[int, Pairs], seed: int, device: Any, probe_cache: Path | None,
             params: Any, model: str | None = None) -> list[Job]:
    """Every method's subspace at every (attribute, layer) that is fitted on states (module doc)."""
    from cprobe.probes import PROBES
    from cprobe.tasks.sites import SiteFits

    fit_rows = np.flatnonzero(P.fit & (P.attribute != CONTEXT))
    ctx_rows = np.flatnonzero(P.fit & (P.attribute == CONTEXT))
    eval_rows = torch.from_numpy(np.flatnonzero(P.scored & (P.attribute != CONTEXT)))  # an SAE's held-out states
    jobs = []
    for a, _ in enumerate(attrs):
        known = fit_rows[value[P.entity[fit_rows], a] >= 0]
        y = torch.from_numpy(value[P.entity[known], a])
        p = scored[a]
        wanted = sorted({(min(i, j), max(i, j)) for i, j in zip(p.base_a.tolist(), p.src_a.tolist())})
        for layer in layers:
            X = P.acts[layer][torch.from_numpy(known)].float()
            site_seed = seed * 100_003 + 1000 * layer + a
            fits = SiteFits(probe_cache, memo={})
            for name in config.methods:
                if declares(name, "causal"):
                    continue  # trained through the model: train_causal
                if declares(name, "whole_vector"):
                    jobs.append(Job(name, family(name), a, layer, whole=True))
                    continue
                if declares(name, "features"):
                    method = build(name, params(name, layer), seed, layer=layer, model=model)
                    contexts = P.acts[layer][torch.from_numpy(ctx_rows)].float() if len(ctx_rows) else None
                    feats = featurizer(method.fit(X, y, contexts=contexts))
                    info = {"n_features": int(feats.n_features), **held_out(method, P.acts[layer][eval_rows])}
                    jobs.append(Job(name, family(name), a, layer, featurizer=feats, info=info))
                    continue
                n = config.random_draws if declares(name, "chance_baseline") else 1

                def fit(Xp: Tensor, z: Tensor, name: str = name, layer: int = layer) -> list[Tensor]:
                    if is_intervention(name):  # fitted where the job runs; a direction method on the CPU states
                        Xp, z = Xp.to(device or Xp.device), z.to(device or Xp.device)
                    probe = lambda: fits.probe("interventional", {"attribute": attrs[a], "layer": layer},  # noqa: E731
                                               PROBES.build(config.interventional_probe, seed=seed + 1, device=device),
                                               Xp, z)
                    ms = fitted(name, params(name, layer), Xp, z, seed, n, site_seed, device, probe, layer=layer)
                    if q := held_out(ms[0], P.acts[layer][eval_rows]):  # an SAE method: its pair's SAE
                        quality.append(q)
                    return [direction_of(m, name) for m in ms]

                quality: list[dict[str, float]] = []
                table, bad = _pair_fits(fit, X, y, wanted, n, X.shape[1], site_seed)
                # an SAE per value pair: the mean of their quality on the same held-out states
                info = {k: float(np.mean([q[k] for q in quality])) for k in HELD_OUT} if quality else {}
                if quality:
                    info["sae_n"] = quality[0]["sae_n"]
                jobs.append(Job(name, family(name), a, layer, pairwise=table, degenerate=bad, draws=n, info=info))
    return jobs


def train_causal(config: Any, adapter: Any, P: Prompts, labels: Labels, attrs: Sequence[str], layers: Sequence[int],
                 train: Mapping[int, tuple[Pairs, Pairs]], seed: int, rng: np.random.Generator, params: Any
                 ) -> list[Job]:
    """Every causal method (DAS) per targeted attribute, at every layer at once (one batched pass,
    :class:`~cprobe.models.multisite.SitesForward`), on the fitting part's pairs ``train[a]`` = (Cause pairs, Isolate
    pairs): the loss is the wanted label's log-probability, teacher-forced over its tokens
    (:class:`~cprobe.models.readouts.ContinuationLogProb`); with ``mdas_weight`` also multi-task (the Isolate rows
    weighted by it). A k-dimensional DAS gives (d, k) bases."""
    from cprobe.models.featurizers import Subspace
    from cprobe.models.formatters import ContinuationFormatter, RegionFormatter
    from cprobe.models.multisite import SitesForward
    from cprobe.models.readouts import ContinuationLogProb
    from cprobe.models.sites import Site

    causal = [m for m in config.methods if declares(m, "causal")]
    if not causal:
        return []
    jobs = []
    fmt = ContinuationFormatter(RegionFormatter(), labels.n)
    sites = [Site(l, ENTITY_SITE) for l in layers]
    answers = _answers(labels.n)
    for a, (cause, iso) in train.items():
        variants = [("", cause, None)]
        if config.mdas_weight is not None and len(iso):
            variants.append(("m", Pairs.cat([cause, iso]), config.mdas_weight))
        for prefix, pairs, w in variants:
            if len(pairs) == 0:
                continue
            order = rng.permutation(len(pairs))  # Cause and Isolate rows mixed in each step
            base, src, q = pairs.base[order], pairs.source[order], pairs.queried[order]
            want = torch.tensor([labels[qq, P.template[b], v] for b, qq, v in zip(base, q, pairs.wanted_value[order])])
            weight = torch.where(torch.from_numpy(q == a), 1.0, float(w or 1.0))
            batch = fmt([with_label(P.items[b], want[i]) for i, b in enumerate(base)], adapter, torch.arange(len(base)))
            clean = adapter.clean_states(batch, [min(layers)])  # every step resumes at the lowest layer
            h = torch.stack([P.acts[l][torch.from_numpy(src)] for l in layers]).to(adapter.device)
            n, K = len(base), len(layers)

            def readout(rows: slice, K: int = K, want: Tensor = want) -> ContinuationLogProb:
                return ContinuationLogProb(answers, want[rows.start:rows.stop].repeat(K, 1))

            for name in causal:
                das = build(name, params(name, None), seed)
                forward = SitesForward(adapter, batch, torch.arange(n), sites, das.windows(n), clean, readout)
                target = torch.zeros(K, n, dtype=torch.long)  # class 0 of ContinuationLogProb: the label
                found = das.fit_many(forward, h, target, weight=weight[None].repeat(K, 1)).cpu()
                for k, layer in enumerate(layers):
                    jobs.append(Job(prefix + name, "direction", a, layer, featurizer=Subspace(found[k].clone()),
                                    info={"n_features": int(found[k].shape[-1]) if found[k].dim() == 2 else 1}))
    return jobs


# ----------------------------------------------------------------------------------------------- the interchanges
def _edit(src: Tensor, direction: Tensor, has_dir: Tensor, whole: Tensor, group: Tensor,
          featurizers: Sequence[Any]) -> Any:
    """Row r: the DII along ``direction[r]`` where ``has_dir[r]``, the whole swap where ``whole[r]``, else the
    interchange of every feature of ``featurizers[group[r]]`` — toward ``src[r]``; float32, cast back."""
    from cprobe.models.edits import dii
    from cprobe.models.featurizers import interchange

    def edit(h: Tensor) -> Tensor:
        hf = h.float()
        s = src.to(h.device)
        out = torch.where(has_dir.to(h.device)[:, None], dii(hf, s, direction.to(h.device)), hf)
        out = torch.where(whole.to(h.device)[:, None], s, out)
        g = group.to(h.device)
        for k in group.unique().tolist():
            if k >= 0:
                rows = g == k
                out[rows] = interchange(hf[rows], s[rows], featurizers[k])
        return out.to(h.dtype)
    return edit


def score(adapter: Any, P: Prompts, labels: Labels, jobs: Sequence[Job], pairs: Mapping[int, Pairs],
          layers: Sequence[int], progress: bool) -> list[np.ndarray]:
    """Each job's hits (bool per pair of its attribute, draws stacked) in the sites engine's pass: row = (base prompt
    with the wanted label appended, its layer's site), the edit toward the source row's state; a hit is RAVEL's match
    of the greedy tokens with the label."""
    from cprobe.models.formatters import ContinuationFormatter, RegionFormatter
    from cprobe.models.multisite import edited_pass
    from cprobe.models.readouts import GreedyTokens
    from cprobe.models.sites import Site

    n = labels.n
    key_of: dict[tuple[int, int], int] = {}  # (base row, wanted value) -> scored item
    items, want = [], []
    cols: dict[str, list[Tensor]] = {k: [] for k in ("item", "site", "src", "dir", "has", "whole", "group", "owner")}
    feats: list[Any] = []
    d = adapter.hidden_size
    for j, job in enumerate(jobs):
        p = pairs[job.a]
        if len(p) == 0:
            continue
        idx = []
        for b, q, v in zip(p.base.tolist(), p.queried.tolist(), p.wanted_value.tolist()):
            if (b, v) not in key_of:
                key_of[b, v] = len(items)
                lab = labels[q, P.template[b], v]
                items.append(with_label(P.items[b], lab))
                want.append(lab)
            idx.append(key_of[b, v])
        for draw in range(job.draws):
            m = len(p)
            cols["item"].append(torch.tensor(idx))
            cols["site"].append(torch.full((m,), layers.index(job.layer)))
            cols["src"].append(P.acts[job.layer][torch.from_numpy(p.source)].float())
            if job.pairwise is not None:
                keys = zip(np.minimum(p.base_a, p.src_a).tolist(), np.maximum(p.base_a, p.src_a).tolist())
                cols["dir"].append(torch.stack([job.pairwise[k][draw] for k in keys]))
            else:
                cols["dir"].append(torch.zeros(m, d))
            cols["has"].append(torch.full((m,), job.pairwise is not None))
            cols["whole"].append(torch.full((m,), job.whole))
            if job.featurizer is not None:
                feats.append(job.featurizer)
            cols["group"].append(torch.full((m,), len(feats) - 1 if job.featurizer is not None else -1))
            cols["owner"].append(torch.full((m,), j))
    if not items:
        return [np.zeros(0, dtype=bool) for _ in jobs]
    t = {k: torch.cat(v) for k, v in cols.items()}
    want_t = np.array(want)
    fmt = ContinuationFormatter(RegionFormatter(), n)
    batch = fmt(items, adapter, torch.arange(len(items)))
    hits = np.zeros(len(t["item"]), dtype=bool)
    sites = [Site(l, ENTITY_SITE) for l in layers]

    def edits(rows: Tensor, _: Any, at: list[Site]) -> dict[Site, Any]:
        e = _edit(t["src"][rows], t["dir"][rows], t["has"][rows], t["whole"][rows], t["group"][rows], feats)
        return {s: e for s in at}

    def scored(rows: Tensor, out: Any) -> None:
        r = rows.numpy()
        hits[r] = M.matches(out.scores.cpu().numpy(), want_t[t["item"][rows].numpy()])

    edited_pass(adapter, batch, t["item"], sites, edits, scored, row_site=t["site"],
                readout=lambda _items: GreedyTokens(_answers(n)), clean=adapter.clean_states(batch, list(layers)),
                desc="RAVEL interchanges", progress=progress)
    owner = t["owner"].numpy()
    return [hits[owner == j] for j in range(len(jobs))]
