"""AxBench's SAE (``sae_axbench``; Wu et al. 2025, ``GemmaScopeSAEMaxAUC`` / ``GemmaScopeSAEMaxDiff`` in
``axbench/models/sae.py`` of stanfordnlp/axbench): one SAE latent, chosen on the training texts, whose **activation**
is the concept score.

- **Which latent.** Every latent of the SAE is scored on the training texts by AxBench's rule ``select``
  (:data:`cprobe.sae.select.TEXT_RULES`): ``auroc`` (default; the rule of AxBench's SAE-selection sweeps) — the AUROC
  of each text's maximum activation, texts with the concept against texts without; ``mean_diff`` — each text's mean
  activation, positive texts' mean minus negative texts' mean. The highest score wins (ties: the lower index).
- **The concept score** of a token is that latent's activation as the SAE computes it (:meth:`token_scores`:
  JumpReLU ``(x·W_enc + b_enc)`` above its threshold for a Gemma Scope SAE, ReLU or TopK for others), which the
  AxBench study pools over a text's tokens (max, as AxBench) — not a projection: values below a JumpReLU threshold,
  or outside a TopK row's k largest, are 0.
- **The direction** ``a`` is the latent's decoder row (unit): what AxBench steers with (``AdditionIntervention`` over
  ``W_dec``), and what every other study edits along (CausalGym's and RAVEL's interchange, the reliability study's
  ``sae_axbench_direction``).

It declares ``fits_on_texts`` (``fit(X, y, texts=...)``: the AxBench study passes each token's text, so a text's
tokens are pooled before the latents are scored; without ``texts`` every row is a text of one token) and
``scores_tokens``. Where the SAE comes from (``path`` or trained on the fitting states) and every other setting:
:mod:`cprobe.sae.method`, docs/sae.md. AxBench rounds activations to three decimals before pooling; cprobe does not.
"""

from __future__ import annotations

from typing import Any, Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, check_binary, unit
from cprobe.errors import ConfigError
from cprobe.sae import select as selection
from cprobe.sae.method import SAEMethod


@DIRECTIONS.register("sae_axbench")
class SAEAxBench(SAEMethod, Direction):
    """AxBench's SAE latent (module doc). After ``fit``: ``latent_`` the chosen latent, ``scores_`` every latent's
    score by ``select``, ``sae_``, ``quality_`` and ``a``."""

    supervised = True
    fits_on_texts = True
    scores_tokens = True
    RULES = selection.TEXT_RULES
    _fitted_attrs = ("a", "sae_", "latent_")

    def __init__(self, select: str = "auroc", **settings: Any) -> None:
        if settings.get("latents", 1) != 1:
            raise ConfigError(f"direction method 'sae_axbench' reads one latent, as AxBench does: latents must be 1, "
                              f"got {settings['latents']!r}")
        super().__init__(select=select, **settings)

    def fit(self, X: Tensor, y: Tensor, texts: Tensor | None = None) -> Self:
        check_binary(X, y)
        Xc = X.detach().to("cpu", torch.float32)
        texts = selection.text_ids(y, texts)
        self.sae_ = self._sae(Xc)
        self.scores_ = selection.text_scores(self.select, self.sae_, Xc, y.cpu().long(), texts)
        self.latent_ = int(selection.top(self.scores_, 1)[0])
        self.latents_ = torch.tensor([self.latent_])
        self.a = unit(self.sae_.W_dec[self.latent_].float()).to(X.device)
        return self

    def token_scores(self, X: Tensor) -> Tensor:
        """(n,) float64: the chosen latent's activation on each state of ``X`` (n, d_in)."""
        with torch.no_grad():
            return self.sae_.latent(X.detach().float().cpu(), self.latent_).double()
