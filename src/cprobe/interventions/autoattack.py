"""AutoAttack intervention (Croce & Hein 2020), targeted at the counterfactual class z'.

The standard AutoAttack ensemble run in sequence, each component only on the rows that the
previous ones have not yet moved to z':

1. **APGD-CE**: Auto-PGD minimising the cross-entropy towards z' (sign steps, momentum 0.75,
   initial step 2 eps, step halved at checkpoints when progress stalls, restart from the best
   point). Its best-effort output is kept for rows that no component flips.
2. **APGD-T**: Auto-PGD on the targeted DLR loss ``(z_t - z_c) / (z_pi1 - (z_pi3 + z_pi4) / 2)``
   with ``z_c`` the strongest non-target logit. The denominator needs k >= 4 classes; with
   k = 2 it equals ``|z_t - z_c|`` and the loss collapses to +-1 with zero gradient, so for
   k < 4 we use the unnormalised margin ``z_t - z_c`` (the Carlini-Wagner loss that DLR
   rescales). For the binary Z_c of Canby et al. this makes APGD-T a margin attack, which
   still differs from APGD-CE in its gradients once the probe saturates.
3. **FAB-T**: the targeted fast adaptive boundary attack (L_inf): project onto the
   linearised boundary between z' and the strongest other class, mix with the projection of
   the original point (alpha <= 0.1, overshoot eta = 1.05), step back towards h (beta = 0.9)
   after each success and keep the smallest adversarial. With no box the L_inf projection
   onto a hyperplane ``w . delta = c`` is closed-form: ``delta = c sign(w) / ||w||_1``.
4. **Square**: the score-based random-search attack (5000 queries by default): the
   perturbation lives on the vertices of the ball (+-eps per coordinate); each query redraws
   the sign of one random contiguous window of coordinates (the 1-D analogue of a square,
   covering a fraction p of the d coordinates, p from 0.8 down on the reference schedule) and
   is kept if it lowers the cross-entropy towards z'. Rows stop as soon as they flip.

There is **no box constraint**: image attacks clip to [0, 1], hidden states have no such range,
so the only constraint anywhere is ``||h' - h||_inf <= eps``. Re-implemented from the papers
and a reading of fra31/auto-attack, not copied.

Cost: APGD and FAB take ``n_iter`` (100) forward+backward passes each over the rows they
attack; Square takes up to ``n_queries`` (5000) forward passes, but only over rows still not
flipped, so it is cheap at large eps and dominates at tiny eps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS
from cprobe.interventions.gbi import (GradientIntervention, input_grad, keep_best, project_linf, target_margin,
                                     targeted_ce)

COMPONENTS = ("apgd-ce", "apgd-t", "fab-t", "square")
Objective = Callable[[Tensor, Tensor], Tensor]

# Square's p schedule (Andriushchenko et al. 2020) on a 10 000-query scale: (last query, divisor).
_SQUARE_SCHEDULE = (
    (10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64), (6000, 128), (8000, 256)
)


def targeted_dlr(logits: Tensor, target: Tensor) -> Tensor:
    """Targeted DLR objective (to maximise); the plain margin when k < 4 (see module doc)."""
    margin = target_margin(logits, target)
    if logits.shape[1] < 4:
        return margin
    top = logits.float().sort(1, descending=True).values
    return margin / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + 1e-12)


def square_p(p_init: float, query: int, n_queries: int) -> float:
    """Fraction of coordinates redrawn at ``query`` (reference schedule rescaled to n_queries)."""
    q = int(query / n_queries * 10_000)
    for last, div in _SQUARE_SCHEDULE:
        if q <= last:
            return p_init / div
    return p_init / 512


@INTERVENTIONS.register("autoattack")
class AutoAttack(GradientIntervention):
    """Targeted AutoAttack ensemble on the interventional probe, L_inf, no box.

    ``attacks`` picks and orders components (default all four); ``n_iter`` and
    ``n_restarts`` apply to APGD and FAB, ``n_queries`` to Square; shrink them for CI.
    """

    def __init__(self, eps: float, *, attacks: Sequence[str] = COMPONENTS, n_iter: int = 100, n_restarts: int = 1,
                 n_queries: int = 5000, rho: float = 0.75, p_init: float = 0.8, **kw: Any) -> None:
        super().__init__(eps, **kw)
        attacks = tuple(attacks)
        unknown = [a for a in attacks if a not in COMPONENTS]
        if not attacks or unknown:
            raise ConfigError(f"attacks must be a non-empty subset of {list(COMPONENTS)}, not {list(attacks)}")
        for name, v in (("n_iter", n_iter), ("n_restarts", n_restarts), ("n_queries", n_queries)):
            if not (isinstance(v, int) and v >= 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if not 0 < rho < 1 or not 0 < p_init <= 1:
            raise ConfigError(f"need 0 < rho < 1 and 0 < p_init <= 1, got rho={rho}, p_init={p_init}")
        self.attacks, self.n_iter, self.n_restarts, self.n_queries = attacks, n_iter, n_restarts, n_queries
        self.rho, self.p_init = rho, p_init

    def _attack(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator) -> Tensor:
        run: dict[str, Callable[[nn.Module, Tensor, Tensor, torch.Generator], Tensor]] = {
            "apgd-ce": lambda m, x, t, g: self._apgd(m, x, t, g, lambda lg, tg: -targeted_ce(lg, tg)),
            "apgd-t": lambda m, x, t, g: self._apgd(m, x, t, g, targeted_dlr),
            "fab-t": self._fab,
            "square": self._square,
        }
        out = h.clone()
        todo = torch.ones(len(h), dtype=torch.bool, device=h.device)
        for i, name in enumerate(self.attacks):
            rows = todo.nonzero().squeeze(1)
            if len(rows) == 0:
                break
            adv = project_linf(run[name](module, h[rows], target[rows], gen), h[rows], self.eps)
            with torch.no_grad():
                ok = module(adv).argmax(1) == target[rows]
            keep = torch.ones_like(ok) if i == 0 else ok
            out[rows[keep]] = adv[keep]
            todo[rows[ok]] = False
        return out

    def _apgd(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator, objective: Objective) -> Tensor:
        """Auto-PGD maximising ``objective``; restarts only on rows not yet at the target."""
        best_x, best_ok = h.clone(), torch.zeros(len(h), dtype=torch.bool, device=h.device)
        best_loss = torch.full((len(h),), torch.inf, device=h.device)
        for _ in range(self.n_restarts):
            rows = (~best_ok).nonzero().squeeze(1)
            if len(rows) == 0:
                break
            x, ok, loss = self._apgd_run(module, h[rows], target[rows], gen, objective)
            bx, bo, bl = keep_best(best_x[rows], best_ok[rows], best_loss[rows], x, ok, loss)
            best_x[rows], best_ok[rows], best_loss[rows] = bx, bo, bl
        return best_x

    def _apgd_run(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator, objective: Objective
                  ) -> tuple[Tensor, Tensor, Tensor]:
        eps, n_iter = self.eps, self.n_iter
        noise = 2 * torch.rand(h.shape, generator=gen, device=h.device, dtype=h.dtype) - 1
        x = project_linf(h + eps * noise / (noise.abs().amax(1, keepdim=True) + 1e-12), h, eps)
        f, grad, logits = input_grad(module, x, objective, target)
        none = torch.zeros_like(f, dtype=torch.bool)
        out = keep_best(h, none, torch.full_like(f, torch.inf), x, logits.argmax(1) == target, -f)

        # Step-size control (Croce & Hein 2020, §3): checkpoints every k iterations, k shrinking
        # from 0.22 n_iter by 0.03 n_iter down to 0.06 n_iter.
        k, k_min, k_decr = max(int(0.22 * n_iter), 1), max(int(0.06 * n_iter), 1), max(int(0.03 * n_iter), 1)
        step = torch.full((len(h), 1), 2 * eps, device=h.device, dtype=h.dtype)
        x_max, g_max, f_max = x, grad, f
        f_max_at_check, halved_at_check = f_max, torch.ones_like(f, dtype=torch.bool)
        n_up, since_check, x_prev = torch.zeros_like(f), 0, x
        for i in range(n_iter):
            a = 0.75 if i > 0 else 1.0
            z = project_linf(x + step * grad.sign(), h, eps)
            x, x_prev = project_linf(x + a * (z - x) + (1 - a) * (x - x_prev), h, eps), x
            f_new, grad, logits = input_grad(module, x, objective, target)
            out = keep_best(*out, x, logits.argmax(1) == target, -f_new)
            n_up += (f_new > f).float()
            f = f_new
            up = f > f_max
            x_max = torch.where(up[:, None], x, x_max)
            g_max = torch.where(up[:, None], grad, g_max)
            f_max = torch.where(up, f, f_max)
            since_check += 1
            if since_check == k:
                stalled = (n_up <= self.rho * k) | (~halved_at_check & (f_max_at_check >= f_max))
                halved_at_check, f_max_at_check = stalled, f_max
                step = torch.where(stalled[:, None], step / 2, step)
                x = torch.where(stalled[:, None], x_max, x)
                grad = torch.where(stalled[:, None], g_max, grad)
                n_up, since_check, k = torch.zeros_like(f), 0, max(k - k_decr, k_min)
        return out

    def _fab(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator) -> Tensor:
        """Targeted FAB (L_inf, no box); returns the smallest adversarial found, else the last iterate."""
        with torch.no_grad():
            found = module(h).argmax(1) == target
        best_x = h.clone()
        best_norm = torch.full((len(h),), torch.inf, device=h.device)
        best_norm[found] = 0.0
        last = h.clone()
        for restart in range(self.n_restarts):
            rows = (best_norm > self.eps).nonzero().squeeze(1)
            if len(rows) == 0:
                break
            h_r = h[rows]
            x = h_r
            if restart > 0:
                u = 2 * torch.rand(h_r.shape, generator=gen, device=h.device, dtype=h.dtype) - 1
                radius = best_norm[rows].clamp(max=self.eps)[:, None] / 2
                x = h_r + radius * u / (u.abs().amax(1, keepdim=True) + 1e-12)
            x, bx, bn = self._fab_run(module, h_r, x, target[rows], best_x[rows], best_norm[rows])
            best_x[rows], best_norm[rows], last[rows] = bx, bn, x
        return torch.where(torch.isfinite(best_norm)[:, None], best_x, last)

    def _fab_run(self, module: nn.Module, h: Tensor, x: Tensor, target: Tensor, best_x: Tensor, best_norm: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor]:
        alpha_max, eta, beta = 0.1, 1.05, 0.9
        for _ in range(self.n_iter):
            # g = z_c - z_t > 0 until x is classified as the target; w = grad g.
            g, w, _ = input_grad(module, x, lambda lg, t: -target_margin(lg, t), target)
            sign, w_l1 = w.sign(), w.abs().sum(1) + 1e-12
            c_cur = -g / w_l1
            c_orig = -(g + ((h - x) * w).sum(1)) / w_l1
            alpha = (c_cur.abs() / (c_cur.abs() + c_orig.abs() + 1e-12)).clamp(max=alpha_max)[:, None]
            x = (1 - alpha) * (x + eta * c_cur[:, None] * sign) + alpha * (h + eta * c_orig[:, None] * sign)
            with torch.no_grad():
                ok = module(x).argmax(1) == target
            norm = (x - h).abs().amax(1)
            better = ok & (norm < best_norm)
            best_x = torch.where(better[:, None], x, best_x)
            best_norm = torch.where(better, norm, best_norm)
            x = torch.where(ok[:, None], h + beta * (x - h), x)
        return x, best_x, best_norm

    def _square(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator) -> Tensor:
        """Square random search on the vertices of the eps-ball, minimising CE towards z'."""
        n, d = h.shape
        dev, dt = h.device, h.dtype

        def score(x: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
            with torch.no_grad():
                logits = module(x)
            return targeted_ce(logits, t), target_margin(logits, t)

        def random_sign(shape: tuple[int, ...]) -> Tensor:
            return torch.randint(0, 2, shape, generator=gen, device=dev).to(dt) * 2 - 1

        sgn = random_sign((n, d))  # the perturbation is eps * sgn
        loss, margin = score(torch.add(h, sgn, alpha=self.eps), target)
        for query in range(1, self.n_queries):
            rows = (margin <= 0).nonzero().squeeze(1)
            if len(rows) == 0:
                break
            s = min(max(round(square_p(self.p_init, query, self.n_queries) * d), 1), d)
            start = torch.randint(0, d - s + 1, (len(rows), 1), generator=gen, device=dev)
            window = start + torch.arange(s, device=dev)
            old = sgn[rows]
            new = random_sign((len(rows), 1))
            # A redraw that would leave the window as it is gets flipped, so every query is a change.
            same = (old.gather(1, window) == new).all(1, keepdim=True)
            cand = old.scatter(1, window, torch.where(same, -new, new).expand(-1, s))
            c_loss, c_margin = score(torch.add(h[rows], cand, alpha=self.eps), target[rows])
            acc = c_loss < loss[rows]
            upd = rows[acc]
            sgn[upd], loss[upd], margin[upd] = cand[acc], c_loss[acc], c_margin[acc]
        return torch.add(h, sgn, alpha=self.eps)
