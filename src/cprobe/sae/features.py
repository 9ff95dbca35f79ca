"""An SAE's latents as a featurizer (:mod:`cprobe.models.featurizers`): the features are the selected latents
``f_S = encode(h)[:, S]``, and the error term is the rest of the vector, so :func:`~cprobe.models.featurizers.
interchange` swaps exactly those latents.

With ``keep_error`` the error term is ``h − f_S W_dec[S]`` and ``inverse(featurize(h)) = h``: an interchange moves the
vector by ``(f_S(source) − f_S(base)) W_dec[S]`` and keeps everything the SAE does not reconstruct (:meth:`cprobe.sae.
dictionary.SAE.edit`'s convention). Without it (RAVEL's SAE method, explanare/ravel ``AutoencoderIntervention``: the
base's latents with S taken from the source, decoded) the error term is ``x̂ − f_S W_dec[S]`` with ``x̂ = decode(encode
(h))``: the base vector becomes the SAE's reconstruction of the swapped latents, so even swapping no latent replaces
``h`` by ``x̂`` and loses what the SAE does not reconstruct (its FVU), which can move the answer on any attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from cprobe.sae.dictionary import SAE


@dataclass
class SAELatents:
    """The latents ``latents`` (m,) of ``sae`` as features (module doc)."""

    sae: SAE
    latents: Tensor
    keep_error: bool = False

    @property
    def n_features(self) -> int:
        return int(self.latents.numel())

    def _rows(self, like: Tensor) -> Tensor:
        return self.sae.W_dec.to(like.device, like.dtype)[self.latents.to(like.device)]

    def featurize(self, h: Tensor) -> tuple[Tensor, Tensor]:
        F = self.sae.encode(h)
        f = F[:, self.latents.to(h.device)]
        whole = h if self.keep_error else self.sae.decode(F)
        return f, whole - f @ self._rows(h)

    def inverse(self, features: Tensor, error: Tensor) -> Tensor:
        return features @ self._rows(features) + error
