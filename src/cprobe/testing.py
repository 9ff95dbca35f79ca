"""The conformance checks every method passes (scikit-learn's ``check_estimator`` idea): one generator of checks,
chosen by the method's family and declared capabilities, run three ways —

- ``cprobe check NAME_OR_IMPORT_PATH [key=value ...]``: a table (``--json``), exit 1 on a failure;
- :func:`parametrize_with_checks` in a test module: one pytest case per (method, check), ids usable with ``-k``;
- :func:`run_checks` from Python: a list of :class:`CheckResult`.

Two groups of checks:

- **contract**: the class builds from config keyword arguments (unknown keys refused like a built-in's), declares
  no contradictory capabilities, raises :class:`~cprobe.errors.NotFittedError` before ``fit``, ``fit`` returns
  ``self``, outputs keep shape, dtype and device and are finite, inputs are never edited in place, a fixed seed
  gives the same result, a fitted method survives a save/load round trip (``state_dict``/``load_state_dict`` when
  offered, else an in-memory pickle), and a streaming ``update()`` equals one ``fit()`` where offered;
- **semantics**, on planted data (a binary property along one coordinate, Gaussian noise elsewhere): a nullifying
  edit leaves a fresh scikit-learn logistic probe, trained and scored on edited states it never saw, near the
  majority rate; a counterfactual edit makes a fresh probe trained on clean states read the target value; a declared
  ``edit_direction`` is a unit vector and the edit stays along it; a direction is unit-norm (and a supervised one
  finds the planted coordinate); a probe separates separable data; a metric returns one value per item inside its
  declared range.

Expected failures are declared by the caller (``expected_failures={"check_name": "why"}``), never by the class
(scikit-learn PR #30149); a new check reaches every existing plugin without its author doing anything. Checks run on
the CPU in seconds; they never read a file or download anything.
"""

from __future__ import annotations

import copy
import inspect
import io
import math
import pickle
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cprobe.data.base import Dataset, DatasetSource, Example
from cprobe.errors import CprobeError, NotFittedError
from cprobe.registry import REGISTRIES, Provenance, Registry, is_import_path, provenance_of

__all__ = ["CHECK_STATUSES", "Check", "CheckResult", "PlantedAgreement", "SkipCheck", "Subject", "checks_for",
           "format_table", "iter_checks", "package_targets", "parametrize_with_checks", "planted", "run_checks",
           "subjects"]

CHECK_STATUSES = ("passed", "failed", "xfail", "xpass", "skipped")
FAMILIES = ("intervention", "direction method", "probe", "explainer", "metric", "dataset type")
"""The families outside methods join, by their registries' kind (``cprobe check --family``); their first words are
what :func:`cprobe.plugin.register` takes (:data:`cprobe.plugin.FAMILIES`)."""
NULL_MARGIN = 0.1
"""A nullifying edit passes when a fresh probe's held-out accuracy is at most the majority rate + this."""
CF_SHARE = 0.8
"""A counterfactual edit passes when a fresh probe reads the target value on at least this share of rows."""


class SkipCheck(Exception):
    """A check that does not apply (the reason is shown as the check's one line)."""


# ----------------------------------------------------------------------------------------------- planted data
def planted(n: int = 240, d: int = 8, seed: int = 0, signal: float = 3.0) -> tuple[Tensor, Tensor]:
    """(X (n, d) float32, z (n,) int64): a balanced binary property planted along the first coordinate (class means
    ±``signal``), independent standard Gaussian noise in every coordinate. A linear probe reads z almost perfectly;
    the first coordinate is the one direction that carries it."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randperm(n, generator=g) % 2
    X = torch.randn(n, d, generator=g)
    X[:, 0] += signal * (2 * z.float() - 1)
    return X, z.long()


def _fresh_reader(X: Tensor, z: Tensor) -> Callable[[Tensor], np.ndarray]:
    """A scikit-learn logistic regression trained on clean states: predicted classes of any states."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(X.double().numpy())
    clf = LogisticRegression(max_iter=200).fit(scaler.transform(X.double().numpy()), z.numpy())
    return lambda S: clf.predict(scaler.transform(S.detach().cpu().double().numpy()))


@dataclass
class ToyThrough:
    """What a method trained through a model (``needs_model``) fits on, for a toy frozen model whose output reads the
    planted coordinate: logits (n, 2) = [−x₀, x₀] of the edited site; each row's minimal-pair source is the row with
    the property flipped (x₀ negated), its target token the source's class."""

    X: Tensor
    z: Tensor

    def build(self) -> Any:
        from cprobe.interventions.direction import Through

        X = self.X

        def forward(edit: Callable[[Tensor], Tensor], idx: Tensor) -> Tensor:
            h = edit(X[idx])
            return torch.stack([-h[:, 0], h[:, 0]], dim=1)

        source = X.clone()
        source[:, 0] = -source[:, 0]
        return Through(forward, source, (1 - self.z).long())


# ----------------------------------------------------------------------------------------------- subjects
@dataclass
class Subject:
    """One method under check: its family, how it was named, the resolved class (or metric / dataset type), the
    constructor settings, its provenance; fitted results are cached here so the checks share one fit."""

    family: str
    ref: str
    obj: Any
    params: dict[str, Any] = field(default_factory=dict)
    source: Provenance | None = None
    registry: Registry[Any] | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        """The id prefix of its checks (``leace``, ``MyEraser``, ``rlace(rank=1)``)."""
        name = self.ref.split(":")[-1] if is_import_path(self.ref) else self.ref
        return name if not self.params else f"{name}({','.join(f'{k}={_short(v)}' for k, v in self.params.items())})"

    def build(self, seed: int = 0) -> Any:
        """A fresh instance from the settings, as a config builds it (the registry's factory when it resolves)."""
        cfg = {"name": self.ref, **self.params}
        if self.registry is not None:
            return self.registry.build(cfg, seed=seed)
        from cprobe.registry import accepted_params

        kwargs = dict(self.params)
        if "seed" in accepted_params(self.obj) and "seed" not in kwargs:
            kwargs["seed"] = seed
        return self.obj(**kwargs)

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def _short(v: Any) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= 20 else text[:19] + "…"


def registry_of(kind: str) -> Registry[Any]:
    """The registry of family ``kind`` (one of :data:`FAMILIES`)."""
    import cprobe.data.registry  # noqa: F401  (the families register their registries on import)
    import cprobe.directions  # noqa: F401
    import cprobe.explainers  # noqa: F401
    import cprobe.interventions  # noqa: F401
    import cprobe.metrics.registry  # noqa: F401
    import cprobe.probes  # noqa: F401

    for reg in REGISTRIES.values():
        if reg.kind == kind:
            return reg
    raise KeyError(kind)


def subjects(target: Any, params: Mapping[str, Any] | None = None, family: str | None = None) -> list[Subject]:
    """The subjects ``target`` names: a registered name or an import path (every family it resolves in, or only
    ``family``), a class, a metric, or ``(target, params)``. A name that resolves nowhere is a ConfigError."""
    from cprobe.errors import ConfigError
    from cprobe.registry import WrongFamily

    if isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], Mapping):
        target, params = target
    if isinstance(target, Subject):
        return [target]
    params = dict(params or {})
    kinds = [family] if family else list(FAMILIES)
    if family is not None and family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; choose from {list(FAMILIES)}")
    out: list[Subject] = []
    errors: list[str] = []
    if isinstance(target, str):
        for kind in kinds:
            reg = registry_of(kind)
            try:
                if not is_import_path(target) and target not in reg and not target.startswith("via_") \
                        and not target.endswith("_direction"):
                    continue
                obj, src = reg.resolve(target)
            except WrongFamily:
                continue
            except ConfigError as e:
                if str(e).startswith(f"unknown {kind}"):
                    continue
                errors.append(str(e))
                continue
            out.append(Subject(kind, target, obj, params, src, reg))
        if params and len(out) > 1:  # a name of several families: the ones whose constructor takes the settings
            from cprobe.registry import accepted_params

            takes = [s for s in out if s.family not in ("metric", "dataset type")
                     and set(params) <= accepted_params(s.obj)]
            out = takes or out
        if not out:
            if errors:
                raise ConfigError(errors[0])
            close = sorted({n for k in kinds for n in registry_of(k).all_names()})
            import difflib

            hint = difflib.get_close_matches(target, close, n=3, cutoff=0.6)
            raise ConfigError(f"{target!r} names no method{' of family ' + repr(family) if family else ''}"
                              + (f"; did you mean {', '.join(map(repr, hint))}?" if hint else "")
                              + " (a registered name, or package.module:Class)")
        return out
    for kind in kinds:
        reg = registry_of(kind)
        if reg.accept is None:
            continue
        try:
            obj = reg.accept(target, _qualname(target))
        except CprobeError:
            continue
        return [Subject(kind, _qualname(target), obj, params, provenance_of(target, "import path"), None)]
    raise ConfigError(f"{_qualname(target)} is no cprobe method: subclass a family base of cprobe.plugin "
                      "(Intervention, Direction, Probe, Explainer), or pass a Metric or a DatasetSource")


def _qualname(obj: Any) -> str:
    o = obj if inspect.isclass(obj) else type(obj)
    if hasattr(obj, "name") and not inspect.isclass(obj) and isinstance(getattr(obj, "name"), str):
        return str(obj.name)
    return getattr(o, "__qualname__", repr(o))


# ----------------------------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class Check:
    """One check: ``fn(subject)`` raises AssertionError (or any exception) on a failure, :class:`SkipCheck` when it
    does not apply. ``group``: ``contract`` or ``semantics``."""

    name: str
    fn: Callable[[Subject], None]
    group: str = "contract"
    doc: str = ""

    def __call__(self, subject: Subject) -> None:
        self.fn(subject)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``status`` one of :data:`CHECK_STATUSES`, ``reason`` one line."""

    subject: str
    family: str
    check: str
    group: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _check(group: str = "contract") -> Callable[[Callable[[Subject], None]], Check]:
    def deco(fn: Callable[[Subject], None]) -> Check:
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        return Check(fn.__name__, fn, group, doc)
    return deco


def _fail(msg: str) -> None:
    raise AssertionError(msg)


def _eq(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


# ---- shared steps ---------------------------------------------------------------------------------
def _fit_intervention(m: Any, X: Tensor, z: Tensor) -> Any:
    """Fit as the studies do: through the toy model (``needs_model``), else ``fit(X, z)`` (a method that attacks a
    probe trains its own in ``fit``; :func:`check_use_probe` covers ``use_probe``)."""
    from cprobe.interventions.base import fit_intervention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_intervention(m, X, z, through=lambda: ToyThrough(X, z).build())


def _goal(m: Any, z: Tensor) -> Tensor | None:
    from cprobe.interventions.base import needs_goal

    return (1 - z).long() if needs_goal(m) else None


def _transform(m: Any, X: Tensor, z: Tensor) -> Tensor:
    from cprobe.interventions.base import apply

    return apply(m, X, _goal(m, z))


@dataclass
class _Fit:
    """One intervention fitted on the planted data's fitting rows (shared by the checks): the method, all rows X
    and z, the fitting rows, its output on every row, and what the fit did (returned itself, left its inputs)."""

    method: Any
    X: Tensor
    z: Tensor
    fit_rows: np.ndarray
    out: Tensor
    returned_self: bool
    inputs_kept: str


def _fitted(s: Subject) -> _Fit:
    """The subject fitted once on :func:`planted` data (1,000 rows, d = 6, class means ±1.5 along e₀): fitted on
    the first of :func:`cprobe.explainers.base.leftover_split`'s three parts, applied to every row."""
    def make() -> _Fit:
        from cprobe.explainers.base import leftover_split
        from cprobe.interventions.base import apply

        X, z = planted(n=1000, d=6, signal=1.5)
        fit_rows = leftover_split(z.numpy(), 0)[0]
        Xf, zf = X[fit_rows].clone(), z[fit_rows].clone()
        Xf0, zf0 = Xf.clone(), zf.clone()
        est = s.build()
        m = _fit_intervention(est, Xf, zf)
        kept = "" if _eq(Xf, Xf0) and _eq(zf, zf0) else "fit modified its inputs in place"
        X0, z0 = X.clone(), z.clone()
        goal = _goal(m, z)
        g0 = None if goal is None else goal.clone()
        out = apply(m, X, goal)
        if not kept and not (_eq(X, X0) and _eq(z, z0) and (goal is None or _eq(goal, g0))):
            kept = "transform modified its inputs (X or z_target) in place"
        return _Fit(m, X0, z0, fit_rows, out, m is est, kept)
    return s.cached("fitted", make)


def _no_fit_needed(s: Subject) -> None:
    if s.family == "explainer" and getattr(s.obj, "needs_training", False):
        raise SkipCheck("needs the explained model's training regime (needs_training): the CEBaB study runs it")


@dataclass
class _Once:
    """A direction method, probe or explainer fitted once on planted data (shared by the checks)."""

    est: Any
    X: Tensor
    z: Tensor
    result: Tensor | None
    returned_self: bool
    inputs_kept: str


def _data(s: Subject) -> tuple[Tensor, Tensor]:
    return planted(n=400) if s.family == "probe" else planted()


def _gives_features(obj: Any) -> bool:
    """A direction method whose fitted state is a featurizer (``featurizer_``), not a direction: a mask over a basis
    (``feature_mask``, MIB's DBM) or features it learns (``features``, RAVEL's SAE method)."""
    return bool(getattr(obj, "feature_mask", False) or getattr(obj, "features", False))


def _result(s: Subject, est: Any) -> Tensor | None:
    """What a fitted method gives: a direction's ``a``, a probe's probabilities of every planted row, an explainer's
    estimates of the planted queries."""
    if s.family == "direction method":  # a method that gives features: its features of fixed states
        return est.featurizer_.featurize(planted(n=32, seed=1)[0])[0] if _gives_features(est) else est.a
    if s.family == "probe":
        return est.predict_proba(_data(s)[0])
    return torch.as_tensor(np.asarray(est.explain(_world().queries), dtype=np.float64))


def _fit_once(s: Subject, fresh: bool = False) -> _Once:
    def make() -> _Once:
        est = s.build()
        if s.family == "explainer":
            w = _world()
            reps0 = w.train.reps.clone()
            out = est.fit(w.model, w.train)
            result = _result(s, est)
            kept = "" if torch.equal(w.train.reps, reps0) else "the representations were modified in place"
            return _Once(est, w.train.reps, torch.zeros(0), result, out is est, kept)
        X, z = _data(s)
        X0, z0 = X.clone(), z.clone()
        if s.family == "direction method":
            out = _fit_direction(est, X, z)
        else:
            out = est.fit(X[:300], z[:300])
        result = _result(s, est)
        kept = "" if _eq(X, X0) and _eq(z, z0) else "the states or labels were modified in place"
        return _Once(est, X0, z0, result, out is est, kept)
    return make() if fresh else s.cached("once", make)


# ---- every family ---------------------------------------------------------------------------------
@_check()
def check_capabilities(s: Subject) -> None:
    """The declared capabilities hold together (no contradiction)."""
    from cprobe.directions.base import capability_problems as dir_problems
    from cprobe.explainers.base import capability_problems as expl_problems
    from cprobe.interventions.base import capability_problems as int_problems
    from cprobe.metrics.registry import metric_problems

    fn = {"intervention": int_problems, "direction method": dir_problems, "explainer": expl_problems,
          "metric": metric_problems}.get(s.family)
    if fn is None:
        raise SkipCheck(f"a {s.family} declares no capabilities")
    problems = fn(s.obj)
    if problems:
        _fail("; ".join(problems))


@_check()
def check_builds_from_config(s: Subject) -> None:
    """It builds from config keyword arguments, and an unknown key is refused in one line, as for a built-in."""
    from cprobe.errors import ConfigError

    if s.family in ("metric",):
        raise SkipCheck("a metric is an object, not built from a config")
    if s.family == "dataset type":
        from cprobe.data.registry import split_config

        split_config({"name": "check", "type": s.ref, **s.params})
        try:
            split_config({"name": "check", "type": s.ref, **s.params, "no_such_key_": 1})
        except ConfigError:
            return
        _fail("an unknown config key was accepted")
    s.build()
    if s.registry is None:
        raise SkipCheck("built from the class itself (name it by a registered name or an import path to check the "
                        "config path)")
    try:
        s.registry.build({"name": s.ref, **s.params, "no_such_key_": 1})
    except ConfigError as e:
        if "no_such_key_" not in str(e):
            _fail(f"an unknown key was refused without naming it: {e}")
        return
    _fail("an unknown constructor key was accepted silently (take no **kwargs you do not check)")


# ---- interventions --------------------------------------------------------------------------------
@_check()
def check_not_fitted_error(s: Subject) -> None:
    """Used before fit, it raises NotFittedError (one line: what to call first)."""
    X, z = planted(n=20)
    est = s.build()
    calls = {"intervention": lambda: _transform(est, X, z),
             "direction method": lambda: est.featurizer_ if _gives_features(est) else est.a,
             "probe": lambda: est.predict_proba(X),
             "explainer": lambda: est.explain(_world().queries)}
    try:
        calls[s.family]()
    except NotFittedError:
        return
    except Exception as e:  # noqa: BLE001
        _fail(f"raised {type(e).__name__} ({str(e).splitlines()[0] if str(e) else ''}) instead of NotFittedError")
    _fail("ran unfitted instead of raising NotFittedError")


@_check()
def check_fit_returns_self(s: Subject) -> None:
    """fit(...) returns the estimator itself (scikit-learn style)."""
    _no_fit_needed(s)
    f = _fitted(s) if s.family == "intervention" else _fit_once(s)
    if not f.returned_self:
        _fail("fit returned something else than the estimator")


@_check()
def check_transform_shape_dtype_device(s: Subject) -> None:
    """transform keeps the input's shape, dtype (float32 and float64) and device."""
    f = _fitted(s)
    m, X, z, out = f.method, f.X, f.z, f.out
    for name, inp, res in (("float32", X, out), ("float64", X.double(), _transform(m, X.double(), z.clone()))):
        if tuple(res.shape) != tuple(inp.shape):
            _fail(f"{name} input {tuple(inp.shape)} came back {tuple(res.shape)}")
        if res.dtype != inp.dtype:
            _fail(f"{name} input came back {res.dtype}")
        if res.device != inp.device:
            _fail(f"input on {inp.device} came back on {res.device}")


@_check()
def check_finite_output(s: Subject) -> None:
    """transform returns finite numbers (no NaN, no inf)."""
    out = _fitted(s).out
    bad = int((~torch.isfinite(out)).sum())
    if bad:
        _fail(f"{bad} of {out.numel()} output values are NaN or infinite")


@_check()
def check_intervenes(s: Subject) -> None:
    """transform changes the states (an edit that returns its input unchanged measures nothing)."""
    f = _fitted(s)
    if f.out.shape == f.X.shape and torch.allclose(f.out.float(), f.X, atol=1e-7):
        _fail("the output equals the input")


@_check()
def check_no_inplace_edits(s: Subject) -> None:
    """fit and transform (predict, explain) never modify their inputs."""
    _no_fit_needed(s)
    f = _fitted(s) if s.family == "intervention" else _fit_once(s)
    if f.inputs_kept:
        _fail(f.inputs_kept)


@_check()
def check_counterfactual_needs_target(s: Subject) -> None:
    """A counterfactual edit without z_target is a one-line error, never a silent no-op."""
    m, X = _fitted(s).method, _fitted(s).X.clone()
    if m.kind != "counterfactual":
        raise SkipCheck("nullifying: transform(X) takes no target")
    try:
        m.transform(X)
    except CprobeError:
        return
    except Exception as e:  # noqa: BLE001
        _fail(f"raised {type(e).__name__} instead of a cprobe error naming z_target")
    _fail("transform(X) without z_target returned states")


@_check()
def check_deterministic(s: Subject) -> None:
    """Two fresh instances with the same seed give the same result."""
    _no_fit_needed(s)
    if s.family == "intervention":
        f = _fitted(s)
        a = f.out
        b = _transform(_fit_intervention(s.build(), f.X[f.fit_rows].clone(), f.z[f.fit_rows].clone()), f.X.clone(),
                       f.z.clone())
    elif s.family == "metric":
        from cprobe.metrics.registry import compute

        if s.obj.fn is None:
            raise SkipCheck("a study's own metric: its study computes it (its tests hold the values)")
        inputs = _metric_inputs(s.obj)
        a, b = (torch.as_tensor(compute(s.obj, **inputs)) for _ in range(2))
    else:
        a, b = _fit_once(s).result, _fit_once(s, fresh=True).result
        if a is None and b is None:
            return
    if not torch.allclose(a.double(), b.double(), atol=1e-6, equal_nan=True):
        _fail(f"results differ by up to {float((a.double() - b.double()).abs().max()):.3g} under the same seed")


def _round_trip(est: Any) -> Any:
    """A copy through the estimator's ``state_dict``/``load_state_dict`` (safetensors bytes) when it offers them,
    else through an in-memory pickle of the object this check made (never of a file)."""
    if callable(getattr(est, "state_dict", None)) and callable(getattr(est, "load_state_dict", None)) \
            and not isinstance(est, torch.nn.Module):
        from safetensors.torch import load, save

        state = est.state_dict()
        blob = save({k: v.contiguous() for k, v in state.items()})
        fresh = copy.deepcopy(est)
        fresh.load_state_dict(load(blob))
        return fresh
    buf = io.BytesIO()
    pickle.dump(est, buf)
    return pickle.loads(buf.getvalue())  # noqa: S301  (the object this check itself made, in memory)


@_check()
def check_save_load_round_trip(s: Subject) -> None:
    """A fitted method gives the same result after a save/load round trip."""
    _no_fit_needed(s)
    f = _fitted(s) if s.family == "intervention" else _fit_once(s)
    est = f.method if s.family == "intervention" else f.est
    try:
        back = _round_trip(est)
    except Exception as e:  # noqa: BLE001
        _fail(f"could not be saved and loaded ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    a = f.out if s.family == "intervention" else f.result
    b = _transform(back, f.X.clone(), f.z.clone()) if s.family == "intervention" else _result(s, back)
    if a is None and b is None:
        return
    if not torch.allclose(a.double(), b.double(), atol=1e-6):
        _fail("the loaded copy gives different results")


@_check()
def check_streaming_update_equals_fit(s: Subject) -> None:
    """update() over uneven batches (one holding a single class) equals one fit() on all rows."""
    if not callable(getattr(s.obj, "update", None)):
        raise SkipCheck("offers no streaming update()")
    X, z = planted(n=300)
    X = X * torch.linspace(0.5, 3.0, X.shape[1]) + 4.0  # off-centre, anisotropic: merging moments matters
    full = _fit_intervention(s.build(), X, z)
    stream = s.build()
    order = torch.argsort(z, stable=True)
    for chunk in torch.split(order, [50, 37, 113, 100]):
        stream.update(X[chunk], z[chunk])
    a, b = _transform(full, X, z), _transform(stream, X, z)
    if not torch.allclose(a, b, atol=1e-4, rtol=1e-4):
        _fail(f"streamed and one-shot fits differ by up to {float((a - b).abs().max()):.3g}")


@_check()
def check_use_probe(s: Subject) -> None:
    """An attack on a classifier (needs_probe) attacks an already-fitted probe given with use_probe."""
    if not getattr(s.obj, "needs_probe", False):
        raise SkipCheck("does not attack a probe (needs_probe is false)")
    from cprobe.probes import PROBES

    X, z = planted()
    probe = PROBES.build(SMALL_PROBE, seed=0).fit(X, z)
    m = s.build().use_probe(probe)
    out = _transform(m, X, z)
    if out.shape != X.shape or not torch.isfinite(out).all():
        _fail("the attack on a given probe returned wrong-shaped or non-finite states")


@_check("semantics")
def check_edit_direction(s: Subject) -> None:
    """exposes_direction: fitted on a binary property, edit_direction() is a unit vector and the edit stays along it."""
    if not getattr(s.obj, "exposes_direction", False):
        raise SkipCheck("does not declare exposes_direction")
    f = _fitted(s)
    m, X, out = f.method, f.X, f.out
    a = m.edit_direction()
    if a is None:
        _fail("declares exposes_direction, but after fitting on a binary property edit_direction() is None (with these "
              "settings it edits more than one direction: check it with settings that edit one, or drop the capability)")
    a = torch.as_tensor(a).double().flatten()
    if a.shape != (X.shape[1],) or not math.isclose(float(a.norm()), 1.0, abs_tol=1e-3):
        _fail(f"edit_direction() is not a unit vector of shape ({X.shape[1]},): shape {tuple(a.shape)}, norm "
              f"{float(a.norm()):.4f}")
    delta = (out.double() - X.double())
    off = delta - (delta @ a)[:, None] * a[None, :]
    if float(off.norm()) > 1e-3 * max(1.0, float(delta.norm())):
        _fail(f"the edit moves states off edit_direction() (residual {float(off.norm()):.3g} of {float(delta.norm()):.3g})")


def _kind(s: Subject) -> str | None:
    """The edit's kind as configured: an instance's ``kind=`` setting (a direction as a nullifying intervention), not
    the class default."""
    return getattr(s.build(), "kind", getattr(s.obj, "kind", None))


@_check("semantics")
def check_nullifying_erases(s: Subject) -> None:
    """A nullifying edit leaves a fresh linear probe, trained on edited states, near the majority rate."""
    if _kind(s) != "nullifying":
        raise SkipCheck("counterfactual: see check_counterfactual_sets_target")
    if getattr(s.obj, "chance_baseline", False):
        raise SkipCheck("a chance baseline (chance_baseline) is not expected to remove the property")
    from cprobe.explainers.base import leftover

    f = _fitted(s)
    before, after, majority = leftover(f.X, f.z.numpy(), None, seed=0, erased=f.out.float())
    if before < 0.9:
        _fail(f"the planted property is not readable before the edit ({before:.3f}); a bug in the check")
    if not after <= majority + NULL_MARGIN:
        _fail(f"a fresh probe still reads the property after the edit: accuracy {after:.3f}, majority {majority:.3f} "
              f"(allowed up to {majority + NULL_MARGIN:.3f})")


@_check("semantics")
def check_counterfactual_sets_target(s: Subject) -> None:
    """A counterfactual edit makes a fresh probe trained on clean states read the target value."""
    if _kind(s) != "counterfactual":
        raise SkipCheck("nullifying: see check_nullifying_erases")
    if getattr(s.obj, "chance_baseline", False):
        raise SkipCheck("a chance baseline (chance_baseline) is not expected to set the property")
    f = _fitted(s)
    rest = np.setdiff1d(np.arange(len(f.z)), f.fit_rows)
    reader = _fresh_reader(f.X[f.fit_rows], f.z[f.fit_rows])
    goal = (1 - f.z[rest]).numpy()
    share = float((reader(f.out[rest]) == goal).mean())
    if share < CF_SHARE:
        _fail(f"a fresh probe reads the target value on {share:.0%} of edited rows it was not fitted on (needs "
              f"{CF_SHARE:.0%})")


# ---- directions -----------------------------------------------------------------------------------
def _fit_direction(d: Any, X: Tensor, z: Tensor) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if getattr(d, "causal", False):
            t = ToyThrough(X, z).build()
            return d.fit(t.forward, t.h_source, t.target)
        return d.fit(X, z)


@_check("semantics")
def check_unit_direction(s: Subject) -> None:
    """After fit, a is a unit float32 (d,) vector (None for the whole-vector swap)."""
    f = _fit_once(s)
    a, d = f.result, f.X.shape[1]
    if _gives_features(s.obj):  # a mask over a featurizer's features, or learnt features: no direction
        fz = getattr(f.est, "featurizer_", None)
        most = d if getattr(s.obj, "feature_mask", False) else float("inf")  # a mask selects among d features
        if fz is None or not 0 <= fz.n_features <= most:
            _fail(f"{'feature_mask' if most == d else 'features'} is declared but the fitted featurizer_ is {fz!r}")
        return
    if getattr(s.obj, "whole_vector", False):
        if a is not None:
            _fail("whole_vector is declared but a is set")
        return
    if not isinstance(a, Tensor) or a.shape != (d,) or a.dtype != torch.float32:
        _fail(f"a must be a float32 tensor of shape ({d},), got {getattr(a, 'dtype', type(a))} "
              f"{tuple(getattr(a, 'shape', ()))}")
    if not math.isclose(float(a.norm()), 1.0, abs_tol=1e-4):
        _fail(f"a has norm {float(a.norm()):.5f}, not 1")


@_check("semantics")
def check_finds_planted_direction(s: Subject) -> None:
    """A supervised direction fitted on the planted property points along the planted coordinate."""
    if not getattr(s.obj, "supervised", False) or getattr(s.obj, "causal", False):
        raise SkipCheck("not a supervised direction fitted on labels")
    if getattr(s.obj, "features", False):  # features chosen for the labels: one of them ranks the planted class
        from cprobe.metrics.detection import auroc_columns

        f = _fit_once(s)
        F = f.est.featurizer_.featurize(f.X)[0].double()
        best = float((auroc_columns(F, f.z) - 0.5).abs().max()) + 0.5 if F.shape[1] else 0.5
        if best < TOKEN_AUROC:
            _fail(f"no chosen feature ranks the planted class (best AUROC {best:.3f} < {TOKEN_AUROC})")
        return
    a = _fit_once(s).result
    if abs(float(a[0])) < 0.8:
        _fail(f"|a · e0| = {abs(float(a[0])):.3f} < 0.8: the planted coordinate was not found")


TOKEN_AUROC = 0.75
"""A method that scores tokens itself (``scores_tokens``) passes when its scores rank the planted class at least this
well (AUROC) on the rows it was fitted on."""


@_check("semantics")
def check_token_scores(s: Subject) -> None:
    """A method that declares ``scores_tokens`` gives one finite float64 score per state, and its scores rank the
    planted class above chance (AUROC >= TOKEN_AUROC)."""
    if not getattr(s.obj, "scores_tokens", False):
        raise SkipCheck("scores no token itself (scores_tokens is false): scored by the projection on a")
    from cprobe.metrics.detection import auroc

    f = _fit_once(s)
    out = f.est.token_scores(f.X)
    if not isinstance(out, Tensor) or out.shape != (len(f.X),) or out.dtype != torch.float64:
        _fail(f"token_scores must give a float64 tensor of shape ({len(f.X)},), got {getattr(out, 'dtype', type(out))} "
              f"{tuple(getattr(out, 'shape', ()))}")
    if not bool(torch.isfinite(out).all()):
        _fail("token_scores gave non-finite scores")
    got = auroc(out, f.z)
    if got < TOKEN_AUROC:
        _fail(f"its token scores rank the planted class at AUROC {got:.3f} < {TOKEN_AUROC}")


@_check()
def check_fits_on_texts(s: Subject) -> None:
    """A method that declares ``fits_on_texts`` fitted with every row a text of its own (``texts = 0 … n−1``) finds
    what it finds without ``texts``: the rows are texts of one token unless a study says otherwise."""
    if not getattr(s.obj, "fits_on_texts", False):
        raise SkipCheck("takes no texts (fits_on_texts is false)")
    f = _fit_once(s)
    X, z = f.X.clone(), f.z.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = s.build().fit(X, z, texts=torch.arange(len(X)))
    if not torch.allclose(again.a.float(), f.result.float(), atol=1e-5):
        _fail("fit(X, y, texts=arange(n)) finds another direction than fit(X, y)")


# ---- probes ---------------------------------------------------------------------------------------
@_check()
def check_probabilities(s: Subject) -> None:
    """predict_proba returns (n, k) rows that are distributions."""
    f = _fit_once(s)
    p = f.result
    if tuple(p.shape) != (len(f.X), 2):
        _fail(f"shape {tuple(p.shape)}, expected ({len(f.X)}, 2)")
    if not torch.allclose(p.sum(1).double(), torch.ones(len(f.X), dtype=torch.float64), atol=1e-4) or (p < 0).any():
        _fail("rows are not probability distributions")


@_check("semantics")
def check_separates_planted_classes(s: Subject) -> None:
    """A probe fitted on separable planted data scores above 0.9 on held-out rows."""
    f = _fit_once(s)
    acc = float((f.result[300:].argmax(1) == f.z[300:]).double().mean())
    if acc < 0.9:
        _fail(f"held-out accuracy {acc:.3f} < 0.9 on separable data")


# ---- explainers -----------------------------------------------------------------------------------
@dataclass
class _World:
    model: Any
    train: Any
    queries: Any


_WORLD: list[_World] = []


def _world() -> _World:
    """A planted concept-effect world (the explained model's logit for class 1 = 2·food + 1·service, φ in R⁴ with
    the concepts' sentiment and mention coordinates), every capability's input supplied."""
    if _WORLD:
        return _WORLD[0]
    from torch import nn

    from cprobe.explainers.base import ExplainedModel, Observed, Queries

    values = ("Negative", "Positive", "unknown")
    rng = np.random.default_rng(0)
    n = 240
    code = {"Negative": -1.0, "Positive": 1.0, "unknown": 0.0}
    food, service = rng.choice(values, n), rng.choice(values, n)
    X = np.stack([[code[f], float(f != "unknown"), code[v], float(v != "unknown")] for f, v in zip(food, service)])
    X = X + 0.05 * rng.standard_normal(X.shape)
    W = np.array([[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 1.0, 0.0]])
    head = nn.Linear(4, 2)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(W, dtype=torch.float32))
        head.bias.zero_()
    logits = X @ W.T
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    concepts = [{"food": f, "service": v} for f, v in zip(food, service)]
    reps = torch.tensor(X, dtype=torch.float32)
    onehot = {c: (np.array(col)[:, None] == np.array(values)).astype(float) for c, col in (("food", food),
                                                                                         ("service", service))}
    train = Observed(texts=[f"t{i}" for i in range(n)], probs=probs, concepts=concepts, reps=reps, predicted=concepts,
                     labels=probs.argmax(1), groups=[f"g{i // 3}" for i in range(n)],
                     embeddings={"st": reps, "pt": reps, "ft": reps}, concept_probs=onehot)
    rows = list(range(12))
    base = train.take(rows)
    base.concepts, base.labels = None, None
    queries = Queries(base, ["food"] * 12, ["Negative"] * 12, ["Positive"] * 12)
    _WORLD.append(_World(ExplainedModel(head, 2, ("food", "service"), values), train, queries))
    return _WORLD[0]


@_check()
def check_explains_every_query(s: Subject) -> None:
    """explain returns one finite (K,) effect estimate per query."""
    _no_fit_needed(s)
    w = _world()
    out = _fit_once(s).result.numpy()
    if out.shape != (len(w.queries), w.model.n_classes):
        _fail(f"shape {out.shape}, expected {(len(w.queries), w.model.n_classes)}")
    if not np.isfinite(out).all():
        _fail("non-finite estimates")


# ---- metrics --------------------------------------------------------------------------------------
def _metric_inputs(m: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    if m.inputs == "edit":
        X, z = planted(n=64)
        after = X + 0.5 * torch.randn(X.shape, generator=g)
        return {"before": X, "after": after, "z": z, "z_target": (1 - z).long()}
    true = torch.randn(64, 3, generator=g).double().numpy() * 0.3
    est = true + 0.1 * torch.randn(64, 3, generator=g).double().numpy()
    return {"true": true, "estimate": est}


@_check("semantics")
def check_metric_values(s: Subject) -> None:
    """On planted inputs the metric returns one value per item, inside its declared range, without editing its
    inputs; a nullifying edit (no z_target) is scored too."""
    from cprobe.metrics.registry import compute

    m = s.obj
    if m.fn is None:
        raise SkipCheck("a study's own metric: its study computes it (its tests hold the values)")
    inputs = _metric_inputs(m)
    before = {k: (v.clone() if isinstance(v, Tensor) else np.array(v, copy=True)) for k, v in inputs.items()
              if v is not None}
    v = compute(m, **inputs)
    for k, v0 in before.items():
        now = inputs[k]
        if not (torch.equal(now, v0) if isinstance(now, Tensor) else np.array_equal(now, v0)):
            _fail(f"the input {k!r} was modified in place")
    if np.isnan(v).all():
        _fail("every value is NaN")
    if m.inputs == "edit":
        compute(m, **{**inputs, "z_target": None})


# ---- datasets -------------------------------------------------------------------------------------
@_check()
def check_loads_items(s: Subject) -> None:
    """It loads from its config into checked items carrying the properties it declares."""
    from cprobe.data.registry import declared_properties, load_dataset
    from cprobe.errors import ConfigError, DataError

    cfg = {"name": "check", "type": s.ref, **s.params}
    try:
        ds = load_dataset(cfg, Path.cwd())
    except (ConfigError, DataError) as e:
        raise SkipCheck(f"cannot load without data: {e}") from None
    if not isinstance(ds, Dataset):
        raise SkipCheck(f"loads {type(ds).__name__} items (a study's own item family)")
    declared = declared_properties(cfg)
    if declared is not None and set(ds.properties) - set(declared):
        _fail(f"items carry {sorted(set(ds.properties) - set(declared))}, which properties does not declare")


# ----------------------------------------------------------------------------------------------- selection
SMALL_PROBE = {"name": "mlp", "lrs": (1e-2,), "epochs": 5, "widths": (16,), "n_layers": (1,)}

CHECKS: dict[str, tuple[Check, ...]] = {
    "intervention": (check_capabilities, check_builds_from_config, check_not_fitted_error, check_fit_returns_self,
                     check_transform_shape_dtype_device, check_finite_output, check_intervenes, check_no_inplace_edits,
                     check_counterfactual_needs_target, check_deterministic, check_save_load_round_trip,
                     check_streaming_update_equals_fit, check_use_probe, check_edit_direction,
                     check_nullifying_erases, check_counterfactual_sets_target),
    "direction method": (check_capabilities, check_builds_from_config, check_not_fitted_error, check_fit_returns_self,
                         check_no_inplace_edits, check_deterministic, check_save_load_round_trip, check_unit_direction,
                         check_finds_planted_direction, check_fits_on_texts, check_token_scores),
    "probe": (check_builds_from_config, check_not_fitted_error, check_fit_returns_self, check_no_inplace_edits,
              check_probabilities, check_deterministic, check_save_load_round_trip, check_separates_planted_classes),
    "explainer": (check_capabilities, check_builds_from_config, check_not_fitted_error, check_fit_returns_self,
                  check_explains_every_query, check_deterministic, check_save_load_round_trip),
    "metric": (check_capabilities, check_metric_values, check_deterministic),
    "dataset type": (check_builds_from_config, check_loads_items),
}
"""Every family's checks, in the order they run (the contract, then the semantics)."""


def checks_for(subject: Subject) -> list[Check]:
    """The checks that apply to ``subject``'s family (a check that does not fit its capabilities skips itself)."""
    return list(CHECKS[subject.family])


_MISSING = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: ((?:'\w+'(?:, | and |, and )?)+)")


def missing_settings(s: Subject) -> list[str]:
    """The constructor settings ``s`` needs and was not given (read from building it once), or ``[]``."""
    if s.family in ("metric", "dataset type"):
        return []
    try:
        s.build()
    except Exception as e:  # noqa: BLE001  (any other failure is the checks' to report)
        m = _MISSING.search(str(e))
        if m is None:
            return []
        try:  # Python names one kind of missing argument at a time: the signature gives them all
            sig = inspect.signature(s.obj)
        except (TypeError, ValueError):
            sig = None
        named = [] if sig is None else [
            n for n, p in sig.parameters.items() if p.default is p.empty and n not in s.params and n != "seed"
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        found = re.findall(r"'(\w+)'", m.group(1))
        # the signature is the subject's own only when it holds what was missing (a via_ explainer builds another)
        return list(dict.fromkeys((named if set(found) <= set(named) else []) + found))
    return []


def _needs_settings(names: list[str]) -> Check:
    def check_settings(s: Subject) -> None:
        ref = s.ref if s.registry is not None else f"{s.obj.__module__}:{s.obj.__qualname__}"
        cli = " ".join(f"{n}=VALUE" for n in names)
        py = ", ".join(f"{n!r}: VALUE" for n in names)
        _fail(f"its constructor needs {' and '.join(names)}; give them: cprobe check {ref} {cli} (Python: ({ref!r}, "
              f"{{{py}}}))")
    return Check("check_settings", check_settings, "contract", "The required constructor settings are given.")


def iter_checks(targets: Any, params: Mapping[str, Any] | None = None,
                family: str | None = None) -> Iterator[tuple[Subject, Check]]:
    """Every (subject, check) for ``targets`` (one target, or a list of them: names, import paths, classes,
    metrics, or ``(target, params)`` pairs). A subject built without a setting its constructor requires gets one
    failing ``check_settings`` naming the settings, in place of its checks (each would fail for that reason)."""
    for t in targets if isinstance(targets, list) else [targets]:
        for s in subjects(t, params, family):
            missing = missing_settings(s)
            yield from [(s, _needs_settings(missing))] if missing else ((s, c) for c in checks_for(s))


def package_targets(package: str) -> list[tuple[Any, dict[str, Any]]]:
    """Every method the installed distribution ``package`` declares as a cprobe entry point, as (subject, {})."""
    from importlib.metadata import PackageNotFoundError, distribution

    from cprobe.errors import ConfigError

    try:
        dist = distribution(package)
    except PackageNotFoundError:
        raise ConfigError(f"no installed package named {package!r} (pip install it first; `cprobe plugins` lists "
                          "the installed plugins)") from None
    registry_of("intervention")  # every family imported: each has registered its registry
    out: list[tuple[Any, dict[str, Any]]] = []
    for ep in dist.entry_points:
        if ep.group in REGISTRIES:
            reg = registry_of(REGISTRIES[ep.group].kind)
            obj, src = reg.resolve(ep.name)
            out.append((Subject(reg.kind, ep.name, obj, {}, src, reg), {}))
    if not out:
        raise ConfigError(f"package {package!r} declares no cprobe entry point (groups {sorted(REGISTRIES)})")
    return out


def _expected(expected: Any, subject: Subject) -> Mapping[str, str]:
    if expected is None:
        return {}
    if callable(expected):
        return expected(subject) or {}
    nested = expected.get(subject.label) or expected.get(subject.ref)
    if isinstance(nested, Mapping):
        return nested
    return {k: v for k, v in expected.items() if isinstance(v, str)}


def run_one(subject: Subject, check: Check, expected: Mapping[str, str] | None = None,
            strict: bool = False) -> CheckResult:
    """Run one check: passed / failed / skipped, or xfail / xpass when the caller expected it to fail (``strict``:
    an expected failure that passes is a failure)."""
    why = (expected or {}).get(check.name)
    t0 = time.perf_counter()
    status, reason = "passed", ""
    try:
        check(subject)
    except SkipCheck as e:
        status, reason = "skipped", str(e)
    except Exception as e:  # noqa: BLE001  (a check's failure, whatever the method raised)
        status = "failed"
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = text if isinstance(e, AssertionError) else f"{type(e).__name__}: {text}"
    if why is not None:
        if status == "failed":
            status, reason = "xfail", f"{why} ({reason})"
        elif status == "passed":
            status, reason = ("failed" if strict else "xpass"), f"expected to fail ({why}) but passed"
    return CheckResult(subject.label, subject.family, check.name, check.group, status, reason,
                       time.perf_counter() - t0, subject.source.text if subject.source else "")


def run_checks(targets: Any, params: Mapping[str, Any] | None = None, *, family: str | None = None,
               expected_failures: Any = None, strict: bool = False,
               callback: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Run every check for ``targets`` and return the results (never raises for a failing check; a name that
    resolves nowhere is a ConfigError). ``expected_failures``: ``{check: reason}``, ``{subject label: {check:
    reason}}``, or a function of the subject giving one; ``callback`` sees each result as it finishes."""
    out = []
    for s, c in iter_checks(targets, params, family):
        r = run_one(s, c, _expected(expected_failures, s), strict)
        if callback is not None:
            callback(r)
        out.append(r)
    return out


def parametrize_with_checks(targets: Iterable[Any], *, expected_failures: Any = None, strict: bool = False) -> Any:
    """A pytest ``parametrize`` decorator over every (subject, check) of ``targets``; ids ``<label>-<check>`` (usable
    with ``-k``); expected failures become ``xfail`` marks with their reason. Use it as::

        from cprobe.testing import parametrize_with_checks

        @parametrize_with_checks([MyEraser, ("rlace", {"rank": 1})], expected_failures={"check_x": "why"})
        def test_conformance(subject, check):
            check(subject)
    """
    import pytest

    params = []
    for s, c in iter_checks(list(targets)):
        why = _expected(expected_failures, s).get(c.name)
        marks = [pytest.mark.xfail(reason=why, strict=strict)] if why else []
        params.append(pytest.param(s, _PytestCheck(c), id=f"{s.label}-{c.name}", marks=marks))
    return pytest.mark.parametrize(("subject", "check"), params)


class _PytestCheck:
    """A check as a pytest case sees it: a skip is ``pytest.skip`` with its reason."""

    def __init__(self, check: Check) -> None:
        self.check = check
        self.__name__ = check.name

    def __call__(self, subject: Subject) -> None:
        import pytest

        try:
            self.check(subject)
        except SkipCheck as e:
            pytest.skip(str(e))

    def __repr__(self) -> str:
        return self.check.name


# ----------------------------------------------------------------------------------------------- output
def format_table(results: Sequence[CheckResult]) -> str:
    """The results as a plain-text table (one row per check, one-line reasons), then a count per status."""
    rows = [(r.subject, r.family, r.check, r.status, r.reason) for r in results]
    head = ("method", "family", "check", "status", "reason")
    widths = [max(len(head[i]), *(len(x[i]) for x in rows)) if rows else len(head[i]) for i in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head[:4], widths)) + "  " + head[4]]
    lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    lines += ["  ".join(v.ljust(w) for v, w in zip(x[:4], widths)) + "  " + x[4] for x in rows]
    counts = {st: sum(r.status == st for r in results) for st in CHECK_STATUSES}
    lines.append(", ".join(f"{n} {st}" for st, n in counts.items() if n) or "no checks")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- a dataset
class PlantedAgreement(DatasetSource):
    """A tiny agreement dataset generated from a seed (no file): ``n`` items "the <noun> <verb> here ." with the
    subject's number as ``z_c`` — an outside dataset class to check the dataset path with (``dataset=custom
    dataset.type=cprobe.testing:PlantedAgreement``)."""

    properties = ("z_c", "z_e")

    def __init__(self, n: int = 40, draw: int = 0) -> None:
        if n < 2:
            raise ValueError(f"n must be >= 2, got {n}")
        self.n, self.draw = n, draw

    def load(self, root: Path, name: str) -> Dataset:
        rng = np.random.default_rng(self.draw)
        out = []
        plural = rng.permutation(self.n) % 2 == 1
        for i, pl in enumerate(plural):
            correct, wrong = ("are", "is") if pl else ("is", "are")
            out.append(Example(f"{name}-{i}", ("the", "authors" if pl else "author", f"w{i}", correct, "here", "."), 3,
                               correct, wrong, {"z_c": "pl" if pl else "sg", "z_e": "none"}))
        return Dataset(name, tuple(out), self.properties, source="built-in (cprobe.testing)")
