"""AxBench's concept-detection yardstick (Wu et al. 2025) for every direction method and every intervention that
exposes a direction.

Per concept, layer and method: the direction is fitted on the token states of the training texts (every token of a
text labelled by its text's class, as AxBench's DiffMean), oriented toward the concept, and each held-out text is
scored by projecting its tokens' states on it and pooling them (``max`` as AxBench; ``mean``; the ``last`` token);
the AUROC of those scores, texts with the concept against texts without, is the table's value. A method that declares
``scores_tokens`` scores each token itself instead (AxBench's SAE, ``sae_axbench``: its chosen latent's activation,
not a projection), and one that declares ``fits_on_texts`` is fitted with each token's text (AxBench's selection rules
pool a text's tokens first). An SAE method's rows carry its SAE's quality on the held-out tokens.

Concepts come from any dataset: an agreement dataset's properties (subject number ``z_c`` of the grammar; the text
is what the agreement studies feed the model: the prefix before the verb for a causal LM, the sentence with the verb
masked for an MLM), or the concepts of a text dataset with splits (CEBaB's aspects, LIBERTy's SCM variables). A
concept is ``name=value`` (the value is the positive class, every other value of the concept negative) or
``name!=value`` (the reverse: any value but it is positive); texts whose concept has no value (CEBaB's unannotated
aspects, "no majority") take no part.

Methods run by their declared capabilities, never by their names (:mod:`cprobe.directions.base`,
:mod:`cprobe.interventions.base`); a name both registries know (``das``) is the direction method:

- a direction fitted on activations: ``supervised`` needs both classes in training, a ``chance_baseline`` is averaged
  over ``random_draws`` draws, a ``whole_vector`` one (no direction) is refused at validation;
- a ``causal`` direction (DAS) is trained through the model at each layer, at the agreement target (a causal LM's
  last prefix token, an MLM's masked verb), on the training texts' minimal pairs that flip the concept's property
  (:func:`cprobe.tasks.sites.minimal_pair_training`, as the reliability study trains it); a dataset that has none for
  the property (CEBaB, LIBERTy) or a model without an LM head is refused at validation;
- an intervention that ``exposes_direction`` (LEACE, R-LACE, INLP, mean_diff, AlterRep) is fitted on the same token
  states and labels as a direction, and its fitted ``edit_direction()`` is the direction; a fitted edit of more than
  one direction (rank > 1) gets NaN at that layer with its reason in ``note``; one trained through the model
  (``needs_model``) or exposing no direction is refused at validation.

Every direction is then oriented and scored alike. The table's ``family`` says which registry ``method`` names
(``direction`` or ``intervention``), so the records land on the yardsticks row of the same method in other studies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

import cprobe.plots as plots
from cprobe.data.base import NONE, Dataset, Example
from cprobe.data.items import TextItem, fingerprint
from cprobe.data.registry import check_properties, load_dataset, pairs_refusal
from cprobe.errors import ConfigError, DataError
from cprobe.extract import extract, extract_sites, resolve_layers
from cprobe import methods
from cprobe.job import JobContext
from cprobe.methods import Needs, build, declares, direction_of, family, fitted, provenance, registry
from cprobe.metrics.detection import POOLINGS, auroc, orient, pool, token_scores
from cprobe.models.formatters import AgreementFormatter, TokensFormatter
from cprobe.models.sites import Site
from cprobe.records import Derived, RecordSpec, const
from cprobe.sae.method import check_sites
from cprobe.sae.quality import HELD_OUT, held_out
from cprobe.tasks import Uses
from cprobe.tasks.sites import minimal_pair_training

USES = Uses(groups=("model", "dataset", "layers"), methods="axbench.methods")
NEEDS = Needs(direction=True)
"""A concept score is a projection on a direction (or a method's own token score, which every direction method here
also has a direction for): no whole-vector swap, no intervention exposing none."""
CAUSAL_POSITION = "target"
"""Where a causal direction (DAS) is trained: the agreement target (a causal LM's last prefix token, an MLM's mask)."""


@dataclass(frozen=True)
class Config:
    """The ``axbench:`` node."""

    concepts: list[str] = field(default_factory=lambda: ["z_c=pl"])  # name=value (positive) or name!=value
    methods: list[str] = field(default_factory=lambda: ["mean", "probe", "pca", "lda", "kmeans", "random"])
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # constructor settings per method
    poolings: list[str] = field(default_factory=lambda: list(POOLINGS))
    max_tokens: int = 64  # tokens read per text (its first ones)
    test_share: float = 0.3  # a dataset without splits: the held-out share (seeded)
    eval_split: str = "test"  # a dataset with splits: the held-out one (the training one is `train`)
    max_test: int | None = None  # subsample the held-out texts (seeded)
    random_draws: int = 5  # a chance baseline's independent draws, averaged


def parse_concept(spec: str) -> tuple[str, str, bool]:
    """``name=value`` → (name, value, True: the value is the positive class); ``name!=value`` → (…, False)."""
    negate = "!=" in spec
    name, _, value = spec.partition("!=" if negate else "=")
    if not name or not value or "=" in value or "=" in name:
        raise ConfigError(f"axbench.concepts: {spec!r} is not name=value or name!=value (e.g. z_c=pl, food=Positive, "
                          "fever!=Absent)")
    return name.strip(), value.strip(), not negate


def refusal(name: str) -> str | None:
    """Why method ``name`` cannot be scored here by its declared capabilities alone, or None (a concept score is a
    direction's: :func:`cprobe.methods.refusal`)."""
    return methods.refusal(name, "axbench.methods", NEEDS)


def causal_refusal(name: str, dataset: Any, concepts: list[str], model: Any) -> str | None:
    """Why the causal direction method ``name`` (DAS) cannot be trained here, or None: a dataset without minimal pairs
    flipping a concept's property, or a model config without an LM head. Nothing is loaded."""
    from cprobe.models.load import parse_model_config

    for prop in dict.fromkeys(parse_concept(c)[0] for c in concepts):
        why = pairs_refusal(dataset or {}, prop)
        if why:
            return f"direction method {name!r} is trained through the model on minimal pairs that flip {prop!r}: {why}"
    mc = parse_model_config(model or {})
    if mc.kind in ("encoder", "classifier"):
        return (f"direction method {name!r} is trained through the model's predictions of the verb (causal); model "
                f"{mc.name!r} is {mc.kind!r}, with no LM head")
    return None


def validate(job: Any) -> None:
    cfg: Config = job.task_cfg
    if not cfg.concepts or not cfg.poolings:
        raise ConfigError("axbench.concepts and axbench.poolings must each list at least one")
    concepts = [parse_concept(c) for c in cfg.concepts]
    if len(set(cfg.concepts)) != len(cfg.concepts):
        raise ConfigError(f"axbench.concepts lists a concept twice: {cfg.concepts}")
    methods.check(cfg.methods, "axbench.methods", NEEDS)
    why = next((w for m in cfg.methods if declares(m, "causal")
                and (w := causal_refusal(m, job.keys.dataset, cfg.concepts, job.keys.model))), None)
    if why:
        raise ConfigError(why)
    unknown = sorted(set(cfg.params) - set(cfg.methods))
    if unknown:
        raise ConfigError(f"axbench.params sets {unknown}, which axbench.methods does not list ({cfg.methods})")
    for m in cfg.methods:  # a bad setting: one line, now; a concept score reads one direction
        methods.one_direction(build(m, cfg.params.get(m, {}), seed=0), m, f"axbench.params.{m}")
        check_sites(registry(m).get(m), cfg.params.get(m, {}), job.keys.layers, (job.keys.model or {}).get("name"))
    bad = [p for p in cfg.poolings if p not in POOLINGS]
    if bad:
        raise ConfigError(f"unknown axbench.poolings {bad}; choose from {list(POOLINGS)}")
    if cfg.max_tokens < 1 or cfg.random_draws < 1 or (cfg.max_test is not None and cfg.max_test < 2):
        raise ConfigError("axbench.max_tokens and axbench.random_draws must be >= 1, axbench.max_test >= 2 or null")
    if not 0 < cfg.test_share < 1:
        raise ConfigError(f"axbench.test_share must lie in (0, 1), got {cfg.test_share}")
    check_properties(job.keys.dataset, [name for name, _, _ in concepts], "axbench.concepts")
    if job.data_root is not None:  # the data's own checks, before any model loads
        checked_labels(split(load_dataset(job.keys.dataset, job.data_root), cfg, job.keys.seed), cfg.concepts)


# ----------------------------------------------------------------------------------------------- texts and labels
@dataclass(frozen=True)
class Split:
    """A dataset's training and held-out units (agreement :class:`Example`s or :class:`TextItem`s), in order."""

    name: str
    train: list[Any]
    test: list[Any]
    held_out: str  # what the held-out split is, for messages


def split(data: Any, cfg: Config, seed: int) -> Split:
    """Training and held-out units of a loaded dataset: an agreement :class:`Dataset` split by ``test_share``
    (seeded), a text dataset's ``train`` split and its ``eval_split``; ``max_test`` subsamples the held-out ones."""
    if isinstance(data, Dataset):
        order = np.random.default_rng([seed, 46]).permutation(len(data))
        n_test = max(1, round(cfg.test_share * len(data)))
        train, test = sorted(order[n_test:].tolist()), sorted(order[:n_test].tolist())
        out = Split(data.name, [data.examples[i] for i in train], [data.examples[i] for i in test],
                    f"held-out (test_share={cfg.test_share})")
    else:
        splits = getattr(data, "splits", None)
        if not isinstance(splits, dict) or "train" not in splits or cfg.eval_split not in splits:
            have = sorted(splits) if isinstance(splits, dict) else "none"
            raise ConfigError(f"axbench needs the dataset's `train` split and axbench.eval_split={cfg.eval_split!r}; "
                              f"{getattr(data, 'name', 'it')} has splits {have}")
        out = Split(data.name, list(splits["train"]), list(splits[cfg.eval_split]), f"held-out ({cfg.eval_split})")
    if cfg.max_test is not None and len(out.test) > cfg.max_test:
        keep = sorted(np.random.default_rng([seed, 47]).choice(len(out.test), cfg.max_test, replace=False).tolist())
        out = Split(out.name, out.train, [out.test[i] for i in keep], out.held_out)
    return out


def concepts_of(unit: Any) -> dict[str, str]:
    """A unit's concept values: an agreement example's properties, a text's concepts."""
    return dict(unit.props if isinstance(unit, Example) else unit.concepts)


def labels(units: list[Any], spec: str) -> Tensor:
    """(n,) 1 where the unit has the concept, 0 where it has another value, −1 where it has none (unannotated, "no
    majority", the grammar's "none")."""
    name, value, positive = parse_concept(spec)
    out = []
    for u in units:
        v = concepts_of(u).get(name)
        out.append(-1 if v in (None, "", NONE, "no majority") else int((v == value) == positive))
    return torch.tensor(out, dtype=torch.long)


def checked_labels(sp: Split, specs: list[str]) -> dict[str, Tensor]:
    """{concept: (n_train + n_test,) labels}; one line when a concept is unknown or a split lacks one of its classes
    (AUROC and the supervised fits need both)."""
    have = sorted({k for u in sp.train + sp.test for k in concepts_of(u)})
    out = {}
    for spec in specs:
        name = parse_concept(spec)[0]
        if name not in have:
            raise ConfigError(f"axbench.concepts: unknown concept {name!r}; the texts of {sp.name} have {have}")
        y_tr, y_te = labels(sp.train, spec), labels(sp.test, spec)
        for where, y in (("training", y_tr), (sp.held_out, y_te)):
            n_pos, n_neg = int((y == 1).sum()), int((y == 0).sum())
            if n_pos == 0 or n_neg == 0:
                raise DataError(f"concept {spec!r} has one class in the {where} split of {sp.name} ({n_pos} text(s) "
                                f"with it, {n_neg} without); AUROC needs both: choose another value, split or dataset")
        out[spec] = torch.cat([y_tr, y_te])
    return out


def model_texts(units: list[Any], adapter: Any) -> list[TextItem]:
    """The texts the model reads: a text unit as it is; an agreement example as the agreement studies feed it (the
    prefix before the verb for a causal LM, the sentence with the verb masked for an MLM)."""
    return [TextItem(u.id, " ".join(AgreementFormatter.words(u, adapter)[0])) if isinstance(u, Example) else u
            for u in units]


# ----------------------------------------------------------------------------------------------- token states
def token_states(ctx: JobContext, adapter: Any, items: list[TextItem], layers: list[int], max_tokens: int,
                 dataset: str) -> tuple[dict[int, Tensor], Tensor, int]:
    """({layer: (n, T, d) states of each text's first T tokens}, (n, T) real-token mask, texts truncated), read by the
    activation cache's extraction at the sites ``token:j``; T = the longest text's tokens, at most ``max_tokens``."""
    counts = TokensFormatter.counts(items, adapter)
    empty = [it.id for it, c in zip(items, counts.tolist()) if c == 0]
    if empty:
        raise DataError(f"{len(empty)} text(s) of {dataset} have no token, e.g. {empty[0]!r}")
    T = min(max_tokens, int(counts.max()))
    sites = [Site(l, f"token:{j}") for l in layers for j in range(T)]
    acts, _, _ = extract_sites(adapter, items, fingerprint(items), dataset, TokensFormatter(T), sites, None,
                               ctx.cache, ctx.progress, desc=f"tokens of {dataset}")
    states = {l: torch.stack([acts.pop(Site(l, f"token:{j}")) for j in range(T)], 1).float() for l in layers}
    mask = torch.arange(T)[None, :] < counts.clamp(max=T)[:, None]
    return states, mask, int((counts > T).sum())


# ----------------------------------------------------------------------------------------------- directions
def causal_directions(ctx: JobContext, config: Config, adapter: Any, data: Any, sp: Split, layers: list[int]
                      ) -> dict[tuple[str, str, int], Tensor]:
    """{(concept, method, layer): unit direction} of every causal method (DAS): trained through the model at each
    layer at the agreement target on the training texts (those with a value of the concept) and their minimal-pair
    twins flipping the concept's property (:func:`cprobe.tasks.sites.minimal_pair_training`, the reliability study's
    training), with ``axbench.params.<method>`` as its settings."""
    causal = [m for m in config.methods if declares(m, "causal")]
    if not causal:
        return {}
    ex = extract(adapter, Dataset(sp.name, tuple(sp.train), data.properties), layers, CAUSAL_POSITION, ctx.cache,
                 ctx.progress)
    for reason, n in ex.dropped.items():
        ctx.warn(f"{causal}: {n} of {len(sp.train)} training texts left out of the minimal-pair training ({reason})")
    out = {}
    for spec in config.concepts:
        prop = parse_concept(spec)[0]
        rows = torch.nonzero(labels(list(ex.dataset.examples), spec) >= 0)[:, 0].tolist()
        for layer in layers:
            through = minimal_pair_training(adapter, ex.dataset, ex, rows, layer, CAUSAL_POSITION, prop,
                                            ctx.cfg["dataset"], ctx.data_root, ctx.progress)
            h, target = through.h_source.to(adapter.device), through.target.to(adapter.device)
            for name in causal:
                method = build(name, config.params.get(name, {}), ctx.seed)
                out[spec, name, layer] = method.fit(through.forward, h, target).a.detach().float().cpu()
    return out


def token_scorer(fit: Any, X: Tensor, y_tok: Tensor, name: str = "") -> Callable[[Tensor, Tensor], Tensor]:
    """How one fitted method scores the tokens of texts, ``(H (n, T, d), mask (n, T)) -> (n, T)`` (padding 0): the
    method's own token scores where it declares ``scores_tokens`` (AxBench's SAE: its latent's activation, not
    oriented: a latent is chosen for firing on the concept); otherwise the projection on its direction (a tensor, a
    direction method's ``a``, an intervention's edit direction), oriented so that the training positives' tokens
    ``X`` (labels ``y_tok``) score higher. ``name``: the method's, for messages."""
    if getattr(fit, "scores_tokens", False):
        def own(H: Tensor, mask: Tensor) -> Tensor:
            out = torch.zeros(mask.shape, dtype=torch.float64)
            out[mask] = fit.token_scores(H[mask])
            return out
        return own
    a = (fit if isinstance(fit, Tensor) else direction_of(fit, name)).float().cpu()
    s_tok = X.double() @ a.double()
    a = orient(a, s_tok[y_tok == 1], s_tok[y_tok == 0])
    return lambda H, mask: token_scores(H, mask, a)


def score_concept(states: dict[int, Tensor], mask: Tensor, y: Tensor, train: Tensor, test: Tensor, cfg: Config,
                  seed: int, trained: dict[tuple[str, int], Tensor] | None = None) -> list[dict[str, Any]]:
    """Rows (layer, method, family, pooling, auroc) of one concept: fitted on the tokens of the ``train`` texts
    (each token's text passed to a method that ``fits_on_texts``), scored on the ``test`` texts (row indices into
    ``states``; :func:`token_scorer`); ``trained`` holds the directions found elsewhere ((method, layer) → unit
    direction: the causal ones). A method that finds no direction at a layer (e.g. LDA's weights not finite on
    near-collinear states) gets NaN there and says why in ``note``. An SAE method's rows carry its SAE's quality on the
    held-out texts' tokens (:func:`cprobe.sae.quality.held_out`)."""
    trained = trained or {}
    rows = []
    tok_train = mask[train]
    y_tok = y[train][:, None].expand_as(tok_train)[tok_train]
    texts = torch.arange(len(train))[:, None].expand_as(tok_train)[tok_train]
    for layer, H in states.items():
        X = H[train][tok_train]
        for name in cfg.methods:
            values: dict[str, list[float]] = {p: [] for p in cfg.poolings}
            fits: list[Any] = []
            try:
                fits = ([trained[name, layer]] if (name, layer) in trained else
                        fitted(name, cfg.params.get(name, {}), X, y_tok, seed, cfg.random_draws, texts=texts,
                                layer=layer))
                scorers, note = [token_scorer(f, X, y_tok, name) for f in fits], ""
            except (ValueError, IndexError, np.linalg.LinAlgError) as err:
                scorers, note = [], f"no direction: {err}"
            for score in scorers:
                s = score(H[test], mask[test])
                for p in cfg.poolings:
                    values[p].append(auroc(pool(s, mask[test], p), y[test]))
            quality = held_out(fits[0], H[test][mask[test]]) if fits else {}
            rows += [{"layer": layer, "method": name, "family": family(name), "pooling": p,
                      "auroc": float(np.mean(v)) if v else float("nan"), "draws": len(v), "note": note, **quality}
                     for p, v in values.items()]
    return rows


def run(ctx: JobContext, config: Config) -> pd.DataFrame:
    cfg = ctx.cfg
    data = ctx.dataset()
    sp = split(data, config, ctx.seed)
    y_all = checked_labels(sp, list(config.concepts))
    adapter = ctx.adapter(cfg["model"])
    layers = resolve_layers(cfg["layers"], adapter.n_layers)
    for name in config.methods:  # a loaded SAE of another width: one line before any state is read
        check = getattr(build(name, config.params.get(name, {}), ctx.seed), "check_states", None)
        if callable(check):
            check(adapter.hidden_size)
    items = model_texts(sp.train + sp.test, adapter)
    t0 = time.perf_counter()
    states, mask, truncated = token_states(ctx, adapter, items, layers, config.max_tokens, sp.name)
    ctx.timings["extract_s"] = time.perf_counter() - t0
    if truncated:
        ctx.warn(f"{truncated} of {len(items)} texts are longer than axbench.max_tokens={config.max_tokens}: "
                 "scored on their first tokens")
    t0 = time.perf_counter()
    causal = causal_directions(ctx, config, adapter, data, sp, layers)
    ctx.timings["train_causal_s"] = time.perf_counter() - t0
    n_train = len(sp.train)
    rows, t0 = [], time.perf_counter()
    for spec, y in y_all.items():
        train = torch.nonzero(y[:n_train] >= 0)[:, 0]
        held = n_train + torch.nonzero(y[n_train:] >= 0)[:, 0]
        base = {"model": adapter.name, "dataset": sp.name, "concept": spec, "n_train": len(train),
                "n_test": len(held), "n_test_positive": int((y[held] == 1).sum()),
                "n_train_tokens": int(mask[train].sum())}
        trained = {(m, layer): a for (c, m, layer), a in causal.items() if c == spec}
        for row in score_concept(states, mask, y, train, held, config, ctx.seed, trained):
            if row["note"] and row["pooling"] == config.poolings[0]:
                ctx.warn(f"{spec}, layer {row['layer']}, {row['method']}: {row['note']} (AUROC NaN)")
            rows.append({**base, **row, "method_source": provenance(row["method"])})
    ctx.timings["score_s"] = time.perf_counter() - t0
    return pd.DataFrame(rows)


def report(table: pd.DataFrame, out_dir: Path) -> None:
    """PNG: AUROC by layer, one panel per concept, a line per method (AxBench's max pooling where run)."""
    pooling = "max" if "max" in set(table["pooling"]) else str(table["pooling"].iloc[0])
    part = table[table["pooling"] == pooling]
    concepts = sorted(part["concept"].unique())
    fig, axes = plots.new_figure(len(concepts))
    for ax, concept in zip(axes, concepts):
        one = part[part["concept"] == concept]
        for (model, method), g in one.groupby(["model", "method"]):
            g = g.groupby("layer", as_index=False)["auroc"].mean()
            ax.plot(g["layer"], g["auroc"], marker="o", label=f"{model} · {method}")
        ax.axhline(0.5, color="k", ls="--", lw=1)
        ax.set(title=f"{concept} (n_test = {plots.values(one['n_test'])})", xlabel="layer (0 = embeddings)",
               ylabel="detection AUROC", ylim=(0, 1.02))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    plots.caption(fig, f"Concept detection AUROC by layer ({pooling} over tokens; dashed: chance)", property=concepts,
                  model=table["model"], data=table["dataset"], n=plots.values(part["n_test"]) + " held-out texts",
                  seed=table.get("seed"))
    plots.save(fig, out_dir / "auroc_by_layer.png")


# ----------------------------------------------------------------------------------------------- records
RECORDS = RecordSpec(
    dataset="dataset", model="model", layer="layer", read_layer=Derived(lambda t: t["layer"]), position=const("tokens"),
    method="method", family=Derived(lambda t: t["family"] if "family" in t else "direction"), setting=("pooling",),
    slice=("concept",), metrics={"auroc": "detection_auroc", **{c: c for c in HELD_OUT}},
    n={"*": "n_test", **{c: "sae_n" for c in HELD_OUT}}, where_defined=HELD_OUT)
"""The table's rows as records (:mod:`cprobe.records`): AUROC per concept (slice) × method × layer × pooling; the
family (``direction`` or ``intervention``: a table written before it had the column is all directions); an SAE
method's quality on the held-out tokens (``sae_fvu``, ``sae_l0``, ``sae_dead_fraction``; only on its rows)."""
