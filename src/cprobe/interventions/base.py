"""The intervention interface: fit on the intervention split, apply to test embeddings.

Two kinds (Canby et al. 2024, §3): *nullifying* interventions remove property Z
(``transform(X)``), *counterfactual* ones set Z to a target value z' (``transform(X, z_target)``).
Every study fits one with :func:`fit_intervention` (by its capabilities) and applies it with :func:`apply` (by kind).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Self

import torch
from torch import Tensor

from cprobe.errors import ConfigError, DataError
from cprobe.estimator import Estimator, accept_class
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
    chance_baseline: ClassVar[bool] = False
    """True for a chance-level reference edit (a random direction): not expected to set or remove Z, so the
    semantic conformance checks (:mod:`cprobe.testing`) do not apply to it."""
    CAPABILITIES = ("kind", "needs_probe", "needs_model", "exposes_direction", "chance_baseline")
    _marks_fitted = ("fit", "use_probe")
    _needs_fitted = ("transform",)
    _fit_hint = "fit(X, z)"

    @abstractmethod
    def fit(self, X: Tensor, z: Tensor) -> Self:
        """Learn whatever the intervention needs (directions, an interventional probe, ...)."""

    @abstractmethod
    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        """Return intervened embeddings of the same shape and dtype as ``X``."""

    def check_goal(self, z_target: Tensor | None) -> None:
        """:func:`check_goal` for this intervention (what :class:`cprobe.models.edits.Apply` calls)."""
        check_goal(self, z_target)

    def edit_direction(self) -> Tensor | None:
        """The unit vector (d,) spanning the subspace the fitted edit changes, when that subspace is one direction
        (an eraser of rank 1, a mean-difference shift on a binary property); ``None`` otherwise (a higher rank, or a
        nonlinear edit). Its sign is arbitrary (a DII along ``a`` and ``−a`` is the same edit)."""
        self.check_fitted()
        return None


EDIT_KINDS = ("nullifying", "counterfactual")


def capability_problems(cls: type) -> list[str]:
    """Contradictions in an intervention class's declared capabilities (empty when they hold together): a kind
    that is neither, flags that are not booleans, ``needs_probe`` without ``use_probe``, ``needs_model`` without a
    ``through`` argument to ``fit``, both at once, ``exposes_direction`` without its own ``edit_direction``."""
    out = []
    if getattr(cls, "kind", None) not in EDIT_KINDS:
        out.append(f"kind must be one of {list(EDIT_KINDS)}, got {getattr(cls, 'kind', None)!r}")
    for flag in ("needs_probe", "needs_model", "exposes_direction", "chance_baseline"):
        if not isinstance(getattr(cls, flag, False), bool):
            out.append(f"{flag} must be true or false, got {getattr(cls, flag)!r}")
    if getattr(cls, "needs_probe", False) and not callable(getattr(cls, "use_probe", None)):
        out.append("needs_probe is declared but there is no use_probe(probe) method")
    if getattr(cls, "needs_probe", False) and getattr(cls, "needs_model", False):
        out.append("needs_probe and needs_model are both declared: an intervention attacks a probe or trains through "
                   "the model, not both")
    if getattr(cls, "needs_model", False):
        try:
            params = inspect.signature(cls.fit).parameters
        except (TypeError, ValueError):
            params = {}
        if "through" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            out.append("needs_model is declared but fit() takes no `through` argument")
    if getattr(cls, "exposes_direction", False) and getattr(cls, "edit_direction", None) is Intervention.edit_direction:
        out.append("exposes_direction is declared but edit_direction() is not implemented")
    return out


ADAPTERS: list[Callable[[Any, str], Any]] = []
"""Other families' classes usable as interventions (a direction method: :mod:`cprobe.interventions.direction`)."""


def accept(obj: Any, ref: str) -> type[Intervention]:
    """``obj`` as an intervention class: a subclass of :class:`Intervention` (or a class with ``fit`` and
    ``transform``, adapted), or another family's class an adapter turns into one; its declared capabilities checked
    for contradictions. A one-line ConfigError otherwise."""
    if not (inspect.isclass(obj) and issubclass(obj, Intervention)):
        for adapter in ADAPTERS:
            got = adapter(obj, ref)
            if got is not None:
                return got
    return accept_class(obj, ref, Intervention, ("fit", "transform"), "intervention", capability_problems)


INTERVENTIONS: Registry[type[Intervention]] = Registry("intervention", group="cprobe.interventions", accept=accept)


def check_batch(X: Tensor, z: Tensor) -> bool:
    """Shapes of a streamed ``update(X, z)`` batch: X (n, d), z (n,); False for an empty batch (nothing to add)."""
    if X.ndim != 2 or z.shape != (X.shape[0],):
        raise ConfigError(f"expected X (n, d) and z (n,), got {tuple(X.shape)} and {tuple(z.shape)}")
    return len(z) > 0


def projection_direction(P: Tensor) -> Tensor | None:
    """The unit u with ``I − P = u uᵀ`` when ``I − P`` is (numerically) a rank-1 orthogonal projection, else None:
    the one direction an orthogonal eraser ``X ↦ X P`` removes. Cheap (no eigendecomposition): the column of
    ``I − P`` with the largest diagonal entry is ``u·u_j``."""
    M = torch.eye(P.shape[0], dtype=torch.float64, device=P.device) - P.double()
    if abs(float(torch.trace(M)) - 1.0) > 1e-3:
        return None
    j = int(torch.argmax(torch.diagonal(M)))
    u = M[:, j] / M[:, j].norm()
    if float((M - torch.outer(u, u)).abs().max()) > 1e-3:
        return None
    return u.float()


def n_classes_of(z: Tensor) -> int:
    """Number of classes implied by int labels in [0, k); at least two must occur."""
    if z.ndim != 1 or z.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise DataError(f"labels must be a 1-d integer tensor, got shape {tuple(z.shape)} dtype {z.dtype}")
    if z.numel() == 0 or int(z.min()) < 0:
        raise DataError("labels must be non-empty class ids in [0, k)")
    if z.unique().numel() < 2:
        raise DataError("labels contain a single class; an intervention needs at least two")
    return int(z.max()) + 1


def needs_goal(method: Any) -> bool:
    """Whether ``method`` is applied toward a target class per row (counterfactual: ``transform(X, z_target)``)."""
    return getattr(method, "kind", None) == "counterfactual"


def check_goal(method: Any, z_target: Tensor | None) -> None:
    """The one rule of the two kinds: a counterfactual intervention needs ``z_target`` (the target class of every
    row), a nullifying one takes none. A one-line ConfigError otherwise."""
    kind = getattr(method, "kind", None)
    if kind == "counterfactual" and z_target is None:
        raise ConfigError(f"{type(method).__name__}: a counterfactual intervention needs targets (z_target, the "
                          "target class of every row)")
    if kind == "nullifying" and z_target is not None:
        raise ConfigError(f"{type(method).__name__}: a nullifying intervention takes no targets (z_target)")


def check_targets(name: str, z_target: Tensor | None, n_classes: int) -> Tensor:
    """``z_target`` as a counterfactual ``transform`` of ``name`` needs it: given, and class ids in [0, n_classes)."""
    if z_target is None:
        raise ConfigError(f"{name} is counterfactual: pass z_target (the value to set Z to)")
    if int(z_target.min()) < 0 or int(z_target.max()) >= n_classes:
        raise ConfigError(f"z_target must be class ids in [0, {n_classes})")
    return z_target


def apply(method: Any, X: Tensor, goal: Tensor | None = None) -> Tensor:
    """The fitted ``method`` applied to ``X`` (n, d) by its kind: ``transform(X, goal)`` toward the target classes
    ``goal`` (n,) for a counterfactual one, ``transform(X)`` for a nullifying one (:func:`check_goal`)."""
    check_goal(method, goal)
    return method.transform(X) if goal is None else method.transform(X, goal)


def fit_intervention(method: Any, X: Tensor, z: Tensor, *, probe: Callable[[], Any] | None = None,
                     through: Callable[[], Any] | None = None) -> Any:
    """``method`` fitted on (X, z) by its declared capabilities: ``needs_probe`` (it attacks a classifier) →
    ``use_probe(probe())``, the study's interventional probe (with no ``probe``, its ``fit`` trains its own);
    ``needs_model`` (trained through the model: DAS) → ``fit(X, z, through=through())``; else ``fit(X, z)``. ``probe``
    and ``through`` are called only when needed (each costs a fit or a forward). Returns what the fit returns."""
    if getattr(method, "needs_probe", False) and probe is not None:
        return method.use_probe(probe())
    if getattr(method, "needs_model", False):
        if through is None:
            raise ConfigError(f"{type(method).__name__} is trained through the model (needs_model): it needs minimal "
                              "pairs at one edit site")
        return method.fit(X, z, through=through())
    return method.fit(X, z)
