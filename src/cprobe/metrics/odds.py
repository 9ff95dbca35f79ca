"""CausalGym's causal-efficacy metrics (Arora et al. 2024, eqs. 9, 10, 19 and §5.2).

Per item e = (b, s, y_b, y_s), with p the clean model and p* the model under intervention:

    Odds = [log p(y_b|b) − log p(y_s|b)] + [log p*(y_s|b,s) − log p*(y_b|b,s)]

(natural log over the full vocabulary). 0 means no effect; it can be negative. AvgOdds is
its mean over the eval set for one site (layer l, region r). Over a (layers × regions) table
of AvgOdds, OverallOdds = mean over layers of the max over regions, and selectivity applies
the same aggregation to the per-site difference task − control (" dog"/" give" labels).
Region cells that are not sites (empty region, or before the label region) are NaN.

Erasers (cprobe, beyond the paper) have no source to move toward; they are scored by how far they move the
clean log-odds m = log p(y_b|b) − log p(y_s|b) toward 0 (indifference between the two labels): per item
``erasure = |m| − |m*|`` (m* the same log-odds under the intervention; nats), and over a set of items
``erased_fraction = 1 − Σ|m*| / Σ|m|`` (1: indifferent everywhere, 0: unchanged).
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor


def log_odds_ratio(base_yb: Tensor, base_ys: Tensor, int_yb: Tensor, int_ys: Tensor) -> Tensor:
    """Per-item log odds-ratio from the four label log-probs (clean b; intervened b←s)."""
    return (base_yb - base_ys) + (int_ys - int_yb)


def avg_odds(base_yb: Tensor, base_ys: Tensor, int_yb: Tensor, int_ys: Tensor) -> float:
    """AvgOdds (eq. 10): the mean per-item log odds-ratio over the eval set."""
    return float(log_odds_ratio(base_yb, base_ys, int_yb, int_ys).mean())


def task_accuracy(base_yb: Tensor, base_ys: Tensor) -> float:
    """Fraction of items where the clean model prefers the base label, p(y_b|b) > p(y_s|b) (the one definition:
    :func:`cprobe.models.readouts.task_accuracy` with the base label as the correct candidate)."""
    from cprobe.models.readouts import task_accuracy as accuracy

    return float(accuracy(torch.stack([base_yb, base_ys], 1)))  # type: ignore[arg-type]


def iia(int_yb: Tensor, int_ys: Tensor) -> float:
    """Interchange-intervention accuracy: the intervened model prefers the source label."""
    return float((int_ys > int_yb).float().mean())


def erasure(base_yb: Tensor, base_ys: Tensor, int_yb: Tensor, int_ys: Tensor) -> Tensor:
    """Per item, how far an edit moved the log-odds toward 0: ``|m| − |m*|`` with m = log p(y_b|b) − log p(y_s|b)
    on the clean run and m* the same under the intervention (nats). ``|m|`` when the edit leaves the model
    indifferent, 0 when it leaves |m| unchanged (or flips m to −m: overshooting is not erasing), negative when it
    makes the model more decided."""
    return (base_yb - base_ys).abs() - (int_yb - int_ys).abs()


def erased_fraction(base_yb: Tensor, base_ys: Tensor, int_yb: Tensor, int_ys: Tensor) -> float:
    """The fraction of the clean |log-odds| an edit removed over a set of items: ``1 − Σ|m*| / Σ|m|`` (1: the
    model indifferent on every item, 0: as decided as before, < 0: more decided); NaN when Σ|m| = 0."""
    before = float((base_yb - base_ys).abs().sum())
    after = float((int_yb - int_ys).abs().sum())
    return 1.0 - after / before if before > 0 else float("nan")


def overall_odds(table: ArrayLike | Tensor) -> float:
    """Eq. 19: mean over layers (rows) of the max over regions (columns), NaN cells skipped."""
    arr = _as_array(table)
    if arr.ndim != 2 or np.isnan(arr).all(axis=1).any():
        raise ValueError("expected a (layers, regions) table with at least one site per layer")
    return float(np.nanmax(arr, axis=1).mean())


def control_selectivity(task: ArrayLike | Tensor, control: ArrayLike | Tensor) -> float:
    """§5.2: overall odds of the per-site difference task − control (not a difference of overalls)."""
    t, c = _as_array(task), _as_array(control)
    if t.shape != c.shape:
        raise ValueError(f"task and control tables differ in shape: {t.shape} vs {c.shape}")
    return overall_odds(t - c)


def _as_array(x: ArrayLike | Tensor) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)
