"""Completeness, selectivity and reliability of an intervention (Canby et al. 2024, §3).

All scores compare oracle-probe distributions with the total-variation distance
δ(p, q) = ½ Σ|p − q|. Per-row functions take (n, k) probability tensors and return (n,)
scores; the paper's aggregate C / S is the mean over test embeddings (``nanmean`` where a
mask marked rows as not applicable).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cprobe.errors import ConfigError


def _check_probs(name: str, p: Tensor) -> None:
    if p.ndim != 2 or p.shape[1] < 2:
        raise ConfigError(f"{name} must be an (n, k) probability tensor with k >= 2, got shape {tuple(p.shape)}")


def tv_distance(p: Tensor, q: Tensor) -> Tensor:
    """Row-wise total-variation distance between two (n, k) distributions."""
    return 0.5 * (p - q).abs().sum(-1)


def counterfactual_completeness(p_hat: Tensor, z_target: Tensor) -> Tensor:
    """Eq. 1: c = 1 − δ(P̂, 1[z′]) per row.

    For one-hot goals δ = 1 − P̂(z′), so c is the oracle's probability of the target value.
    For k > 2 the paper averages c over every z′ ≠ z; callers do that by scoring one
    intervened copy per target value and averaging.
    """
    _check_probs("p_hat", p_hat)
    goal = torch.nn.functional.one_hot(z_target.to(p_hat.device), p_hat.shape[1]).to(p_hat.dtype)
    return 1.0 - tv_distance(p_hat, goal)


def nullifying_completeness(p_hat: Tensor) -> Tensor:
    """Eq. 2: c = 1 − k/(k−1) · δ(P̂, U(Z)) per row; 1 at uniform, 0 at a one-hot output.

    The k/(k−1) factor rescales δ, whose maximum against the uniform is 1 − 1/k.
    """
    _check_probs("p_hat", p_hat)
    k = p_hat.shape[1]
    uniform = torch.full_like(p_hat, 1.0 / k)
    return 1.0 - k / (k - 1) * tv_distance(p_hat, uniform)


def selectivity(p_hat: Tensor, p: Tensor, mask: Tensor | None = None) -> Tensor:
    """Eq. 3 for one non-targeted property: s = 1 − δ(P̂, P)/m, m = max(1 − min P, max P).

    ``p`` is the oracle's distribution on the original embedding and ``m`` the largest TV
    distance any P̂ can have from it, so s ∈ [0, 1]. Rows where ``mask`` is False (the
    property does not apply, e.g. Z_e = "none") get NaN so that ``nanmean`` skips them.
    """
    _check_probs("p_hat", p_hat)
    if p.shape != p_hat.shape:
        raise ConfigError(f"p_hat {tuple(p_hat.shape)} and p {tuple(p.shape)} must have the same shape")
    m = torch.maximum(1.0 - p.min(-1).values, p.max(-1).values)
    s = 1.0 - tv_distance(p_hat, p) / m
    if mask is not None:
        s = torch.where(mask.to(s.device, torch.bool), s, torch.full_like(s, float("nan")))
    return s


def reliability(completeness: float | Tensor, selectivity: float | Tensor) -> float | Tensor:
    """Harmonic mean of completeness and selectivity (the F1 analogue); 0 when both are 0."""
    c = torch.as_tensor(completeness, dtype=torch.float64)
    s = torch.as_tensor(selectivity, dtype=torch.float64)
    denom = c + s
    r = torch.where(denom > 0, 2 * c * s / torch.where(denom > 0, denom, 1.0), 0.0)
    if isinstance(completeness, Tensor) or isinstance(selectivity, Tensor):
        return r.float()
    return float(r)
