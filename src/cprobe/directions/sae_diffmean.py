"""AxBench's SAE-DiffMean (``sae_diffmean``; ``GemmaScopeSAEDiffMean`` in ``axbench/models/mean.py`` of
stanfordnlp/axbench): DiffMean taken in an SAE's latent space and mapped back through its decoder.

Each training text's latents are averaged over its tokens; ``δ`` (d_sae,) is the mean over the texts with the concept
minus the mean over the texts without; the direction is ``a ∝ δ W_dec`` (every latent, weighted by its mean
difference). With ``δ W_dec = E[x̂ | concept] − E[x̂ | not]`` over the texts' mean reconstructions, it is DiffMean of
the SAE's reconstructions: the SAE's error term is what it leaves out. Texts are scored by the projection on ``a``,
like any direction (AxBench scores it so too). Every latent takes part, so ``select`` and ``latents`` are refused.

It declares ``fits_on_texts``: the AxBench study passes each token's text (``fit(X, y, texts=...)``); without
``texts`` every row is a text of one token and ``δ`` is the class-mean difference of the rows' latents. Where the SAE
comes from and every other setting: :mod:`cprobe.sae.method`, docs/sae.md.
"""

from __future__ import annotations

from typing import Any, Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit
from cprobe.errors import ConfigError
from cprobe.sae import select as selection
from cprobe.sae.method import SAEMethod


@DIRECTIONS.register("sae_diffmean")
class SAEDiffMean(SAEMethod, Direction):
    """DiffMean in an SAE's latent space, decoded (module doc). After ``fit``: ``delta_`` (d_sae,) float64, the
    latents' mean difference, besides ``sae_``, ``quality_`` and ``a``."""

    supervised = True
    fits_on_texts = True
    _fitted_attrs = ("a", "sae_", "delta_")

    def __init__(self, **settings: Any) -> None:
        if given := sorted(k for k in ("select", "latents") if k in settings):
            raise ConfigError(f"direction method 'sae_diffmean' weighs every latent by its mean difference: it takes "
                              f"no {' or '.join(given)}")
        super().__init__(**settings)

    def fit(self, X: Tensor, y: Tensor, texts: Tensor | None = None) -> Self:
        check_binary(X, y)
        Xc = X.detach().to("cpu", torch.float32)
        texts = selection.text_ids(y, texts)
        self.sae_ = self._sae(Xc)
        lab = selection.text_labels(y, texts)
        V = selection.pooled_latents(self.sae_, Xc, texts, "mean")
        self.delta_ = V[lab == 1].mean(0) - V[lab == 0].mean(0)
        self.a = unit((self.delta_ @ self.sae_.W_dec.double()).float()).to(X.device)
        return self
