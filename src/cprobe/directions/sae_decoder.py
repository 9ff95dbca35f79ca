"""cprobe's SAE decoder direction for a property (``sae_decoder``; as an intervention ``sae_decoder_direction``): the
latents that best separate the classes, by a selection rule (:mod:`cprobe.sae.select`), mapped onto one unit vector,
from an SAE trained on the fitting states themselves (or loaded). Scored by projection everywhere, AxBench included:
AxBench's own use of an SAE, a latent's activation, is :mod:`cprobe.directions.sae_axbench`.

``a ∝ Σ_{j∈S} (μ₁,j − μ₀,j) W_dec,j`` over the ``latents`` selected latents S: the move of the SAE's reconstruction
between the two class means restricted to S. With ``latents: 1`` (the default) it is the selected latent's decoder
row, signed so that positive projections point to class 1. Where the SAE comes from, and every setting:
:mod:`cprobe.sae.method`, docs/sae.md.
"""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit
from cprobe.sae.method import SAEMethod
from cprobe.sae.select import one_vs_rest


@DIRECTIONS.register("sae_decoder")
class SAEDirection(SAEMethod, Direction):
    """The decoder direction of the property's SAE latents (module doc)."""

    supervised = True

    def fit(self, X: Tensor, y: Tensor) -> Self:
        check_binary(X, y)
        F = self.fit_latents(X, y)
        S = self.latents_
        weight = one_vs_rest(F[:, S], y.cpu().long())[1]  # μ₁ − μ₀ of each selected latent
        if not bool((weight != 0).any()):
            raise ValueError(f"the selected SAE latents {S.tolist()} do not differ between the two classes")
        self.a = unit((weight.float() @ self.sae_.W_dec[S]).to(X.device))
        return self
