"""Softmax-regression probe (the linear oracles of Canby et al. 2024, App. D.3), trained by grid search."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from cprobe.probes.base import PROBES
from cprobe.probes.grid import GridSearchProbe, check_grid_axis


@PROBES.register("linear")
class LinearProbe(GridSearchProbe):
    """Multinomial logistic regression; grid over ``lrs`` (Canby et al. D.3's linear oracles)."""

    def __init__(self, lrs: Sequence[float] = (1e-4, 1e-3, 1e-2, 1e-1), epochs: int = 8, batch_size: int = 64,
                 weight_decay: float = 0.0, val_fraction: float = 0.2,
                 seed: int = 0, device: str | None = None) -> None:
        super().__init__(epochs, batch_size, weight_decay, val_fraction, seed, device)
        self.lrs = check_grid_axis("lrs", lrs)

    def _grid(self) -> list[dict[str, Any]]:
        return [{"lr": lr} for lr in self.lrs]

    def _build(self, d: int, k: int, params: Mapping[str, Any]) -> nn.Module:
        return nn.Linear(d, k)
