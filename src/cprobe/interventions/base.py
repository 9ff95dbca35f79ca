"""The intervention interface: fit on the intervention split, apply to test embeddings.

Two kinds (Canby et al. 2024, §3): *nullifying* interventions remove property Z
(``transform(X)``), *counterfactual* ones set Z to a target value z' (``transform(X, z_target)``).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal, Self

from torch import Tensor

from cprobe.errors import NotFittedError
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
    fitted_: bool = False
    """Set by ``fit`` (and ``use_probe``); ``transform`` before it raises :class:`NotFittedError`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "fit" in cls.__dict__:
            fit = cls.__dict__["fit"]

            @functools.wraps(fit)
            def fitted(self, *args: Any, **kw: Any):
                out = fit(self, *args, **kw)
                self.fitted_ = True
                return out
            cls.fit = fitted  # type: ignore[method-assign]
        if "transform" in cls.__dict__:
            transform = cls.__dict__["transform"]

            @functools.wraps(transform)
            def checked(self, *args: Any, **kw: Any):
                if not self.fitted_:
                    raise NotFittedError(self, "fit(X, z)")
                return transform(self, *args, **kw)
            cls.transform = checked  # type: ignore[method-assign]

    @abstractmethod
    def fit(self, X: Tensor, z: Tensor) -> Self:
        """Learn whatever the intervention needs (directions, an interventional probe, ...)."""

    @abstractmethod
    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        """Return intervened embeddings of the same shape and dtype as ``X``."""


INTERVENTIONS: Registry[type[Intervention]] = Registry("intervention")


def check_batch(X: Tensor, z: Tensor) -> bool:
    """Shapes of a streamed ``update(X, z)`` batch: X (n, d), z (n,); False for an empty batch (nothing to add)."""
    from cprobe.errors import ConfigError

    if X.ndim != 2 or z.shape != (X.shape[0],):
        raise ConfigError(f"expected X (n, d) and z (n,), got {tuple(X.shape)} and {tuple(z.shape)}")
    return len(z) > 0
