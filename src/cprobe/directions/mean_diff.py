"""Difference in class means (CausalGym eqs. 14–15): ``a ∝ μ₁ − μ₀``."""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit
from cprobe.stats import class_means


@DIRECTIONS.register("mean")
class MeanDirection(Direction):
    """The line between the two class centroids; positive projection points to class 1."""

    supervised = True

    def fit(self, X: Tensor, y: Tensor) -> Self:
        check_binary(X, y)
        means = class_means(X.float(), y)  # the one class-means implementation (float64), shared with mean_diff
        self.a = unit((means[1] - means[0]).float())
        return self
