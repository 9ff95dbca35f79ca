"""A sparse autoencoder's dictionary: encode a state into sparse latents, decode them back, and the edit of latents
that keeps the SAE's error term.

Conventions are SAELens's (so a released SAE loads as is): ``W_enc`` (d_in, d_sae), ``b_enc`` (d_sae,), ``W_dec``
(d_sae, d_in), ``b_dec`` (d_in,). The pre-activation is ``(x − b_dec) W_enc + b_enc`` (without ``− b_dec`` when
``apply_b_dec_to_input`` is false), the reconstruction ``x̂ = f W_dec + b_dec``, the error term ``e = x − x̂``.

Activations (:data:`ACTIVATIONS`): ``topk`` keeps each row's k largest pre-activations (ReLU'd) and zeroes the rest
(Gao et al. 2024); ``relu`` is ReLU (the L1-trained SAE); ``jumprelu`` keeps a pre-activation only above its latent's
``threshold`` (Rajamanoharan et al. 2024; loaded, not trained here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ACTIVATIONS = ("topk", "relu", "jumprelu")


def topk_relu(pre: Tensor, k: int) -> Tensor:
    """Each row's ``k`` largest entries of ``pre``, ReLU'd; every other entry 0 (differentiable: training uses it)."""
    k = min(k, pre.shape[-1])
    vals, idx = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter_(-1, idx, vals.clamp_min(0))


@dataclass
class SAE:
    """One sparse autoencoder (module doc). ``model_name`` and ``hook_name`` are what it was trained on, as recorded
    (SAELens's cfg keys); ``k`` is TopK's, ``threshold`` (d_sae,) JumpReLU's."""

    W_enc: Tensor
    b_enc: Tensor
    W_dec: Tensor
    b_dec: Tensor
    activation: str = "topk"
    k: int | None = None
    threshold: Tensor | None = None
    apply_b_dec_to_input: bool = True
    model_name: str | None = None
    hook_name: str | None = None

    def __post_init__(self) -> None:
        d_in, d_sae = self.W_enc.shape
        shapes = {"b_enc": (self.b_enc, (d_sae,)), "W_dec": (self.W_dec, (d_sae, d_in)), "b_dec": (self.b_dec, (d_in,))}
        if self.threshold is not None:
            shapes["threshold"] = (self.threshold, (d_sae,))
        for name, (t, want) in shapes.items():
            if tuple(t.shape) != want:
                raise ValueError(f"SAE {name} has shape {tuple(t.shape)}, expected {want} for W_enc {(d_in, d_sae)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown SAE activation {self.activation!r}; choose from {list(ACTIVATIONS)}")
        if self.activation == "topk" and not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"a TopK SAE needs k >= 1, got {self.k!r}")
        if self.activation == "jumprelu" and self.threshold is None:
            raise ValueError("a JumpReLU SAE needs a threshold (d_sae,)")

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    def pre(self, x: Tensor) -> Tensor:
        """Pre-activations (n, d_sae)."""
        W = self.W_enc.to(x.device, x.dtype)
        x = x - self.b_dec.to(x.device, x.dtype) if self.apply_b_dec_to_input else x
        return x @ W + self.b_enc.to(x.device, x.dtype)

    def encode(self, x: Tensor) -> Tensor:
        """Latent activations f (n, d_sae) of states x (n, d_in)."""
        pre = self.pre(x)
        if self.activation == "topk":
            return topk_relu(pre, int(self.k or 0))
        if self.activation == "relu":
            return pre.relu()
        return pre.relu() * (pre > self.threshold.to(x.device, x.dtype))  # type: ignore[union-attr]

    def latent(self, x: Tensor, j: int, batch_size: int = 4096) -> Tensor:
        """The activation (n,) of latent ``j`` on states x (n, d_in), as :meth:`encode` gives it: from its own
        pre-activation for ``relu`` / ``jumprelu``; from every latent's, ``batch_size`` rows at a time, for ``topk``
        (whether j is among a row's k largest depends on the others)."""
        if self.activation == "topk":
            return torch.cat([self.encode(x[i:i + batch_size])[:, j] for i in range(0, len(x), batch_size)]) \
                if len(x) else x.new_zeros(0)
        xb = x - self.b_dec.to(x.device, x.dtype) if self.apply_b_dec_to_input else x
        pre = xb @ self.W_enc[:, j].to(x.device, x.dtype) + self.b_enc[j].to(x.device, x.dtype)
        if self.activation == "relu":
            return pre.relu()
        return pre.relu() * (pre > self.threshold[j].to(x.device, x.dtype))  # type: ignore[index]

    def decode(self, f: Tensor) -> Tensor:
        """The reconstruction x̂ = f W_dec + b_dec (n, d_in)."""
        return f @ self.W_dec.to(f.device, f.dtype) + self.b_dec.to(f.device, f.dtype)

    def edit(self, x: Tensor, latents: Tensor, values: Tensor | None) -> Tensor:
        """``x`` with the latents ``latents`` (m,) set to ``values`` (n, m) — zeroed when None — and the SAE's error
        term kept: ``x′ = decode(f′) + (x − decode(f)) = x + (f′_S − f_S) W_dec[S]``. Only the selected features move;
        setting latents to their own values returns ``x`` exactly (computed as that difference, never through x̂)."""
        f_sel = self.encode(x)[:, latents]
        new = torch.zeros_like(f_sel) if values is None else values.to(x.device, x.dtype)
        return x + (new - f_sel) @ self.W_dec.to(x.device, x.dtype)[latents]
