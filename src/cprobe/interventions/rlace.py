"""R-LACE, relaxed linear adversarial concept erasure (Ravfogel et al. 2022), as in the rlace-icml code.

The rank-r game  min_θ max_{P ∈ 𝒫_r} ℓ(z, θᵀ(I − P)x)  over rank-r orthogonal projections is relaxed to the
Fantope F_r = {0 ⪯ P ⪯ I, tr P = r}. Each step takes one random batch for an SGD ascent step on P (then
the Euclidean projection back onto F_r) and another for an SGD step of the linear predictor θ. Every
``eval_every`` steps the relaxed P is rounded to the projection removing its top-r eigenvectors and scored
by a fresh logistic regression trained to convergence on the erased training data; the rounding with the
highest fresh-probe loss is kept, and the game stops once the best fresh-probe accuracy is within
``epsilon`` of the majority rate (``stop_reason`` "eps"), or after ``max_steps`` ("cap").

Two stops and a start beyond the reference, each off by default here (the reliability study's config turns them on,
``conf/intervention/rlace.yaml``):

- **A plateau** (``patience`` steps, ``plateau_tol``; "plateau"): the game also stops once the best fresh-probe loss
  (what the kept rounding is chosen by) has risen by less than ``plateau_tol`` over the last ``patience`` steps
  (:func:`plateaued`). The loss is bounded by the labels' entropy, which a fully erased representation reaches; where
  ε is out of reach (a rank whose rounding never brings the fresh probe to the majority rate) the reference runs to
  its 75k-step cap while the kept rounding no longer changes.
- **A warm start** (``fit(X, z, start=game)``): the game of rank r continues from a lower-rank :class:`Game` instead
  of the random start: its relaxed P projected onto F_r, its predictor; the first candidate rounding is the lower
  rank's kept one extended by the directions the projected P weighs most outside it (:func:`extend`), so the kept
  fresh-probe loss starts at the lower rank's. The relaxed game is convex in θ and linear in P over the convex
  Fantope, so its saddle value does not depend on the start; the start only changes how soon the game gets there.
  ``warm_start`` chains a rank sweep's separate jobs through the cache (:mod:`cprobe.interventions.rlace_chain`).

Differences from the reference code, none of which changes the game's iterates beyond floating point:
P is kept as c·I + V diag(m) Vᵀ (the Fantope projection clips most eigenvalues to one shared value, and
each SGD step adds a symmetric rank-2k update), so the eigendecomposition is of a small (m + 2k)-square
matrix instead of d × d — and once V spans nearly everything (ranks of ten and more at d = 128), of P's d × d
update in the standard basis, without the QR; the fresh probe is an exact Newton solve of the same objective as the
reference's ``SGDClassifier(alpha=1e-4)`` (warm-started), instead of the best of three stochastic fits; it is cheap,
so cprobe's default evaluates every 100 steps (the reference, and the reliability study's config, every 1000). The
reference's defaults: batch 128, lr 0.005, weight decay 1e-4, ε = 0.0015, 75k steps; Canby et al. use weight decay
1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import torch
from torch import Tensor, nn

from cprobe.compute import fit_threads
from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS, Intervention, projection_direction
from cprobe.interventions.inlp import prepare_rank_fit
from cprobe.interventions.rlace_chain import Game, Played, chained
from cprobe.paths import cache_dir
from cprobe.progress import track
from cprobe.stats import fit_logistic, log_loss_and_accuracy


def fantope_shift(lam: Tensor, rank: int, extra: Tensor | None = None, n_extra: int = 0) -> Tensor:
    """The θ with Σ clip(λ − θ, 0, 1) (+ n_extra · clip(extra − θ, 0, 1)) = rank, exactly.

    The sum is piecewise linear and non-increasing in θ with kinks at λᵢ and λᵢ − 1: evaluate it at every
    kink, find the segment holding ``rank`` and interpolate (the reference bisects 25 times instead).
    """
    vals = lam.detach().double().cpu().numpy()
    mult = np.ones_like(vals)
    if extra is not None and n_extra:
        vals = np.append(vals, float(extra))
        mult = np.append(mult, float(n_extra))

    def total(theta: np.ndarray) -> np.ndarray:
        return (np.clip(vals[None, :] - theta[:, None], 0, 1) * mult).sum(1)

    kinks = np.unique(np.concatenate([vals, vals - 1]))  # ascending
    f = total(kinks)  # non-increasing
    i = int(np.searchsorted(-f, -rank, side="left"))  # first kink with f <= rank
    if i == 0:
        theta = kinks[0]
    elif f[i] == rank or i == len(kinks):
        theta = kinks[min(i, len(kinks) - 1)]
    else:  # linear between kinks[i-1] (f > rank) and kinks[i] (f <= rank)
        t0, t1, f0, f1 = kinks[i - 1], kinks[i], f[i - 1], f[i]
        theta = t0 + (f0 - rank) * (t1 - t0) / (f0 - f1)
    return torch.tensor(theta, dtype=lam.dtype, device=lam.device)


def extend(U: Tensor, P: Tensor, rank: int) -> Tensor:
    """``U`` (d × r, orthonormal) and the ``rank`` − r directions ``P`` weighs most outside it: the top eigenvectors
    of P restricted to U's orthogonal complement (d × rank)."""
    Q = torch.eye(P.shape[0], dtype=P.dtype, device=P.device) - U @ U.T
    _, V = torch.linalg.eigh(Q @ ((P + P.T) / 2) @ Q)
    return torch.cat([U, V[:, V.shape[1] - (rank - U.shape[1]):]], 1)


class LowRankFantope:
    """P = c·I + V diag(m) Vᵀ (V orthonormal d × q) on the Fantope of rank ``rank``."""

    def __init__(self, P: Tensor, rank: int) -> None:
        lam, U = torch.linalg.eigh((P + P.T) / 2)
        mu = (lam - fantope_shift(lam, rank)).clamp(0, 1)
        c = mu.median()  # the shared (clipped) value: 0 unless the Fantope forces mass everywhere
        keep = (mu - c).abs() > 1e-12
        self.rank, self.d = rank, P.shape[0]
        self.c, self.V, self.m = c, U[:, keep], (mu - c)[keep]

    def dense(self) -> Tensor:
        eye = torch.eye(self.d, dtype=self.V.dtype, device=self.V.device)
        return self.c * eye + (self.V * self.m) @ self.V.T

    def erase(self, X: Tensor) -> Tensor:
        """X (I − P)."""
        return (1 - self.c) * X - ((X @ self.V) * self.m) @ self.V.T

    def sgd_step(self, A: Tensor, B: Tensor, lr: float, weight_decay: float) -> None:
        """P ← Π_F( sym( P − lr·(A Bᵀ + weight_decay·P) ) ) for the gradient A Bᵀ (A, B: d × k)."""
        decay = 1 - lr * weight_decay
        if self.V.shape[1] + 2 * A.shape[1] >= self.d:  # [V, A, B] spans everything: the standard basis is as good
            basis = None
            cross = A @ B.T
            S = decay * (self.V * self.m) @ self.V.T - lr / 2 * (cross + cross.T)
        else:
            basis, _ = torch.linalg.qr(torch.cat([self.V, A, B], 1))
            VB, AB, BB = self.V.T @ basis, A.T @ basis, B.T @ basis
            cross = AB.T @ BB
            S = decay * (VB.T * self.m) @ VB - lr / 2 * (cross + cross.T)
        s, R = torch.linalg.eigh((S + S.T) / 2)
        c = decay * self.c
        n_rest = 0 if basis is None else self.d - basis.shape[1]
        theta = fantope_shift(c + s, self.rank, extra=c if n_rest else None, n_extra=n_rest)
        c_new = (c - theta).clamp(0, 1) if n_rest else torch.zeros_like(c)
        mu = (c + s - theta).clamp(0, 1) - c_new
        keep = mu.abs() > 1e-12
        self.c, self.V, self.m = c_new, (R if basis is None else basis @ R)[:, keep], mu[keep]

    def top(self, rank: int) -> Tensor:
        """The top-``rank`` eigenvectors (d, rank)."""
        if int((self.m > 0).sum()) >= rank:
            return self.V[:, self.m.argsort(descending=True)[:rank]]
        _, U = torch.linalg.eigh(self.dense())  # degenerate top eigenspace: any basis of it is as good
        return U[:, -rank:]


def _logit_grad(logits: Tensor, yb: Tensor, binary: bool) -> Tensor:
    """∂(mean log-loss)/∂logits of the batch: one sigmoid logit for a binary Z (``yb`` float), softmax otherwise."""
    if binary:
        return (torch.sigmoid(logits[:, 0]) - yb)[:, None] / len(yb)
    return (torch.softmax(logits, 1) - nn.functional.one_hot(yb, logits.shape[1])) / len(yb)


STOP_REASONS = ("eps", "plateau", "cap", "none")
"""Why a game stopped (``stop_reason``): the fresh probe came within ``epsilon`` of the majority rate; the best
fresh-probe loss stopped rising (:func:`plateaued`); ``max_steps`` ran out; or no game was played (rank 0)."""


def plateaued(history: Sequence[tuple[int, float]], patience: int, tol: float) -> bool:
    """Whether the best fresh-probe loss has risen by less than ``tol`` over the last ``patience`` steps.

    ``history``: (step, best loss so far) at each evaluation, in order (the best is a running maximum). False until an
    evaluation ``patience`` steps or more before the last exists; then compares the last best with the best at the
    latest such evaluation."""
    if not history:
        return False
    step, best = history[-1]
    before = [b for s, b in history if s <= step - patience]
    return bool(before) and best - before[-1] < tol


@INTERVENTIONS.register("rlace")
class RLACE(Intervention):
    """Nullifying: ``transform(X) = X P`` with ``P`` (d, d) an orthogonal projection of rank d − r.

    After ``fit``: ``P``, ``probe_accuracy`` and ``probe_loss`` (the fresh probe on X P of the kept
    rounding, training rows), ``steps_run``, ``stop_reason`` (:data:`STOP_REASONS`), ``converged`` (stopped by
    ``epsilon``), ``start_rank`` (the rank of the game it continued from; None: the reference's random start) and
    ``game_`` (:class:`~cprobe.interventions.rlace_chain.Game`: where the relaxed game ended).
    """

    kind = "nullifying"
    exposes_direction = True

    def __init__(
        self,
        rank: int,
        lr: float = 0.005,
        weight_decay: float = 1e-5,
        batch_size: int = 128,
        max_steps: int = 75_000,
        eval_every: int = 100,
        epsilon: float = 0.0015,
        eval_l2: float = 1e-4,
        patience: int | None = None,
        plateau_tol: float = 1e-4,
        warm_start: bool = False,
        cache: bool = True,
        seed: int = 0,
        device: str | None = None,
    ) -> None:
        if not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"rank must be a non-negative integer, got {rank!r}")
        if lr <= 0:
            raise ConfigError(f"lr must be > 0, got {lr}")
        if weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")
        for name, v in (("batch_size", batch_size), ("max_steps", max_steps), ("eval_every", eval_every)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if epsilon < 0 or eval_l2 <= 0:
            raise ConfigError(f"epsilon must be >= 0 and eval_l2 > 0, got {epsilon} and {eval_l2}")
        if patience is not None and (not isinstance(patience, int) or patience < 1):
            raise ConfigError(f"patience must be an integer >= 1 (steps) or null (no plateau stop), got {patience!r}")
        if plateau_tol < 0:
            raise ConfigError(f"plateau_tol must be >= 0, got {plateau_tol}")
        self.rank, self.lr, self.weight_decay = rank, lr, weight_decay
        self.batch_size, self.max_steps, self.eval_every = batch_size, max_steps, eval_every
        self.epsilon, self.eval_l2, self.seed, self.device = epsilon, eval_l2, seed, device
        self.patience, self.plateau_tol = patience, plateau_tol
        self.warm_start, self.cache = bool(warm_start), bool(cache)

    def settings(self) -> dict[str, Any]:
        """Every setting that decides a game but the rank (what the cached games of a rank chain are keyed by)."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "batch_size": self.batch_size,
                "max_steps": self.max_steps, "eval_every": self.eval_every, "epsilon": self.epsilon,
                "eval_l2": self.eval_l2, "patience": self.patience, "plateau_tol": self.plateau_tol, "seed": self.seed}

    def _score(self, X: Tensor, z: Tensor, k: int, U: Tensor, warm: tuple[Tensor, Tensor] | None
               ) -> tuple[float, float, tuple[Tensor, Tensor]]:
        Xe = X - (X @ U) @ U.T
        W, b = fit_logistic(Xe, z, k, self.eval_l2, init=warm)
        loss, acc = log_loss_and_accuracy(Xe, z, W, b)
        return loss, acc, (W, b)

    def fit(self, X: Tensor, z: Tensor, start: Game | None = None) -> Self:
        """Play the game on (X, z). ``start``: a :class:`~cprobe.interventions.rlace_chain.Game` to continue from
        instead of the reference's random start. With ``warm_start`` (and no ``start``), rank r is the last game of
        the chain 1 → … → r, each game continuing from the one below and kept in the cache
        (:func:`cprobe.interventions.rlace_chain.chained`)."""
        # thousands of ~1 ms steps of small ops: one thread (cprobe.compute.fit_threads), as every small fit
        step_flops = 2 * self.batch_size * X.shape[-1] * (3 * max(self.rank, 1) + 2)
        with fit_threads(step_flops, self.device or X.device):
            return self._fit(X, z, start)

    def _fit(self, X: Tensor, z: Tensor, start: Game | None) -> Self:
        Xd, zd, k = prepare_rank_fit(X, z, self.rank, self.device)
        Xd = Xd.double()
        self.n_classes = k
        if self.rank == 0:
            d = Xd.shape[1]
            self.P = torch.eye(d, device=Xd.device)
            self.steps_run, self.converged, self.stop_reason, self.start_rank = 0, True, "none", None
            W, b = fit_logistic(Xd, zd, k, self.eval_l2)
            self.probe_loss, self.probe_accuracy = log_loss_and_accuracy(Xd, zd, W, b)
            zero = torch.zeros(d, d, dtype=torch.float64, device=Xd.device)
            self.game_ = Game(zero, W, b, zero[:, :0], 0)
            return self
        if self.warm_start and start is None:
            root = cache_dir() if self.cache else None
            played = chained(Xd, zd, self.rank, self.settings(), lambda r, g: self._play(Xd, zd, k, r, g), root)
        else:
            played = self._play(Xd, zd, k, self.rank, start)
        U = played.game.U.to(Xd.device, torch.float64)
        self.P = (torch.eye(Xd.shape[1], device=Xd.device, dtype=torch.float64) - U @ U.T).float()
        self.probe_loss, self.probe_accuracy = played.probe_loss, played.probe_accuracy
        self.steps_run, self.stop_reason, self.start_rank = played.steps_run, played.stop_reason, played.start_rank
        self.converged, self.game_ = played.stop_reason == "eps", played.game
        return self

    def _play(self, Xd: Tensor, zd: Tensor, k: int, rank: int, start: Game | None) -> Played:
        """One game of rank ``rank`` ≥ 1 on (Xd float64, zd), from ``start`` or the reference's random start."""
        (n, d), device = Xd.shape, Xd.device
        gen = torch.Generator().manual_seed(self.seed)
        binary = k == 2
        target = zd.double() if binary else zd
        order: list[Tensor] = []

        def batch() -> tuple[Tensor, Tensor]:
            # batches of a fresh permutation until it runs out (the reference draws each batch anew)
            if not order or len(order[0]) < self.batch_size:
                order[:] = [torch.randperm(n, generator=gen).to(device)]
            idx, order[0] = order[0][: self.batch_size], order[0][self.batch_size :]
            return Xd[idx], target[idx]

        first = None  # the first evaluation's rounding: the state's own, or a warm start's extended one
        if start is None:
            state, W, b = self._cold_start(d, k, rank, gen, device, batch, binary)
        else:
            if start.P.shape != (d, d) or start.W.shape[1] != d or not 1 <= start.rank < rank:
                raise ConfigError(f"a warm start of a rank-{rank} R-LACE game needs a game of a lower rank on "
                                  f"{d}-dimensional states, got rank {start.rank} and P of shape {tuple(start.P.shape)}")
            state = LowRankFantope(start.P.to(device, torch.float64), rank)
            first = extend(start.U.to(device, torch.float64), state.dense(), rank)
            W, b = start.W.to(device, torch.float64).clone(), start.b.to(device, torch.float64).clone()

        majority = torch.bincount(zd, minlength=k).max().item() / n
        best_loss, best_acc, best_U, warm = -1.0, 1.0, None, None
        history: list[tuple[int, float]] = []
        stop, step = "cap", 0
        for step in track(range(1, self.max_steps + 1), "rlace"):
            if (step - 1) % self.eval_every == 0:
                U = first if step == 1 and first is not None else state.top(rank)
                loss, acc, warm = self._score(Xd, zd, k, U, warm)
                if loss > best_loss:
                    best_loss, best_U = loss, U
                if abs(acc - majority) < abs(best_acc - majority):
                    best_acc = acc
                history.append((step, best_loss))
                if abs(best_acc - majority) < self.epsilon:
                    stop = "eps"
                    break
                if self.patience is not None and plateaued(history, self.patience, self.plateau_tol):
                    stop = "plateau"
                    break
            xb, yb = batch()
            A, B = self._gradient(W, b, xb, state.erase(xb), yb, binary)
            state.sgd_step(A, B, self.lr, self.weight_decay)
            self._predictor_step(W, b, state, *batch(), binary)
        assert best_U is not None
        return Played(Game(state.dense(), W, b, best_U, rank), best_loss, best_acc, step, stop,
                      None if start is None else start.rank)

    def _cold_start(self, d: int, k: int, rank: int, gen: torch.Generator, device: torch.device, batch: Any,
                    binary: bool) -> tuple[LowRankFantope, Tensor, Tensor]:
        """The reference's start: nn.Linear's default initialisation of the predictor, a random symmetric P (scale
        0.1) and one dense SGD step on it before the low-rank form; then one predictor step."""
        rows, bound = (1 if binary else k), 1 / math.sqrt(d)
        W = ((torch.rand(rows, d, generator=gen, dtype=torch.float64) * 2 - 1) * bound).to(device)
        b = ((torch.rand(rows, generator=gen, dtype=torch.float64) * 2 - 1) * bound).to(device)
        P0 = 0.1 * torch.randn(d, d, generator=gen, dtype=torch.float64).to(device)
        P0 = (P0 + P0.T) / 2
        xb, yb = batch()
        A, B = self._gradient(W, b, xb, xb - xb @ P0, yb, binary)
        P1 = P0 - self.lr * (A @ B.T + self.weight_decay * P0)
        state = LowRankFantope((P1 + P1.T) / 2, rank)
        self._predictor_step(W, b, state, *batch(), binary)
        return state, W, b

    @staticmethod
    def _gradient(W: Tensor, b: Tensor, xb: Tensor, erased: Tensor, yb: Tensor, binary: bool) -> tuple[Tensor, Tensor]:
        """∂(−loss)/∂P = A Bᵀ for the batch: the P-player ascends the predictor's loss on X(I − P)."""
        delta = _logit_grad(erased @ W.T + b, yb, binary)
        # the loss depends on P through −X P Wᵀ: ∂loss/∂P = −Xᵀ Δ W, so ∂(−loss)/∂P = (XᵀΔ) W
        return xb.T @ delta, W.T

    def _predictor_step(self, W: Tensor, b: Tensor, state: LowRankFantope, xb: Tensor, yb: Tensor,
                        binary: bool) -> None:
        """One SGD step (weight decay on W and b, as torch's SGD) of the predictor on X(I − P), in place."""
        erased = state.erase(xb)
        delta = _logit_grad(erased @ W.T + b, yb, binary)
        W -= self.lr * (delta.T @ erased + self.weight_decay * W)
        b -= self.lr * (delta.sum(0) + self.weight_decay * b)

    def edit_direction(self) -> Tensor | None:
        """The one direction removed, when the projection has rank d − 1 (``rank: 1``)."""
        self.check_fitted()
        return projection_direction(self.P)

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        P = self.P.to(X.device)
        return (X.to(P.dtype) @ P).to(X.dtype)
