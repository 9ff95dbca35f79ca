"""The method vocabulary: what a study's method name is (docs/architecture.md, "The method vocabulary").

A study names its methods in one list (``causalgym.methods``, ``ravel.methods``, ``axbench.methods``; ``method=`` on
the command line writes it); every answer about such a name is here, read from the registries' declared capabilities
and bridges, never from the name itself:

- which registry and family it reads (:func:`is_intervention`: a name both registries know, ``das``, is the
  direction), every name a list accepts (:func:`method_names`), where it came from (:func:`provenance`);
- the bridges: the intervention that applies a direction (:func:`bridge`), and the method underneath a record's
  method and family (:func:`method_of`, the yardsticks' rows);
- whether it may run in a study (:func:`check`, one wording per capability: unknown, listed twice, trained through the
  model, exposing no direction, a whole-vector swap);
- building it for a run (:func:`build`), fitting it on states (:func:`fitted`: a chance baseline's draws, each row's
  text for a direction that ``fits_on_texts``), its chance draws (:func:`draw_seed`), the fallback where a method
  fits nothing (:func:`fallback_direction`), its unit directions (:func:`direction_of`, :func:`unit_directions`), a
  study that reads one direction refusing a k-dimensional subspace (:func:`one_direction`), and a fitted method as a
  featurizer (:func:`featurizer`: MIB's and RAVEL's interchange of features).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from torch import Tensor

from cprobe.directions import DIRECTIONS, Direction
from cprobe.errors import ConfigError
from cprobe.explainers import EXPLAINERS
from cprobe.interventions import INTERVENTIONS, Intervention, fit_intervention
from cprobe.models.featurizers import Featurizer, Subspace
from cprobe.registry import did_you_mean
from cprobe.sae.method import at_site

DRAW_STRIDE = 7_919
"""Draw k of a chance baseline is seeded ``seed + DRAW_STRIDE * k`` (a prime: draws of nearby sites never meet)."""


class MethodError(ConfigError, ValueError):
    """A method a study cannot run (a ValueError too, so a settings dataclass raising it reads as a bad value)."""


def is_intervention(name: str) -> bool:
    """Whether method ``name`` reads the intervention registry: a name both registries know (``das``) is the
    direction."""
    return name not in DIRECTIONS and name in INTERVENTIONS


def registry(name: str) -> Any:
    return INTERVENTIONS if is_intervention(name) else DIRECTIONS


def family(name: str) -> str:
    """A study's method's record family: ``intervention`` or ``direction``."""
    return "intervention" if is_intervention(name) else "direction"


def declares(name: str, capability: str) -> bool:
    """Whether method ``name``'s class declares ``capability`` (``causal``, ``needs_probe``, ``chance_baseline``, …)
    in the registry it reads."""
    return bool(getattr(registry(name).get(name), capability, False))


def method_names() -> list[str]:
    """Every name a study's method list accepts: the direction methods and the interventions (installed plugins' too;
    any ``package.module:Class`` of either family as well)."""
    return sorted(set(DIRECTIONS.all_names()) | set(INTERVENTIONS.all_names()))


def provenance(name: str) -> str:
    """Where method ``name`` came from (built-in, a plugin's package and version, an import path)."""
    return registry(name).provenance(name).text


def bridge(direction: str) -> str | None:
    """The intervention that applies direction method ``direction`` (it declares it as its ``direction_name``), or
    None."""
    return next((i for i in INTERVENTIONS.names() if getattr(INTERVENTIONS.get(i), "direction_name", "") == direction),
                None)


RECORD_FAMILIES = {"direction": DIRECTIONS, "intervention": INTERVENTIONS, "counterfactual": INTERVENTIONS,
                   "nullifying": INTERVENTIONS, "explainer": EXPLAINERS}
"""A record's ``family`` → the registry its ``method`` is named in (an intervention's family may be its edit kind)."""


@cache
def method_of(name: str, record_family: str) -> str | None:
    """The method underneath a record's method: an explainer's intervention, an intervention's direction (the
    declared bridges, followed to the end); None for a family that is no method family; the label itself where its
    family's registry does not know it (``probe0`` of a λ grid, ``<name>_dir``)."""
    reg = RECORD_FAMILIES.get(record_family)
    if reg is None or not name:
        return None
    try:
        obj = reg.get(name)
    except ConfigError:
        return name
    if reg is EXPLAINERS and getattr(obj, "intervention", ""):
        return method_of(obj.intervention, "intervention")
    return (getattr(obj, "direction_name", "") or name) if reg is INTERVENTIONS else name


# ----------------------------------------------------------------------------------------------- may it run here
@dataclass(frozen=True)
class Needs:
    """What a study asks of every method in its list. An intervention trained through the model (``needs_model``) is
    never one: a study trains a causal direction itself (the bridge's direction method)."""

    direction: bool = False  # a unit direction: no intervention exposing none, no whole-vector swap ...
    whole_vector: bool = False  # ... unless the whole-vector swap is welcome beside them (RAVEL's vanilla)
    features: bool = False  # ... or a featurizer's features, interchanged (RAVEL's SAE method: capability features)
    feature_mask: bool = False  # ... or a learned mask over a featurizer's features (MIB's DBM)


def refusal(name: str, key: str, needs: Needs = Needs()) -> str | None:
    """Why ``name`` cannot run in the list ``key``, or None (one wording per capability)."""
    if name not in DIRECTIONS and name not in INTERVENTIONS:
        return (f"unknown method {name!r} in {key}{did_you_mean(name, method_names())}; choose from {method_names()} "
                "(or package.module:Class)")
    cls = registry(name).get(name)
    if is_intervention(name) and cls.needs_model:
        instead = getattr(cls, "direction_name", "") or "das"
        return (f"intervention {name!r} trains through the model (needs_model); {key} fits an intervention on states "
                f"and trains a causal direction itself, so intervention {name!r} cannot run in {key}: list its "
                f"direction method instead (e.g. {instead})")
    if needs.direction and is_intervention(name) and not cls.exposes_direction:
        exposing = [n for n in INTERVENTIONS.names() if INTERVENTIONS.get(n).exposes_direction]
        return (f"intervention {name!r} exposes no direction (exposes_direction is false); {key} scores a direction, "
                f"so intervention {name!r} cannot run in {key}: interventions that do: {exposing}")
    if needs.direction and not needs.features and not is_intervention(name) and getattr(cls, "features", False):
        return (f"direction method {name!r} learns features, not one direction (features); {key} scores a direction, "
                f"so direction method {name!r} cannot run in {key}")
    masks = getattr(cls, "feature_mask", False)
    if needs.direction and not needs.feature_mask and not is_intervention(name) and masks:
        return (f"direction method {name!r} learns a mask over a featurizer's features, no direction (feature_mask); "
                f"{key} scores a direction, so direction method {name!r} cannot run in {key}")
    if needs.direction and not needs.whole_vector and not is_intervention(name) and cls.whole_vector:
        return (f"direction method {name!r} learns no direction (whole_vector); {key} scores a direction, so direction "
                f"method {name!r} cannot run in {key}")
    return None


def check(methods: Sequence[str], key: str, needs: Needs = Needs()) -> None:
    """A study's method list, whole: not empty, no name twice, each one able to run (:func:`refusal`). Raises
    :class:`MethodError` with one line."""
    if not methods:
        raise MethodError(f"{key} is empty; choose from {method_names()}")
    if len(set(methods)) != len(methods):
        raise MethodError(f"{key} lists a method twice: {list(methods)}")
    why = next((w for m in methods if (w := refusal(m, key, needs))), None)
    if why:
        raise MethodError(why)


# ----------------------------------------------------------------------------------------------- a method for a run
def build(name: str, params: Mapping[str, Any], seed: int, device: Any = None, layer: int | None = None,
          model: str | None = None) -> Any:
    """Method ``name`` from its registry's one factory (``seed``/``device`` reach constructors that take them); built
    for the site at ``layer`` of ``model``, a method that loads an SAE gets that site's folder, checked
    (:func:`cprobe.sae.method.at_site`)."""
    if layer is not None:
        params = at_site(registry(name).get(name), params, layer, model)
    return registry(name).build({"name": name, **params}, seed=seed, device=device)


def draw_seed(seed: int, k: int) -> int:
    return seed + DRAW_STRIDE * k


def fallback_direction(d: int, seed: int) -> Tensor:
    """A chance-level unit direction of dimension ``d`` where a method finds none (the registry's first chance
    baseline; its draw depends on ``d`` and ``seed`` only)."""
    import torch

    name = next(n for n in DIRECTIONS.names() if DIRECTIONS.get(n).chance_baseline)
    return DIRECTIONS.build({"name": name}, seed=seed).fit(torch.zeros(2, d)).a


def fitted(name: str, params: Mapping[str, Any], X: Tensor, y: Tensor, seed: int, n_draws: int = 1,
           site_seed: int | None = None, device: Any = None, probe: Any = None, *, texts: Tensor | None = None,
           layer: int | None = None) -> list[Any]:
    """Method ``name`` fitted on states ``X`` with labels ``y``: a direction method (a chance baseline's draws
    seeded :func:`draw_seed` from ``site_seed``, default ``seed``; one that ``fits_on_texts`` also gets ``texts``, each
    row's text id, where given), or an intervention (``probe``: a callable giving its interventional probe where it
    ``needs_probe``). One fitted object per draw; ``layer``: the site's (:func:`build`)."""
    if not is_intervention(name):
        by_text = {"texts": texts} if texts is not None and declares(name, "fits_on_texts") else {}
        if not DIRECTIONS.get(name).chance_baseline:
            return [build(name, params, seed, layer=layer).fit(X, y, **by_text)]
        base = seed if site_seed is None else site_seed
        return [build(name, params, draw_seed(base, k), layer=layer).fit(X, y, **by_text) for k in range(n_draws)]
    method = build(name, params, seed, device, layer)
    fit_intervention(method, X, y, probe=probe)
    return [method]


def direction_of(method: Any, name: str = "") -> Tensor:
    """The unit direction of a fitted method (named ``name`` in messages): a direction method's ``a``, an
    intervention's ``edit_direction()`` (ValueError where the fitted edit is not one direction)."""
    if isinstance(method, Direction):
        return method.a
    a = method.edit_direction()
    if a is None:
        raise ValueError(f"the fitted {name or type(method).__name__} edit is not one direction (rank > 1)")
    return a


def unit_directions(name: str, params: Mapping[str, Any], X: Tensor, y: Tensor, seed: int, n_draws: int = 1,
                    site_seed: int | None = None, device: Any = None, probe: Any = None, *,
                    texts: Tensor | None = None, layer: int | None = None) -> list[Tensor]:
    """Method ``name``'s fitted direction(s) on states ``X`` with labels ``y`` (:func:`fitted`, then
    :func:`direction_of`): a direction method's ``a`` per draw, or an intervention's fitted ``edit_direction()``.
    ValueError where a fitted edit is not one direction."""
    return [direction_of(m, name) for m in fitted(name, params, X, y, seed, n_draws, site_seed, device, probe,
                                                     texts=texts, layer=layer)]


def one_direction(method: Any, name: str, key: str) -> Any:
    """``method`` (built) for a study that reads one direction (``a``); :class:`MethodError` where it learns a
    k-dimensional subspace, k > 1 (DAS's ``k``), whose ``a`` is only the first column."""
    k = getattr(method, "k", 1)
    if k != 1:
        raise MethodError(f"{key}: {name} with k={k} learns a {k}-dimensional subspace, but this study reads one "
                          f"direction (it would keep only the first column): set k=1")
    return method


def featurizer(fitted: Any) -> Featurizer | None:
    """The featurizer (:mod:`cprobe.models.featurizers`) a fitted method localises a variable in, by what it declares,
    never by its name: a :class:`Featurizer` itself; a ``whole_vector`` swap None (the whole-vector swap:
    ``Identity`` with every feature is its equivalent); a direction method its ``Subspace(basis_)`` (k-dimensional
    DAS) or ``Subspace(a)``; a mask over a basis (``feature_mask``: DBM) the basis restricted to its selected features
    (``featurizer_``); a bridged direction (``direction_name``) its fitted direction's; an intervention that
    ``exposes_direction`` ``Subspace(edit_direction())``. ValueError where it offers none."""
    if isinstance(fitted, Featurizer):
        return fitted
    if getattr(fitted, "whole_vector", False):
        return None
    if getattr(fitted, "feature_mask", False):
        return fitted.featurizer_
    if isinstance(fitted, Direction):
        basis = getattr(fitted, "basis_", None)
        return Subspace(fitted.a if basis is None else basis)
    if isinstance(fitted, Intervention) and getattr(fitted, "direction_name", ""):
        found = fitted.directions_
        if len(found) != 1:
            raise ValueError(f"the fitted {fitted.direction_name} edit has {len(found)} directions, one per class: "
                             "no one featurizer")
        return featurizer(found[0])
    if isinstance(fitted, Intervention) and fitted.exposes_direction:
        a = fitted.edit_direction()
        if a is None:
            raise ValueError(f"the fitted {type(fitted).__name__} edit is not one direction (rank > 1)")
        return Subspace(a)
    raise ValueError(f"{type(fitted).__name__} is no featurizer: it is neither a direction method nor an intervention "
                     "that exposes a direction")
