"""Difference-of-class-means steering: a linear counterfactual baseline (not in Canby et al.).

With class means μ_c from the fitting split, each row is assigned the class ĉ(h) whose mean
is nearest within the span S of the mean differences {μ_c − μ_0} (a nearest-centroid rule
that ignores directions carrying no class signal), and moved by the difference of means:

    h′ = h + α (μ_{z′} − μ_{ĉ(h)}).

At α = 1 the row keeps its offset from its own class centre but around z′'s centre; rows
already nearest to μ_{z′} are left unchanged; α = 0 is the identity. Works for any k ≥ 2.

Streaming: ``update(X, z)`` adds a batch to per-class sums and counts (float64, :class:`cprobe.stats.ClassMeans`, the
one class-means implementation the ``mean`` direction shares); ``fit`` = one update.
"""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError, NotFittedError
from cprobe.interventions.base import INTERVENTIONS, Intervention, check_batch, check_targets, n_classes_of
from cprobe.stats import ClassMeans


@INTERVENTIONS.register("mean_diff")
class MeanDiff(Intervention):
    """Counterfactual. After ``fit``: ``means`` (k, d) and ``basis`` (d, m) an orthonormal basis
    of S (m ≤ k − 1)."""

    kind = "counterfactual"
    exposes_direction = True

    def __init__(self, alpha: float = 1.0) -> None:
        if alpha < 0:
            raise ConfigError(f"alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)

    def fit(self, X: Tensor, z: Tensor) -> Self:
        n_classes_of(z)
        self._stats = None
        return self.update(X, z)._solve()

    def update(self, X: Tensor, z: Tensor) -> Self:
        """Add a batch to the per-class sums and counts (classes may be missing from a batch)."""
        if not check_batch(X, z):
            return self
        if getattr(self, "_stats", None) is None:
            self._stats = ClassMeans()
        self._stats.update(X, z)
        self._stale, self.fitted_ = True, True
        return self

    def _solve(self) -> Self:
        counts = self._stats.counts
        k = len(counts)
        if (counts == 0).any() or k < 2:
            raise ConfigError(f"classes {self._stats.missing()} have no rows; MeanDiff needs every class in [0, {k}) "
                              "(k >= 2)")
        means = self._stats.means()
        u, s, _ = torch.linalg.svd((means[1:] - means[0]).T, full_matrices=False)
        self._basis = u[:, s > s.max() * 1e-6].float()
        self._means = means.float()
        self._stale = False
        return self

    def _current(self) -> None:
        if getattr(self, "_stats", None) is None:
            raise NotFittedError(self, "fit(X, z) or update(X, z)")
        if self._stale:
            self._solve()

    @property
    def means(self) -> Tensor:
        """Class means (k, d), current with every update."""
        self._current()
        return self._means

    @property
    def basis(self) -> Tensor:
        """Orthonormal basis (d, m) of the span of the mean differences."""
        self._current()
        return self._basis

    @property
    def n_classes(self) -> int:
        self._current()
        return len(self._means)

    def edit_direction(self) -> Tensor | None:
        """The unit class-mean difference when the mean-difference span is one direction (a binary Z)."""
        B = self.basis
        return B[:, 0].clone() if B.shape[1] == 1 else None

    def nearest_class(self, X: Tensor) -> Tensor:
        """ĉ(h): the class whose mean is nearest to h within the mean-difference span."""
        B = self.basis.to(X.device)
        coords = X.float() @ B  # (n, m)
        centres = self.means.to(X.device) @ B  # (k, m)
        return torch.cdist(coords, centres).argmin(-1)

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        z_target = check_targets("MeanDiff", z_target, self.n_classes)
        means = self.means.to(X.device)
        shift = means[z_target.to(X.device)] - means[self.nearest_class(X)]
        return (X.float() + self.alpha * shift).to(X.dtype)
