"""Completeness, selectivity and reliability of an intervention (Canby et al. 2024, §3).

All scores compare oracle-probe distributions with the total-variation distance
δ(p, q) = ½ Σ|p − q|. Per-row functions take (n, k) probability tensors and return (n,)
scores; the paper's aggregate C / S is the mean over test embeddings (``nanmean`` where a
mask marked rows as not applicable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

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


def completeness(p_hat: Tensor, z_goal: Tensor | None = None, nullifying: bool | Tensor | None = None) -> Tensor:
    """Per row, the completeness of edited states an oracle (at the edited layer or a later one) reads as ``p_hat``:
    eq. 2 where the row's edit is nullifying, else eq. 1 toward ``z_goal``. ``nullifying``: one bool (default ``z_goal
    is None``), or (n,) bools for rows of both kinds in one pass. The reliability study's and CausalGym's one scorer."""
    null = z_goal is None if nullifying is None else nullifying
    if isinstance(null, bool):
        return nullifying_completeness(p_hat) if null else counterfactual_completeness(p_hat, z_goal)
    return torch.where(null.to(p_hat.device), nullifying_completeness(p_hat), counterfactual_completeness(p_hat, z_goal))


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


def counterfactual_targets(z: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Every (row, z′ ≠ z) pair: returns (row indices, targets); for k = 2 each row once.

    Scoring the k − 1 copies of a row and averaging them is the paper's per-embedding
    average over counterfactual values (§3); every row keeps equal weight in C, S and ΔTask.
    """
    if k < 2:
        raise ConfigError(f"a counterfactual intervention needs a property with >= 2 values, got k={k}")
    rows = torch.arange(len(z)).repeat_interleave(k - 1)
    offsets = torch.arange(1, k).repeat(len(z))
    return rows, (z[rows] + offsets) % k


def aggregate_selectivity(parts: Mapping[str, Tensor]) -> tuple[float, dict[str, float]]:
    """Eq. 3 aggregated as in the paper: s(ĥ) = mean over the non-targeted properties that apply to
    that row (NaN = not applicable, e.g. Z_e = none), then S = mean over rows with at least one.

    Returns (S, per-property means). A property that applies to no row is an error, never skipped.
    """
    if not parts:
        raise ConfigError("selectivity needs at least one non-targeted property (reliability.others)")
    empty = [p for p, s in parts.items() if not torch.isfinite(s).any()]
    if empty:
        raise ConfigError(f"non-targeted propert{'ies' if len(empty) > 1 else 'y'} {empty} apply to no test row; "
                          "selectivity cannot be computed (use more data or drop them from reliability.others)")
    per_prop = {p: torch.nanmean(s.double()).item() for p, s in parts.items()}
    return torch.nanmean(selectivity_rows(parts)).item(), per_prop


def selectivity_rows(parts: Mapping[str, Tensor]) -> Tensor:
    """s(ĥ) per row: the mean over the non-targeted properties that apply to it (NaN where none does)."""
    return torch.nanmean(torch.stack([s.double() for s in parts.values()], 1), 1)


class Oracle(Protocol):
    def predict_proba(self, X: Tensor) -> Tensor: ...


def score_intervention(oracles: Mapping[str, Oracle], target: str, others: Sequence[str], X_orig: Tensor,
                       X_new: Tensor, z_goal: Tensor | None, applies: Mapping[str, Tensor],
                       task_acc_before: float | None = None, task_acc_after: float | None = None,
                       rows: dict[str, Tensor] | None = None) -> dict[str, float]:
    """Completeness, selectivity (overall and per non-targeted property), reliability and ΔTask Acc of one
    intervention, from the oracles' distributions on the original and the intervened test states.

    ``X_orig``/``X_new`` (n, d): the scored rows before and after the intervention (for a counterfactual
    method one row per (test embedding, z′) pair, ``z_goal`` (n,) holding z′; ``None`` for a nullifying one).
    ``applies[p]`` (n,) marks the rows where property p is defined. ΔTask Acc = accuracy before − after
    (Canby et al. §4: the drop in the model's own task accuracy when the intervened states are fed back).
    ``rows``, when given, receives the per-row scores C and S average: ``completeness`` and ``selectivity`` (n,),
    and each non-targeted property's ``selectivity_<p>`` (n,; NaN where p does not apply).
    """
    p_hat = oracles[target].predict_proba(X_new)
    per_row = completeness(p_hat, z_goal)
    comp = per_row.double().mean().item()
    parts = {p: selectivity(oracles[p].predict_proba(X_new), oracles[p].predict_proba(X_orig), applies[p])
             for p in others}
    sel, sel_parts = aggregate_selectivity(parts)
    if rows is not None:
        rows["completeness"] = per_row.double().cpu()
        rows["selectivity"] = selectivity_rows(parts).cpu()
        rows.update({f"selectivity_{p}": s.double().cpu() for p, s in parts.items()})
    out = {"completeness": comp, "selectivity": sel, "reliability": float(reliability(comp, sel)),
           **{f"selectivity_{p}": v for p, v in sel_parts.items()}}
    if task_acc_before is not None and task_acc_after is not None:
        out.update(task_acc_before=task_acc_before, task_acc_after=task_acc_after,
                   delta_task_acc=task_acc_before - task_acc_after)
    return out


def oracle_informative(accuracy: float, majority: float, margin: float = 0.02) -> bool:
    """Whether an oracle beats always predicting the majority class by more than ``margin``: selectivity
    measured with an oracle at chance cannot tell a selective intervention from a destructive one."""
    return accuracy > majority + margin
