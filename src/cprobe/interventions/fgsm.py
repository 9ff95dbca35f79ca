"""FGSM intervention (Goodfellow et al. 2015), targeted at the counterfactual class.

One signed-gradient step that lowers the probe's cross-entropy towards z' (Canby et al.
2024, App. C.3): ``h' = h - eps * sign(grad_h CE(f(h), z'))``. Every coordinate with a
non-zero gradient moves by exactly eps, so ``||h' - h||_inf = eps`` (no [0, 1] clamp).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cprobe.interventions.base import INTERVENTIONS
from cprobe.interventions.gbi import GradientIntervention, input_grad, targeted_ce


@INTERVENTIONS.register("fgsm")
class FGSM(GradientIntervention):
    """Single targeted step of size eps along the sign of the loss gradient."""

    def _attack(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator) -> Tensor:
        _, grad, _ = input_grad(module, h, targeted_ce, target)
        return h - self.eps * grad.sign()
