"""The intervention interface: fit on the intervention split, apply to test embeddings.

Two kinds (Canby et al. 2024, §3): *nullifying* interventions remove property Z
(``transform(X)``), *counterfactual* ones set Z to a target value z' (``transform(X, z_target)``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Literal, Self

from torch import Tensor

from cprobe.estimator import Estimator
from cprobe.registry import Registry

Kind = Literal["nullifying", "counterfactual"]


class Intervention(Estimator, ABC):
    """Fit on (X, z) from the intervention split; transform test embeddings.

    ``X``: float (n, d); ``z``: int64 (n,) class ids in [0, k). ``z_target`` (counterfactual
    only): int64 (n,) target class per row. Implementations never modify inputs in place. ``fit`` (and
    ``use_probe``) set ``fitted_``; ``transform`` before it raises :class:`NotFittedError`
    (:class:`cprobe.estimator.Estimator`).
    """

    kind: ClassVar[Kind]
    needs_probe: ClassVar[bool] = False
    """True when the intervention attacks a fitted classifier: ``use_probe(probe)`` replaces ``fit`` (GBIs)."""
    exposes_direction: ClassVar[bool] = False
    """True when the fitted edit can be confined to one direction (e.g. a rank-1 eraser on a binary property):
    :meth:`edit_direction` then returns that unit vector, usable as a 1-D DII direction (CausalGym's ``<name>_dir``
    rows). Declared for what the class *can* do; whether a fitted instance does is what ``edit_direction`` says."""
    needs_model: ClassVar[bool] = False
    """True when ``fit`` trains through the frozen model on minimal pairs (a direction found by DAS): the study passes
    ``fit(X, z, through=Through(forward, h_source, target))`` (:mod:`cprobe.interventions.direction`)."""
    CAPABILITIES = ("kind", "needs_probe", "needs_model", "exposes_direction")
    _marks_fitted = ("fit", "use_probe")
    _needs_fitted = ("transform",)
    _fit_hint = "fit(X, z)"

    @abstractmethod
    def fit(self, X: Tensor, z: Tensor) -> Self:
        """Learn whatever the intervention needs (directions, an interventional probe, ...)."""

    @abstractmethod
    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        """Return intervened embeddings of the same shape and dtype as ``X``."""

    def edit_direction(self) -> Tensor | None:
        """The unit vector (d,) spanning the subspace the fitted edit changes, when that subspace is one direction
        (an eraser of rank 1, a mean-difference shift on a binary property); ``None`` otherwise (a higher rank, or a
        nonlinear edit). Its sign is arbitrary (a DII along ``a`` and ``−a`` is the same edit)."""
        self.check_fitted()
        return None


INTERVENTIONS: Registry[type[Intervention]] = Registry("intervention")


def check_batch(X: Tensor, z: Tensor) -> bool:
    """Shapes of a streamed ``update(X, z)`` batch: X (n, d), z (n,); False for an empty batch (nothing to add)."""
    from cprobe.errors import ConfigError

    if X.ndim != 2 or z.shape != (X.shape[0],):
        raise ConfigError(f"expected X (n, d) and z (n,), got {tuple(X.shape)} and {tuple(z.shape)}")
    return len(z) > 0


def projection_direction(P: Tensor) -> Tensor | None:
    """The unit u with ``I − P = u uᵀ`` when ``I − P`` is (numerically) a rank-1 orthogonal projection, else None:
    the one direction an orthogonal eraser ``X ↦ X P`` removes. Cheap (no eigendecomposition): the column of
    ``I − P`` with the largest diagonal entry is ``u·u_j``."""
    import torch

    M = torch.eye(P.shape[0], dtype=torch.float64, device=P.device) - P.double()
    if abs(float(torch.trace(M)) - 1.0) > 1e-3:
        return None
    j = int(torch.argmax(torch.diagonal(M)))
    u = M[:, j] / M[:, j].norm()
    if float((M - torch.outer(u, u)).abs().max()) > 1e-3:
        return None
    return u.float()
