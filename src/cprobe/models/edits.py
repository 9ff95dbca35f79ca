"""Edits: what an intervention does to the site vectors of a batch during a forward pass.

An :data:`Edit` maps the base rows' site vectors (n, d) to their new values (n, d). An :class:`EditSpec`
holds per-item data for a whole item list and *binds* to a batch's rows (pyvene's intervention over a
base and an optional source, with the site kept as data):

- :class:`Replace`: set the site to given vectors (the reliability study's write-back);
- :class:`Interchange`: the 1-D distributed interchange intervention (DII) along a unit direction ``a``,
  ``f*(b, s) = f(b) + ((f(s) − f(b))·a) a`` (CausalGym eq. 11), or the vanilla whole-vector swap when
  ``a`` is None;
- :class:`Apply`: a fitted estimator's ``transform`` (an eraser, a steering intervention; per-item targets for a
  counterfactual one) or any row-wise function, applied live in the pass.

Edits are computed in float32 and cast back, so half-precision models keep precision; they are
differentiable in whatever they close over (DAS trains its direction through :class:`Interchange`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cprobe.errors import ConfigError

Edit = Callable[[Tensor], Tensor]
"""Maps the base rows' site vectors (n, d) to their intervened values (n, d)."""


def dii(h_base: Tensor, h_source: Tensor, a: Tensor) -> Tensor:
    """``h_base + ((h_source − h_base)·a) a`` row-wise; ``a`` (d,) must be unit-norm.

    Differentiable in all three arguments; leading dimensions broadcast.
    """
    coef = ((h_source - h_base) * a).sum(-1, keepdim=True)
    return h_base + coef * a


def vanilla(h_base: Tensor, h_source: Tensor) -> Tensor:
    """The source activation itself (the base is ignored, kept for a common signature)."""
    return h_source.expand_as(h_base)


def dii_edit(h_source: Tensor, a: Tensor) -> Edit:
    """A hook-ready edit applying the 1-D DII with fixed source rows ``h_source`` (n, d)."""
    return lambda h_base: dii(h_base.float(), h_source.to(h_base.device).float(),
                              a.to(h_base.device).float()).to(h_base.dtype)


def vanilla_edit(h_source: Tensor) -> Edit:
    """A hook-ready edit replacing the base rows with ``h_source`` (n, d)."""
    return lambda h_base: vanilla(h_base, h_source.to(h_base.device, h_base.dtype))


class EditSpec(ABC):
    """Per-item edit data for a whole item list; :meth:`bind` gives the edit for a batch's rows."""

    @abstractmethod
    def bind(self, rows: Tensor) -> Edit:
        """The edit for the batch whose rows are ``rows`` (indices into the item list)."""


@dataclass
class Replace(EditSpec):
    """Set the site of item i to ``vectors[i]`` (N, d)."""

    vectors: Tensor

    def bind(self, rows: Tensor) -> Edit:
        v = self.vectors[rows.to(self.vectors.device)]
        return lambda h: v.to(h.device, h.dtype)


@dataclass
class Interchange(EditSpec):
    """DII of item i with source vector ``source[i]`` (N, d) along unit ``direction`` (d,); the vanilla
    swap (the whole source vector) when ``direction`` is None."""

    source: Tensor
    direction: Tensor | None = None

    def bind(self, rows: Tensor) -> Edit:
        s = self.source[rows.to(self.source.device)]
        return vanilla_edit(s) if self.direction is None else dii_edit(s, self.direction)


class Apply(EditSpec):
    """A fitted estimator (or any row-wise function) as a live in-model edit: every row's site vector ``h`` becomes
    ``transform(h)`` during the forward pass — an eraser, a steering intervention — computed per batch on the
    model's device, so nothing of size (N, d) is held.

    ``Apply(eraser)`` takes anything with a ``transform(X[, z_target])`` method (the interventions), checked fitted
    here; a counterfactual one needs ``targets`` (N,), the target class of each item, bound per batch like the
    other specs, and a nullifying one takes none (the intervention's ``check_goal``). ``Apply(fn)`` takes a plain
    function (n, d) → (n, d). Applied in the model it equals
    :class:`Replace` with the transformed states of the same pass (tests/unit/test_edits.py).
    """

    def __init__(self, fn: Edit | Any, targets: Tensor | None = None) -> None:
        transform = getattr(fn, "transform", None)
        if transform is not None:
            check = getattr(fn, "check_fitted", None)
            if check is not None:
                check()
            check_goal = getattr(fn, "check_goal", None)  # an intervention's kind rule (interventions.base)
            if check_goal is not None:
                check_goal(targets)
        elif not callable(fn):
            raise ConfigError(f"Apply needs a fitted estimator (with transform) or a function, got {fn!r}")
        elif targets is not None:
            raise ConfigError("Apply(fn): targets go with an estimator's transform(X, z_target), not a function")
        self.fn = fn
        self.transform = transform
        self.targets = targets

    def bind(self, rows: Tensor) -> Edit:
        if self.transform is None:
            return lambda h: self.fn(h.float()).to(h.dtype)
        if self.targets is None:
            return lambda h: _outside_inference(self.transform, h.float()).to(h.dtype)
        z = self.targets[rows.to(self.targets.device)]
        return lambda h: _outside_inference(self.transform, h.float(), z.to(h.device)).to(h.dtype)


def _outside_inference(transform: Callable[..., Tensor], h: Tensor, *args: Tensor) -> Tensor:
    """``transform(h, *args)`` with autograd available, also inside a pass run under ``torch.inference_mode``: a
    gradient attack (FGSM, PGD, AutoAttack) differentiates its probe with respect to the states, which inference
    tensors cannot take part in — so the states are cloned into ordinary tensors first (one (n, d) copy per batch)."""
    if not torch.is_inference_mode_enabled():
        return transform(h, *args)
    with torch.inference_mode(False):
        return transform(h.clone(), *(a.clone() for a in args))
