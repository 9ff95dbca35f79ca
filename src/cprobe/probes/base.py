"""The probe interface: fit on activations + labels, predict class distributions.

Probes are torch modules underneath so gradient-based interventions (FGSM/PGD/AutoAttack)
can differentiate through them; ``module`` returns logits of shape (n, k).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Self

import torch
from torch import Tensor, nn

from cprobe.estimator import Estimator, accept_class
from cprobe.registry import Registry


class Probe(Estimator, ABC):
    """A classifier over hidden states.

    Conventions: ``X`` is float (n, d); ``y`` is int64 (n,) with values in [0, k). Fitted (or loaded) state:
    ``module`` and ``n_classes``; reading them, or scoring, before ``fit`` raises :class:`NotFittedError`
    (:class:`cprobe.estimator.Estimator`).
    """

    module: nn.Module
    n_classes: int
    _marks_fitted = ("fit", "fit_stream")
    _needs_fitted = ("logits",)
    _fitted_attrs = ("module", "n_classes")
    _fit_hint = "fit(X, y)"

    @abstractmethod
    def fit(self, X: Tensor, y: Tensor, X_val: Tensor | None = None, y_val: Tensor | None = None) -> Self:
        """Train (with hyperparameter selection on the validation split when given)."""

    def logits(self, X: Tensor) -> Tensor:
        p = next(self.module.parameters())
        with torch.inference_mode():
            return self.module(X.to(device=p.device, dtype=p.dtype)).float().cpu()

    def predict_proba(self, X: Tensor) -> Tensor:
        return self.logits(X).softmax(-1)

    def predict(self, X: Tensor) -> Tensor:
        return self.logits(X).argmax(-1)

    def score(self, X: Tensor, y: Tensor) -> float:
        """Accuracy on (X, y)."""
        return float((self.predict(X) == y.cpu()).double().mean())


def accept(obj: Any, ref: str) -> type[Probe]:
    """``obj`` as a probe class (a :class:`Probe` subclass, or a class with ``fit`` and ``predict_proba``, adapted);
    a one-line ConfigError otherwise."""
    return accept_class(obj, ref, Probe, ("fit", "predict_proba"), "probe")


PROBES: Registry[type[Probe]] = Registry("probe", group="cprobe.probes", accept=accept)
