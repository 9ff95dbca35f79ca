"""Training an SAE on a stream of states: TopK (Gao et al. 2024) or ReLU + L1 (Anthropic's April 2024 recipe), by a
small hand-written trainer (docs/sae.md says why no library).

- The states are scaled by one number, ``s = sqrt(mean ‖x − x̄‖² / d_in)`` measured on the first minibatch, so one
  learning rate fits every model; ``s`` is folded back into the weights at the end (``W_enc / s``, ``s·W_dec``,
  ``s·b_dec``): the SAE returned acts on the raw states.
- Initialisation: decoder rows random unit vectors, ``W_enc = W_decᵀ``, ``b_enc = 0``, ``b_dec`` the first
  minibatch's mean.
- Loss: the squared error summed over dimensions, averaged over rows; ReLU adds ``l1 · Σ_j f_j ‖W_dec,j‖`` (the L1
  penalty weighted by the decoder norms, so shrinking the decoder cannot buy sparsity). TopK keeps the decoder rows
  at unit norm after every step (and removes the gradient's component along them), as EleutherAI's ``sparsify``.
- Adam; the default learning rate is ``sparsify``'s ``2e-4 / sqrt(d_sae / 2¹⁴)``.

``batches()`` is called once per epoch and yields minibatches of states (n_b, d_in): a shuffled in-memory tensor
(:func:`minibatches`) or the shards of an activation cache entry, so host memory stays at one minibatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from cprobe.compute import fit_threads
from cprobe.sae.dictionary import SAE, topk_relu

ARCHITECTURES = ("topk", "relu")


@dataclass(frozen=True)
class TrainSettings:
    """Everything that determines a trained SAE besides its states (the cache key's settings)."""

    architecture: str = "topk"
    d_sae: int = 512
    k: int = 16
    l1: float = 1.0
    lr: float | None = None
    epochs: int = 20
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"unknown SAE architecture {self.architecture!r}; choose from {list(ARCHITECTURES)}")
        for name in ("d_sae", "k", "epochs", "batch_size"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"SAE {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.l1 < 0 or (self.lr is not None and self.lr <= 0):
            raise ValueError(f"SAE l1 must be >= 0 and lr > 0, got l1={self.l1}, lr={self.lr}")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else 2e-4 / math.sqrt(self.d_sae / 2 ** 14)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def minibatches(X: Tensor, batch_size: int, seed: int) -> Callable[[], Iterable[Tensor]]:
    """An epoch stream over the rows of ``X`` in a new seeded order each epoch."""
    gen = torch.Generator().manual_seed(seed)

    def epoch() -> Iterable[Tensor]:
        order = torch.randperm(len(X), generator=gen)
        for i in range(0, len(X), batch_size):
            yield X[order[i:i + batch_size]].float()
    return epoch


def train(batches: Callable[[], Iterable[Tensor]], d_in: int, settings: TrainSettings) -> SAE:
    """An SAE trained on the stream ``batches`` (module doc), on the threads its size calls for: one for a small
    dictionary (:func:`cprobe.compute.fit_threads`; its largest op is a minibatch times the encoder)."""
    with fit_threads(2 * settings.batch_size * d_in * settings.d_sae):
        return _train(batches, d_in, settings)


def _train(batches: Callable[[], Iterable[Tensor]], d_in: int, settings: TrainSettings) -> SAE:
    torch.manual_seed(settings.seed)
    W_dec = torch.randn(settings.d_sae, d_in)
    W_dec /= W_dec.norm(dim=1, keepdim=True)
    W_dec.requires_grad_(True)
    W_enc = W_dec.detach().T.clone().requires_grad_(True)
    b_enc = torch.zeros(settings.d_sae, requires_grad=True)
    b_dec = torch.zeros(d_in, requires_grad=True)
    params = [W_enc, b_enc, W_dec, b_dec]
    opt = torch.optim.Adam(params, lr=settings.learning_rate)
    topk = settings.architecture == "topk"
    scale: float | None = None
    for _ in range(settings.epochs):
        for x in batches():
            if scale is None:  # the first minibatch fixes the scale and b_dec's start
                scale = float(((x - x.mean(0)) ** 2).sum(1).mean() / d_in) ** 0.5 or 1.0
                with torch.no_grad():
                    b_dec.copy_(x.mean(0) / scale)
            x = x / scale
            pre = (x - b_dec) @ W_enc + b_enc
            f = topk_relu(pre, settings.k) if topk else pre.relu()
            loss = ((f @ W_dec + b_dec - x) ** 2).sum(1).mean()
            if not topk:
                loss = loss + settings.l1 * (f * W_dec.norm(dim=1)).sum(1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if topk:  # the gradient's component along each (unit) decoder row would only change its norm
                with torch.no_grad():
                    W_dec.grad -= (W_dec.grad * W_dec).sum(1, keepdim=True) * W_dec  # type: ignore[operator]
            opt.step()
            if topk:
                with torch.no_grad():
                    W_dec /= W_dec.norm(dim=1, keepdim=True)
    if scale is None:
        raise ValueError("no states to train the SAE on")
    return SAE(W_enc=W_enc.detach() / scale, b_enc=b_enc.detach().clone(), W_dec=W_dec.detach() * scale,
               b_dec=b_dec.detach() * scale, activation=settings.architecture,
               k=settings.k if topk else None)

