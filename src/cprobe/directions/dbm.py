"""Differentiable binary masking (DBM; MIB's baseline, after De Cao et al. 2020 and Csordás et al. 2021): a learned
binary mask over a featurizer's features — the standard basis, the principal components of the site's states, or
an SAE's latents — that says which features an interchange takes from the source.

Trained through the frozen model as CausalAbstraction's ``FeatureMaskIntervention`` is: one logit per feature
(``mask``, started at 0), the soft gate ``σ(mask / T)`` interchanging ``(1 − g)·f_base + g·f_source`` while training,
the loss the interchange's cross-entropy toward the counterfactual label's token plus ``sparsity · ‖σ(mask / T)‖₁``,
AdamW (no weight decay) at a constant learning rate, the temperature T annealed linearly from ``temperature[0]`` to
``temperature[1]`` over the steps. The fitted mask is binary: the features whose ``σ(mask) > 0.5``.

:meth:`DBM.fit_many` trains K sites' masks in one batched pass, as DAS does (:mod:`cprobe.directions.das`): the
model stays outside; ``forward(rows, h_source, gates)`` runs the step's base rows once per site with the soft
interchange at site k gated by ``gates[k]``. The fitted DBM at site k is :meth:`featurizer` — its basis restricted to
the selected features (:class:`cprobe.models.featurizers.Subspace` for a linear basis), what MIB's submission holds
as the featurizer and its ``_indices``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction
from cprobe.directions.das import target_log_prob
from cprobe.models.featurizers import Featurizer, Identity, Subspace

BASES = ("standard", "pca", "sae")

MaskForward = Callable[[slice, Tensor, Tensor], Tensor]
"""``forward(rows, h_source (K, b, d), gates (K, m)) -> (K, b, V)``: the train base rows ``rows`` run once per site k
with the soft interchange toward ``h_source[k]`` gated by ``gates[k]``; differentiable in ``gates``. It may declare
``log_prob(rows, h_source, gates, target) -> (K, b)`` as DAS's forward may
(:func:`cprobe.directions.das.target_log_prob`; :class:`cprobe.models.multisite.EditForward`)."""


class Masked:
    """A featurizer restricted to the features ``indices``, the others left in the error term. Exact for an affine
    inverse (the standard basis, a subspace, an SAE's decoder): with ``lin(f_I)`` the inverse's linear part on the
    selected features, ``featurize(h) = (f_I, h − lin(f_I))`` and ``inverse(f_I, e) = lin(f_I) + e``, so interchanging
    every feature of it is the base's interchange of the features ``indices``."""

    def __init__(self, base: Featurizer, indices: Tensor) -> None:
        self.base, self.indices = base, indices.long()
        self.n_features = int(len(self.indices))

    def _lin(self, fi: Tensor) -> Tensor:
        full = torch.zeros(len(fi), self.base.n_features, dtype=fi.dtype, device=fi.device)
        full[:, self.indices] = fi
        zero = torch.zeros(len(fi), 1, dtype=fi.dtype, device=fi.device)
        return self.base.inverse(full, zero) - self.base.inverse(torch.zeros_like(full), zero)

    def featurize(self, h: Tensor) -> tuple[Tensor, Tensor]:
        fi = self.base.featurize(h)[0][:, self.indices]
        return fi, h - self._lin(fi)

    def inverse(self, features: Tensor, error: Tensor) -> Tensor:
        return self._lin(features) + error


@DIRECTIONS.register("dbm")
class DBM(Direction):
    """A binary mask over a featurizer's features, trained through the model (module doc). ``basis``: ``standard``
    (the site vector's coordinates), ``pca`` (the principal components of the states it is given, standardised as
    MIB's PCA featurizer is: every component, applied to the raw vector) or ``sae`` (the latents of the SAE given
    to :meth:`basis_featurizer`). Defaults are CausalAbstraction's (lr 1e-2, 3 epochs, batch 32, sparsity 1e-4,
    temperature 1.0 → 0.01)."""

    causal = True
    feature_mask: ClassVar[bool] = True
    _fitted_attrs = ("masks_", "featurizer_")

    def __init__(self, basis: str = "standard", lr: float = 1e-2, batch_size: int = 32, epochs: int = 3,
                 sparsity: float = 1e-4, temperature: Sequence[float] = (1.0, 0.01), seed: int = 0) -> None:
        if basis not in BASES:
            raise ValueError(f"unknown DBM basis {basis!r}; choose from {list(BASES)}")
        t = tuple(float(x) for x in temperature)
        if lr <= 0 or batch_size < 1 or epochs < 1 or sparsity < 0 or len(t) != 2 or min(t) <= 0:
            raise ValueError("DBM needs lr > 0, batch_size >= 1, epochs >= 1, sparsity >= 0 and two temperatures > 0")
        self.basis, self.lr, self.batch_size, self.epochs = basis, lr, batch_size, epochs
        self.sparsity, self.temperature, self.seed = sparsity, t, seed

    def fit(self, forward: Callable[[Any, Tensor], Tensor], h_source: Tensor, target: Tensor) -> Self:
        """One site, as DAS's ``fit``: ``forward(edit, batch_idx)`` runs the base rows with the site vector edited,
        ``h_source`` (n, d) the sources' vectors (the PCA basis is theirs), ``target`` (n,) the label tokens. Sets
        ``featurizer_`` (the selected features of ``base_``) and ``masks_`` (1, m)."""
        from cprobe.models.featurizers import interchange

        base = self.basis_featurizer(h_source)

        def one(rows: slice, hs: Tensor, gates: Tensor) -> Tensor:
            def edit(h: Tensor) -> Tensor:
                return interchange(h.float(), hs[0].to(h.device), base, gates[0]).to(h.dtype)
            return forward(edit, torch.arange(rows.start, rows.stop))[None]
        masks = self.fit_many(one, h_source[None], target[None], [base.n_features])
        self.base_, self.featurizer_ = base, self.featurizer(base, masks[0])
        return self

    def steps(self, n: int) -> int:
        return math.ceil(n / self.batch_size) * self.epochs

    def windows(self, n: int) -> list[tuple[int, int]]:
        """The (start, stop) train rows of each step of one epoch (data order, as DAS)."""
        return [(s, min(s + self.batch_size, n)) for s in range(0, n, self.batch_size)]

    def basis_featurizer(self, X: Tensor, sae: Any = None) -> Featurizer:
        """The featurizer whose features the mask selects, at a site whose states are ``X`` (n, d)."""
        d = X.shape[1]
        if self.basis == "standard":
            return Identity(d)
        if self.basis == "sae":
            if sae is None:
                raise ValueError("DBM basis 'sae' needs an SAE at the site")
            return sae
        Z = X.double()
        Z = (Z - Z.mean(0)) / Z.std(0, unbiased=False).clamp_min(1e-6)
        _, _, Vh = torch.linalg.svd(Z, full_matrices=False)  # rows: the principal axes, largest variance first
        return Subspace(Vh[: min(Z.shape)].T.float().contiguous())

    def gates(self, logits: Tensor, temperature: float) -> Tensor:
        return torch.sigmoid(logits / temperature)

    def fit_many(self, forward: MaskForward, h_source: Tensor, target: Tensor, n_features: Sequence[int]) -> Tensor:
        """Train K sites' masks (module doc): ``h_source`` (K, n, d) each site's source vectors, ``target`` (K, n) the
        label tokens, ``n_features[k]`` site k's number of features. Returns the masks (K, m) bool, m the largest
        count (a site's features past its own count are never selected); ``masks_`` keeps them, ``losses_`` (steps,
        K) the per-site cross-entropies."""
        K, n, _ = h_source.shape
        if target.shape != (K, n) or len(n_features) != K:
            raise ValueError(f"expected target (K, n) = {(K, n)} and {K} feature counts")
        device = h_source.device
        m = max(n_features)
        valid = (torch.arange(m)[None, :] < torch.tensor(list(n_features))[:, None]).to(device)
        logits = torch.nn.Parameter(torch.zeros(K, m, device=device))
        opt = torch.optim.AdamW([logits], lr=self.lr, weight_decay=0.0)
        total = self.steps(n)
        temps = torch.linspace(*self.temperature, total).tolist()
        windows = self.windows(n)
        losses = torch.zeros(total, K, device=device)
        h_source, target = h_source.detach().float(), target.to(device)
        for step in range(total):
            start, stop = windows[step % len(windows)]
            g = self.gates(logits, temps[step]) * valid
            nll = -target_log_prob(forward, slice(start, stop), h_source[:, start:stop], g,
                                   target[:, start:stop]).mean(1)
            loss = nll + self.sparsity * g.sum(1)  # ‖σ(mask/T)‖₁ per site
            opt.zero_grad()
            loss.sum().backward()  # each site's mask gets its own site's gradient
            opt.step()
            losses[step] = nll.detach()
        self.losses_ = losses
        self.masks_ = (torch.sigmoid(logits.detach()) > 0.5) & valid
        return self.masks_

    def featurizer(self, base: Featurizer, mask: Tensor) -> Featurizer:
        """The fitted mask at a site as one featurizer: ``base`` restricted to the selected features (a subspace's
        columns, the standard basis's coordinates, an SAE's latents)."""
        idx = mask[: base.n_features].nonzero().flatten().cpu()
        if isinstance(base, Identity):
            return Subspace(torch.eye(base.n_features)[:, idx])
        if isinstance(base, Subspace):
            return Subspace(base.basis[:, idx])
        return Masked(base, idx)
