"""R-LACE, relaxed linear adversarial concept erasure (Ravfogel et al. 2022).

The rank-r game  min_θ max_{P ∈ 𝒫_r} Σ ℓ(z, θᵀ(I − P)x)  over orthogonal projections P of rank
r is relaxed to the Fantope F_r = {0 ⪯ P ⪯ I, tr P = r} (its convex hull): alternate an SGD
step for a linear classifier θ with an SGD ascent step on P followed by the Euclidean
projection back onto F_r. At the end of each epoch the relaxed P is rounded to the
projection onto its top-r eigenvectors and scored by how well a freshly trained linear
classifier still predicts Z; the least predictive rounding is kept.
"""

from __future__ import annotations

from typing import Literal, Self

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS, Intervention
from cprobe.interventions.inlp import (
    fit_linear_classifier,
    prepare_rank_fit,
)


def project_fantope(A: Tensor, rank: int, iters: int = 60) -> Tensor:
    """Euclidean projection of a symmetric matrix onto {0 ⪯ P ⪯ I, tr P = rank}.

    Shifts and clips the eigenvalues, λ ↦ clip(λ − θ, 0, 1), with θ found by bisection so
    that they sum to ``rank``.
    """
    lam, V = torch.linalg.eigh((A + A.T) / 2)
    lo, hi = lam.min() - 1, lam.max()
    for _ in range(iters):
        mid = (lo + hi) / 2
        over = (lam - mid).clamp(0, 1).sum() > rank
        lo = torch.where(over, mid, lo)
        hi = torch.where(over, hi, mid)
    clipped = (lam - (lo + hi) / 2).clamp(0, 1)
    return (V * clipped) @ V.T


def round_to_projection(P_relaxed: Tensor, rank: int) -> Tensor:
    """I − V Vᵀ with V the top-``rank`` eigenvectors of the relaxed P: the hard eraser."""
    _, V = torch.linalg.eigh((P_relaxed + P_relaxed.T) / 2)
    top = V[:, V.shape[1] - rank :]
    return torch.eye(P_relaxed.shape[0], device=P_relaxed.device) - top @ top.T


@INTERVENTIONS.register("rlace")
class RLACE(Intervention):
    """Nullifying: ``transform(X) = X P`` with ``P`` (d, d) an orthogonal projection of rank d − r.

    ``lr``/``weight_decay`` are shared by both players (Canby et al.: 0.005 and 1e-5).
    Stops early once the fresh probe's accuracy is within ``tol`` of the majority rate.
    After ``fit``: ``P``, ``probe_accuracy`` (fresh linear probe on X P, training split) and
    ``epochs_run``.
    """

    kind = "nullifying"

    def __init__(
        self,
        rank: int,
        lr: float = 0.005,
        weight_decay: float = 1e-5,
        epochs: int = 100,
        batch_size: int = 256,
        optimizer: Literal["sgd", "adam"] = "sgd",
        tol: float = 0.01,
        seed: int = 0,
        device: str | None = None,
    ) -> None:
        if not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"rank must be a non-negative integer, got {rank!r}")
        if lr <= 0:
            raise ConfigError(f"lr must be > 0, got {lr}")
        if weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")
        if epochs < 1 or batch_size < 1:
            raise ConfigError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
        if optimizer not in ("sgd", "adam"):
            raise ConfigError(f"unknown optimizer {optimizer!r}; choose from ['adam', 'sgd']")
        self.rank = rank
        self.lr = lr
        self.weight_decay = weight_decay
        self.epochs = epochs
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.tol = tol
        self.seed = seed
        self.device = device

    def _optim(self, params: list[Tensor]) -> torch.optim.Optimizer:
        cls = torch.optim.SGD if self.optimizer == "sgd" else torch.optim.Adam
        return cls(params, lr=self.lr, weight_decay=self.weight_decay)

    def _probe_accuracy(self, X: Tensor, z: Tensor, k: int) -> float:
        W, b = fit_linear_classifier(X, z, k, max_iter=50)
        logits = torch.addmm(b, X, W.T)
        pred = (logits[:, 0] > 0).long() if k == 2 else logits.argmax(-1)
        return (pred == z).float().mean().item()

    def fit(self, X: Tensor, z: Tensor) -> Self:
        Xd, zd, k = prepare_rank_fit(X, z, self.rank, self.device)
        (n, d), device = Xd.shape, Xd.device
        self.n_classes = k
        if self.rank == 0:
            self.P = torch.eye(d, device=device)
            self.epochs_run = 0
            self.probe_accuracy = self._probe_accuracy(Xd, zd, k)
            return self

        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        majority = torch.bincount(zd, minlength=k).max().item() / n
        clf = nn.Linear(d, k).to(device)
        with torch.no_grad():
            clf.weight.copy_(torch.randn(k, d, generator=gen) / d**0.5)
            clf.bias.zero_()
        init = torch.randn(d, d, generator=gen).to(device) * 1e-3
        P = project_fantope(init, self.rank).requires_grad_(True)
        opt_clf = self._optim(list(clf.parameters()))
        opt_P = self._optim([P])
        loss_fn = nn.CrossEntropyLoss()

        best_acc, best_P = float("inf"), None
        self.epochs_run = 0
        for _ in tqdm(range(self.epochs), desc="rlace", disable=None, leave=False):
            self.epochs_run += 1
            perm = torch.randperm(n, generator=gen).to(device)
            for idx in perm.split(self.batch_size):
                xb, zb = Xd[idx], zd[idx]
                opt_clf.zero_grad()
                loss_fn(clf(xb - xb @ P.detach()), zb).backward()
                opt_clf.step()
                opt_P.zero_grad()
                (-loss_fn(clf(xb - xb @ P), zb)).backward()
                opt_P.step()
                with torch.no_grad():
                    P.copy_(project_fantope(P, self.rank))
            with torch.no_grad():
                hard = round_to_projection(P.detach(), self.rank)
                acc = self._probe_accuracy(Xd @ hard, zd, k)
            if acc < best_acc:
                best_acc, best_P = acc, hard
            if acc - majority <= self.tol:
                break
        self.P = best_P
        self.probe_accuracy = best_acc
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        P = self.P.to(X.device)
        return (X.float() @ P).to(X.dtype)
