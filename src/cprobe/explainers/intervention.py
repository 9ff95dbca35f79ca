"""Interventions as explainers: every registered intervention gets ICaCE-Error (CEBaB) and ED / order-faithfulness
(LIBERTy) through one generic explainer, registered as ``via_<intervention>`` (``via_rlace``, ``via_alterrep``,
``via_mean_diff``, ``via_fgsm``, ``via_pgd``, ``via_autoattack``, ``via_leace``, ``via_inlp``, ``via_mean_direction``, ...).

Per concept C, the intervention is fitted on φ(x) of the explainer's training texts against C's coded label (the
study's value coding, e.g. Negative / Positive / unknown; rows without a label are left out); an intervention that
attacks a classifier (``needs_probe``: the gradient attacks) attacks a probe for C trained on the same rows (the
``probe`` setting, a probe config; default a small MLP; fitted through the job's content-keyed probe-fit cache,
:func:`cprobe.probes.grid.fit_cached`). The estimate for a query ``(C: c → c′)`` is

    softmax N(φ′) − softmax N(φ(x)),

with the explained head N unchanged and φ′ chosen by the intervention's declared ``kind``:

- ``counterfactual`` → φ′ = transform(φ(x), z′ = c′): the counterfactual to the query's target value;
- ``nullifying``     → φ′ = transform(φ(x)): concept removal, so the explainer is ``removal_only`` and the studies
  refuse it at validation where no concept value means "absent" (as they refuse the home INLP / LEACE explainers).

An intervention trained through the model on minimal pairs (``needs_model``: DAS) has no bridge: an explainer sees
φ(x) of texts, not counterfactual texts to train through. Settings of the intervention go in the study's
``explainer.via_<name>`` node (``cebab.explainer.via_rlace.rank=1``) and are checked against the intervention.

Same numbers as the home explainers where both apply: ``via_leace`` equals :class:`~cprobe.explainers.leace.
LEACEExplainer` (the same eraser on the same rows, the head unchanged). ``via_inlp`` keeps the explained head; the
home INLP explainer re-trains a copy of the head on the projected states (CEBaB App. F) — with ``head_epochs=0`` and
``rank = iterations · (k if k > 2 else 1)`` the two are equal (``tests/unit/test_explainer_bridge.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self
from pathlib import Path

import numpy as np
import torch

from cprobe.errors import ConfigError, DataError
from cprobe.explainers.base import (EXPLAINERS, ExplainedModel, Explainer, Observed, Queries, concept_targets, leftover,
                                    per_concept, rows_of)
from cprobe.interventions import INTERVENTIONS, Intervention, apply, fit_intervention, needs_goal
from cprobe.probes import PROBES
from cprobe.probes.grid import fit_cached

DEFAULT_PROBE = {"name": "mlp", "lrs": (1e-3, 1e-2), "epochs": 20, "widths": (64,), "n_layers": (1,)}
"""The probe a gradient attack attacks when the ``probe`` setting is not given (one hidden layer, a small grid)."""


class InterventionExplainer(Explainer):
    """A registered intervention as a concept-effect explainer (module doc). After ``fit``: ``interventions_`` (per
    concept, the fitted intervention) and, with ``diagnose`` on a nullifying one, ``leftover_`` as the home erasers
    report it."""

    intervention: ClassVar[str] = ""
    needs_representation = True
    forwards_kwargs_to: ClassVar[tuple[type, ...]] = ()

    def __init__(self, probe: Mapping[str, Any] | None = None, seed: int = 0, device: str | None = None,
                 diagnose: bool = False, probe_cache: Path | None = None, **params: Any) -> None:
        cls = INTERVENTIONS.get(self.intervention)
        if "kind" in params and params["kind"] != cls.kind:
            raise ConfigError(f"explainer {self.name!r}: kind is the intervention's declared {cls.kind!r} (it decides "
                              "removal vs counterfactual, checked before any model loads)")
        self.params, self.seed, self.device, self.diagnose = dict(params), seed, device, diagnose
        self.probe_cache = probe_cache  # the probe-fit cache the attacked probe fits through (None: fitted here)
        self.probe = dict(probe) if probe is not None else (dict(DEFAULT_PROBE) if cls.needs_probe else None)
        if probe is not None and not cls.needs_probe:
            raise ConfigError(f"explainer {self.name!r}: probe is only for interventions that attack a classifier")
        try:
            self._build()
            if self.probe is not None:
                PROBES.build(self.probe, seed=seed)
        except ConfigError as e:
            raise ConfigError(f"explainer {self.name!r}: {e} (set it in <study>.explainer.{self.name})") from None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by the intervention it bridges (the class is made by :func:`bridge`, so it is rebuilt there)."""
        return (_unpickle, (self.intervention,), self.__dict__)

    def _build(self) -> Intervention:
        return INTERVENTIONS.build({"name": self.intervention, **self.params}, seed=self.seed, device=self.device)

    def _fit_one(self, X: torch.Tensor, z: torch.Tensor) -> Intervention:
        def probe() -> Any:
            return fit_cached(PROBES.build(self.probe, seed=self.seed, device=self.device), X, z,
                              cache_dir=self.probe_cache)[0]

        return fit_intervention(self._build(), X, z, probe=probe)

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        assert train.reps is not None and train.concepts is not None
        self.model_ = model
        self.interventions_: dict[str, Intervention] = {}
        self.leftover_: dict[str, tuple[float, float, float]] = {}
        for concept in model.concepts:
            z = concept_targets(train.concepts, concept, model.values)
            rows = torch.from_numpy(np.flatnonzero(z >= 0))
            if len(rows) == 0:
                continue
            self.interventions_[concept] = self._fit_one(train.reps[rows].float(), torch.from_numpy(z)[rows])
            if self.diagnose and self.removal_only:
                self.leftover_[concept] = leftover(train.reps, z, lambda X, y: self._fit_one(X, y).transform,
                                                   self.seed)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        reps = queries.base.reps
        assert reps is not None
        values = list(self.model_.values)

        def estimate(concept: str, rows: np.ndarray) -> np.ndarray:
            method = self.interventions_[concept]
            X = rows_of(reps, rows)
            goal = None
            if needs_goal(method):
                goal = [values.index(queries.c_prime[r]) if queries.c_prime[r] in values else -1 for r in rows]
                k = getattr(method, "n_classes", None)
                bad = [v for v, r in zip(goal, rows) if v < 0 or (k is not None and v >= k)]
                if bad:
                    raise DataError(f"{self.name}: target value {queries.c_prime[rows[goal.index(bad[0])]]!r} of "
                                    f"concept {concept!r} has no training text to fit the counterfactual on")
            new = apply(method, X, None if goal is None else torch.tensor(goal, dtype=torch.long))
            return self.model_.head_probs(new.float()) - queries.base.probs[rows]

        missing = sorted(set(queries.aspect) - set(self.interventions_))
        if missing:
            raise DataError(f"{self.name}: concept(s) {missing} have no labelled training text")
        return per_concept(queries, self.n_classes_, list(self.interventions_), estimate)


PREFIX = "via_"


def bridge(name: str, cls: type[Intervention] | None = None) -> type[InterventionExplainer]:
    """The :class:`InterventionExplainer` subclass for the intervention ``name`` (a registered name or an import
    path); an intervention trained through the model (``needs_model``) has none: a one-line ConfigError naming the
    capability."""
    cls = cls or INTERVENTIONS.get(name)
    if cls.needs_model:  # trained through the model on minimal pairs: not from φ(x) alone (module doc)
        raise ConfigError(f"explainer {PREFIX + name!r}: intervention {name!r} declares needs_model (it trains through "
                          "the model on minimal pairs), and an explainer sees only φ(x) of texts")
    key = (name, cls)
    if key not in _BRIDGES:
        _BRIDGES[key] = type(f"Via{cls.__name__}", (InterventionExplainer,), {
            "__doc__": f"The {name!r} intervention as an explainer (:class:`InterventionExplainer`).",
            "name": f"{PREFIX}{name}", "intervention": name, "removal_only": cls.kind == "nullifying",
            "forwards_kwargs_to": (cls,), "__module__": __name__,
        })
    return _BRIDGES[key]


_BRIDGES: dict[tuple[str, type], type[InterventionExplainer]] = {}


def _unpickle(intervention: str) -> InterventionExplainer:
    cls = bridge(intervention)
    return cls.__new__(cls)


def _outside_intervention(name: str) -> tuple[type[InterventionExplainer], Any] | None:
    """``via_<intervention>`` for any intervention the registry resolves (an installed plugin, a registered one, an
    import path, a direction method as ``<name>_direction``); the built-ins are registered below."""
    if not name.startswith(PREFIX) or len(name) == len(PREFIX):
        return None
    inner = name[len(PREFIX):]
    try:
        cls, src = INTERVENTIONS.resolve(inner)
    except ConfigError as e:
        if str(e).startswith("unknown intervention"):
            return None
        raise ConfigError(f"explainer {name!r}: {e}") from None
    return bridge(inner, cls), src


VIA_EXPLAINERS = {name: EXPLAINERS.register(f"{PREFIX}{name}")(bridge(name)) for name in INTERVENTIONS.names()
                  if not INTERVENTIONS.get(name).needs_model}
"""Intervention name → its explainer class."""
EXPLAINERS.resolvers.append(_outside_intervention)
