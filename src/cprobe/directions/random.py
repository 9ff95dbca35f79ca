"""A random isotropic Gaussian direction: the chance baseline for causal efficacy."""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, unit


@DIRECTIONS.register("random")
class RandomDirection(Direction):
    """``g/‖g‖`` with ``g ~ N(0, I_d)``, drawn from a seeded CPU generator (device-independent)."""

    chance_baseline = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def fit(self, X: Tensor, y: Tensor | None = None) -> Self:
        g = torch.Generator().manual_seed(self.seed)
        self.a = unit(torch.randn(X.shape[-1], generator=g)).to(X.device)
        return self
