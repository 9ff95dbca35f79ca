"""Distributed Alignment Search with a rank-1 subspace (CausalGym eq. 12, App. B).

DAS learns ``a`` so that the 1-D DII at the site makes the frozen model predict the source
label: ``min_a −Σ log p_{f←f*_a}(y_s | b, s)``. It is the only method trained on the causal
objective. The model stays outside this module: ``fit`` receives a differentiable
``forward(edit, batch_idx)`` that runs the base inputs ``batch_idx`` with the site vector
replaced by ``edit(h_base_rows)`` and returns next-token log-probs (or logits) ``(n, V)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Self

import torch
from torch import Tensor

from cprobe.models.edits import Edit, dii_edit
from cprobe.directions.base import DIRECTIONS, Direction, unit

Forward = Callable[[Edit, Tensor], Tensor]
"""``forward(edit, batch_idx) -> (len(batch_idx), V)`` next-token scores of the edited base rows."""


@DIRECTIONS.register("das")
class DAS(Direction):
    """Rank-1 DAS. ``parametrization="orthogonal"`` (default) is the reference's (pyvene's rotate layer):
    ``a`` is the single column of a (d, 1) matrix under torch's orthogonal parametrisation
    (Householder), so Adam moves the underlying parameter and ``a`` stays a unit vector;
    ``"normalize"`` (cprobe ≤ 0.3) runs Adam on a raw vector ``v`` and uses ``v/‖v‖``.

    Defaults are the paper's: lr 5e-3, batch 4, 1 epoch (100 steps on 400 items), linear
    warm-up over the first 10% of steps from 0, then linear decay to 0. Batches are taken in
    data order, as in the reference (each block of 4 is 2 pairs and their swaps).
    """

    causal = True

    def __init__(self, lr: float = 5e-3, batch_size: int = 4, epochs: int = 1,
                 warmup: float = 0.1, seed: int = 0, parametrization: str = "orthogonal") -> None:
        if lr <= 0 or batch_size < 1 or epochs < 1 or not 0 <= warmup < 1:
            raise ValueError("DAS needs lr > 0, batch_size >= 1, epochs >= 1 and 0 <= warmup < 1")
        if parametrization not in ("orthogonal", "normalize"):
            raise ValueError(f"unknown parametrization {parametrization!r}; choose from ['normalize', 'orthogonal']")
        self.lr, self.batch_size, self.epochs, self.warmup, self.seed = lr, batch_size, epochs, warmup, seed
        self.parametrization = parametrization

    def fit(
        self,
        forward: Forward,
        h_source: Tensor,
        target: Tensor,
        callback: Callable[[int, Tensor], None] | None = None,
    ) -> Self:
        """Train on the train set's source site vectors ``h_source`` (n, d) toward ``target`` (n,).

        ``target`` holds the source-label token ids y_s. ``callback(step, a)`` runs after each
        optimiser step (e.g. to evaluate at steps 25/50/75/99 as in the paper). The per-step
        mean cross-entropy is kept in ``self.losses``.
        """
        n, d = h_source.shape
        if target.shape != (n,):
            raise ValueError(f"target must be ({n},), got {tuple(target.shape)}")
        h_source = h_source.detach().float()
        target = target.to(h_source.device)
        g = torch.Generator().manual_seed(self.seed)
        init = unit(torch.randn(d, generator=g)).to(h_source.device)
        if self.parametrization == "orthogonal":
            rotate = torch.nn.Linear(1, d, bias=False).to(h_source.device)  # weight (d, 1)
            with torch.no_grad():
                rotate.weight.copy_(init[:, None])
            torch.nn.utils.parametrizations.orthogonal(rotate)
            params = list(rotate.parameters())

            def direction() -> Tensor:
                return rotate.weight[:, 0]
        else:
            v = torch.nn.Parameter(init)
            params = [v]

            def direction() -> Tensor:
                return unit(v)
        per_epoch = math.ceil(n / self.batch_size)
        total = per_epoch * self.epochs
        warm = self.warmup * total
        optimizer = torch.optim.Adam(params, lr=self.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: s / warm if s < warm else max(0.0, (total - s) / (total - warm))
        )
        self.losses: list[float] = []
        for step in range(total):
            start = (step % per_epoch) * self.batch_size
            idx = torch.arange(start, min(start + self.batch_size, n))
            scores = forward(dii_edit(h_source[idx.to(h_source.device)], direction()), idx)
            loss = -torch.log_softmax(scores.float(), -1).gather(1, target[idx.to(target.device), None]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            self.losses.append(loss.item())
            if callback is not None:
                with torch.no_grad():
                    callback(step, direction().detach().clone())
        with torch.no_grad():
            self.a = unit(direction().detach().clone())
        return self
