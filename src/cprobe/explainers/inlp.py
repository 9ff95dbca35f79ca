"""INLP as an explainer (CEBaB §4, App. F; Ravfogel et al. 2020).

Per concept C: the project's INLP (:class:`cprobe.interventions.inlp.INLP`, logistic-regression classifiers —
the paper found them to behave like its SGD SVMs) removes C's 3-way label from φ in ``iterations`` rounds
(one-vs-rest: k directions per round for k > 2 classes; the paper's 10 rounds), giving the projection P; a copy of
the explained head is then re-trained on P·φ of the training split (the paper's 5 epochs of Adam at lr 2e-5, full
batch, as the public code) and the estimate is softmax N′(P φ(x)) − softmax N(φ(x)). It models only the
removal of C (``c′ = unknown``) and returns the same estimate whatever c′ is. With ``diagnose`` (default),
``leftover_[C]`` = (accuracy before, after, majority rate) of a fresh logistic probe for C on training rows that an
INLP projection fit on the other half never saw (:func:`~cprobe.explainers.base.leftover`).
"""

from __future__ import annotations

import copy
from typing import Self

import numpy as np
import torch
from torch import nn

from cprobe.errors import ConfigError
from cprobe.explainers.base import (EXPLAINERS, ExplainedModel, Explainer, Observed, Queries, concept_targets,
                                    leftover, per_concept, rows_of)


def retrain_head(head: nn.Module, X: torch.Tensor, y: torch.Tensor, epochs: int, lr: float,
                 batch_size: int | None = None, seed: int = 0) -> nn.Module:
    """A copy of ``head`` re-trained on (X, y) with Adam (full batch when ``batch_size`` is None)."""
    new = copy.deepcopy(head).float()
    dev = next(new.parameters()).device
    for p in new.parameters():
        p.requires_grad_(True)
    X, y = X.float().to(dev), y.long().to(dev)
    opt = torch.optim.Adam(new.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    new.train()
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(X), generator=gen).to(dev)
            step = batch_size or len(X)
            for s in range(0, len(X), step):
                b = order[s: s + step]
                loss = nn.functional.cross_entropy(new(X[b]), y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
    new.eval()
    for p in new.parameters():
        p.requires_grad_(False)
    return new


@EXPLAINERS.register("inlp")
class INLPExplainer(Explainer):
    name = "inlp"
    needs_representation = True
    removal_only = True

    def __init__(self, iterations: int = 10, head_epochs: int = 5, head_lr: float = 2e-5,
                 head_batch_size: int | None = None, seed: int = 0, device: str | None = None,
                 diagnose: bool = True) -> None:
        if iterations < 1:
            raise ConfigError(f"inlp: iterations must be >= 1, got {iterations}")
        self.iterations, self.head_epochs, self.head_lr = iterations, head_epochs, head_lr
        self.head_batch_size, self.seed, self.device = head_batch_size, seed, device
        self.diagnose = diagnose

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        assert train.reps is not None and train.concepts is not None
        self.model_ = model
        y = np.asarray(train.labels if train.labels is not None else train.probs.argmax(1))
        self.P_, self.heads_, self.leftover_ = {}, {}, {}
        for concept in model.concepts:
            z = concept_targets(train.concepts, concept, model.values)
            rows = torch.from_numpy(np.flatnonzero(z >= 0))
            self.P_[concept] = self._projection(train.reps[rows].float(), torch.from_numpy(z)[rows])
            X = train.reps.float() @ self.P_[concept]
            if self.diagnose:
                self.leftover_[concept] = leftover(train.reps, z, self._eraser, self.seed)
            keep = torch.from_numpy(y >= 0)
            self.heads_[concept] = retrain_head(model.head, X[keep], torch.from_numpy(y)[keep], self.head_epochs,
                                                self.head_lr, self.head_batch_size, self.seed)
        return self

    def directions(self, k: int, d: int) -> int:
        """Directions removed for a k-class concept in d dimensions: one per class per round for k > 2 (the reference's
        one-vs-rest classifier has k rows: 30 for a 3-way concept in 10 rounds), one per round for k = 2."""
        return min(self.iterations * (k if k > 2 else 1), d)

    def _projection(self, X: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """INLP's projection P (d, d), on the CPU, removing :meth:`directions` directions of the labels ``z``."""
        from cprobe.interventions.inlp import INLP

        return INLP(rank=self.directions(int(z.unique().numel()), X.shape[1]), device=self.device).fit(X, z).P.cpu()

    def _eraser(self, X: torch.Tensor, z: torch.Tensor):
        P = self._projection(X, z)
        return lambda Y: Y.float() @ P

    def explain(self, queries: Queries) -> np.ndarray:
        reps = queries.base.reps
        assert reps is not None

        def estimate(concept: str, rows: np.ndarray) -> np.ndarray:
            head = ExplainedModel(self.heads_[concept], self.n_classes_, (), ())
            return head.head_probs(rows_of(reps, rows) @ self.P_[concept]) - queries.base.probs[rows]

        return per_concept(queries, self.n_classes_, list(self.P_), estimate)
