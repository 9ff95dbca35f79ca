"""AlterRep (Ravfogel et al. 2021): counterfactuals from INLP's classifiers.

Binary Z (the paper's rule, with the normals ŵᵢ of INLP's classifiers, which are orthonormal):

    h′ = P_N h + α Σᵢ sᵢ |ŵᵢ·h| ŵᵢ,    sᵢ = +1 if z′ is on ŵᵢ's positive side else −1,

i.e. the nullspace part is kept and every rowspace coordinate is moved to z′'s side of its
hyperplane (through the origin, as in the original) with its magnitude scaled by α.
α = 0 is INLP's projection; α = 1 with z′ = z leaves a correctly classified h unchanged.

k > 2 (our generalisation): INLP's rows are one-vs-rest normals, so the target signed
coordinates are tᵢ = α sᵢ |ŵᵢ·h| with sᵢ = +1 for z′'s row and −1 for every other class's row
(z′ vs rest on every hyperplane). The rows of one iteration are not orthogonal, so the
rowspace part is the unique vector v in their span with ŵᵢ·v = tᵢ for all i (v = U⁺t);
with orthonormal rows this is exactly the binary rule.
"""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS, Intervention, check_targets
from cprobe.interventions.inlp import INLP


@INTERVENTIONS.register("alterrep")
class AlterRep(Intervention):
    """Counterfactual: ``transform(X, z_target)``; ``inlp_kwargs`` go to :class:`INLP`."""

    kind = "counterfactual"
    exposes_direction = True
    forwards_kwargs_to = (INLP,)

    def __init__(self, rank: int, alpha: float = 1.0, **inlp_kwargs: object) -> None:
        if alpha < 0:
            raise ConfigError(f"alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)
        self.inlp = INLP(rank, **inlp_kwargs)  # type: ignore[arg-type]

    def fit(self, X: Tensor, z: Tensor) -> Self:
        self.inlp.fit(X, z)
        # (d, r) right inverse of the normals: maps target coordinates back into the rowspace
        self._lift = torch.linalg.pinv(self.inlp.directions.double()).float()
        return self

    def edit_direction(self) -> Tensor | None:
        """The one INLP normal whose coordinate AlterRep sets, when there is one (``rank: 1``, binary Z)."""
        self.check_fitted()
        return self.inlp.edit_direction()

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        inlp = self.inlp
        z_target = check_targets("AlterRep", z_target, inlp.n_classes)
        dev = X.device
        U = inlp.directions.to(dev)
        Xf = X.float()
        coords = Xf @ U.T  # (n, r) signed coordinates along each normal
        positive = inlp.row_classes.to(dev)[None, :] == z_target.to(dev)[:, None]
        target = self.alpha * torch.where(positive, 1.0, -1.0) * coords.abs()
        out = Xf @ inlp.P.to(dev) + target @ self._lift.to(dev).T
        return out.to(X.dtype)
