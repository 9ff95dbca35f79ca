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
  (:func:`rank_instability`; the paper ranks 4 models: :func:`rank_instability_k` averages over every k-model subset);
- verbalization stability: per relation (original prompt), the share of subjects with ≥ 2 mentions whose top-1
  prediction is the same for every mention; averaged over relations (:func:`verbalization_stability`);
- evaluation settings (:data:`SETTINGS`) score one model on one relation: ``original`` (prompt 0, mention 0),
  ``random`` (one random prompt, one random mention per subject — drawn anew for every model in every bootstrap run),
  ``backdoor`` (Eq. 2 with a uniform P(p, x): per subject the mean over its mentions, per prompt the mean over
  subjects, per relation the mean over prompts) and ``backdoor_sampled`` (the same over ``k_prompts`` random prompts
  and ``k_mentions`` random mentions per subject, redrawn like ``random``). As the public code, a prompt's P@1 is
  rounded to 2 decimals before it is averaged over prompts;
- rank consistency (Table 4): ``n_samples`` draws of ``subset`` relations without replacement (:func:`draw_subsets`),
  **the same draws for every setting** (as the public code); each model's score in a draw is the mean of its relation
  scores rounded to 2 decimals (:func:`bootstrap_scores`); models are ordered by a stable ascending argsort, so tied
  models keep the models' order (:func:`orderings`); a model's consistency is the share of draws giving its most
  frequent rank, the overall consistency the share of draws giving the most frequent full ordering
  (:func:`consistency`). Because ties are broken by model order and "overall" hinges on the closest pair, the ties
  (:func:`ties`) and every pair's gap and flip rate (:func:`pair_stats`) are reported beside it.

Randomised settings are vectorised over draws, models and relations (:func:`sampled_relation_scores`); their random
numbers come in a fixed order from two generators seeded by (seed, setting), so a plain loop over draws, models and
relations reading the same streams gives the same numbers (``tests/unit/test_prompt_bias_metrics.py``).
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cprobe.errors import ConfigError, DataError

KEYS = ["model", "relation", "prompt"]
DECIMALS = 2  # the public code rounds every P@1 (per prompt, and a draw's mean over relations) to 2 decimals
_BUDGET = 4_000_000  # random keys per chunk of draws (memory: ~8 bytes each, a few arrays of that size)


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
    return pd.DataFrame([{"model": model, "lama_p1": g["original"].mean(), "worst_p1": g["worst"].mean(),
                          "best_p1": g["best"].mean(), "std": g["std"].mean(), "diff": g["diff"].mean(),
                          "diff_gt10_share": 100.0 * float((g["diff"] > threshold).mean()), "relations": len(g)}
                         for model, g in spread.groupby("model", sort=False)])


def ordering(scores: Sequence[float], decimals: int | None = DECIMALS) -> tuple[int, ...]:
    """Model indices from worst to best (stable ascending argsort of the rounded scores, as the public code)."""
    s = np.asarray(scores, dtype=float)
    if decimals is not None:
        s = np.round(s, decimals)
    return tuple(int(i) for i in np.argsort(s, kind="stable"))


def rank_instability(p1: pd.DataFrame, models: Sequence[str] | None = None) -> float:
    """Share (%) of relations on which the ordering of ``models`` (default: every model in ``p1``) differs between at
    least two prompts (needs ≥ 2 models; relations with one prompt count as stable). Prompt P@1 is rounded to 2
    decimals and ties keep the models' order, as everywhere in the public code."""
    models = list(dict.fromkeys(p1["model"])) if models is None else list(models)
    if len(models) < 2:
        return float("nan")
    unstable = []
    for _, g in p1[p1["model"].isin(models)].groupby("relation", sort=False):
        wide = g.pivot_table(index="prompt", columns="model", values="p1")[models]
        orders = {ordering(row) for row in wide.to_numpy()}
        unstable.append(len(orders) > 1)
    return 100.0 * float(np.mean(unstable))


def rank_instability_k(p1: pd.DataFrame, k: int, max_subsets: int = 5000) -> tuple[float, int]:
    """Rank instability of ``k`` models (the paper ranks 4): the mean of :func:`rank_instability` over every k-model
    subset of the models in ``p1`` (``k`` ≥ their number: all of them) and how many subsets that is. More than
    ``max_subsets`` subsets is refused (a ConfigError), not silently sampled."""
    models = list(dict.fromkeys(p1["model"]))
    if k < 2:
        raise ConfigError(f"rank instability needs at least 2 models per ranking, got {k}")
    if k >= len(models):
        return rank_instability(p1, models), 1
    n = math.comb(len(models), k)
    if n > max_subsets:
        raise ConfigError(f"rank instability over {k} of {len(models)} models is {n} subsets (> {max_subsets}); "
                          "list the models instead")
    # per relation: a (prompts, models) matrix of rounded P@1; a subset's ordering per prompt
    wide = {r: np.round(g.pivot_table(index="prompt", columns="model", values="p1")[models].to_numpy(float),
                        DECIMALS) for r, g in p1.groupby("relation", sort=False)}
    values = []
    for subset in itertools.combinations(range(len(models)), k):
        cols = list(subset)
        unstable = [len({tuple(np.argsort(row, kind="stable")) for row in w[:, cols]}) > 1 for w in wide.values()]
        values.append(100.0 * float(np.mean(unstable)))
    return float(np.mean(values)), n


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
@dataclass(frozen=True)
class Stack:
    """Every model's correctness on every relation as one padded array.

    ``correct[m, r, p, s, x]``: 1 when model ``m`` answers relation ``r``'s prompt ``p`` with subject ``s``'s mention
    ``x`` correctly, else 0 (also where padded: a relation with fewer prompts or subjects, a subject with fewer
    mentions). ``n_prompts`` (relations,), ``n_subjects`` (relations,), ``n_mentions`` (relations, subjects; 0 for
    padding) say what is real."""

    models: tuple[str, ...]
    relations: tuple[str, ...]
    correct: np.ndarray
    n_prompts: np.ndarray
    n_subjects: np.ndarray
    n_mentions: np.ndarray

    @property
    def scale(self) -> int:
        """lcm(1..max mentions): a subject's mean over k of its mentions is an integer count × scale / k / scale."""
        return math.lcm(*range(1, self.correct.shape[4] + 1))


def stack(pred: pd.DataFrame, models: Sequence[str] | None = None) -> Stack:
    """The :class:`Stack` of a prediction table (models in ``models`` order, default: the table's; relations and
    subjects in the table's order). Every model must have answered the same queries."""
    models = list(dict.fromkeys(pred["model"])) if models is None else list(models)
    relations = list(dict.fromkeys(pred["relation"]))
    pred = pred[pred["model"].isin(models)]
    subjects = pred.loc[pred["model"] == models[0], ["relation", "subject"]].drop_duplicates()
    within = subjects.groupby("relation", sort=False).cumcount().to_numpy()  # a subject's index in its relation
    at = pd.MultiIndex.from_frame(subjects).get_indexer(pd.MultiIndex.from_frame(pred[["relation", "subject"]]))
    n_r = len(relations)
    n_p = int(pred["prompt"].max()) + 1
    n_s = int(within.max()) + 1
    n_x = int(pred["mention"].max()) + 1
    r_idx = pd.Categorical(pred["relation"], categories=relations).codes.astype(np.int64)
    s_idx = np.where(at >= 0, within[at], -1).astype(np.int64)
    m_idx = pd.Categorical(pred["model"], categories=models).codes.astype(np.int64)
    if (s_idx < 0).any():
        raise DataError("the models in the prediction table were not asked the same queries")
    p_idx, x_idx = pred["prompt"].to_numpy(np.int64), pred["mention"].to_numpy(np.int64)
    correct = np.zeros((len(models), n_r, n_p, n_s, n_x), dtype=np.int8)
    correct[m_idx, r_idx, p_idx, s_idx, x_idx] = pred["correct"].to_numpy(bool)
    seen = np.zeros(correct.shape[1:], dtype=np.int32)
    np.add.at(seen, (r_idx[m_idx == 0], p_idx[m_idx == 0], s_idx[m_idx == 0], x_idx[m_idx == 0]), 1)
    n_prompts = (seen.sum(axis=(2, 3)) > 0).sum(axis=1)
    n_mentions = (seen[:, 0] > 0).sum(axis=2)
    n_subjects = (n_mentions > 0).sum(axis=1)
    counts = np.bincount(m_idx, minlength=len(models))
    if (counts != counts[0]).any():
        raise DataError("the models in the prediction table were not asked the same queries "
                        f"({dict(zip(models, counts.tolist()))})")
    return Stack(tuple(models), tuple(relations), correct, n_prompts, n_subjects, n_mentions)


def _prompt_p1(scaled_hits: np.ndarray, stack_: Stack, axis_relation: int = -2) -> np.ndarray:
    """P@1 (%) rounded to 2 decimals from integer hit counts scaled by ``stack_.scale`` (exact until the division)."""
    shape = [1] * scaled_hits.ndim
    shape[axis_relation] = len(stack_.relations)
    denom = (stack_.scale * np.maximum(stack_.n_subjects, 1)).reshape(shape)
    return np.round(100.0 * scaled_hits / denom, DECIMALS)


def _original(st: Stack) -> np.ndarray:
    hits = st.correct[:, :, 0, :, 0].astype(np.int64).sum(-1) * st.scale  # (models, relations)
    return _prompt_p1(hits, st, axis_relation=-1)


def _backdoor(st: Stack) -> np.ndarray:
    weight = np.where(st.n_mentions > 0, st.scale // np.maximum(st.n_mentions, 1), 0)  # (relations, subjects)
    hits = (st.correct.astype(np.int64).sum(-1) * weight[:, None, :]).sum(-1)  # (models, relations, prompts)
    p = _prompt_p1(hits, st, axis_relation=-2)
    valid = np.arange(p.shape[-1]) < st.n_prompts[:, None]
    return np.where(valid, p, 0.0).sum(-1) / st.n_prompts


FIXED: dict[str, Callable[[Stack], np.ndarray]] = {"original": _original, "backdoor": _backdoor}
SAMPLED: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "random": lambda k_prompts, k_mentions: (1, 1),  # one prompt, one mention per subject
    "backdoor_sampled": lambda k_prompts, k_mentions: (k_prompts, k_mentions)}
SETTINGS = (*FIXED, *SAMPLED)


def check_setting(name: str) -> str:
    if name not in SETTINGS:
        raise ConfigError(f"unknown evaluation setting {name!r}; choose from {sorted(SETTINGS)}")
    return name


def relation_scores(st: Stack, setting: str) -> np.ndarray:
    """(models, relations) scores of a fixed setting (``original``, ``backdoor``)."""
    if check_setting(setting) not in FIXED:
        raise ConfigError(f"setting {setting!r} is randomised: use sampled_relation_scores")
    return FIXED[setting](st)


def setting_streams(seed: int, setting: str) -> tuple[np.random.Generator, np.random.Generator]:
    """The two generators of a randomised setting: prompt keys, mention keys (independent of the relation draws)."""
    tag = zlib.crc32(setting.encode())
    return np.random.default_rng([seed, tag, 1]), np.random.default_rng([seed, tag, 2])


def _subset_masks(n_x: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a subject with n = 1..``n_x`` mentions: its ``min(k, n)``-mention subsets as bit masks, in lexicographic
    order (``masks[offset[n] + i]``, ``i < count[n]``); n = 0 (a padding subject) gets one empty mask."""
    masks, offset, count = [0], np.zeros(n_x + 1, np.int64), np.ones(n_x + 1, np.int64)
    for n in range(1, n_x + 1):
        combos = list(itertools.combinations(range(n), min(k, n)))
        offset[n], count[n] = len(masks), len(combos)
        masks += [sum(1 << i for i in c) for c in combos]
    return np.array(masks, np.int64), offset, count


def _popcount(x: np.ndarray, bits: int) -> np.ndarray:
    """Set bits per element (numpy >= 2's ``bitwise_count``, else a loop over the ``bits`` low bits)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    return sum((x >> b) & 1 for b in range(bits))


def sampled_relation_scores(st: Stack, n_draws: int, k_prompts: int, k_mentions: int,
                            prompt_rng: np.random.Generator, mention_rng: np.random.Generator) -> np.ndarray:
    """(draws, models, relations) scores with ``k_prompts`` random prompts per relation and ``k_mentions`` random
    mentions per subject (each without replacement; fewer when a relation or subject has fewer), drawn anew for every
    draw and model. Per draw, ``prompt_rng.random((models, relations, max_prompts))`` are the prompts' keys (the
    ``k_prompts`` smallest are taken, in key order) and ``mention_rng.random((models, relations, k_prompts,
    max_subjects))`` one number u per subject and taken prompt: of the C(n, k) sets of k of its n mentions (in
    lexicographic order), the ⌊u · C(n, k)⌋-th — a uniform draw without replacement. A prompt's P@1 is rounded to 2
    decimals; the score is the mean over the taken prompts."""
    n_m, n_r, n_p, n_s, n_x = st.correct.shape
    kp = min(k_prompts, n_p)
    if n_x > 30:
        raise DataError(f"at most 30 mentions per subject, got {n_x} (dataset.max_mentions)")
    masks, offset, count = _subset_masks(n_x, k_mentions)
    dtype = np.uint8 if n_x <= 8 else np.int64
    masks = masks.astype(dtype)
    kx_eff = np.minimum(k_mentions, st.n_mentions)  # (relations, subjects)
    weight = np.where(kx_eff > 0, st.scale // np.maximum(kx_eff, 1), 0)  # (relations, subjects)
    bad_prompt = np.arange(n_p)[None, :] >= st.n_prompts[:, None]  # (relations, prompts)
    kp_eff = np.minimum(k_prompts, st.n_prompts)  # (relations,)
    prompt_ok = np.arange(kp)[None, :] < kp_eff[:, None]  # (relations, kp)
    bits = (st.correct.astype(np.int64) << np.arange(n_x)).sum(-1).astype(dtype)  # (models, relations, prompts, subj)
    first, size = offset[st.n_mentions], count[st.n_mentions]  # (relations, subjects)
    out = np.empty((n_draws, n_m, n_r))
    step = max(1, _BUDGET // max(1, n_m * n_r * max(n_p, kp * n_s)))
    for start in range(0, n_draws, step):
        n = min(step, n_draws - start)
        pk = prompt_rng.random((n, n_m, n_r, n_p))
        pk[:, :, bad_prompt] = np.inf
        chosen = np.argsort(pk, axis=-1, kind="stable")[..., :kp]  # (n, models, relations, kp)
        u = mention_rng.random((n, n_m, n_r, kp, n_s))
        taken = masks[first[:, None] + (u * size[:, None]).astype(np.int64)]  # (n, models, relations, kp, subjects)
        both = np.take_along_axis(bits[None], chosen[..., None], axis=3) & taken
        hits = _popcount(both, n_x)
        scaled = (hits.astype(np.int64) * weight[:, None, :]).sum(-1)  # (n, models, relations, kp)
        p = _prompt_p1(scaled, st, axis_relation=-2)
        out[start:start + n] = np.where(prompt_ok, p, 0.0).sum(-1) / kp_eff
    return out


def draw_subsets(n_relations: int, subset: int, n_samples: int, seed: int) -> np.ndarray:
    """(n_samples, subset) relation indices: each row ``subset`` distinct relations (without replacement, in random
    order), seeded — one set of draws shared by every evaluation setting, as the public code."""
    if not 1 <= subset <= n_relations:
        raise ConfigError(f"rank consistency: subset {subset} must be in [1, {n_relations}] (the relations probed)")
    keys = np.random.default_rng(seed).random((n_samples, n_relations))
    return np.argsort(keys, axis=1, kind="stable")[:, :subset]


def bootstrap_scores(st: Stack, setting: str, picks: np.ndarray, seed: int = 42, k_prompts: int = 3,
                     k_mentions: int = 2) -> np.ndarray:
    """(n_samples, models) scores: per draw (a row of ``picks``), each model's mean relation score over the drawn
    relations under ``setting``, rounded to 2 decimals (randomised settings redrawn for every draw)."""
    check_setting(setting)
    if setting in FIXED:
        per = np.broadcast_to(relation_scores(st, setting)[None], (len(picks), len(st.models), len(st.relations)))
    else:
        kp, kx = SAMPLED[setting](k_prompts, k_mentions)
        per = sampled_relation_scores(st, len(picks), kp, kx, *setting_streams(seed, setting))
    drawn = np.take_along_axis(per, np.broadcast_to(picks[:, None, :], (len(picks), per.shape[1], picks.shape[1])),
                               axis=2)
    return np.round(drawn.mean(-1), DECIMALS)


def orderings(scores: np.ndarray) -> np.ndarray:
    """(n_samples, models) model indices worst → best per draw: a stable ascending argsort (ties keep model order)."""
    return np.argsort(np.asarray(scores), axis=1, kind="stable")


def bootstrap_orderings(st: Stack, setting: str, n_samples: int = 1000, subset: int = 20, seed: int = 42,
                        k_prompts: int = 3, k_mentions: int = 2) -> np.ndarray:
    """:func:`orderings` of :func:`bootstrap_scores` over :func:`draw_subsets` (one setting, its own draws)."""
    picks = draw_subsets(len(st.relations), subset, n_samples, seed)
    return orderings(bootstrap_scores(st, setting, picks, seed, k_prompts, k_mentions))


def consistency(orderings_: np.ndarray) -> tuple[np.ndarray, float]:
    """Rank consistency from bootstrap orderings (runs, models: model indices worst → best): per model, the share
    (%) of runs in which it takes its most frequent rank; overall, the share of runs with the most frequent full
    ordering."""
    orderings_ = np.asarray(orderings_)
    runs, k = orderings_.shape
    ranks = np.argsort(orderings_, axis=1, kind="stable")  # ranks[i, m]: position of model m in run i
    per_model = np.array([np.bincount(ranks[:, m], minlength=k).max() for m in range(k)]) * 100.0 / runs
    _, counts = np.unique(orderings_, axis=0, return_counts=True)
    return per_model, 100.0 * float(counts.max()) / runs


def ties(scores: np.ndarray) -> tuple[np.ndarray, float]:
    """Per model, the share (%) of draws in which its (rounded) score equals another model's — its rank there comes
    from the models' order, not from its score — and the share of draws with any tie."""
    s = np.asarray(scores)
    equal = s[:, :, None] == s[:, None, :]
    tied = (equal.sum(-1) > 1)  # (draws, models): equal to someone besides itself
    return 100.0 * tied.mean(0), 100.0 * float(tied.any(1).mean())


def pair_stats(scores: np.ndarray, models: Sequence[str]) -> pd.DataFrame:
    """Every model pair (a before b in the models' order): the mean score gap b − a over draws (points), the share
    (%) of draws in which they tie, and the share in which their order is the less frequent one (the flips that keep
    overall consistency below 100%). Sorted by the absolute gap: the first row is the closest pair."""
    s = np.asarray(scores)
    rows = []
    for a, b in itertools.combinations(range(len(models)), 2):
        below = s[:, a] <= s[:, b]  # a ranks below b (a tie keeps the models' order: a first)
        rows.append({"model_a": models[a], "model_b": models[b], "gap": float((s[:, b] - s[:, a]).mean()),
                     "tied": 100.0 * float((s[:, a] == s[:, b]).mean()),
                     "flips": 100.0 * float(min(below.mean(), 1.0 - below.mean()))})
    out = pd.DataFrame(rows, columns=["model_a", "model_b", "gap", "tied", "flips"])
    return out.iloc[np.argsort(out["gap"].abs().to_numpy(), kind="stable")].reset_index(drop=True)
