"""Individual causal concept effects and the distances that score explainers against them
(Abraham et al. 2022, CEBaB eqs. 2–3; reused by LIBERTy, Toker et al. 2026, Def. 3).

An effect is a vector over the model's classes: the change of the predicted class distribution.

    ICaCE^(x_c, x_c') = f(x_c') − f(x_c)                       (eq. 2; empirical, from an edit pair)
    ICaCE-Error = mean over pairs of Dist(ICaCE^, E(x_c, c'))  (eq. 3; E is the explainer's estimate)

Dist is one of (CEBaB's code, ``metric_utils``):
- ``l2``:       ‖a − b‖₂ (direction and magnitude);
- ``cosine``:   1 − cos(a, b), and **1 when either vector is all zero** (so Random scores ≈ 1);
- ``normdiff``: | ‖a‖₂ − ‖b‖₂ | (magnitude only).
All functions are row-wise over (n, K) arrays and return (n,) float64 arrays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from cprobe.errors import ConfigError


def _rows(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"effect vectors differ in shape: {a.shape} vs {b.shape}")
    return a, b


def l2(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    a, b = _rows(a, b)
    return np.linalg.norm(a - b, axis=1)


def cosine(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    a, b = _rows(a, b)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    zero = ~(a != 0).any(axis=1) | ~(b != 0).any(axis=1)
    cos = (a * b).sum(axis=1) / np.where(zero, 1.0, na * nb)
    return np.where(zero, 1.0, 1.0 - cos)


def normdiff(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    a, b = _rows(a, b)
    return np.abs(np.linalg.norm(a, axis=1) - np.linalg.norm(b, axis=1))


DISTANCES: dict[str, Callable[[ArrayLike, ArrayLike], np.ndarray]] = {"l2": l2, "cosine": cosine,
                                                                     "normdiff": normdiff}


def distance(name: str) -> Callable[[ArrayLike, ArrayLike], np.ndarray]:
    try:
        return DISTANCES[name]
    except KeyError:
        raise ConfigError(f"unknown distance {name!r}; choose from {sorted(DISTANCES)}") from None


def icace(p_base: ArrayLike, p_counterfactual: ArrayLike) -> np.ndarray:
    """Eq. 2, row-wise: ``f(x_c') − f(x_c)`` from the two predicted distributions (n, K)."""
    p, q = _rows(p_base, p_counterfactual)
    return q - p


def icace_error(true_effects: ArrayLike, estimates: ArrayLike, dist: str = "l2") -> np.ndarray:
    """Eq. 3 before averaging: ``Dist(ICaCE^, E)`` per pair; average over pairs (or groups of pairs) outside."""
    return distance(dist)(true_effects, estimates)
