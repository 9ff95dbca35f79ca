"""Structural causal models over discrete concepts, declared in YAML (LIBERTy, Toker et al. 2026, §4 / App. E).

A variable has named values ``0 … m−1``. A root draws its value from a categorical distribution (``uniform`` or a
list of probabilities); an endogenous variable is a clipped, rounded linear function of its parents plus Gaussian
noise (the paper's Tables 7–9)::

    V = min(m − 1, max(0, round(intercept + Σ_j w_j · term_j + ε_V))),   ε_V ~ N(mean, sd)

where a term is a parent's value index (``education: 0.4``) or an indicator of one of its values
(``disease=Migraine: 0.9`` is 0.9 · 1{disease = Migraine}; an index works too: ``disease=0``).

Every unit's exogenous values are kept (:class:`Noise`: the uniform draw u behind each root, ε of every equation),
so the model answers the three rungs exactly:

- :meth:`SCM.sample` — draw units (values in topological order, noise stored);
- :meth:`SCM.solve` with ``do`` — interventions cut the intervened variables' equations (their parents no longer
  matter) and fix their values;
- :meth:`SCM.counterfactual` — abduction (the unit's stored noise), action (``do``), prediction (re-solve): a
  counterfactual that sets a variable to its factual value reproduces the unit exactly.

:func:`true_effects` estimates by Monte Carlo the effect of each concept on the label, the paper's "True Effect"
row (Tables 3/17): E over units and every other value c′ of Σ_y |1{Y_do(C=c′) = y} − 1{Y = y}|.

Files live in ``conf/scm/<name>.yaml`` (``cv``, ``violence``, ``disease`` are built in) or anywhere by path; a
malformed file is a one-line :class:`~cprobe.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cprobe.errors import ConfigError

VARIABLE_KEYS = {"values", "distribution", "terms", "intercept", "noise", "description"}


@dataclass(frozen=True)
class Term:
    """``weight · parent`` (``level`` None) or ``weight · 1{parent = level}``."""

    parent: str
    weight: float
    level: int | None = None


@dataclass(frozen=True)
class Variable:
    key: str
    values: tuple[str, ...]
    distribution: tuple[float, ...] | None = None  # roots
    terms: tuple[Term, ...] = ()
    intercept: float = 0.0
    noise_mean: float = 0.0
    noise_sd: float = 0.0

    @property
    def is_root(self) -> bool:
        return self.distribution is not None

    @property
    def parents(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.parent for t in self.terms))

    def index(self, value: str | int, where: str = "") -> int:
        """The index of a value: an integer is an index; a string is a value name, else a decimal index (a name
        wins: values named "1", "2", "3" read "1" as the first). A one-line error naming the variable otherwise."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if 0 <= int(value) < len(self.values):
                return int(value)
        elif isinstance(value, str):
            if value in self.values:
                return self.values.index(value)
            if value.lstrip("-").isdigit() and 0 <= int(value) < len(self.values):
                return int(value)
        raise ConfigError(f"{where}{value!r} is not a value of {self.key!r}; choose from {list(self.values)} "
                          f"(or 0..{len(self.values) - 1})")


@dataclass
class Noise:
    """The exogenous values of n units: ``u[root]`` ~ U(0, 1) picks a root's value, ``eps[var]`` is an
    equation's Gaussian noise. Indexable by unit rows."""

    u: dict[str, np.ndarray]
    eps: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter({**self.u, **self.eps}.values())))

    def take(self, rows: Sequence[int] | np.ndarray) -> Noise:
        rows = np.asarray(rows, dtype=np.int64)
        return Noise({k: v[rows] for k, v in self.u.items()}, {k: v[rows] for k, v in self.eps.items()})

    def row(self, i: int) -> dict[str, float]:
        """One unit's noise as a flat JSON-able mapping (``u.<root>`` / ``eps.<var>``)."""
        return {**{f"u.{k}": float(v[i]) for k, v in self.u.items()},
                **{f"eps.{k}": float(v[i]) for k, v in self.eps.items()}}

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, float]]) -> Noise:
        keys = list(rows[0]) if rows else []
        u = {k[2:]: np.array([r[k] for r in rows], dtype=np.float64) for k in keys if k.startswith("u.")}
        eps = {k[4:]: np.array([r[k] for r in rows], dtype=np.float64) for k in keys if k.startswith("eps.")}
        return cls(u, eps)


@dataclass(frozen=True)
class SCM:
    """A validated structural causal model; ``variables`` in topological order."""

    name: str
    variables: dict[str, Variable]
    label: str
    title: str = ""
    null_value: str | None = None  # the value meaning "absent" (Disease: every symptom's 0)
    text: Mapping[str, Any] = field(default_factory=dict)  # the template realiser's phrase bank
    digest: str = ""  # content hash of the declaration (cache keys)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "scm") -> SCM:
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: an SCM must be a mapping with `variables:` and `label:`")
        unknown = set(d) - {"name", "title", "label", "variables", "null_value", "text"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; an SCM has name, title, label, variables, "
                              "null_value, text")
        raw = d.get("variables")
        if not isinstance(raw, Mapping) or not raw:
            raise ConfigError(f"{where}: `variables:` must map variable names to their declarations")
        name = str(d.get("name") or where)
        specs = {str(k): v for k, v in raw.items()}
        values = {}
        for key, spec in specs.items():
            if not isinstance(spec, Mapping):
                raise ConfigError(f"{where}: variable {key!r} must be a mapping (values, distribution | terms, noise)")
            vals = spec.get("values")
            if not isinstance(vals, Sequence) or isinstance(vals, str) or len(vals) < 2:
                raise ConfigError(f"{where}: variable {key!r} needs `values:`, a list of at least 2 value names")
            vals = tuple(str(v) for v in vals)
            if len(set(vals)) != len(vals):
                raise ConfigError(f"{where}: variable {key!r} lists a value twice: {list(vals)}")
            values[key] = vals
        variables = {key: _variable(key, spec, values, f"{where}: variable {key!r}") for key, spec in specs.items()}
        order = _topological(variables, where)
        label = d.get("label")
        if not isinstance(label, str) or label not in variables:
            raise ConfigError(f"{where}: label {label!r} is not a variable; choose from {list(variables)}")
        null = d.get("null_value")
        text = d.get("text") or {}
        if not isinstance(text, Mapping):
            raise ConfigError(f"{where}: `text:` must be a mapping (the realiser's phrase bank)")
        digest = hashlib.sha256(json.dumps(_plain(d), sort_keys=True, default=str).encode()).hexdigest()[:16]
        return cls(name, {k: variables[k] for k in order}, str(label), str(d.get("title") or name),
                   None if null is None else str(null), text, digest)

    @classmethod
    def load(cls, name_or_path: str | Path, config_dir: Path | None = None) -> SCM:
        """``conf/scm/<name>.yaml`` (built in) or a YAML file by path."""
        import yaml

        p = Path(str(name_or_path)).expanduser()
        if not p.suffix:
            from cprobe.paths import config_dir as conf

            base = (config_dir or conf()) / "scm"
            p = base / f"{name_or_path}.yaml"
            if not p.is_file():
                known = sorted(f.stem for f in base.glob("*.yaml")) if base.is_dir() else []
                raise ConfigError(f"unknown SCM {str(name_or_path)!r}; choose from {known} or give a .yaml path")
        if not p.is_file():
            raise ConfigError(f"SCM file {p} does not exist")
        try:
            d = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"SCM file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
        return cls.from_dict(d, where=f"scm {p.stem}")

    # ------------------------------------------------------------------ structure
    @property
    def concepts(self) -> tuple[str, ...]:
        """Every variable but the label (what explainers intervene on)."""
        return tuple(k for k in self.variables if k != self.label)

    def children(self, key: str) -> tuple[str, ...]:
        return tuple(k for k, v in self.variables.items() if key in v.parents)

    def descendants(self, key: str) -> tuple[str, ...]:
        """Every variable downstream of ``key`` (topological order, ``key`` excluded)."""
        self._var(key)
        out: set[str] = set()
        frontier = [key]
        while frontier:
            for c in self.children(frontier.pop()):
                if c not in out:
                    out.add(c)
                    frontier.append(c)
        return tuple(k for k in self.variables if k in out)

    def _var(self, key: str) -> Variable:
        try:
            return self.variables[key]
        except KeyError:
            raise ConfigError(f"unknown variable {key!r} of SCM {self.name!r}; choose from "
                              f"{list(self.variables)}") from None

    # ------------------------------------------------------------------ the three rungs
    def sample_noise(self, n: int, rng: np.random.Generator) -> Noise:
        """Exogenous values of ``n`` units, drawn variable by variable in topological order."""
        u, eps = {}, {}
        for k, v in self.variables.items():
            if v.is_root:
                u[k] = rng.uniform(size=n)
            else:
                eps[k] = rng.normal(v.noise_mean, v.noise_sd, size=n) if v.noise_sd > 0 else np.full(n, v.noise_mean)
        return Noise(u, eps)

    def solve(self, noise: Noise, do: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Every variable's value index (n,) given the units' noise, under the intervention ``do`` (a value name
        or index per variable, a scalar or one per unit)."""
        n = len(noise)
        fixed = {}
        for key, value in (do or {}).items():
            var = self._var(key)
            arr = np.asarray(value, dtype=object).reshape(-1)
            idx = np.array([var.index(x, f"do({key}): ") for x in arr], dtype=np.int64)
            if len(idx) not in (1, n):
                raise ConfigError(f"do({key}) needs one value or one per unit ({n}), got {len(idx)}")
            fixed[key] = np.broadcast_to(idx, (n,)).copy()
        out: dict[str, np.ndarray] = {}
        for key, v in self.variables.items():
            if key in fixed:
                out[key] = fixed[key]
            elif v.is_root:
                cdf = np.cumsum(v.distribution)
                cdf[-1] = 1.0
                out[key] = np.searchsorted(cdf, noise.u[key], side="right").clip(0, len(v.values) - 1)
            else:
                z = np.full(n, v.intercept, dtype=np.float64) + noise.eps[key]
                for t in v.terms:
                    x = out[t.parent]
                    z = z + t.weight * (x == t.level if t.level is not None else x)
                out[key] = np.clip(np.rint(z), 0, len(v.values) - 1).astype(np.int64)
        return out

    def sample(self, n: int, seed: int | np.random.Generator = 0) -> tuple[dict[str, np.ndarray], Noise]:
        """``n`` units: (values, noise)."""
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        noise = self.sample_noise(n, rng)
        return self.solve(noise), noise

    def counterfactual(self, noise: Noise, do: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Abduction–action–prediction: the units' own (stored) noise, the intervention, the re-solved values.
        With every variable's noise stored, abduction is exact: it is the stored noise."""
        return self.solve(noise, do)

    def names(self, key: str, idx: np.ndarray) -> list[str]:
        vals = self._var(key).values
        return [vals[int(i)] for i in idx]


def true_effects(scm: SCM, n: int = 200_000, seed: int = 0, label: str | None = None) -> dict[str, float]:
    """Monte-Carlo "True Effect" of every concept on the label (Toker et al. Tables 3/17; reading of the digest
    B.6.4): for each unit and each value c′ other than its own, Σ_y |1{Y_do(C=c′) = y} − 1{Y = y}| (= 2 when the
    label changes), averaged over units and c′. Concepts that are not ancestors of the label get 0."""
    label = label or scm.label
    values, noise = scm.sample(n, seed)
    y = values[label]
    out = {}
    for c in scm.concepts:
        if c == label:
            continue
        m = len(scm.variables[c].values)
        total = np.zeros(n)
        for shift in range(1, m):  # every other value, once per unit
            cf = scm.solve(noise, {c: (values[c] + shift) % m})[label]
            total += 2.0 * (cf != y)
        out[c] = float(total.mean() / (m - 1))
    return out


# ---------------------------------------------------------------------- helpers
def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _number(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ConfigError(f"{where} must be a number, got {x!r}")
    if not np.isfinite(x):
        raise ConfigError(f"{where} must be finite, got {x!r}")
    return float(x)


def _variable(key: str, spec: Mapping[str, Any], values: dict[str, tuple[str, ...]], where: str) -> Variable:
    unknown = set(spec) - VARIABLE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; choose from {sorted(VARIABLE_KEYS)}")
    vals = values[key]
    dist, terms = spec.get("distribution"), spec.get("terms")
    if (dist is None) == (terms is None):
        raise ConfigError(f"{where}: give either `distribution:` (a root) or `terms:` (an equation), not "
                          f"{'both' if dist is not None else 'neither'}")
    if dist is not None:
        if dist == "uniform":
            probs = tuple(1.0 / len(vals) for _ in vals)
        elif isinstance(dist, Sequence) and not isinstance(dist, str) and len(dist) == len(vals):
            probs = tuple(_number(p, f"{where}: a probability") for p in dist)
            if min(probs) < 0 or abs(sum(probs) - 1) > 1e-6:
                raise ConfigError(f"{where}: distribution {list(probs)} must be non-negative and sum to 1")
        else:
            raise ConfigError(f"{where}: distribution must be `uniform` or {len(vals)} probabilities (one per value), "
                              f"got {dist!r}")
        if spec.get("noise") is not None or spec.get("intercept") is not None:
            raise ConfigError(f"{where}: a root takes no noise or intercept (its distribution is its noise)")
        return Variable(key, vals, distribution=probs)
    if not isinstance(terms, Mapping):
        raise ConfigError(f"{where}: terms must map parents (or `parent=value` indicators) to weights")
    parsed = []
    for t, w in terms.items():
        parent, _, level = str(t).partition("=")
        parent = parent.strip()
        if parent not in values:
            others = sorted(k for k in values if k != key)
            raise ConfigError(f"{where}: unknown parent {parent!r}; choose from {others}")
        if parent == key:
            raise ConfigError(f"{where}: a variable cannot be its own parent")
        lvl = None
        if level:
            pv = Variable(parent, values[parent])
            lvl = pv.index(level.strip(), f"{where}: indicator {t!r}: ")
        parsed.append(Term(parent, _number(w, f"{where}: the weight of {t!r}"), lvl))
    noise = spec.get("noise", {})
    if not isinstance(noise, Mapping) or set(noise) - {"mean", "sd", "var"} or ("sd" in noise and "var" in noise):
        raise ConfigError(f"{where}: noise must be {{mean: μ, sd: σ}} (or {{mean: μ, var: σ²}}), got {noise!r}")
    mean = _number(noise.get("mean", 0.0), f"{where}: noise mean")
    if "var" in noise:
        var = _number(noise["var"], f"{where}: noise var")
        if var < 0:
            raise ConfigError(f"{where}: noise var must be >= 0, got {var}")
        sd = float(np.sqrt(var))
    else:
        sd = _number(noise.get("sd", 0.0), f"{where}: noise sd")
        if sd < 0:
            raise ConfigError(f"{where}: noise sd must be >= 0, got {sd}")
    intercept = _number(spec.get("intercept", 0.0), f"{where}: intercept")
    return Variable(key, vals, terms=tuple(parsed), intercept=intercept, noise_mean=mean, noise_sd=sd)


def _topological(variables: dict[str, Variable], where: str) -> list[str]:
    """A topological order as close to the declaration order as the parents allow (each step takes the first
    declared variable whose parents are placed); a cycle is an error naming its variables."""
    order: list[str] = []
    done: set[str] = set()
    pending = list(variables)
    while pending:
        ready = next((k for k in pending if all(p in done for p in variables[k].parents)), None)
        if ready is None:
            cycle = _find_cycle({k: variables[k].parents for k in pending})
            raise ConfigError(f"{where}: the equations form a cycle: {' → '.join(cycle)}")
        order.append(ready)
        done.add(ready)
        pending.remove(ready)
    return order


def _find_cycle(parents: dict[str, tuple[str, ...]]) -> list[str]:
    start = next(iter(parents))
    path: list[str] = []
    seen: dict[str, int] = {}
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in parents[node] if p in parents)
    return list(reversed([*path[seen[node]:], node]))  # parent → child
