"""2-means clustering (CausalGym eq. 18): the direction joins the two centroids; labels unused."""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, from_numpy, to_numpy


@DIRECTIONS.register("kmeans")
class KMeans(Direction):
    """``μ_A − μ_B`` for the 2-means clusters (10 restarts, seeded as in the reference)."""

    def __init__(self, seed: int = 0, n_init: int = 10) -> None:
        self.seed, self.n_init = seed, n_init

    def fit(self, X: Tensor, y: Tensor | None = None) -> Self:
        from sklearn.cluster import KMeans as _SkKMeans  # here, not at import: scikit-learn costs seconds per process

        centers = _SkKMeans(n_clusters=2, random_state=self.seed, n_init=self.n_init).fit(to_numpy(X)).cluster_centers_
        self.a = from_numpy(centers[0] - centers[1], X)
        return self
