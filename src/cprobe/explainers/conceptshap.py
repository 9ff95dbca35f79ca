"""ConceptSHAP adapted to effects (CEBaB App. H, eqs. 23–25; Yeh et al. 2020).

With the concepts' CAVs V (m, d) (fit as for :mod:`~cprobe.explainers.tcav`), every subset S of the m concepts
gets a map g_S from the concept scores V_S φ(x) back to φ-space — a two-layer perceptron (500 hidden units, ReLU)
trained with the head frozen so that N(g_S(V_S φ(x))) predicts the training labels (the paper's sup over g:
Adam, lr 1e-2, 50 epochs, batch 128); the empty set's g is a learned constant. Per text, η_x(S) =
softmax N(g_S(V_S φ(x))) and the estimate for concept C is its Shapley value

    Σ_{S ⊆ M∖{C}} |S|! (m − |S| − 1)! / m! · (η_x(S ∪ {C}) − η_x(S))      (eq. 24)

— a probability-difference vector over classes, so the values over all concepts sum to η_x(M) − η_x(∅)
(efficiency). The public code instead softmaxes the Shapley vector and subtracts 0.5; cprobe keeps the Shapley
vector itself (a difference of distributions, on ICaCE's scale). ``completeness_`` is eq. 25 on the training
split: (acc of N∘g_M − 1/K) / (acc of N − 1/K).
"""

from __future__ import annotations

import copy
import math
from itertools import combinations
from typing import Self

import numpy as np
import torch
from torch import Tensor, nn

from cprobe.errors import DataError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries
from cprobe.explainers.tcav import fit_cav


def shapley_weight(size: int, m: int) -> float:
    """|S|! (m − |S| − 1)! / m! for a coalition of ``size`` concepts out of ``m``."""
    return math.factorial(size) * math.factorial(m - size - 1) / math.factorial(m)


def shapley_values(eta: dict[frozenset[int], np.ndarray], m: int) -> np.ndarray:
    """(m, n, K) Shapley values of each of ``m`` players from the value of every coalition (n, K)."""
    out = []
    for c in range(m):
        others = [i for i in range(m) if i != c]
        total = 0.0
        for size in range(m):
            for S in combinations(others, size):
                s = frozenset(S)
                total = total + shapley_weight(size, m) * (eta[s | {c}] - eta[s])
        out.append(total)
    return np.stack(out)


class _G(nn.Module):
    def __init__(self, n_in: int, d: int, hidden: int) -> None:
        super().__init__()
        self.n_in = n_in
        self.net = nn.Sequential(nn.Linear(max(n_in, 1), hidden), nn.ReLU(), nn.Linear(hidden, d))

    def forward(self, scores: Tensor) -> Tensor:
        if self.n_in == 0:
            scores = scores.new_ones(len(scores), 1)
        return self.net(scores)


@EXPLAINERS.register("conceptshap")
class ConceptSHAP(Explainer):
    name = "conceptshap"
    needs_representation = True

    def __init__(self, hidden: int = 500, epochs: int = 50, lr: float = 1e-2, batch_size: int = 128,
                 seed: int = 0, device: str | None = None) -> None:
        self.hidden, self.epochs, self.lr, self.batch_size = hidden, epochs, lr, batch_size
        self.seed, self.device = seed, device

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        if train.concepts is None:
            raise DataError("ConceptSHAP needs the training split's concept labels")
        assert train.reps is not None
        self.concepts_ = model.concepts
        self.head_ = copy.deepcopy(model.head).float().eval()
        dev = torch.device(self.device) if self.device else train.reps.device
        self.head_.to(dev)
        for p in self.head_.parameters():
            p.requires_grad_(False)
        self.V_ = torch.stack([torch.from_numpy(fit_cav(train.reps, train.concepts, c, model.values, model.null_value,
                                                        self.seed)) for c in model.concepts]).float().to(dev)
        y = train.labels if train.labels is not None else train.probs.argmax(1)
        keep = torch.from_numpy(np.asarray(y) >= 0)
        X, yt = train.reps[keep].float().to(dev), torch.as_tensor(np.asarray(y))[keep].long().to(dev)
        m, d = len(model.concepts), X.shape[1]
        self.g_: dict[frozenset[int], _G] = {}
        gen = torch.Generator().manual_seed(self.seed)
        for size in range(m + 1):
            for S in combinations(range(m), size):
                torch.manual_seed(self.seed * 7919 + sum(1 << i for i in S))
                g = _G(size, d, self.hidden).to(dev)
                opt = torch.optim.Adam(g.parameters(), lr=self.lr)
                scores = X @ self.V_[list(S)].T if S else X.new_zeros(len(X), 0)
                for _ in range(self.epochs):
                    order = torch.randperm(len(X), generator=gen).to(dev)
                    for s in range(0, len(X), self.batch_size):
                        b = order[s: s + self.batch_size]
                        loss = nn.functional.cross_entropy(self.head_(g(scores[b])), yt[b])
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                self.g_[frozenset(S)] = g.eval()
        with torch.inference_mode():
            acc_full = float((self.head_(self.g_[frozenset(range(m))](X @ self.V_.T)).argmax(1) == yt).float().mean())
            acc_model = float((self.head_(X).argmax(1) == yt).float().mean())
        chance = 1.0 / model.n_classes
        self.completeness_ = (acc_full - chance) / (acc_model - chance) if acc_model != chance else float("nan")
        return self

    def eta(self, reps: Tensor) -> dict[frozenset[int], np.ndarray]:
        """η_x(S) (n, K) for every coalition S."""
        dev = self.V_.device
        X = reps.float().to(dev)
        out = {}
        with torch.inference_mode():
            for S, g in self.g_.items():
                idx = sorted(S)
                scores = X @ self.V_[idx].T if idx else X.new_zeros(len(X), 0)
                out[S] = self.head_(g(scores)).softmax(-1).double().cpu().numpy()
        return out

    def explain(self, queries: Queries) -> np.ndarray:
        assert queries.base.reps is not None
        phi = shapley_values(self.eta(queries.base.reps), len(self.concepts_))  # (m, n, K)
        at = np.array([self.concepts_.index(a) for a in queries.aspect])
        return phi[at, np.arange(len(queries))]
