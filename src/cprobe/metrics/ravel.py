"""RAVEL's disentanglement scores (Huang et al., ACL 2024, §3): Cause, Isolate and their mean.

An interchange on an entity's representation targets attribute A: the base prompt is about entity e, the source's
representation comes from a prompt about e′. On prompts querying A the edit should carry e′'s value (Cause); on
prompts querying another attribute B it should leave e's value (Isolate). Each is a share of edited prompts; the
predictions and values are value indices (or any comparable labels), one per edited prompt.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def _share(predicted: ArrayLike, wanted: ArrayLike) -> float:
    p, w = np.asarray(predicted), np.asarray(wanted)
    if p.shape != w.shape or p.ndim != 1:
        raise ValueError(f"predictions and values must be two 1-D arrays of one length, got {p.shape} and {w.shape}")
    return float((p == w).mean()) if len(p) else float("nan")


def cause(predicted: ArrayLike, source_value: ArrayLike) -> float:
    """Cause(A): the share of edits on prompts querying A after which the model outputs the source entity's A
    (NaN with no edit)."""
    return _share(predicted, source_value)


def isolate(predicted: ArrayLike, base_value: ArrayLike) -> float:
    """Isolate(A → B): the share of edits targeting A, on prompts querying B ≠ A, after which the model still outputs
    the base entity's B (NaN with no edit)."""
    return _share(predicted, base_value)


def disentangle(cause_score: float, isolate_score: float) -> float:
    """RAVEL's disentanglement score: the mean of Cause and Isolate (NaN when either is)."""
    return (cause_score + isolate_score) / 2
