"""RAVEL's SAE method (``sae_features``; Huang et al. 2024, explanare/ravel ``scripts/train_sae.py``,
``select_features.py``, ``AutoencoderIntervention``): one SAE of broad states, the property's latents chosen by an
L1-penalised linear classifier, and those latents interchanged.

- **The SAE**: trained on ``contexts``, states of broad text given to :meth:`~SAEFeatures.fit` (the RAVEL study gives
  the entity token's states in RAVEL's Wikipedia contexts; the reference trains on 200k Wikipedia sentences), not on
  the labelled states; where none are given, on those. Defaults are the reference's architecture: a ReLU SAE with an
  L1 penalty (cprobe's trainer, :mod:`cprobe.sae.train`; the reference's width is 4 × d). Or a loaded one (``path``).
  One SAE per site: the same contexts and settings read the cached SAE back (:mod:`cprobe.sae.store`).
- **The selection**: :func:`cprobe.sae.select.l1_classifier` on the latents of the labelled states ``X`` with their
  classes ``y`` (all of the property's values, not one pair), penalty ``C`` (the reference's notebook: 0.01 and
  0.001).
- **The features**: the selected latents (:class:`cprobe.sae.features.SAELatents`); the fitted method *is* that
  featurizer (``n_features``, ``featurize``, ``inverse``), so a study that interchanges features
  (:func:`cprobe.models.featurizers.interchange`) takes it as it is. ``keep_error: false`` (the reference's) decodes the
  swapped latents alone — the base vector becomes the SAE's reconstruction; ``true`` keeps the SAE's error term.

It learns no one direction (capability ``features``): a study that scores one direction refuses it in one line.
"""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction
from cprobe.errors import ConfigError
from cprobe.sae import select as selection
from cprobe.sae.features import SAELatents
from cprobe.sae.method import SAEMethod


@DIRECTIONS.register("sae_features")
class SAEFeatures(SAEMethod, Direction):
    """RAVEL's SAE method (module doc). After ``fit``: ``sae_``, ``quality_`` (its FVU, L0 and dead fraction on the
    states it was trained on, or a loaded one's on ``contexts``), ``latents_`` (the selected latents, ascending) and
    ``featurizer_``; the method is its featurizer."""

    supervised = True
    features = True
    _fitted_attrs = ("sae_", "latents_", "featurizer_")

    def __init__(self, C: float = 0.01, keep_error: bool = False, path: str | None = None, architecture: str = "relu",
                 d_sae: int = 512, k: int = 16, l1: float = 1.0, lr: float | None = None, epochs: int = 20,
                 batch_size: int = 256, model: str | None = None, layer: int | None = None, cache: bool = True,
                 seed: int = 0) -> None:
        if not (isinstance(C, int | float) and not isinstance(C, bool) and C > 0):
            raise ConfigError(f"sae_features: C (the L1 classifier's inverse penalty) must be > 0, got {C!r}")
        if not isinstance(keep_error, bool):
            raise ConfigError(f"sae_features: keep_error must be true or false, got {keep_error!r}")
        super().__init__(path=path, architecture=architecture, d_sae=d_sae, k=k, l1=l1, lr=lr, epochs=epochs,
                         batch_size=batch_size, model=model, layer=layer, cache=cache, seed=seed)
        self.C, self.keep_error, self.seed = float(C), keep_error, seed

    def fit(self, X: Tensor, y: Tensor, contexts: Tensor | None = None) -> Self:
        """The SAE of ``contexts`` (else of ``X``), the latents an L1 classifier picks for the classes ``y`` of the
        states ``X``."""
        broad = (X if contexts is None else contexts).detach().to("cpu", torch.float32)
        self.sae_ = self._sae(broad)
        F = self.sae_.encode(X.detach().to("cpu", torch.float32))
        self.latents_ = selection.l1_classifier(F, y, self.C, self.seed)
        self.featurizer_ = SAELatents(self.sae_, self.latents_, self.keep_error)
        return self

    # the featurizer protocol (cprobe.models.featurizers.Featurizer), once fitted
    @property
    def n_features(self) -> int:
        return self.featurizer_.n_features

    def featurize(self, h: Tensor) -> tuple[Tensor, Tensor]:
        return self.featurizer_.featurize(h)

    def inverse(self, features: Tensor, error: Tensor) -> Tensor:
        return self.featurizer_.inverse(features, error)
