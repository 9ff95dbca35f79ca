"""The MIB study's plan and scoring (:mod:`cprobe.tasks.mib`): a task's prompts and MIB's filter, every method's
featurizer at every site by its declared capabilities, the controls, and the interchange scored by MIB's checker on
greedy outputs — through the sites engine (:func:`cprobe.models.multisite.edited_generate`,
:class:`~cprobe.models.multisite.SitesForward`), never a forward of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cprobe.data.mib import Pair, Task, pairs
from cprobe.methods import build, declares, featurizer, is_intervention
from cprobe.models.edits import Edit
from cprobe.models.featurizers import Featurizer, Subspace, rowwise_interchange
from cprobe.models.sites import Site


@dataclass
class Prompts:
    """One task's pairs on one model: every distinct prompt (bases and sources), what the model generates on each,
    MIB's filter (a pair is kept where the model's output is right on its base and its source) and the states."""

    task: Task
    items: list[Any]
    index: dict[str, int]
    correct: np.ndarray  # (N,) the clean output passes the task's checker
    train: list[Pair]  # kept train pairs
    test: list[Pair]  # kept test pairs
    candidates: dict[str, int]  # test pairs per kind before the filter
    accuracy: float  # on the test pairs' base prompts
    acts: dict[Site, Tensor]

    def rows(self, ps: Sequence[Pair], side: str) -> Tensor:
        return torch.tensor([self.index[getattr(p, side).id] for p in ps], dtype=torch.long)


def decode(tok: Any, ids: Tensor) -> list[str]:
    return [tok.decode(row.tolist(), skip_special_tokens=True) for row in ids]


def encode(adapter: Any, task: Task, items: Sequence[Any], sites: Sequence[Site]) -> Any:
    """The prompts as one batch; a site's token position outside a prompt (an empty region) is refused in one line."""
    from cprobe.errors import DataError
    from cprobe.models.formatters import RegionFormatter

    batch = RegionFormatter()(list(items), adapter, torch.arange(len(items)))
    names = {task.position(p): p for p in task.positions}
    for pos in dict.fromkeys(s.position for s in sites):
        at = batch.positions[pos]
        bad = torch.nonzero((at < 0) | (at >= batch.attention_mask.sum(1))).flatten()
        if len(bad):
            it = items[int(bad[0])]
            raise DataError(f"MIB task {task.key}: token position {names.get(pos, pos)!r} is outside the prompt of "
                            f"{it.id} ({it.text[:60]!r}) for {adapter.name}'s tokenizer")
    return batch


def generate(adapter: Any, batch: Any, steps: int, progress: bool) -> list[str]:
    """The clean greedy outputs of the prompts of ``batch`` (``steps`` tokens each)."""
    from cprobe.models.multisite import edited_generate

    ids = edited_generate(adapter, batch, torch.arange(len(batch)), [], lambda *_: {}, steps,
                          desc="MIB clean outputs", progress=progress)
    return decode(adapter.tok, ids)


FILTERS = ("both", "base", "none")
"""MIB's filter keeps a pair whose base and source the model gets right (``both``); ``base``: the base only; ``none``."""


def prompts(adapter: Any, task: Task, kinds: Sequence[str], sites: Sequence[Site], n_train: int, n_test: int,
            seed: int, progress: bool, keep: Prompts | None = None, filter: str = "both") -> Prompts:
    """The task's train and test pairs of ``kinds`` (seeded apart), the clean outputs, the filter (:data:`FILTERS`)
    and the states at ``sites``. ``keep``: another model's prompts whose kept pairs are used as they are (the untrained
    control)."""
    if keep is None:
        train = [p for k in kinds for p in pairs(task, k, n_train, seed, "train/")]
        test = [p for k in kinds for p in pairs(task, k, n_test, seed + 1, "test/")]
    else:
        train, test = keep.train, keep.test
    items = list({it.id: it for p in [*train, *test] for it in (p.base, p.source)}.values())
    index = {it.id: i for i, it in enumerate(items)}
    outputs = generate(adapter, encode(adapter, task, items, sites), task.max_new_tokens, progress)
    correct = np.array([task.check(o, it.outcome) for o, it in zip(outputs, items)], dtype=bool)
    base_ok = np.array([correct[index[p.base.id]] for p in test], dtype=bool)
    accuracy = float(base_ok.mean()) if len(test) else float("nan")
    candidates = {k: sum(p.kind == k for p in test) for k in kinds}
    if keep is None:
        def kept(ps: list[Pair]) -> list[Pair]:
            return [p for p in ps if filter == "none" or (correct[index[p.base.id]] and (
                filter == "base" or correct[index[p.source.id]]))]
        train, test = kept(train), kept(test)
    acts = {}
    if sites and (train or test):
        from cprobe.models.formatters import RegionFormatter

        out = adapter.map(items, RegionFormatter(), read=list(sites), desc="MIB states" if progress else None)
        acts = {s: out.acts[s].float() for s in sites}
    return Prompts(task, items, index, correct, train, test, candidates, accuracy, acts)


def label_ids(tok: Any, labels: Sequence[str]) -> Tensor:
    """Each expected output's first token, as it follows the prompt (the token DAS and DBM train toward)."""
    out = []
    for text in labels:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append(int(ids[0]) if ids else int(tok.eos_token_id or 0))
    return torch.tensor(out, dtype=torch.long)


# ----------------------------------------------------------------------------------------------- featurizers
@dataclass
class Fit:
    """One method's featurizer at one site (None: the whole vector)."""

    method: str
    family: str
    site: Site
    featurizer: Featurizer | None
    base: Featurizer | None = None  # a mask's basis (DBM), written to MIB's submission with ``indices``
    indices: list[int] | None = None

    @property
    def k(self) -> int | None:
        return None if self.featurizer is None else self.featurizer.n_features


def values(task: Task, inputs: Sequence[Mapping[str, Any]], variable: str) -> Tensor:
    """The variable's value in each prompt's run, as indices (sorted by text)."""
    vals = [repr(task.model.run(x)[variable]) for x in inputs]
    order = {v: i for i, v in enumerate(sorted(set(vals)))}
    return torch.tensor([order[v] for v in vals], dtype=torch.long)


def state_subspace(name: str, params: Mapping[str, Any], X: Tensor, y: Tensor, seed: int, max_directions: int,
                   device: Any = None) -> Subspace | None:
    """A method fitted on states (a direction method, or an intervention that exposes its direction) as a subspace:
    one direction per pair of consecutive values among the ``max_directions + 1`` most frequent values of the
    variable (binary, as every direction method is), orthonormalised; None where no two values occur or no pair gives
    a direction (states that do not vary there: a method finds none, as at the embeddings of a constant token)."""
    counts = torch.bincount(y)
    top = [int(v) for v in counts.argsort(descending=True)[: max_directions + 1] if counts[v] > 0]
    top.sort()
    dirs = []
    for a, b in zip(top, top[1:]):
        keep = (y == a) | (y == b)
        m = build(name, params, seed, device)
        try:
            if is_intervention(name):
                from cprobe.interventions import fit_intervention

                fit_intervention(m, X[keep].to(device or X.device), (y[keep] == b).long().to(device or X.device))
            else:
                m.fit(X[keep], (y[keep] == b).long())
            dirs.append(featurizer(m).basis.float().cpu())  # the shared answer: a fitted method as a featurizer
        except ValueError:  # no direction between these two values' states
            continue
    if not dirs:
        return None
    Q, R = torch.linalg.qr(torch.cat(dirs, 1))
    rank = int((R.diagonal().abs() > 1e-6).sum())
    return Subspace(Q[:, :rank].contiguous())


def fit_states(P: Prompts, variable: str, method: str, params: Mapping[str, Any], sites: Sequence[Site], seed: int,
               max_directions: int, device: Any = None) -> list[Fit]:
    """A method that learns on states (or the whole vector) at every site, from the kept train pairs' prompts."""
    from cprobe.methods import family

    if declares(method, "whole_vector"):
        return [Fit(method, family(method), s, None) for s in sites]
    if not P.train:
        return []
    rows = torch.cat([P.rows(P.train, "base"), P.rows(P.train, "source")])
    inputs = [P.items[i].meta["inputs"] for i in rows.tolist()]
    y = values(P.task, inputs, variable)
    out = []
    for s in sites:
        sub = state_subspace(method, params, P.acts[s][rows], y, seed, max_directions, device)
        if sub is None:  # one value only among the kept prompts: the chance direction (methods.fallback_direction)
            from cprobe.methods import fallback_direction

            sub = Subspace(fallback_direction(P.acts[s].shape[1], seed))
        out.append(Fit(method, family(method), s, sub))
    return out


def fit_through(adapter: Any, P: Prompts, variable: str, method: str, params: Mapping[str, Any],
                sites: Sequence[Site], seed: int) -> list[Fit]:
    """A method trained through the model on the kept train pairs (DAS; DBM, ``feature_mask``): the interchange at
    each site toward the label's first token; the sites of one position train together."""
    from cprobe.methods import family
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.multisite import EditForward, SitesForward

    if not P.train:
        return []
    base, src = P.rows(P.train, "base"), P.rows(P.train, "source")
    labels = [P.task.label(p.base_inputs, p.source_inputs, variable) for p in P.train]
    target = label_ids(adapter.tok, labels).to(adapter.device)
    train = RegionFormatter()([P.items[i] for i in base.tolist()], adapter, torch.arange(len(base)))
    out = []
    for position in dict.fromkeys(s.position for s in sites):
        group = [s for s in sites if s.position == position]
        K, n = len(group), len(base)
        h = torch.stack([P.acts[s][src] for s in group]).to(adapter.device)
        m = build(method, params, seed)
        clean = adapter.clean_states(train, [min(s.layer for s in group)])
        forward = SitesForward(adapter, train, torch.arange(n), group, m.windows(n), clean)
        if declares(method, "feature_mask"):  # DBM: a mask over each site's basis
            bases = [m.basis_featurizer(P.acts[s][base]) for s in group]
            site_of = torch.arange(K).repeat_interleave

            def gated(rows: slice, hs: Tensor, gates: Tensor, bases: list = bases) -> Edit:
                b = rows.stop - rows.start
                return rowwise_interchange(hs.reshape(K * b, -1), site_of(b), bases,
                                           [g[: f.n_features] for g, f in zip(gates, bases)])
            masks = m.fit_many(EditForward(forward, gated), h, target[None].repeat(K, 1),
                               [f.n_features for f in bases]).cpu()
            for k, (s, f) in enumerate(zip(group, bases)):
                chosen = masks[k][: f.n_features].nonzero().flatten().tolist()
                out.append(Fit(method, family(method), s, m.featurizer(f, masks[k]), f, chosen))
        else:
            found = m.fit_many(forward, h, target[None].repeat(K, 1)).cpu()
            out += [Fit(method, family(method), s, Subspace(found[k])) for k, s in enumerate(group)]
    return out


def rotation(fit: Fit, d: int, seed: int) -> Fit:
    """The random-rotation control: a seeded random orthonormal basis of the fit's dimension (the whole vector's: d)."""
    k = d if fit.k is None else max(1, fit.k)
    g = torch.Generator().manual_seed(seed)
    Q, R = torch.linalg.qr(torch.randn(d, k, generator=g))
    return Fit(fit.method, fit.family, fit.site, Subspace(Q * torch.where(R.diagonal() < 0, -1.0, 1.0)))


# ----------------------------------------------------------------------------------------------- scoring
@dataclass
class Scored:
    """Which fit each scored row belongs to, and whether its output passed MIB's checker."""

    fit: np.ndarray  # (rows,) index into the fits
    pair: np.ndarray  # (rows,) index into the test pairs
    correct: np.ndarray  # (rows,) bool


def score(adapter: Any, P: Prompts, variable_fits: Mapping[str, list[Fit]], sites: Sequence[Site],
          progress: bool) -> dict[str, Scored]:
    """Every fit of every variable interchanged on every kept test pair at its site, in one greedy pass of the sites
    engine (a site per row); the output checked against the causal model's counterfactual output."""
    from cprobe.models.formatters import RegionFormatter
    from cprobe.models.multisite import edited_generate

    items, site, source, group, owner, labels, fits = [], [], [], [], [], [], []
    base_rows, src_rows = P.rows(P.test, "base"), P.rows(P.test, "source")
    spans = {}
    for variable, vf in variable_fits.items():
        lab = [P.task.label(p.base_inputs, p.source_inputs, variable) for p in P.test]
        start = len(owner)
        for f in vf:
            g = len(fits)
            fits.append(f.featurizer)
            items.append(base_rows)
            site.append(torch.full((len(base_rows),), sites.index(f.site)))
            source.append(P.acts[f.site][src_rows])
            group.append(torch.full((len(base_rows),), g))
            owner.append(np.arange(len(P.test)))
            labels += lab
        spans[variable] = (start, len(owner), len(vf))
    if not owner:
        return {}
    item_t, site_t, src_t, group_t = torch.cat(items), torch.cat(site), torch.cat(source), torch.cat(group)
    dev = adapter.device

    def edits(rows: Tensor, _: Any, at: list[Site]) -> dict[Site, Callable[[Tensor], Tensor]]:
        edit = rowwise_interchange(src_t[rows].to(dev), group_t[rows], fits)
        return {s: edit for s in at}

    batch = RegionFormatter()(P.items, adapter, torch.arange(len(P.items)))
    ids = edited_generate(adapter, batch, item_t, sites, edits, P.task.max_new_tokens, row_site=site_t,
                          clean=adapter.clean_states(batch, sorted({s.layer for s in sites})),
                          desc=f"MIB {P.task.key} interchanges", progress=progress)
    texts = decode(adapter.tok, ids)
    ok = np.array([P.task.check(t, lab) for t, lab in zip(texts, labels)], dtype=bool)
    pair = np.concatenate(owner)
    g = group_t.numpy()
    out = {}
    for variable, (a, b, _) in spans.items():
        lo, hi = a * len(P.test), b * len(P.test)
        first = int(g[lo]) if hi > lo else 0
        out[variable] = Scored(g[lo:hi] - first, pair[lo:hi], ok[lo:hi])
    return out
