"""Causal concept effects (ICaCE, CaCE, ACaCE, ITE) and the distances that score explainers against them
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


DISTANCES: dict[str, Callable[[ArrayLike, ArrayLike], np.ndarray]] = {"l2": l2, "cosine": cosine, "normdiff": normdiff}


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


def cace(effects: ArrayLike) -> np.ndarray:
    """Empirical CaCE (eq. 4/16): the mean ICaCE over the pairs of one (concept, c → c′) group, (n, K) → (K,)
    (or (n,) → scalar for the argmax-class version of the paper's Table 4)."""
    e = np.asarray(effects, dtype=np.float64)
    if len(e) == 0:
        raise ValueError("CaCE of an empty set of pairs is undefined")
    return e.mean(0)


def acace(caces: ArrayLike) -> float:
    """Empirical ACaCE (eq. 17): the mean over a concept's value pairs {c, c′} of |CaCE| — the absolute value
    of scalar CaCEs, the L2 norm of vector ones."""
    c = np.asarray(caces, dtype=np.float64)
    if len(c) == 0:
        raise ValueError("ACaCE over no value pairs is undefined")
    mags = np.abs(c) if c.ndim == 1 else np.linalg.norm(c, axis=1)
    return float(mags.mean())


def ite(rating_base: ArrayLike, rating_counterfactual: ArrayLike) -> np.ndarray:
    """Empirical ITE (eq. 5): the change of the human (review-majority) label, no model involved."""
    return np.asarray(rating_counterfactual, dtype=np.float64) - np.asarray(rating_base, dtype=np.float64)
