"""Gradient-based interventions (GBIs): adversarial attacks on an interventional probe.

Canby et al. (2024, §3 and App. C.3) set a property Z to a counterfactual value z' by
training an MLP *interventional probe* f on Z and moving each embedding h to an h' with
``||h' - h||_inf <= eps`` that f classifies as z'. FGSM, PGD and AutoAttack differ only in
how they search that ball, so this module holds what they share: the probe, batching,
seeding, device handling, the targeted losses and the L_inf projection.

Hidden states are not images: there is no [0, 1] box. The eps-ball is the only constraint.
"""

from __future__ import annotations

import copy
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import torch
from torch import Tensor, nn

from cprobe.compute import fit_threads
from cprobe.errors import ConfigError
from cprobe.interventions.base import Intervention, Kind
from cprobe.probes.base import Probe


def project_linf(x: Tensor, h: Tensor, eps: float) -> Tensor:
    """Closest point to ``x`` in the L_inf ball of radius ``eps`` around ``h`` (exact in float).

    ``h + clamp(x - h)`` can overshoot the radius by half an ulp of ``h`` (noticeable when
    |h| is large, as in outlier dimensions of LM hidden states), so offending entries are
    nudged one ulp towards ``h`` until the measured distance is within ``eps``.
    """
    out = h + (x - h).clamp(-eps, eps)
    for _ in range(4):
        bad = (out - h).abs() > eps
        if not bad.any():
            break
        out = torch.where(bad, torch.nextafter(out, h), out)
    return out


def targeted_ce(logits: Tensor, target: Tensor) -> Tensor:
    """Per-row cross-entropy towards the target class; lower means closer to z'."""
    return nn.functional.cross_entropy(logits.float(), target, reduction="none")


def target_margin(logits: Tensor, target: Tensor) -> Tensor:
    """``z_t - max_{j != t} z_j`` per row: positive exactly when the probe predicts the target."""
    logits = logits.float()
    z_t = logits.gather(1, target[:, None]).squeeze(1)
    others = logits.scatter(1, target[:, None], -math.inf)
    return z_t - others.amax(1)


def input_grad(module: nn.Module, x: Tensor, objective: Callable[[Tensor, Tensor], Tensor],
               target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Return (per-row objective, its gradient w.r.t. ``x``, logits) in one forward/backward.

    Rows are independent, so the gradient of the summed objective is the per-row gradient.
    """
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = module(x)
        obj = objective(logits, target)
        (grad,) = torch.autograd.grad(obj.sum(), x)
    return obj.detach(), grad.detach(), logits.detach()


def keep_best(best_x: Tensor, best_ok: Tensor, best_loss: Tensor, x: Tensor, ok: Tensor,
              loss: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row, keep the better iterate: reaching the target first, then lower loss."""
    better = (ok & ~best_ok) | ((ok == best_ok) & (loss < best_loss))
    return torch.where(better[:, None], x, best_x), best_ok | ok, torch.where(better, loss, best_loss)


class GradientIntervention(Intervention):
    """Counterfactual intervention by a targeted L_inf attack on an interventional probe.

    ``fit`` trains the probe described by ``probe`` (a ``cprobe.probes.build_probe`` config,
    default the MLP probe of the paper); ``use_probe`` reuses an already-fitted one so an
    eps sweep shares a single probe; ``from_module`` wraps any logits module (for tests and
    custom probes). ``transform(X, z_target)`` returns ``h'`` with ``||h' - h||_inf <= eps``.
    """

    kind: ClassVar[Kind] = "counterfactual"
    needs_probe: ClassVar[bool] = True
    _fit_hint = "fit, use_probe or from_module"

    def __init__(self, eps: float, *, probe: Mapping[str, Any] | None = None, batch_size: int = 4096,
                 seed: int = 0) -> None:
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ConfigError(f"eps must be a finite number > 0, got {eps!r}; set a positive L_inf radius")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.eps = float(eps)
        self.probe = dict(probe) if probe is not None else {"name": "mlp"}
        self.batch_size = batch_size
        self.seed = seed
        self.module_: nn.Module | None = None
        self.n_classes_: int | None = None

    def fit(self, X: Tensor, z: Tensor) -> Self:
        """Train the interventional probe on the intervention split."""
        from cprobe.probes import build_probe

        return self.use_probe(build_probe(self.probe).fit(X, z))

    def use_probe(self, probe: Probe) -> Self:
        """Attack an already-fitted probe (shared across an eps sweep)."""
        return self._set_module(probe.module, probe.n_classes)

    @classmethod
    def from_module(cls, module: nn.Module, n_classes: int, **kw: Any) -> Self:
        """Build an intervention that attacks ``module`` (any (n, d) -> (n, k) logits map)."""
        return cls(**kw)._set_module(module, n_classes)

    def _set_module(self, module: nn.Module, n_classes: int) -> Self:
        if not (isinstance(n_classes, int) and n_classes >= 2):
            raise ConfigError(f"the interventional probe needs >= 2 classes, got {n_classes!r}")
        # A private frozen copy: eval mode (no dropout) and no parameter gradients, without
        # mutating the caller's probe.
        self.module_ = copy.deepcopy(module).eval().requires_grad_(False)
        self.n_classes_ = n_classes
        self.fitted_ = True
        return self

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        """Move each row of ``X`` towards class ``z_target`` within the eps-ball, in batches."""
        if z_target is None:
            raise ConfigError(f"{type(self).__name__} is counterfactual; pass z_target (a class id per row)")
        if X.ndim != 2 or not X.is_floating_point():
            raise ConfigError(f"X must be a float (n, d) tensor, got shape {tuple(X.shape)} dtype {X.dtype}")
        z_target = torch.as_tensor(z_target).to(device=X.device, dtype=torch.long)
        if z_target.shape != (X.shape[0],):
            raise ConfigError(f"z_target must have shape ({X.shape[0]},), got {tuple(z_target.shape)}")
        if len(z_target) and not (0 <= int(z_target.min()) and int(z_target.max()) < self.n_classes_):
            raise ConfigError(f"z_target values must lie in [0, {self.n_classes_})")

        X = X.detach()
        module = self.module_ = self.module_.to(X.device)  # the private probe copy, moved (once) to the data's device
        dtype = next(module.parameters(), torch.empty(0)).dtype
        gen = torch.Generator(device=X.device).manual_seed(self.seed)
        out = torch.empty_like(X)
        # the attack's steps are the probe's forward and backward on a batch: small ones run on one thread
        widest = max((p.numel() for p in module.parameters() if p.ndim == 2), default=0)
        with fit_threads(2 * min(self.batch_size, len(X)) * widest, X.device):
            for i in range(0, len(X), self.batch_size):
                h = X[i : i + self.batch_size].to(dtype)
                t = z_target[i : i + self.batch_size]
                adv = self._attack(module, h, t, gen)
                out[i : i + self.batch_size] = project_linf(adv.to(X.dtype), X[i : i + len(h)], self.eps)
        return out

    @abstractmethod
    def _attack(self, module: nn.Module, h: Tensor, target: Tensor, gen: torch.Generator) -> Tensor:
        """Return adversarial rows for one batch (the caller projects onto the eps-ball)."""
