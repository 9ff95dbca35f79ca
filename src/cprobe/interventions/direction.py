"""Directions as interventions: any fitted direction of :mod:`cprobe.directions` used wherever an intervention is.

One adapter, :class:`DirectionIntervention`, registered once per direction method under an intervention name
(:data:`BRIDGED`: ``das``, ``probe_direction``, ``mean_direction``, ``lda_direction``, ``pca_direction``,
``kmeans_direction``, ``random_direction``, ``sae_decoder_direction``, ``sae_axbench_direction``,
``sae_diffmean_direction`` — ``probe``/``mean``/... alone would read as the
probe config group or collide with ``mean_diff``). It finds the unit direction ``a`` with the direction method,
then edits only the coordinate ``aᵀx`` and leaves the orthogonal complement exactly as it was:

- ``kind: counterfactual`` (default): ``x′ = x + (t_{z′} − aᵀx) a``, so ``aᵀx′ = t_{z′}``. The target statistic
  ``t_c`` is the **mean of aᵀx over the fitting rows of class c** (the intervention split): the expected value of
  the 1-D interchange intervention toward a source of class c (CausalGym's DII sets ``aᵀx`` to one source's ``aᵀs``;
  averaging over the sources of class c gives ``t_c``), so the study's counterfactual is the DII with an average
  source. It needs no model, works for any number of classes, and is not an extreme of the class (a max or a
  margin would overshoot into off-distribution states).
- ``kind: nullifying``: ``x′ = x − (aᵀx) a`` (the coordinate projected out, ``aᵀx′ = 0``).

``along`` says which way a row moves to reach its new coordinate. ``direction`` (default): along ``a`` itself, as
above — the smallest Euclidean move. ``covariance``: along ``Σa`` (Σ the covariance of the fitting rows),
``x′ = x + (t_{z′} − aᵀx) Σa / (aᵀΣa)`` and, nullifying, the oblique projection ``x′ = x − Σa (aᵀx) / (aᵀΣa)``
(``ΣB (BᵀΣB)⁻¹ Bᵀx`` for several directions, B a basis of their span) — the smallest move in the data's own
(Mahalanobis) metric. The coordinate reached is the same; the states differ wherever ``a`` is not an eigenvector of
Σ. For a discriminant direction ``a ∝ Σ⁻¹(μ₁ − μ₀)`` (LDA) the two differ most: ``Σa ∝ μ₁ − μ₀``, so the covariance
edit moves the class means apart along the line the classes actually differ on, while the edit along ``a`` moves
them along a direction nearly orthogonal to it (docs/methods.md: on the tiny models LDA's ``a`` reads Z_c yet is
almost orthogonal to μ₁ − μ₀, and only the covariance edit moves the oracles and the model).

A ``supervised`` direction separates two classes; on a property with k > 2 values (CEBaB's and LIBERTy's concepts)
the adapter fits one direction per class, class c against the rest: the counterfactual to z′ sets the coordinate
along z′'s direction to ``t_{z′}`` (the class-z′ mean along it), the nullifying one projects all k out. For k = 2 the
two one-vs-rest directions are one line (±a), so one direction is fitted.

What a direction needs is read from its declared capabilities, never from its name: a ``causal`` direction (DAS)
is trained through the frozen model on minimal pairs — this adapter declares ``needs_model`` and the study passes
``fit(X, z, through=Through(forward, h_source, target))`` (the reliability study builds them from the agreement
data's minimal pairs, :func:`cprobe.data.registry.minimal_pairs`); a ``supervised`` one needs exactly two classes;
a ``chance_baseline`` one (random) ignores the labels for ``a`` (one draw per seed: sweep ``seed`` for several).
The whole-vector swap (``vanilla``) learns no direction and is not bridged.

Settings of the direction method go in the same config (``intervention.lr=...`` for DAS, ``intervention.lam=...``
for the probe): the constructor forwards them to the direction, and the registry checks them against it. DAS's
``k > 1`` (a k-dimensional subspace) is refused: this adapter edits one coordinate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch
from torch import Tensor

from cprobe.directions import DIRECTIONS, Direction
from cprobe.errors import ConfigError, DataError
from cprobe.interventions.base import ADAPTERS, INTERVENTIONS, Intervention, Kind, check_targets, n_classes_of

ALONG = ("direction", "covariance")
"""How a row moves to its new coordinate: along ``a`` (the Euclidean-smallest move) or along ``Σa`` (module doc)."""

BRIDGED: dict[str, str] = {
    "das": "das", "probe_direction": "probe", "mean_direction": "mean", "lda_direction": "lda",
    "pca_direction": "pca", "kmeans_direction": "kmeans", "random_direction": "random",
    "sae_decoder_direction": "sae_decoder", "sae_axbench_direction": "sae_axbench",
    "sae_diffmean_direction": "sae_diffmean",
}
"""Intervention name → direction method (every registered direction that learns a direction)."""


@dataclass
class Through:
    """What a direction trained through the model (``causal``: DAS) fits on: ``forward(edit, rows)`` runs the base
    rows ``rows`` (a tensor of indices into the fitting rows) with their site vectors replaced by ``edit(h)`` and
    returns the frozen model's scores (n, V); ``h_source`` (n, d) are the site vectors of each base row's minimal-pair
    source (the same input with the property flipped); ``target`` (n,) the token id the source's label predicts."""

    forward: Callable[[Callable[[Tensor], Tensor], Tensor], Tensor]
    h_source: Tensor
    target: Tensor


class DirectionIntervention(Intervention):
    """A direction method as an intervention (module doc). After ``fit``: ``A`` (m, d) unit float32 directions (m = 1,
    except a ``supervised`` method on k > 2 classes: one one-vs-rest direction per class, m = k), ``a`` = ``A[0]``,
    ``targets_`` (k,) float64 with ``targets_[c]`` the mean over the fitting rows of class c of the coordinate along
    class c's direction, ``n_classes`` and ``directions_`` the fitted direction methods."""

    kind: Kind = "counterfactual"
    direction_name: ClassVar[str] = ""
    forwards_kwargs_to: ClassVar[tuple[type, ...]] = ()
    _fitted_attrs = ("A", "a", "targets_", "directions_")

    def __init__(self, kind: str = "counterfactual", along: str = "direction", seed: int = 0,
                 device: str | None = None, **params: Any) -> None:
        if kind not in ("counterfactual", "nullifying"):
            raise ConfigError(f"intervention {self.direction_name!r} direction: kind must be counterfactual or "
                              f"nullifying, got {kind!r}")
        if along not in ALONG:
            raise ConfigError(f"intervention {self.direction_name!r} direction: along must be one of {list(ALONG)}, "
                              f"got {along!r}")
        self.kind = kind  # type: ignore[misc]
        self.along, self.seed, self.device, self.params = along, seed, device, dict(params)
        k = getattr(self._method(), "k", 1)  # unknown or bad direction settings fail here, at validation
        if k != 1:
            raise ConfigError(f"intervention {self.direction_name!r} moves one coordinate along one direction; k={k} "
                              f"learns a {k}-dimensional subspace (kept whole by RAVEL and MIB only): set k=1")

    def _method(self) -> Direction:
        return DIRECTIONS.build({"name": self.direction_name, **self.params}, seed=self.seed)

    def fit(self, X: Tensor, z: Tensor, through: Through | None = None) -> Self:
        k = n_classes_of(z)
        cls = DIRECTIONS.get(self.direction_name)
        dev = torch.device(self.device) if self.device else X.device
        Xd, zd = X.to(dev).float(), z.to(dev).long()
        methods: list[Direction] = []
        try:
            if cls.causal:
                if through is None:
                    raise ConfigError(f"{self.direction_name} is trained through the model on minimal pairs "
                                      "(needs_model): pass fit(X, z, through=Through(forward, h_source, target))")
                methods.append(self._method().fit(through.forward, through.h_source.to(dev), through.target.to(dev)))
            elif cls.supervised and k > 2:  # one direction per class, class c against the rest
                methods.extend(self._method().fit(Xd, (zd == c).long()) for c in range(k))
            else:
                methods.append(self._method().fit(Xd, zd))
        except ValueError as e:  # a direction method's own input check
            raise DataError(f"direction {self.direction_name!r}: {e}") from None
        A = torch.stack([m.a.detach().float().to(dev) for m in methods])
        row = torch.arange(k, device=dev) if len(A) == k > 2 else torch.zeros(k, dtype=torch.long, device=dev)
        coord = (Xd.double() * A[row[zd]].double()).sum(1)  # each row along its own class's direction
        self.targets_ = torch.zeros(k, dtype=torch.float64, device=dev).index_add_(0, zd, coord) / \
            torch.bincount(zd, minlength=k).to(dev)
        self.A, self.a, self._row, self.n_classes, self.directions_ = A, A[0], row, k, methods
        self._basis = _span(A.double())  # orthonormal basis of the directions' span (nullifying)
        if self.along == "covariance":
            self._push, self._oblique = _covariance_moves(Xd.double(), A.double(), self._basis)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by the direction it bridges (the class is made by :func:`bridge`, so it is rebuilt there)."""
        return (_unpickle, (self.direction_name,), self.__dict__)

    def coordinate(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        """The edited coordinate per row (n,): ``aᵀx``, or along the direction of ``z_target``'s class where there is
        one direction per class; in X's precision (float32 or float64)."""
        self.check_fitted()
        dt = torch.float64 if X.dtype == torch.float64 else torch.float32
        D = self._directions(X, z_target, dt)
        return (X.to(dt) * D).sum(1)

    def _directions(self, X: Tensor, z_target: Tensor | None, dt: torch.dtype) -> Tensor:
        A = self.A.to(X.device, dt)
        if z_target is None:
            return A[0].expand_as(X)
        return A[self._row.to(X.device)[z_target.to(X.device).long()]]

    def transform(self, X: Tensor, z_target: Tensor | None = None) -> Tensor:
        dt = torch.float64 if X.dtype == torch.float64 else torch.float32
        Xf = X.to(dt)
        if self.kind == "nullifying":
            Q = self._basis.to(X.device, dt)
            W = Q if self.along == "direction" else self._oblique.to(X.device, dt)
            return (Xf - (Xf @ Q) @ W.T).to(X.dtype)
        z_target = check_targets(self.direction_name, z_target, self.n_classes)
        D = self._directions(X, z_target, dt)
        goal = self.targets_.to(X.device, dt)[z_target.to(X.device).long()]
        move = D if self.along == "direction" else \
            self._push.to(X.device, dt)[self._row.to(X.device)[z_target.to(X.device).long()]]
        return (Xf + (goal - (Xf * D).sum(1))[:, None] * move).to(X.dtype)


def _covariance_moves(X: Tensor, A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """For ``along: covariance``, from the fitting rows X (n, d) and the unit directions A (m, d), B (d, r) a basis of
    their span (all float64): the moves ``Σa / (aᵀΣa)`` per direction (m, d) — moving x by (t − aᵀx) times it sets
    aᵀx to t — and ``ΣB (BᵀΣB)⁻¹`` (d, r), the oblique projection's factor (x − (xB)·itᵀ has Bᵀx′ = 0). Σ is never
    formed (d × d): Σv = Xcᵀ(Xc v)/n."""
    Xc = X - X.mean(0)
    n = len(X)
    XA = Xc @ A.T  # (n, m)
    SA = (Xc.T @ XA / n).T  # (m, d): Σ a_i
    var = (SA * A).sum(1)  # aᵢᵀ Σ aᵢ
    scale = float((Xc * Xc).sum()) / n / max(1, X.shape[1])  # the mean variance per coordinate
    if bool((var <= 1e-10 * max(scale, 1e-300)).any()):
        raise DataError("along=covariance: the fitting rows do not vary along the direction (aᵀΣa = 0); use "
                        "along=direction")
    XB = Xc @ B
    SB = Xc.T @ XB / n  # (d, r): Σ B
    return SA / var[:, None], SB @ torch.linalg.inv(XB.T @ XB / n)


def _span(A: Tensor) -> Tensor:
    """(d, r) orthonormal basis of the span of the rows of ``A`` (m, d), r its numerical rank. The k one-vs-rest
    mean directions span only k − 1 dimensions (Σ_c n_c(μ_c − μ) = 0): a QR of all k would add one arbitrary unit
    vector, and the nullifying edit would project out a direction no class defines."""
    U, S, _ = torch.linalg.svd(A.T, full_matrices=False)
    return U[:, S > S.max() * 1e-4]  # the directions are float32 unit vectors: a dependent one leaves σ ~ 1e-7


def bridge(direction: str, method: type[Direction] | None = None) -> type[DirectionIntervention]:
    """The :class:`DirectionIntervention` subclass for the direction method ``direction`` (a registered name or an
    import path): what an intervention name resolves to when it names a direction method."""
    method = method or DIRECTIONS.get(direction)
    key = (direction, method)
    if key not in _BRIDGES:
        _BRIDGES[key] = type(f"{method.__name__}Intervention", (DirectionIntervention,), {
            "__doc__": f"The {direction!r} direction as an intervention (:class:`DirectionIntervention`).",
            "direction_name": direction, "needs_model": bool(method.causal),
            "chance_baseline": bool(method.chance_baseline), "forwards_kwargs_to": (method,), "__module__": __name__,
        })
    return _BRIDGES[key]


_BRIDGES: dict[tuple[str, type], type[DirectionIntervention]] = {}
SUFFIX = "_direction"


def _unpickle(direction: str) -> DirectionIntervention:
    cls = bridge(direction)
    return cls.__new__(cls)


def _direction_as_intervention(obj: Any, ref: str) -> type[DirectionIntervention] | None:
    """A direction method's class named where an intervention is expected (an import path): its bridge. The
    whole-vector swap learns no direction and is not one."""
    import inspect

    if not (inspect.isclass(obj) and issubclass(obj, Direction)):
        return None
    if obj.whole_vector:
        raise ConfigError(f"{ref!r} is a whole-vector swap (whole_vector): it learns no direction to intervene along")
    if getattr(obj, "feature_mask", False):
        raise ConfigError(f"{ref!r} learns a mask over a featurizer's features (feature_mask): no direction to "
                          "intervene along")
    return bridge(ref, obj)


def _plugin_direction(name: str) -> tuple[type[DirectionIntervention], Any] | None:
    """``<direction>_direction`` for a direction method that is not built in (an installed plugin, a registered one):
    the built-ins have their names in :data:`BRIDGED`."""
    if not name.endswith(SUFFIX) or name[: -len(SUFFIX)] not in DIRECTIONS:
        return None
    direction = name[: -len(SUFFIX)]
    method, src = DIRECTIONS.resolve(direction)
    if method.whole_vector or getattr(method, "feature_mask", False):
        return None
    return bridge(direction, method), src


for _name, _direction in BRIDGED.items():
    INTERVENTIONS.register(_name)(bridge(_direction))
ADAPTERS.append(_direction_as_intervention)
INTERVENTIONS.resolvers.append(_plugin_direction)
