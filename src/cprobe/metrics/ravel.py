"""RAVEL's disentanglement scores (Huang et al., ACL 2024, §3; explanare/ravel ``src/utils/metric_utils.py``): Cause,
Isolate and their mean.

An interchange on an entity's representation targets attribute A: the base prompt is about entity e, the source's
representation comes from a prompt about e′. On prompts querying A the edit should carry e′'s value (Cause); on
prompts querying another attribute B it should leave e's value (Isolate). Each is a share of edited prompts.

**A match** (the reference's ``compute_metrics``, its sequence accuracy): the model's greedy tokens after the prompt
against the label's first ``n`` tokens (RAVEL's ``max_new_tokens``, 3), label positions past the label's end
(padding: negative ids) ignored — a label shorter than ``n`` tokens matches when its own tokens do, one longer when
its first ``n`` do. Predictions and labels are (edits, n) token arrays, or one comparable label per edit (1-D: plain
equality, e.g. value indices).

**The score over attributes** (the reference's ``compute_disentangle_score``): Cause is the mean over the targeted
attribute's tasks, Isolate the mean over the other attributes of the mean over each one's tasks (a task: a base
template with its source kind), disentanglement their mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike


def matches(predicted: ArrayLike, label: ArrayLike) -> np.ndarray:
    """Per edit, whether the prediction matches the label (module doc): (n,) bool."""
    p, w = np.asarray(predicted), np.asarray(label)
    if p.shape != w.shape or p.ndim not in (1, 2):
        raise ValueError(f"predictions and labels must be two 1-D arrays of one length (one label per edit) or two "
                         f"2-D arrays of one shape (edits × tokens), got {p.shape} and {w.shape}")
    if p.ndim == 1:
        return p == w
    return ((p == w) | (w < 0)).all(1)


def _share(predicted: ArrayLike, wanted: ArrayLike) -> float:
    hit = matches(predicted, wanted)
    return float(hit.mean()) if len(hit) else float("nan")


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


def disentangle_score(cause_tasks: Mapping[str, Sequence[float]], isolate_tasks: Mapping[str, Sequence[float]]
                      ) -> dict[str, float]:
    """The reference's score over attributes: ``cause`` = the mean over the targeted attributes of the mean of their
    tasks' Cause, ``isolate`` = the same over the other attributes' tasks' Isolate, ``disentangle`` their mean. An
    attribute without a task does not count (the reference skips a task it has no log of); NaN where none has one."""
    def mean_of_means(tasks: Mapping[str, Sequence[float]]) -> float:
        means = [float(np.mean(v)) for v in tasks.values() if len(v)]
        return float(np.mean(means)) if means else float("nan")
    c, i = mean_of_means(cause_tasks), mean_of_means(isolate_tasks)
    return {"cause": c, "isolate": i, "disentangle": disentangle(c, i)}
