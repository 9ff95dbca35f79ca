"""SpectralEraser: remove the top-k directions of the between-class scatter (a nullifying intervention)."""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.plugin import DataError, Intervention


class SpectralEraser(Intervention):
    """Nullifying. ``fit`` computes the between-class scatter B = Σ_c n_c (μ_c − μ)(μ_c − μ)ᵀ of the states and
    keeps its top-``k`` eigenvectors U (those with a non-negligible eigenvalue: at most k − 1 for k classes);
    ``transform(X) = X − (X − μ) U Uᵀ`` projects them out around the mean (the mean is kept). With one direction
    (a binary property, or ``k=1``) the edit is along ``edit_direction()``."""

    kind = "nullifying"
    exposes_direction = True

    def __init__(self, k: int = 1, tol: float = 1e-6) -> None:
        if not (isinstance(k, int) and k >= 1):
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        self.k, self.tol = k, tol

    def fit(self, X: Tensor, z: Tensor) -> Self:
        Xd, z = X.detach().double(), z.long()
        classes = torch.unique(z)
        if len(classes) < 2:
            raise DataError(f"SpectralEraser needs at least two classes among the labels, got {classes.tolist()}")
        mu = Xd.mean(0)
        B = torch.zeros(X.shape[1], X.shape[1], dtype=torch.float64)
        for c in classes:
            d = Xd[z == c].mean(0) - mu
            B += int((z == c).sum()) * torch.outer(d, d)
        vals, vecs = torch.linalg.eigh(B)  # ascending
        keep = vals.flip(0)[: self.k] > self.tol * float(vals.max())
        self.U_ = vecs.flip(1)[:, : self.k][:, keep]
        self.mean_ = mu
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        U, mu = self.U_.to(X.device), self.mean_.to(X.device)
        Xd = X.double()
        return (Xd - ((Xd - mu) @ U) @ U.T).to(X.dtype)

    def edit_direction(self) -> Tensor | None:
        self.check_fitted()
        return self.U_[:, 0].float() if self.U_.shape[1] == 1 else None
