"""MLP probe with the grid of Canby et al. 2024, appendix C.2.

The paper fixes 1–3 hidden layers, widths 64/256/512/1024, lr 1e-4/1e-3/1e-2, 8 epochs,
cross-entropy and selection by validation accuracy; it does not state the activation,
optimizer or batch size, so we use ReLU, Adam and 64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from cprobe.errors import ConfigError
from cprobe.probes.base import PROBES
from cprobe.probes.grid import GridSearchProbe, check_grid_axis, product_grid


def make_mlp(d: int, k: int, n_layers: int, width: int) -> nn.Sequential:
    """``n_layers`` hidden Linear+ReLU blocks of size ``width``, then a linear read-out."""
    layers: list[nn.Module] = []
    for i in range(n_layers):
        layers += [nn.Linear(d if i == 0 else width, width), nn.ReLU()]
    layers.append(nn.Linear(width, k))
    return nn.Sequential(*layers)


@PROBES.register("mlp")
class MLPProbe(GridSearchProbe):
    """Grid over ``n_layers`` × ``widths`` × ``lrs`` (every axis a tuple, so configs can shrink it)."""

    def __init__(self, n_layers: Sequence[int] = (1, 2, 3), widths: Sequence[int] = (64, 256, 512, 1024),
                 lrs: Sequence[float] = (1e-4, 1e-3, 1e-2), epochs: int = 8, batch_size: int = 64,
                 weight_decay: float = 0.0, val_fraction: float = 0.2,
                 seed: int = 0, device: str | None = None) -> None:
        super().__init__(epochs, batch_size, weight_decay, val_fraction, seed, device)
        self.n_layers = check_grid_axis("n_layers", n_layers)
        self.widths = check_grid_axis("widths", widths)
        for name, axis in (("n_layers", self.n_layers), ("widths", self.widths)):
            if any(not isinstance(v, int) for v in axis):
                raise ConfigError(f"{name} values must be positive integers, got {list(axis)}")
        self.lrs = check_grid_axis("lrs", lrs)

    def _grid(self) -> list[dict[str, Any]]:
        return product_grid(n_layers=self.n_layers, width=self.widths, lr=self.lrs)

    def _build(self, d: int, k: int, params: Mapping[str, Any]) -> nn.Module:
        return make_mlp(d, k, params["n_layers"], params["width"])
