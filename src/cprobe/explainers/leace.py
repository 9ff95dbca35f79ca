"""LEACE as an explainer (beyond the CEBaB paper; Belrose et al. 2023): per concept C, the project's LEACE
eraser (:class:`cprobe.interventions.leace.LEACE`) fit on φ of the training split against C's 3-way label;
the estimate is softmax N(E(φ(x))) − softmax N(φ(x)) with the explained head unchanged — what the model does
once no linear readout of C is left. Like INLP it models removal only. With ``diagnose`` (default),
``leftover_[C]`` = (accuracy before, after, majority rate) of a fresh logistic probe for C on training rows an eraser
fit on the other half never saw (:func:`~cprobe.explainers.base.leftover`; a few tenths of a second)."""

from __future__ import annotations

from typing import Self

import numpy as np
import torch

from cprobe.explainers.base import (EXPLAINERS, ExplainedModel, Explainer, Observed, Queries, concept_targets,
                                    leftover, per_concept, rows_of)


@EXPLAINERS.register("leace")
class LEACEExplainer(Explainer):
    name = "leace"
    needs_representation = True
    removal_only = True

    def __init__(self, seed: int = 0, diagnose: bool = True) -> None:
        self.seed, self.diagnose = seed, diagnose

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        from cprobe.interventions.leace import LEACE

        assert train.reps is not None and train.concepts is not None
        self.model_ = model
        self.erasers_, self.leftover_ = {}, {}
        for concept in model.concepts:
            z = concept_targets(train.concepts, concept, model.values)
            rows = torch.from_numpy(np.flatnonzero(z >= 0))
            self.erasers_[concept] = LEACE().fit(train.reps[rows].float(), torch.from_numpy(z)[rows])
            if self.diagnose:
                self.leftover_[concept] = leftover(train.reps, z, lambda X, y: LEACE().fit(X, y).transform, self.seed)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        reps = queries.base.reps
        assert reps is not None

        def estimate(concept: str, rows: np.ndarray) -> np.ndarray:
            erased = self.erasers_[concept].transform(rows_of(reps, rows))
            return self.model_.head_probs(erased) - queries.base.probs[rows]

        return per_concept(queries, self.n_classes_, list(self.erasers_), estimate)
