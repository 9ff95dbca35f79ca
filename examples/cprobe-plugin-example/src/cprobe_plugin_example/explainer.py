"""MeanShiftExplainer: a concept's effect as the explained head's response to shifting φ(x) by the concept's mean
difference between the target and the source value."""

from __future__ import annotations

from typing import Self

import numpy as np
import torch

from cprobe.plugin import DataError, ExplainedModel, Explainer, Observed, Queries


class MeanShiftExplainer(Explainer):
    """Needs φ(x). ``fit``: per concept and value, the mean representation of the training texts with that value;
    ``explain``: for a query (C: c → c′) on a text x, ``softmax N(φ(x) + α(m_{C,c′} − m_{C,c})) − softmax N(φ(x))``."""

    name = "mean_shift"
    needs_representation = True

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = float(alpha)

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        assert train.reps is not None and train.concepts is not None
        self.model_ = model
        self.means_: dict[tuple[str, str], torch.Tensor] = {}
        for concept in model.concepts:
            for value in model.values:
                rows = [i for i, c in enumerate(train.concepts) if c.get(concept) == value]
                if rows:
                    self.means_[(concept, value)] = train.reps[torch.tensor(rows)].float().mean(0)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        reps = queries.base.reps
        assert reps is not None
        shifts = []
        for concept, c, c2 in zip(queries.aspect, queries.c, queries.c_prime):
            if (concept, c) not in self.means_ or (concept, c2) not in self.means_:
                raise DataError(f"mean_shift: no training text has {concept}={c!r} or {concept}={c2!r}")
            shifts.append(self.means_[(concept, c2)] - self.means_[(concept, c)])
        moved = reps.float() + self.alpha * torch.stack(shifts)
        return self.model_.head_probs(moved) - queries.base.probs
