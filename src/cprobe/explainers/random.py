"""RandomExplainer (CEBaB's baseline): the difference of two random probability vectors, each drawn
Uniform(0, 1)^K and L1-normalised. Expected cosine error ≈ 1."""

from __future__ import annotations

from typing import Self

import numpy as np

from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries


@EXPLAINERS.register("random")
class RandomExplainer(Explainer):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        k = self.n_classes_
        a, b = rng.uniform(size=(len(queries), k)), rng.uniform(size=(len(queries), k))
        return b / b.sum(1, keepdims=True) - a / a.sum(1, keepdims=True)
