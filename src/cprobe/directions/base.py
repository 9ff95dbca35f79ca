"""The direction-finding interface (CausalGym §4.2): each method proposes one unit vector ``a``.

The 1-D DII (``cprobe.models.edits``) is invariant to the sign of ``a``, so methods only
promise a unit-norm direction. Most methods are fitted on base activations ``X`` (n, d) with
the base class ids ``y`` (n,) of the train set (``fit(X, y)``); DAS (``causal = True``) is
instead trained through the frozen model (see ``cprobe.directions.das``).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import Tensor

from cprobe.estimator import Estimator, accept_class
from cprobe.registry import Registry


class Direction(Estimator, ABC):
    """A feature-finding method; after ``fit`` the attribute ``a`` is a unit float32 (d,) tensor (None for the
    ``whole_vector`` swap; reading it, or ``score``, before ``fit`` raises :class:`NotFittedError`:
    :class:`cprobe.estimator.Estimator`)."""

    a: Tensor
    causal: ClassVar[bool] = False
    """True when ``fit`` needs the model (a forward callable) rather than activations and labels; such a
    direction is trained per condition (task / control labels), the others once per site."""
    supervised: ClassVar[bool] = False
    """True when ``fit`` needs both classes among the labels ``y`` (a site with one class gets no direction)."""
    chance_baseline: ClassVar[bool] = False
    """True for a chance-level baseline that ignores the data's labels: scored as the mean over several
    independent draws (``random_draws``), each seeded per site."""
    whole_vector: ClassVar[bool] = False
    """True for the whole-vector swap (the vanilla interchange, CausalGym's reference row): no direction is learned,
    ``a`` is None after ``fit`` and the intervention replaces the site vector by the source's."""
    per_model_lambda: ClassVar[bool] = False
    """True when the constructor takes a penalty ``lam`` tuned per model (the paper's probe λ, ``causalgym.probe_lam``);
    several λs run as several methods (``probe0``, ``probe1``)."""
    fits_on_texts: ClassVar[bool] = False
    """True when ``fit(X, y, texts=None)`` also takes each row's text id (n,) int: the rows are the tokens of texts,
    each labelled by its text's class, and the method pools a text's tokens itself (AxBench's SAE selection rules). A
    study that reads the tokens of texts (AxBench) passes them; every other study passes none (each row is then a
    text of one token)."""
    scores_tokens: ClassVar[bool] = False
    """True when the fitted method scores a token state itself, ``token_scores(X) -> (n,)`` float64 (AxBench's SAE:
    the chosen latent's activation), rather than by the projection on ``a``: a study that scores a concept per token
    (AxBench) reads it instead of the projection; ``a`` is still the direction every other study edits along."""
    features: ClassVar[bool] = False
    """True when ``fit`` learns several features, not one direction: the fitted method is a featurizer
    (:mod:`cprobe.models.featurizers`: ``n_features``, ``featurize``, ``inverse``) whose features a study interchanges
    (RAVEL's SAE method); ``fit(X, y, contexts=None)`` also takes states of broad text. A study that scores one
    direction refuses it."""
    feature_mask: ClassVar[bool] = False
    """True for a learned mask over a featurizer's features (MIB's DBM, :mod:`cprobe.directions.dbm`): no direction
    ``a``; a study that interchanges features (MIB) takes its fitted featurizer, one that reads a direction refuses
    it (:func:`cprobe.methods.refusal`)."""
    CAPABILITIES = ("causal", "supervised", "chance_baseline", "whole_vector", "per_model_lambda", "fits_on_texts",
                    "scores_tokens", "features", "feature_mask")
    _needs_fitted = ("score", "token_scores")
    _fitted_attrs = ("a",)

    @abstractmethod
    def fit(self, *args: Any, **kwargs: Any) -> Self:
        """Learn ``self.a``; returns ``self`` (scikit-learn style)."""


def capability_problems(cls: type) -> list[str]:
    """Contradictions in a direction class's declared capabilities: flags that are not booleans, a whole-vector swap
    that also learns (``causal``/``supervised``/``per_model_lambda``), ``per_model_lambda`` without a ``lam``
    constructor argument."""
    out = [f"{f} must be true or false, got {getattr(cls, f)!r}" for f in Direction.CAPABILITIES
           if not isinstance(getattr(cls, f, False), bool)]
    if getattr(cls, "whole_vector", False):
        learns = [f for f in ("causal", "supervised", "per_model_lambda", "fits_on_texts", "scores_tokens", "features")
                  if getattr(cls, f, False)]
        if learns:
            out.append(f"whole_vector (no direction is learned) contradicts {learns}")
    if getattr(cls, "causal", False) and (fitted := [f for f in ("fits_on_texts", "scores_tokens", "features")
                                                     if getattr(cls, f, False)]):
        out.append(f"causal (trained through the model) contradicts {fitted} (fitted on token states)")
    if getattr(cls, "scores_tokens", False) and not callable(getattr(cls, "token_scores", None)):
        out.append("scores_tokens is declared but the class has no token_scores(X) method")
    if getattr(cls, "per_model_lambda", False):
        try:
            params = inspect.signature(cls.__init__).parameters
        except (TypeError, ValueError):
            params = {}
        if "lam" not in params:
            out.append("per_model_lambda is declared but the constructor takes no `lam`")
    return out


def accept(obj: Any, ref: str) -> type[Direction]:
    """``obj`` as a direction class (a :class:`Direction` subclass, or a class with ``fit``, adapted), its
    capabilities checked; a one-line ConfigError otherwise."""
    return accept_class(obj, ref, Direction, ("fit",), "direction method", capability_problems,
                        unless=("transform", "explain", "predict_proba"))


DIRECTIONS: Registry[type[Direction]] = Registry("direction method", group="cprobe.directions", accept=accept)


def unit(v: Tensor) -> Tensor:
    """``v / ‖v‖``; a zero vector means the method found no direction, which is a bug upstream."""
    norm = v.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise ValueError("direction has zero or non-finite norm")
    return v / norm


def check_binary(X: Tensor, y: Tensor) -> None:
    """The supervised methods separate exactly two classes, ids 0 and 1."""
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"expected X (n, d) and y (n,), got {tuple(X.shape)} and {tuple(y.shape)}")
    if set(torch.unique(y).tolist()) != {0, 1}:
        raise ValueError(f"expected class ids {{0, 1}} in y, got {sorted(torch.unique(y).tolist())}")


def to_numpy(X: Tensor) -> np.ndarray:
    """Float64 CPU copy for scikit-learn (half-precision activations included)."""
    return X.detach().to("cpu", torch.float64).numpy()


def from_numpy(v: np.ndarray, like: Tensor) -> Tensor:
    """A unit float32 direction on ``like``'s device."""
    return unit(torch.as_tensor(v, dtype=torch.float32, device=like.device))
