"""Interchange interventions on one site (CausalGym eq. 11 and App. E).

The 1-D distributed interchange intervention (DII) swaps the component of the base
activation along a unit direction ``a`` for the source's component:
``f*(b, s) = f(b) + ((f(s) − f(b))·a) a``. Everything orthogonal to ``a`` stays the base's,
so the intervention moves exactly one feature. The vanilla interchange replaces the whole
vector (an n-dim DII) and is the expressive upper reference.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

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
    """A hook-ready edit applying the 1-D DII with fixed source rows ``h_source`` (n, d).

    The swap is computed in float32 and cast back, so half-precision models keep precision.
    """
    return lambda h_base: dii(h_base.float(), h_source.float(), a.float()).to(h_base.dtype)


def vanilla_edit(h_source: Tensor) -> Edit:
    """A hook-ready edit replacing the base rows with ``h_source`` (n, d)."""
    return lambda h_base: vanilla(h_base, h_source.to(h_base.dtype))
