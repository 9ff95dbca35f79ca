"""The public surface for outside methods: everything a plugin may import from cprobe, in one module.

Write a class against one of the family bases, declare its capabilities as class attributes, then name it
from a config — by import path (``intervention.name=my_lab.eraser:SpectralEraser``), by a name a module of the
config's ``plugins:`` list registers (``@register("spectral")``), or by an installed package's entry point (group
``cprobe.interventions``, ``cprobe.directions``, ``cprobe.probes``, ``cprobe.explainers``, ``cprobe.metrics`` or
``cprobe.datasets``). It is then scored on every yardstick a built-in of its family is (the reliability study,
CausalGym, CEBaB and LIBERTy as ``via_<name>``, downstream read layers, multi-site edits), dispatched on its declared
capabilities exactly as a built-in is, with its provenance in every record. Check it with ``cprobe check NAME`` or
:func:`parametrize_with_checks`. The walk-through: docs/extending.md.

Everything not exported here is private: it may change without notice. This module's contract is versioned by
:data:`PLUGIN_API_VERSION` (written into every record as ``plugin_api``).
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

from cprobe import testing
from cprobe.data.base import Dataset, DatasetSource, Example
from cprobe.directions.base import Direction, unit
from cprobe.errors import ConfigError, CprobeError, DataError, NotFittedError
from cprobe.explainers.base import ExplainedModel, Explainer, Observed, Queries
from cprobe.interventions.base import Intervention, Kind
from cprobe.interventions.direction import Through
from cprobe.metrics.registry import HIGHER, INPUTS, LOWER, NEITHER, Metric
from cprobe.probes.base import Probe
from cprobe.registry import PLUGIN_API_VERSION, Provenance, Registry
from cprobe.testing import CheckResult, parametrize_with_checks, run_checks

__all__ = [
    "HIGHER", "INPUTS", "LOWER", "NEITHER", "PLUGIN_API_VERSION",
    "CheckResult", "ConfigError", "CprobeError", "DataError", "Dataset", "DatasetSource", "Direction", "Example",
    "ExplainedModel", "Explainer", "Intervention", "Kind", "Metric", "NotFittedError", "Observed", "Probe",
    "Provenance", "Queries", "Through",
    "capabilities", "family_registry", "parametrize_with_checks", "provenance", "register", "run_checks", "unit",
]

T = TypeVar("T")

FAMILIES = tuple(kind.split()[0] for kind in testing.FAMILIES)
"""The families :func:`register` takes (its ``family=``): the first words of :data:`cprobe.testing.FAMILIES`."""


def family_registry(family: str) -> Registry[Any]:
    """The registry of ``family`` (one of :data:`FAMILIES`)."""
    if family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; choose from {list(FAMILIES)}")
    return testing.registry_of(testing.FAMILIES[FAMILIES.index(family)])


def _family_of(obj: Any) -> str | None:
    if isinstance(obj, Metric):
        return "metric"
    if not inspect.isclass(obj):
        return None
    for base, family in ((Intervention, "intervention"), (Direction, "direction"), (Probe, "probe"),
                         (Explainer, "explainer"), (DatasetSource, "dataset")):
        if issubclass(obj, base):
            return family
    return None


def register(name: str, obj: T | None = None, *, family: str | None = None) -> Any:
    """Register ``obj`` (a class of a family base, a :class:`Metric`, a :class:`DatasetSource`) under ``name``, as a
    decorator or a call; ``family`` is read from the base class unless given (a duck-typed class needs it). A
    module that registers is listed under the config's ``plugins:`` (code that is not packaged), or is the target
    of its package's entry point. A name is never a built-in's, and two plugins never claim one name (a one-line
    error naming both)."""
    def deco(o: T) -> T:
        fam = family or _family_of(o)
        if fam is None:
            raise ConfigError(f"register({name!r}): cannot tell the family of {o!r}; subclass a family base of "
                              f"cprobe.plugin or pass family= (one of {list(FAMILIES)})")
        if fam == "metric" and isinstance(o, Metric) and o.name != name:
            raise ConfigError(f"register({name!r}): the metric is named {o.name!r}; register it under its own name")
        family_registry(fam).register(name, o)
        return o

    return deco if obj is None else deco(obj)


def capabilities(cls: type) -> dict[str, Any]:
    """The capabilities ``cls`` declares, with its family's defaults for what it leaves out."""
    fam = _family_of(cls)
    if fam in (None, "metric", "dataset"):
        return {}
    return cls.capabilities()  # type: ignore[attr-defined]


def provenance(family: str, name: str) -> Provenance:
    """Where the ``family`` member ``name`` (a registered name or an import path) comes from."""
    return family_registry(family).provenance(name)
