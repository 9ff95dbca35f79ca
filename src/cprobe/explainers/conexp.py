"""CONEXP, the conditional expectation (CEBaB eq. 7; Goyal et al.): the model's mean prediction over the
training texts whose concept ``C`` is ``c′`` minus the mean over those where it is ``c`` — the same for every
text. Groups use the gold majority labels of the training split, as the public code does."""

from __future__ import annotations

from typing import Self

import numpy as np

from cprobe.errors import DataError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries


@EXPLAINERS.register("conexp")
class CONEXP(Explainer):
    name = "conexp"

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        if train.concepts is None:
            raise DataError("CONEXP needs the training split's concept labels")
        self.means_: dict[tuple[str, str], np.ndarray] = {}
        for concept in model.concepts:
            for value in model.values:
                rows = [i for i, c in enumerate(train.concepts) if c.get(concept) == value]
                if rows:
                    self.means_[(concept, value)] = train.probs[rows].mean(0)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        out = np.zeros((len(queries), self.n_classes_))
        for i, (a, c, c2) in enumerate(zip(queries.aspect, queries.c, queries.c_prime)):
            missing = [v for v in (c, c2) if (a, v) not in self.means_]
            if missing:
                raise DataError(f"CONEXP: no training text has {a} = {missing[0]}")
            out[i] = self.means_[(a, c2)] - self.means_[(a, c)]
        return out
