"""Seeded, stratified splits; optionally decorrelate two properties inside one split.

The reliability study trains oracle probes on a split where Z_c and Z_e are independent, so a
Z_c oracle cannot succeed by reading Z_e (Canby et al. 2024, §4).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cprobe.data.base import Dataset
from cprobe.errors import ConfigError


def check_split_spec(spec: Mapping) -> None:
    """Model- and data-free checks of a ``split`` config node."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"split must be a mapping with 'fractions', got {spec!r}")
    unknown = sorted(set(spec) - {"fractions", "stratify", "independent"})
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} under split; known keys: ['fractions', 'independent', 'stratify']")
    fractions = spec.get("fractions") or {}
    if (not isinstance(fractions, Mapping) or not fractions
            or any(not isinstance(f, (int, float)) or isinstance(f, bool) or f <= 0 for f in fractions.values())
            or abs(sum(fractions.values()) - 1) > 1e-6):
        raise ConfigError(f"split fractions must be positive numbers summing to 1, got {dict(fractions) if isinstance(fractions, Mapping) else fractions}")
    for name, pair in (spec.get("independent") or {}).items():
        if name not in fractions:
            raise ConfigError(f"split.independent names {name!r}, which is not among {list(fractions)}")
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ConfigError(f"split.independent.{name} must be [target, other], got {pair!r}")


def split_indices(ds: Dataset, fractions: Mapping[str, float], stratify: str | None, seed: int
                  ) -> dict[str, np.ndarray]:
    """Partition example indices by ``fractions`` (summing to 1), stratified by a property."""
    if not fractions or any(f <= 0 for f in fractions.values()) or abs(sum(fractions.values()) - 1) > 1e-6:
        raise ConfigError(f"split fractions must be positive and sum to 1, got {dict(fractions)}")
    rng = np.random.default_rng(seed)
    keys = np.array([e.props.get(stratify, "none") if stratify else "" for e in ds.examples])
    names = list(fractions)
    cum = np.cumsum([fractions[n] for n in names])
    out: dict[str, list[int]] = {n: [] for n in names}
    for v in np.unique(keys):
        idx = rng.permutation(np.flatnonzero(keys == v))
        bounds = np.round(cum * len(idx)).astype(int)
        for n, lo, hi in zip(names, np.r_[0, bounds[:-1]], bounds):
            out[n] += idx[lo:hi].tolist()
    for n, idx in out.items():
        if not idx:
            raise ConfigError(f"split {n!r} is empty ({len(ds)} examples); use more data or a larger fraction")
    return {n: np.sort(np.array(idx)) for n, idx in out.items()}


def decorrelate(ds: Dataset, idx: np.ndarray, target: str, other: str, seed: int) -> np.ndarray:
    """The largest subsample of ``idx`` (up to rounding) in which ``target`` is independent of ``other``
    while keeping ``target``'s prior: within every value of ``other``, ``target`` takes the proportions π it
    has over all of ``idx`` (Canby et al. ask for Z_c ⟂ Z_e, not for balanced classes)."""
    rng = np.random.default_rng(seed)
    t = np.array([ds.examples[i].props.get(target, "none") for i in idx])
    o = np.array([ds.examples[i].props.get(other, "none") for i in idx])
    values, counts = np.unique(t, return_counts=True)
    prior = counts / counts.sum()
    keep: list[int] = []
    for ov in np.unique(o):
        cells = [np.flatnonzero((o == ov) & (t == tv)) for tv in values]
        size = min(len(c) / p for c, p in zip(cells, prior))  # rows this value of `other` can keep
        for c, p in zip(cells, prior):
            keep += rng.choice(c, min(len(c), int(round(size * p))), replace=False).tolist()
    if not keep:
        raise ConfigError(f"cannot make {target} independent of {other}: some combination never occurs")
    return np.sort(idx[np.array(keep)])


def make_splits(ds: Dataset, spec: Mapping, seed: int) -> dict[str, np.ndarray]:
    """``spec``: {fractions: {name: f}, stratify: prop, independent: {split: [target, other]}}."""
    check_split_spec(spec)
    out = split_indices(ds, spec["fractions"], spec.get("stratify"), seed)
    for name, pair in (spec.get("independent") or {}).items():
        if name not in out:
            raise ConfigError(f"split.independent names {name!r}, which is not among {list(out)}")
        target, other = pair
        out[name] = decorrelate(ds, out[name], target, other, seed)
    return out


