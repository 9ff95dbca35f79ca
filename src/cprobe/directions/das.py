"""Distributed Alignment Search (CausalGym eq. 12, App. B; RAVEL's and MIB's k-dimensional DAS).

DAS learns ``a`` so that the 1-D DII at the site makes the frozen model predict the source
label: ``min_a −Σ log p_{f←f*_a}(y_s | b, s)``. It is the only method trained on the causal
objective. With ``k > 1`` it learns an orthonormal basis R (d, k) (pyvene's ``LowRankRotateLayer(d, k)``) and
interchanges the subspace, ``h + R Rᵀ (s − h)`` (:class:`cprobe.models.featurizers.Subspace`); ``k = 1`` is the
DII. The model stays outside this module: ``fit`` receives a differentiable ``forward(edit, batch_idx)`` that runs
the base inputs ``batch_idx`` with the site vector replaced by ``edit(h_base_rows)`` and returns next-token log-probs
(or logits) ``(n, V)``.

Sites are independent problems (separate parameters, the model frozen), so :meth:`DAS.fit_many` trains K of
them in one batched pass: each step runs the step's base rows once per site (K copies in one forward), the
loss is the sum of the K per-site mean cross-entropies, so every direction receives exactly its own gradient,
and one Adam over the (K, d) parameters updates each row as K separate Adams would (Adam is elementwise).
The only difference to K separate runs is floating-point summation order in the batched forward.

No step synchronises with the host: the losses stay on the device (``losses_``) and are read once, at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Self

import torch
from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction, unit
from cprobe.models.edits import Edit, dii_edit
from cprobe.models.featurizers import Subspace, interchange

Forward = Callable[[Edit, Tensor], Tensor]
"""``forward(edit, batch_idx) -> (len(batch_idx), V)`` next-token scores of the edited base rows."""

BatchForward = Callable[[slice, Tensor, Tensor], Tensor]
"""``forward(rows, h_source, a) -> (K, b, V)``: the train base rows ``rows`` (a slice of b rows) run once per site k,
with the DII at site k toward the source rows ``h_source[k]`` (K, b, d) along ``a[k]`` (K, d), or the interchange of
the span of the orthonormal columns of ``a[k]`` (K, d, k) where DAS's ``k > 1``; differentiable in ``a``. Rows come
as a slice of plain ints, so a forward needs no index tensor read back. A forward may also declare
``log_prob(rows, h_source, a, target) -> (K, b)``, the log-probabilities of ``target`` (K, b) directly
(:meth:`cprobe.models.multisite.SitesForward.log_prob`: the head's target rows and its streamed normaliser, no (K, b, V)
scores); training then uses it (:func:`target_log_prob`)."""


def target_log_prob(forward: Callable[..., Tensor], rows: slice, h_source: Tensor, a: Tensor,
                    target: Tensor) -> Tensor:
    """log p(target) (K, b) of a training step's edited rows: the forward's own ``log_prob`` where it declares one,
    else the log-softmax of its scores (K, b, V) at ``target`` (K, b). The loss of DAS and DBM is its negative."""
    own = getattr(forward, "log_prob", None)
    if callable(own):
        return own(rows, h_source, a, target)
    return torch.log_softmax(forward(rows, h_source, a).float(), -1).gather(2, target[..., None]).squeeze(2)


@DIRECTIONS.register("das")
class DAS(Direction):
    """Rank-1 DAS. ``parametrization="orthogonal"`` (default) is the reference's (pyvene's rotate layer):
    ``a`` is the single column of a (d, 1) matrix under torch's orthogonal parametrisation
    (Householder, with the trivialisation's base completed from a generator seeded by ``seed``), so Adam moves
    the underlying parameter and ``a`` stays a unit vector; ``"normalize"`` (cprobe ≤ 0.3) runs Adam on a raw
    vector ``v`` and uses ``v/‖v‖``.

    Defaults are the paper's: lr 5e-3, batch 4, 1 epoch (100 steps on 400 items), linear
    warm-up over the first 10% of steps from 0, then linear decay to 0. Batches are taken in
    data order, as in the reference (each block of 4 is 2 pairs and their swaps).

    ``k`` (default 1) is the subspace's dimension: the rotate layer has k columns, ``basis_`` (d, k) is the fitted
    orthonormal basis and ``a`` its first column (``basis_`` is ``a`` as a column where k = 1). Its first column starts
    at the 1-D start; the others are seeded Gaussian columns orthonormalised against it. k > 1 needs the orthogonal
    parametrisation.
    """

    causal = True
    _fitted_attrs = ("a", "basis_")

    def __init__(self, lr: float = 5e-3, batch_size: int = 4, epochs: int = 1,
                 warmup: float = 0.1, seed: int = 0, parametrization: str = "orthogonal", k: int = 1) -> None:
        if lr <= 0 or batch_size < 1 or epochs < 1 or not 0 <= warmup < 1:
            raise ValueError("DAS needs lr > 0, batch_size >= 1, epochs >= 1 and 0 <= warmup < 1")
        if parametrization not in ("orthogonal", "normalize"):
            raise ValueError(f"unknown parametrization {parametrization!r}; choose from ['normalize', 'orthogonal']")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"DAS k (the subspace's dimension) must be an integer >= 1, got {k!r}")
        if k > 1 and parametrization != "orthogonal":
            raise ValueError(f"DAS k={k} needs parametrization=orthogonal (normalize is rank-1)")
        self.lr, self.batch_size, self.epochs, self.warmup, self.seed = lr, batch_size, epochs, warmup, seed
        self.parametrization, self.k = parametrization, k

    def steps(self, n: int) -> int:
        """Optimiser steps on ``n`` train items: ⌈n / batch_size⌉ per epoch."""
        return math.ceil(n / self.batch_size) * self.epochs

    def windows(self, n: int) -> list[tuple[int, int]]:
        """The (start, stop) train rows of each step of one epoch (data order; every epoch repeats them)."""
        return [(s, min(s + self.batch_size, n)) for s in range(0, n, self.batch_size)]

    def fit(self, forward: Forward, h_source: Tensor, target: Tensor,
            callback: Callable[[int, Tensor], None] | None = None) -> Self:
        """Train on the train set's source site vectors ``h_source`` (n, d) toward ``target`` (n,).

        ``target`` holds the source-label token ids y_s. ``callback(step, a)`` runs after each
        optimiser step (e.g. to evaluate at steps 25/50/75/99 as in the paper; ``a`` is the (d, k) basis where
        k > 1). The per-step mean cross-entropy is kept in ``self.losses`` (read from the device once, after the
        last step).
        """
        n = h_source.shape[0]
        if target.shape != (n,):
            raise ValueError(f"target must be ({n},), got {tuple(target.shape)}")

        def one(rows: slice, hs: Tensor, a: Tensor) -> Tensor:
            return forward(subspace_edit(hs[0], a[0]), torch.arange(rows.start, rows.stop))[None]

        each = None if callback is None else (lambda step, a: callback(step, a[0]))
        found = self.fit_many(one, h_source[None], target[None], callback=each)[0]
        self.basis_ = found[:, None] if found.dim() == 1 else found
        self.a = self.basis_[:, 0]
        self.losses: list[float] = self.losses_[:, 0].tolist()
        return self

    def fit_many(self, forward: BatchForward, h_source: Tensor, target: Tensor,
                 callback: Callable[[int, Tensor], None] | None = None, weight: Tensor | None = None) -> Tensor:
        """Train K independent directions, one per site, in one batched pass; returns them (K, d), unit rows (where
        k > 1: the K orthonormal bases (K, d, k), columns orthonormal to float precision).

        ``h_source`` (K, n, d) holds each site's source vectors of the n train items, ``target`` (K, n) each
        site's source-label ids (e.g. the task's and the control's labels at one site are two of the K). Every
        site starts from the same seeded direction and follows the schedule of :meth:`fit`; site k's result
        equals ``fit`` on site k alone up to floating-point summation order. ``losses_`` (steps, K) stays on
        the device; ``callback(step, A)`` receives the (K, d) directions after each step. ``weight`` (K, n), when
        given, weighs each row's cross-entropy (a step's loss is the weighted mean of its rows': multi-task DAS's
        Cause and Isolate rows, ``cprobe.tasks.ravel``); None is the plain mean.
        """
        if h_source.ndim != 3 or target.shape != h_source.shape[:2]:
            raise ValueError(f"expected h_source (K, n, d) and target (K, n), got {tuple(h_source.shape)} and "
                             f"{tuple(target.shape)}")
        if weight is not None and weight.shape != target.shape:
            raise ValueError(f"weight must be shaped as target {tuple(target.shape)}, got {tuple(weight.shape)}")
        K, n, d = h_source.shape
        if self.k > d:
            raise ValueError(f"DAS k={self.k} exceeds the site vectors' dimension d={d}")
        device = h_source.device
        h_source = h_source.detach().float()
        target = target.to(device)
        weight = None if weight is None else weight.to(device, torch.float32)
        direction, params = self._parametrise(K, d, device)
        total = self.steps(n)
        warm = self.warmup * total
        optimizer = torch.optim.Adam(params, lr=self.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: s / warm if s < warm else max(0.0, (total - s) / (total - warm)))
        windows = self.windows(n)
        losses = torch.zeros(total, K, device=device)
        for step in range(total):
            start, stop = windows[step % len(windows)]
            nll = -target_log_prob(forward, slice(start, stop), h_source[:, start:stop], direction(),
                                   target[:, start:stop])  # (K, b)
            if weight is None:
                per_site = nll.mean(1)  # (K,)
            else:
                w = weight[:, start:stop]
                per_site = (nll * w).sum(1) / w.sum(1).clamp_min(1e-12)
            optimizer.zero_grad()
            per_site.sum().backward()  # each direction gets its own site's gradient
            optimizer.step()
            schedule.step()
            losses[step] = per_site.detach()
            if callback is not None:
                with torch.no_grad():
                    callback(step, direction().detach().clone())
        self.losses_ = losses
        with torch.no_grad():
            a = direction().detach().clone()
            if a.dim() == 2:
                self.directions_ = a / a.norm(dim=-1, keepdim=True)
            else:  # re-orthonormalised, each column's sign kept
                Q, R = torch.linalg.qr(a)
                self.directions_ = Q * torch.where(R.diagonal(dim1=-2, dim2=-1) < 0, -1.0, 1.0)[:, None]
        return self.directions_

    def start(self, d: int) -> tuple[Tensor, Tensor | None]:
        """(the seeded unit start direction (d,) — the (d, k) orthonormal start where k > 1 —, the orthogonal
        parametrisation's (d, d) base or None), on the CPU.

        The base is what ``torch.nn.utils.parametrizations.orthogonal`` builds for the (d, k) weight holding the
        start: it completes the columns to an orthogonal matrix with ``torch.randn``, here drawn from the global
        generator reseeded with ``seed`` inside a fork (so a run does not depend on what drew random numbers before
        it: a cold and a warm run, or a resumed one, train the same directions)."""
        g = torch.Generator().manual_seed(self.seed)
        init = unit(torch.randn(d, generator=g))
        if self.k > 1:  # column 0 the 1-D start, the others seeded and orthonormalised against it
            Q, R = torch.linalg.qr(torch.cat([init[:, None], torch.randn(d, self.k - 1, generator=g)], 1))
            init = Q * torch.where(R.diagonal() < 0, -1.0, 1.0)
        if self.parametrization != "orthogonal":
            return init, None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            rotate = torch.nn.Linear(self.k, d, bias=False)  # weight (d, k), as pyvene's rotate layer
            with torch.no_grad():
                rotate.weight.copy_(init.reshape(d, self.k))
            torch.nn.utils.parametrizations.orthogonal(rotate)
        return init, rotate.parametrizations.weight[0].base.detach().clone()

    def _parametrise(self, K: int, d: int, device: torch.device) -> tuple[Callable[[], Tensor], list[Tensor]]:
        """(directions() -> (K, d), or the bases (K, d, k) where k > 1; the parameters): K copies of the start,
        vectorised.

        Orthogonal: torch's Householder map of a (d, 1) matrix X, batched over K: with A = X below the diagonal,
        τ = 2 / (1 + ‖A‖²) and v = e₁ + A, the column is sign(X₁₁)·(e₁ − τ v), rotated by the shared base; X starts
        at −e₁ (the trivialisation's identity), so the first direction is the start itself. Normalize: ``v/‖v‖``.
        k > 1: the same map of a (d, k) X (torch's ``householder_product`` of its k reflectors, the diagonal's signs
        kept), X starting at −I (d, k).
        """
        init, base = self.start(d)
        if self.k > 1:
            return self._householder_k(K, d, base.to(device), device)  # type: ignore[union-attr]
        if base is None:
            v = torch.nn.Parameter(init.to(device).repeat(K, 1))

            def normalised() -> Tensor:
                return v / v.norm(dim=-1, keepdim=True)
            return normalised, [v]
        X = torch.zeros(K, d, device=device)
        X[:, 0] = -1.0
        X = torch.nn.Parameter(X)
        base = base.to(device)
        e1 = torch.zeros(d, device=device)
        e1[0] = 1.0
        below = 1.0 - e1  # the strictly-lower part of the column: every entry but the diagonal one

        def householder() -> Tensor:
            A = X * below
            tau = 2.0 / (1.0 + (A * A).sum(-1, keepdim=True))
            q = (e1 - tau * (e1 + A)) * X[:, :1].detach().int()  # the diagonal's sign is not trained
            return q @ base.T
        return householder, [X]

    def _householder_k(self, K: int, d: int, base: Tensor, device: torch.device
                       ) -> tuple[Callable[[], Tensor], list[Tensor]]:
        """torch's orthogonal (Householder) map of K (d, k) matrices X under the shared base: ``bases()`` (K, d, k)."""
        X = torch.zeros(K, d, self.k, device=device)
        X.diagonal(dim1=-2, dim2=-1).fill_(-1.0)
        X = torch.nn.Parameter(X)

        def bases() -> Tensor:
            A = X.tril(-1)
            Q = torch.linalg.householder_product(A, 2.0 / (1.0 + (A * A).sum(-2)))
            return base @ (Q * X.diagonal(dim1=-2, dim2=-1).detach().int()[:, None, :])
        return bases, [X]


def subspace_edit(h_source: Tensor, a: Tensor) -> Edit:
    """The DII along ``a`` (d,), or the interchange of the span of the orthonormal columns of ``a`` (d, k), toward the
    fixed source rows ``h_source`` (n, d); computed in float32 and cast back."""
    if a.dim() == 1:
        return dii_edit(h_source, a)
    return lambda h: interchange(h.float(), h_source.to(h.device).float(), Subspace(a.to(h.device).float())
                                 ).to(h.dtype)
