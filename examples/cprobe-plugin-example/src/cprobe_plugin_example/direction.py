"""TrimmedMeanDirection: the difference of the two classes' trimmed means, as a unit direction."""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.plugin import Direction, unit


class TrimmedMeanDirection(Direction):
    """Supervised: ``a ∝ tmean(X[y = 1]) − tmean(X[y = 0])``, each coordinate's mean taken after dropping the
    ``trim`` share of the lowest and of the highest values (a robust mean-difference direction)."""

    supervised = True

    def __init__(self, trim: float = 0.1) -> None:
        if not 0.0 <= trim < 0.5:
            raise ValueError(f"trim must be in [0, 0.5), got {trim!r}")
        self.trim = trim

    def fit(self, X: Tensor, y: Tensor) -> Self:
        if set(torch.unique(y).tolist()) != {0, 1}:
            raise ValueError(f"expected class ids {{0, 1}}, got {sorted(torch.unique(y).tolist())}")
        self.a = unit((_trimmed_mean(X[y == 1], self.trim) - _trimmed_mean(X[y == 0], self.trim)).float())
        return self


def _trimmed_mean(X: Tensor, trim: float) -> Tensor:
    s = torch.sort(X.double(), dim=0).values
    cut = int(trim * len(s))
    return s[cut: len(s) - cut].mean(0)
