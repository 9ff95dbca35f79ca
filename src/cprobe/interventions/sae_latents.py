"""SAE latents as an intervention (``sae_latents``): edit the property's latents and keep the SAE's error term, so
that only those features move (:meth:`cprobe.sae.dictionary.SAE.edit`).

With S the ``latents`` latents selected by ``select`` (:mod:`cprobe.sae.select`) on the fitting rows and f = the SAE's
latents of a row x:

- ``kind: nullifying``: ``x′ = x − f_S W_dec[S]`` (the latents zeroed, the error term ``x − x̂`` kept);
- ``kind: counterfactual`` (default): ``x′ = x + (m_{z′} − f_S) W_dec[S]``, with ``m_c`` the mean of the latents S
  over the fitting rows of class c (the target class's mean activation).

A row whose selected latents are already at their new values is returned exactly. (The ``sae_decoder`` direction is
the one-vector form, also as ``sae_decoder_direction``.) Where the SAE comes from, and every setting: :mod:`cprobe.sae.method`,
docs/sae.md.
"""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS, Intervention, Kind, check_targets, n_classes_of
from cprobe.sae.method import SAEMethod
from cprobe.stats import class_means


@INTERVENTIONS.register("sae_latents")
class SAEIntervention(SAEMethod, Intervention):
    """The property's SAE latents zeroed or set to the target class's mean (module doc). After ``fit``: ``targets_``
    (k, m) float32, the class means of the selected latents, besides :mod:`cprobe.sae.method`'s attributes."""

    kind: Kind = "counterfactual"
    _fitted_attrs = ("sae_", "latents_", "targets_")

    def __init__(self, kind: str = "counterfactual", **settings: object) -> None:
        if kind not in ("counterfactual", "nullifying"):
            raise ConfigError(f"intervention 'sae_latents': kind must be counterfactual or nullifying, got {kind!r}")
        self.kind = kind  # type: ignore[misc]
        super().__init__(**settings)  # type: ignore[arg-type]

    def fit(self, X: Tensor, z: Tensor) -> Self:
        self.n_classes = n_classes_of(z)
        F = self.fit_latents(X, z)
        self.targets_ = class_means(F[:, self.latents_], z.cpu().long()).float()
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        Xf = X.float()
        S = self.latents_.to(X.device)
        if self.kind == "nullifying":
            return self.sae_.edit(Xf, S, None).to(X.dtype)
        z_target = check_targets("sae_latents", z_target, self.n_classes)
        return self.sae_.edit(Xf, S, self.targets_.to(X.device)[z_target.to(X.device).long()]).to(X.dtype)

