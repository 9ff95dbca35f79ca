"""S-Learner (CEBaB eq. 8; Künzel et al.): a logistic regression E from the one-hot values of every concept to
the explained model's predicted class, fit on the training split; the effect of ``C: c → c′`` on a text is
E(x′ with C := c′) − E(x′), where x′ are the text's concept labels predicted by the concept classifier.

As the public code: scikit-learn ``LogisticRegression()`` with its defaults, target argmax N(φ(x)), features
from the gold training labels. A missing or no-majority training label (10–42 % of CEBaB's train_exclusive rows per
aspect) gets an **all-zero block** — the public code's coding (``missing: zero``, default); ``missing: null`` codes
it as the null value (``unknown``) instead, which tells the regression "not mentioned" where the annotators simply
did not say. The base texts' predicted labels are never missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Self

import numpy as np

from cprobe.errors import ConfigError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries


@EXPLAINERS.register("s_learner")
class SLearner(Explainer):
    name = "s_learner"
    needs_predicted_concepts = True

    def __init__(self, C: float = 1.0, max_iter: int = 1000, missing: str = "zero") -> None:
        if missing not in ("zero", "null"):
            raise ConfigError(f"s_learner: missing must be 'zero' (the reference's all-zero block) or 'null' (the "
                              f"null value), got {missing!r}")
        self.C, self.max_iter, self.missing = C, max_iter, missing

    def _features(self, labels: Sequence[Mapping[str, str]]) -> np.ndarray:
        """One block of len(values) per concept: one-hot of the label; a missing label all zeros (or the null
        value's one-hot with ``missing: null``)."""
        X = np.zeros((len(labels), len(self.concepts_) * len(self.values_)))
        for i, lab in enumerate(labels):
            for j, c in enumerate(self.concepts_):
                v = lab.get(c)
                if v not in self.values_:
                    if self.missing == "zero":
                        continue
                    v = self.null_
                X[i, j * len(self.values_) + self.values_.index(v)] = 1.0
        return X

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        from sklearn.linear_model import LogisticRegression

        self.concepts_, self.values_, self.null_ = model.concepts, model.values, model.null_value
        labels = train.concepts if train.concepts is not None else train.predicted
        y = train.probs.argmax(1)
        self.constant_ = int(y[0]) if len(np.unique(y)) == 1 else None  # the model predicts one class: no effect
        self.lr_ = None if self.constant_ is not None else LogisticRegression(
            C=self.C, max_iter=self.max_iter).fit(self._features(labels), y)
        return self

    def _proba(self, X: np.ndarray) -> np.ndarray:
        p = np.zeros((len(X), self.n_classes_))
        if self.lr_ is None:
            p[:, self.constant_] = 1.0
            return p
        p[:, self.lr_.classes_] = self.lr_.predict_proba(X)  # classes the model never predicted get 0
        return p

    def explain(self, queries: Queries) -> np.ndarray:
        factual = [dict(p) for p in queries.base.predicted]  # type: ignore[union-attr]
        counter = [dict(p, **{a: c2}) for p, a, c2 in zip(factual, queries.aspect, queries.c_prime)]
        return self._proba(self._features(counter)) - self._proba(self._features(factual))
