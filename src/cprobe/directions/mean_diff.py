"""Difference in class means (CausalGym eqs. 14–15): ``a ∝ μ₁ − μ₀``."""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit


@DIRECTIONS.register("mean")
class MeanDirection(Direction):
    """The line between the two class centroids; positive projection points to class 1."""

    supervised = True

    def fit(self, X: Tensor, y: Tensor) -> Self:
        check_binary(X, y)
        X = X.float()
        self.a = unit(X[y == 1].mean(0) - X[y == 0].mean(0))
        return self
