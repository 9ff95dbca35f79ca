"""Concept detection (AxBench, Wu et al. 2025): a direction's per-token concept score, pooled over a text's
tokens, ranked by the AUROC of held-out texts with the concept against texts without it.

Pure functions of tensors: the per-token score is the projection ``h_t · a`` (:func:`token_scores`), a text's score
pools its real tokens (:func:`pool`: ``max`` as AxBench, ``mean``, or the ``last`` token), and :func:`auroc` is the
Mann–Whitney form of the area under the ROC curve (ties count one half).
"""

from __future__ import annotations

import torch
from torch import Tensor

POOLINGS = ("max", "mean", "last")
"""How a text's token scores become its score: AxBench's max over tokens, their mean, or the last token's."""


def token_scores(H: Tensor, mask: Tensor, a: Tensor) -> Tensor:
    """(n, T) projections ``H[i, t] · a`` of the token states ``H`` (n, T, d) on the direction ``a`` (d,); padding
    (``mask`` False) scores 0 (:func:`pool` never reads it)."""
    s = H.double() @ a.double().to(H.device)
    return torch.where(mask.to(s.device), s, torch.zeros_like(s))


def pool(scores: Tensor, mask: Tensor, how: str) -> Tensor:
    """(n,) one score per text from its token ``scores`` (n, T) over its real tokens ``mask`` (n, T; every row has
    one): ``max`` (AxBench), ``mean``, or ``last`` (the last real token's)."""
    if how not in POOLINGS:
        raise ValueError(f"unknown pooling {how!r}; choose from {list(POOLINGS)}")
    mask = mask.to(scores.device).bool()
    if not bool(mask.any(1).all()):
        raise ValueError("a text has no token to pool")
    if how == "max":
        return torch.where(mask, scores, torch.full_like(scores, -torch.inf)).amax(1)
    if how == "mean":
        return (scores * mask).sum(1) / mask.sum(1)
    last = mask.long().cumsum(1).argmax(1)  # the first index reaching the row's count: its last real token
    return scores.gather(1, last[:, None])[:, 0]


def auroc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve of ``scores`` (n,) for binary ``labels`` (n,; 1 = the concept): the probability that
    a positive text outscores a negative one, a tie counting one half — (mean rank of the positives − (n₊ + 1)/2)
    / n₋ with average ranks (Mann–Whitney U / (n₊ n₋)); scikit-learn's ``roc_auc_score``."""
    y = labels.bool().cpu()
    s = scores.double().cpu()
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUROC needs both classes, got {n_pos} positive and {n_neg} negative")
    order = torch.argsort(s, stable=True)
    sorted_s = s[order]
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts + 1  # the first rank of each run of ties
    average = first.to(s.dtype) + (counts.to(s.dtype) - 1) / 2
    ranks = torch.empty_like(s)
    ranks[order] = average[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auroc_columns(scores: Tensor, labels: Tensor) -> Tensor:
    """(m,) float64: :func:`auroc` of every column of ``scores`` (n, m) against the binary ``labels`` (n,), at once
    (AxBench's latent selection scores every SAE latent so). Each entry's average rank is the number of smaller entries
    of its column plus (ties + 1) / 2 (``searchsorted`` of the sorted column), the Mann–Whitney form of
    :func:`auroc`."""
    y = labels.bool().cpu()
    s = scores.double().cpu()
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUROC needs both classes, got {n_pos} positive and {n_neg} negative")
    cols = s.T.contiguous()  # (m, n)
    ordered = cols.sort(1).values
    below = torch.searchsorted(ordered, cols, right=False)
    upto = torch.searchsorted(ordered, cols, right=True)
    ranks = below.double() + (upto - below + 1).double() / 2  # 1-based average ranks
    return (ranks[:, y].sum(1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def orient(a: Tensor, scores_pos: Tensor, scores_neg: Tensor) -> Tensor:
    """``a`` pointing to the concept: flipped when the training positives' mean score (``scores_pos``) is below the
    negatives' — a direction's sign is arbitrary for the unsupervised methods (PCA, k-means, a random draw)."""
    return -a if float(scores_pos.double().mean()) < float(scores_neg.double().mean()) else a
