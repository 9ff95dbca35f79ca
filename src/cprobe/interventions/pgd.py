"""PGD intervention (Madry et al. 2018), targeted at the counterfactual class.

Iterates ``h_{t+1} = Proj_{B_inf(h, eps)}(h_t - alpha * sign(grad CE(f(h_t), z')))`` for T
steps (T = 40 in Canby et al. 2024, App. C.3), from a uniform random start in the ball by
default (Madry et al.; torchattacks). The default step ``alpha = 2.5 * eps / T`` is Madry's
choice: enough to cross the ball 2.5 times, so the last steps can still refine. Returned is the
last iterate, as in the paper's attack (``select: last``); ``select: best`` returns the best iterate
seen instead (reaching z' first, then lowest loss).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError
from cprobe.interventions.base import INTERVENTIONS
from cprobe.interventions.gbi import GradientIntervention, input_grad, keep_best, project_linf, targeted_ce


@INTERVENTIONS.register("pgd")
class PGD(GradientIntervention):
    """Targeted L_inf projected gradient descent; the last (default) or the best iterate."""

    def __init__(self, eps: float, *, steps: int = 40, step_size: float | None = None, random_start: bool = True,
                 select: str = "last", **kw: Any) -> None:
        super().__init__(eps, **kw)
        if select not in ("last", "best"):
            raise ConfigError(f"unknown select {select!r}; choose from ['best', 'last']")
        if not (isinstance(steps, int) and steps >= 1):
            raise ConfigError(f"steps must be an integer >= 1, got {steps!r}")
        if step_size is not None and not step_size > 0:
            raise ConfigError(f"step_size must be > 0 (or null for 2.5*eps/steps), got {step_size!r}")
        self.steps = steps
        self.step_size = 2.5 * self.eps / steps if step_size is None else float(step_size)
        self.random_start = random_start
        self.select = select

    def _attack(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator) -> Tensor:
        x = h
        if self.random_start:
            noise = torch.rand(h.shape, generator=gen, device=h.device, dtype=h.dtype)
            x = project_linf(h + self.eps * (2 * noise - 1), h, self.eps)
        best_x, best_ok = h, torch.zeros(len(h), dtype=torch.bool, device=h.device)
        best_loss = torch.full((len(h),), torch.inf, device=h.device)
        for step in range(self.steps + 1 if self.select == "best" else self.steps):
            loss, grad, logits = input_grad(module, x, targeted_ce, target)
            if self.select == "best":
                best_x, best_ok, best_loss = keep_best(best_x, best_ok, best_loss, x, logits.argmax(1) == target, loss)
            if step < self.steps:
                x = project_linf(x - self.step_size * grad.sign(), h, self.eps)
        return best_x if self.select == "best" else x
