"""First principal component of the activations (CausalGym eq. 17); labels are not used."""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, from_numpy, to_numpy


@DIRECTIONS.register("pca")
class PCA(Direction):
    """Top principal direction; ``n_components > 1`` averages the first c (App. C found c = 1 best)."""

    def __init__(self, n_components: int = 1) -> None:
        if n_components < 1:
            raise ValueError(f"n_components must be >= 1, got {n_components}")
        self.n_components = n_components

    def fit(self, X: Tensor, y: Tensor | None = None) -> Self:
        from sklearn.decomposition import PCA as _SkPCA  # here, not at import: scikit-learn costs seconds per process

        pca = _SkPCA(n_components=self.n_components).fit(to_numpy(X))
        self.explained_variance_ratio_ = float(pca.explained_variance_ratio_.sum())
        self.a = from_numpy(pca.components_.mean(0), X)
        return self
