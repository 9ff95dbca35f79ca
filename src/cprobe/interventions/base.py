"""The intervention interface: fit on the intervention split, apply to test embeddings.

Two kinds (Canby et al. 2024, §3): *nullifying* interventions remove property Z
(``transform(X)``), *counterfactual* ones set Z to a target value z' (``transform(X, z_target)``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Literal, Self

from torch import Tensor

from cprobe.registry import Registry

Kind = Literal["nullifying", "counterfactual"]


class Intervention(ABC):
    """Fit on (X, z) from the intervention split; transform test embeddings.

    ``X``: float (n, d); ``z``: int64 (n,) class ids in [0, k). ``z_target`` (counterfactual
    only): int64 (n,) target class per row. Implementations never modify inputs in place.
    """

    kind: ClassVar[Kind]
    needs_probe: ClassVar[bool] = False
    """True when the intervention attacks a fitted classifier: ``use_probe(probe)`` replaces ``fit`` (GBIs)."""

    @abstractmethod
    def fit(self, X: Tensor, z: Tensor) -> Self:
        """Learn whatever the intervention needs (directions, an interventional probe, ...)."""

    @abstractmethod
    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        """Return intervened embeddings of the same shape and dtype as ``X``."""


INTERVENTIONS: Registry[type[Intervention]] = Registry("intervention")
