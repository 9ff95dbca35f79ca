"""Prompt-based probing biases (Cao et al. 2022): every metric is an aggregation of the long prediction table.

The prediction table has one row per (model, relation, prompt, subject, mention) query with columns ``model``,
``relation``, ``prompt`` (index; 0 = the original prompt), ``subject``, ``mention`` (index; 0 = the default name),
``prediction`` (the top-1 token after stop-word skipping) and ``correct`` (bool). Definitions follow the paper and,
where it is silent, the authors' public code (causalEval):

- P@1 = 100 · #correct / #queries, per (model, relation, prompt) with the default mention; macro averages over
  relations (:func:`precision_at_1`);
- per relation over its prompts: the original prompt's P@1, worst, best, std (population, ddof 0) and diff = best −
  worst (:func:`prompt_spread`); Table 1 averages them over relations and counts relations with diff > 10
  (:func:`table1`);
- rank instability: the share of relations on which the models' ranking changes with the prompt
  (:func:`rank_instability`);
- verbalization stability: per relation (original prompt), the share of subjects with ≥ 2 mentions whose top-1
  prediction is the same for every mention; averaged over relations (:func:`verbalization_stability`);
- evaluation settings (:data:`SETTINGS`): ``original`` (prompt 0, mention 0), ``random`` (per model and relation one
  random prompt, per subject one random mention — drawn anew in every bootstrap run), ``backdoor`` (Eq. 2 with a
  uniform P(p, x): the mean over every prompt and mention; per subject over mentions, per prompt over subjects, per
  relation over prompts) and ``backdoor_sampled`` (the same over ``k_prompts`` random prompts and ``k_mentions``
  random mentions per subject);
- rank consistency (Table 4): 1000 seeded draws of ``subset`` relations; each model's score is the mean of its
  relation scores (rounded to 2 decimals as the public code does), models ranked by a stable ascending argsort; a
  model's consistency is the share of draws giving its most frequent rank, the overall consistency the share of
  draws giving the most frequent full ordering (:func:`consistency`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError

KEYS = ["model", "relation", "prompt"]


def precision_at_1(pred: pd.DataFrame, mention: int | None = 0) -> pd.DataFrame:
    """P@1 (%) per (model, relation, prompt): over subjects with mention index ``mention`` (None: every query, each
    subject weighted by its mentions' mean correctness)."""
    rows = pred if mention is None else pred[pred["mention"] == mention]
    if mention is None:  # per subject: the mean over its mentions, then the mean over subjects
        rows = rows.groupby([*KEYS, "subject"], sort=False)["correct"].mean().reset_index()
    out = rows.groupby(KEYS, sort=False)["correct"].agg(["mean", "size"]).reset_index()
    return out.assign(p1=100.0 * out["mean"]).rename(columns={"size": "n"}).drop(columns="mean")


def prompt_spread(p1: pd.DataFrame) -> pd.DataFrame:
    """Per (model, relation): ``original`` (prompt 0), ``worst``, ``best``, ``std`` (ddof 0), ``diff``, ``prompts``."""
    rows = []
    for (model, rel), g in p1.groupby(["model", "relation"], sort=False):
        v = g["p1"].to_numpy(float)
        orig = g.loc[g["prompt"] == 0, "p1"]
        rows.append({"model": model, "relation": rel, "original": float(orig.iloc[0]) if len(orig) else np.nan,
                     "worst": float(v.min()), "best": float(v.max()), "std": float(v.std(ddof=0)),
                     "diff": float(v.max() - v.min()), "prompts": len(v)})
    return pd.DataFrame(rows)


def table1(spread: pd.DataFrame, threshold: float = 10.0) -> pd.DataFrame:
    """Table 1 per model: the means over relations of LAMA (original-prompt) P@1, worst, best and std, the mean diff
    and the share (%) of relations whose diff exceeds ``threshold`` points."""
    rows = []
    for model, g in spread.groupby("model", sort=False):
        rows.append({"model": model, "lama_p1": g["original"].mean(), "worst_p1": g["worst"].mean(),
                     "best_p1": g["best"].mean(), "std": g["std"].mean(), "diff": g["diff"].mean(),
                     "diff_gt10_share": 100.0 * float((g["diff"] > threshold).mean()), "relations": len(g)})
    return pd.DataFrame(rows)


def ordering(scores: Sequence[float], decimals: int | None = 2) -> tuple[int, ...]:
    """Model indices from worst to best (stable ascending argsort of the rounded scores, as the public code)."""
    s = np.asarray(scores, dtype=float)
    if decimals is not None:
        s = np.round(s, decimals)
    return tuple(int(i) for i in np.argsort(s, kind="stable"))


def rank_instability(p1: pd.DataFrame) -> float:
    """Share (%) of relations on which the models' ordering differs between at least two prompts (needs ≥ 2
    models; relations with one prompt count as stable)."""
    models = list(dict.fromkeys(p1["model"]))
    if len(models) < 2:
        return float("nan")
    unstable = []
    for _, g in p1.groupby("relation", sort=False):
        wide = g.pivot_table(index="prompt", columns="model", values="p1")[models]
        orders = {ordering(row) for row in wide.to_numpy()}
        unstable.append(len(orders) > 1)
    return 100.0 * float(np.mean(unstable))


def verbalization_stability(pred: pd.DataFrame, prompt: int = 0) -> pd.DataFrame:
    """Per (model, relation): the share (%) of subjects with ≥ 2 mentions whose top-1 prediction (with prompt
    ``prompt``) is identical for all their mentions, and how many such subjects there are."""
    rows = pred[pred["prompt"] == prompt]
    per = rows.groupby(["model", "relation", "subject"], sort=False)["prediction"].agg(["nunique", "size"])
    per = per[per["size"] >= 2].reset_index()
    out = per.groupby(["model", "relation"], sort=False).agg(
        stability=("nunique", lambda s: 100.0 * float((s == 1).mean())), subjects=("nunique", "size"))
    return out.reset_index()


# ----------------------------------------------------------------------------- evaluation settings (Eq. 2)
@dataclass
class Cube:
    """One model's correctness on one relation as an array (prompts, subjects, mentions), NaN where a subject has
    fewer mentions; ``n_mentions`` per subject."""

    correct: np.ndarray
    n_mentions: np.ndarray


def cubes(pred: pd.DataFrame) -> dict[tuple[str, str], Cube]:
    """:class:`Cube` per (model, relation)."""
    out = {}
    for (model, rel), g in pred.groupby(["model", "relation"], sort=False):
        subjects = {s: i for i, s in enumerate(dict.fromkeys(g["subject"]))}
        n_p, n_m = int(g["prompt"].max()) + 1, int(g["mention"].max()) + 1
        arr = np.full((n_p, len(subjects), n_m), np.nan)
        arr[g["prompt"].to_numpy(), g["subject"].map(subjects).to_numpy(), g["mention"].to_numpy()] = \
            g["correct"].to_numpy(float)
        out[(model, rel)] = Cube(arr, (~np.isnan(arr[0])).sum(1))
    return out


def _original(c: Cube, rng: np.random.Generator, **_: int) -> float:
    return 100.0 * float(np.mean(c.correct[0, :, 0]))


def _backdoor(c: Cube, rng: np.random.Generator, **_: int) -> float:
    per_subject = np.nanmean(c.correct, axis=2)  # (prompts, subjects): over mentions
    return 100.0 * float(per_subject.mean(axis=1).mean())  # over subjects, then over prompts


def _random(c: Cube, rng: np.random.Generator, **_: int) -> float:
    p = int(rng.integers(c.correct.shape[0]))
    m = (rng.random(len(c.n_mentions)) * c.n_mentions).astype(int)
    return 100.0 * float(np.mean(c.correct[p, np.arange(len(m)), m]))


def _backdoor_sampled(c: Cube, rng: np.random.Generator, k_prompts: int = 3, k_mentions: int = 2) -> float:
    n_p, n_s, n_m = c.correct.shape
    prompts = rng.choice(n_p, min(k_prompts, n_p), replace=False)
    keys = rng.random((len(prompts), n_s, n_m))  # k random mentions per subject (without replacement, per prompt)
    keys[:, np.arange(n_m)[None, :] >= c.n_mentions[:, None]] = np.inf
    order = np.argsort(keys, axis=2)[:, :, :k_mentions]
    take = np.take_along_axis(c.correct[prompts], order, axis=2)
    valid = np.arange(order.shape[2])[None, None, :] < np.minimum(k_mentions, c.n_mentions)[None, :, None]
    per_subject = np.where(valid, take, 0.0).sum(2) / valid.sum(2)
    return 100.0 * float(per_subject.mean(axis=1).mean())


SETTINGS: dict[str, Callable[..., float]] = {"original": _original, "random": _random, "backdoor": _backdoor,
                                             "backdoor_sampled": _backdoor_sampled}
RANDOMISED = {"random", "backdoor_sampled"}  # re-drawn in every bootstrap run


def check_setting(name: str) -> str:
    if name not in SETTINGS:
        raise ConfigError(f"unknown evaluation setting {name!r}; choose from {sorted(SETTINGS)}")
    return name


def relation_score(c: Cube, setting: str, rng: np.random.Generator, k_prompts: int = 3, k_mentions: int = 2) -> float:
    """One model's P@1 (%) on one relation under an evaluation setting (:data:`SETTINGS`)."""
    return SETTINGS[check_setting(setting)](c, rng, k_prompts=k_prompts, k_mentions=k_mentions)


def consistency(orderings: np.ndarray) -> tuple[np.ndarray, float]:
    """Rank consistency from bootstrap orderings (runs, models: model indices worst → best): per model, the share
    (%) of runs in which it takes its most frequent rank; overall, the share of runs with the most frequent full
    ordering."""
    orderings = np.asarray(orderings)
    runs, k = orderings.shape
    ranks = np.argsort(orderings, axis=1, kind="stable")  # ranks[i, m]: position of model m in run i
    per_model = np.array([np.bincount(ranks[:, m], minlength=k).max() for m in range(k)]) * 100.0 / runs
    _, counts = np.unique(orderings, axis=0, return_counts=True)
    return per_model, 100.0 * float(counts.max()) / runs


def bootstrap_orderings(cube: dict[tuple[str, str], Cube], models: Sequence[str], relations: Sequence[str],
                        setting: str, n_samples: int = 1000, subset: int = 20, seed: int = 42,
                        k_prompts: int = 3, k_mentions: int = 2) -> np.ndarray:
    """(n_samples, models) orderings: each run draws ``subset`` relations (without replacement) and scores every
    model by the mean of its relation scores under ``setting`` (randomised settings re-drawn per run)."""
    check_setting(setting)
    if not 1 <= subset <= len(relations):
        raise ConfigError(f"rank consistency: subset {subset} must be in [1, {len(relations)}] (the relations probed)")
    rng = np.random.default_rng(seed)
    fixed = None
    if setting not in RANDOMISED:
        fixed = np.array([[relation_score(cube[(m, r)], setting, rng) for r in relations] for m in models])
    out = np.empty((n_samples, len(models)), dtype=np.int64)
    for i in range(n_samples):
        pick = rng.choice(len(relations), subset, replace=False)
        if fixed is not None:
            scores = fixed[:, pick].mean(axis=1)
        else:
            scores = np.array([np.mean([relation_score(cube[(m, relations[j])], setting, rng, k_prompts, k_mentions)
                                        for j in pick]) for m in models])
        out[i] = ordering(np.round(scores, 2))
    return out
