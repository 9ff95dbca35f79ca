"""The vanilla interchange: the whole site vector swapped for the source's (CausalGym's n-dimensional reference row).

Not a direction (no subspace is learned): the DII along every direction at once, ``f*(b, s) = f(s)``. It is
registered beside the direction methods so a run lists it like them; its ``whole_vector`` capability tells the
caller to swap the whole vector.
"""

from __future__ import annotations

from typing import Self

from torch import Tensor

from cprobe.directions.base import DIRECTIONS, Direction


@DIRECTIONS.register("vanilla")
class Vanilla(Direction):
    """The whole-vector swap; ``a`` is None after ``fit`` (activations and labels unused)."""

    whole_vector = True

    def fit(self, X: Tensor | None = None, y: Tensor | None = None) -> Self:
        self.a = None  # type: ignore[assignment]
        return self
