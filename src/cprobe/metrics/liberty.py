"""LIBERTy's scores of concept-effect explanations (Toker et al. 2026, §5 / Defs. 3–4, §7.2–7.3).

Inputs are row-aligned arrays over the counterfactual pairs: the true effects ``icace`` (n, K) = f(x̃) − f(x), an
explainer's estimates ``estimate`` (n, K), and per pair its ``example`` (the base text) and ``change`` (a label of
c⃗ = (C, c, c′), e.g. ``"education: Bachelor's→Master's"``) and ``concept``.

- **ED** (Def. 3): ED̄ = mean over changes c⃗ of the mean over D_c⃗ of dist(ICaCE, M) — per distance
  (:mod:`cprobe.metrics.icace`: l2, cosine, normdiff); the reported ED is the mean of the three.
- **Local order-faithfulness** (Def. 4): for two changes of the *same* example,
  OF = (1/K) Σ_y 1[sgn(ICaCE₁ − ICaCE₂)_y = sgn(M₁ − M₂)_y]; OF̄ averages, over every ordered pair of changes
  (c⃗₁ ≠ c⃗₂) that share at least one example, the mean OF over their shared examples (pairs of changes sharing no
  example are skipped: the printed formula would divide by zero). sgn(0) = 0 matches only 0 (a tie agrees only with
  a tie).
- **Global importance** of a concept (§7.2): Σ_y |CaCE_y(c⃗)| with CaCE(c⃗) the mean effect over D_c⃗, averaged over
  the concept's changes — from true effects (gold) or from an explainer's estimates.
- **Global OF**: the share of unordered concept pairs that a method orders like the gold importances
  (sgn of the two differences equal; ties as above) — the reading under which every Table 16 value is k/21 or k/28.
- **Sensitivity** (§7.3): the mean over a concept's pairs of Σ_y |ICaCE_y|.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from cprobe.metrics.icace import distance


def _frame(values: np.ndarray, **cols: Sequence) -> pd.DataFrame:
    f = pd.DataFrame({k: list(v) for k, v in cols.items()})
    f["value"] = values
    return f


def error_distance(icace: ArrayLike, estimate: ArrayLike, change: Sequence[str], dist: str = "l2") -> float:
    """ED̄ for one distance: the mean over changes of the mean per-pair distance within the change."""
    d = distance(dist)(icace, estimate)
    return float(_frame(d, change=change).groupby("change")["value"].mean().mean())


def sign_agreement(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """Row-wise share of entries whose signs agree, (n, K) × (n, K) → (n,) (Def. 4's sign(a; b))."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    return (np.sign(a) == np.sign(b)).mean(axis=1)


def order_faithfulness(icace: ArrayLike, estimate: ArrayLike, example: Sequence[str], change: Sequence[str]) -> float:
    """OF̄ (Def. 4) over ordered pairs of distinct changes sharing examples; NaN when no two changes share one."""
    icace, estimate = np.asarray(icace, dtype=np.float64), np.asarray(estimate, dtype=np.float64)
    frame = pd.DataFrame({"example": list(example), "change": list(change)})
    per_pair: dict[tuple[str, str], list[float]] = {}
    for _, g in frame.groupby("example", sort=False):
        rows = g.index.to_numpy()
        for i in rows:
            for j in rows:
                if i == j or frame["change"][i] == frame["change"][j]:
                    continue
                of = sign_agreement(icace[i] - icace[j], estimate[i] - estimate[j])[0]
                per_pair.setdefault((frame["change"][i], frame["change"][j]), []).append(float(of))
    if not per_pair:
        return float("nan")
    return float(np.mean([np.mean(v) for v in per_pair.values()]))


def importance(effects: ArrayLike, concept: Sequence[str], change: Sequence[str]) -> dict[str, float]:
    """Per concept: the mean over its changes c⃗ of Σ_y |mean_{D_c⃗} effect_y| (global importance, §7.2)."""
    e = np.asarray(effects, dtype=np.float64)
    frame = pd.DataFrame({"concept": list(concept), "change": list(change)})
    out: dict[str, float] = {}
    for c, g in frame.groupby("concept", sort=False):
        per_change = [np.abs(e[gc.index.to_numpy()].mean(0)).sum() for _, gc in g.groupby("change", sort=False)]
        out[c] = float(np.mean(per_change))
    return out


def global_order_faithfulness(gold: Mapping[str, float], method: Mapping[str, float]) -> float:
    """Share of unordered concept pairs ordered alike by ``method`` and ``gold`` (concordance; ties agree only
    with ties). 1 for the gold ranking itself, 0 for its reverse (without ties)."""
    concepts = [c for c in gold if c in method]
    pairs = list(combinations(concepts, 2))
    if not pairs:
        return float("nan")
    agree = [np.sign(gold[a] - gold[b]) == np.sign(method[a] - method[b]) for a, b in pairs]
    return float(np.mean(agree))


def sensitivity(icace: ArrayLike, concept: Sequence[str]) -> dict[str, float]:
    """Per concept: the mean over its pairs of Σ_y |ICaCE_y| (∈ [0, 2] for probability vectors)."""
    s = np.abs(np.asarray(icace, dtype=np.float64)).sum(axis=1)
    return {c: float(g["value"].mean()) for c, g in _frame(s, concept=concept).groupby("concept", sort=False)}


def top(scores: Mapping[str, float], k: int = 3) -> list[str]:
    """The ``k`` highest-scoring concepts (ties broken by name)."""
    return [c for c, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]
