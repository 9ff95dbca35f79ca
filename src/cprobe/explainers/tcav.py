"""TCAV adapted to effects (CEBaB eq. 9, App. G; Kim et al. 2018).

The concept activation vector v_C is the unit normal of a linear separator in φ-space between training texts
that *mention* C (any value but the null one) and texts that do not (the null value); texts whose label is
missing or has no majority are dropped. The paper's separator: a linear SVM trained by SGD (α = 0.01,
tol = 1e-3, max_iter = 1000). The public code's label map sends only Positive to the mention class (Negative
texts silently dropped); here every non-null value counts, as the paper describes. Orientation as the public
code (``cav = −coef``): v_C points from "mentioned" towards "not mentioned" — the direction of a removal edit.
The sign is a convention the paper does not state; it flips every estimate (cosine distance d ↔ 2 − d per
pair), and since CEBaB's pairs come in both orders the mean cosine error is ≈ 1 either way.

The effect estimate for class k is tanh(∇_φ N_k(φ(x)) · v_C), the directional derivative of the head's logit
k along v_C, squashed by tanh because logits and probability differences live on different scales. It does not
depend on c or c′ (TCAV only knows a concept's direction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import numpy as np
import torch
from torch import Tensor

from cprobe.errors import DataError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries, per_concept, rows_of


def fit_cav(reps: Tensor, concepts: Sequence[dict[str, str]], concept: str, values: Sequence[str], null: str,
            seed: int = 0, alpha: float = 0.01, max_iter: int = 1000, tol: float = 1e-3) -> np.ndarray:
    """Unit CAV (d,) of ``concept``: from "mentioned" towards "not mentioned" (hinge-loss SGD separator; the
    public code's −coef orientation)."""
    from sklearn.linear_model import SGDClassifier

    y = np.array([-1 if c.get(concept) not in values else int(c[concept] != null) for c in concepts])
    keep = y >= 0
    if len(np.unique(y[keep])) < 2:
        raise DataError(f"cannot fit a CAV for {concept!r}: the training texts need both mentioned and "
                        f"not-mentioned ({null}) labels")
    X = reps[torch.from_numpy(keep)].double().cpu().numpy()
    sgd = SGDClassifier(alpha=alpha, max_iter=max_iter, tol=tol, random_state=seed).fit(X, y[keep])
    w = -sgd.coef_[0]
    return w / np.linalg.norm(w)


def directional_derivatives(head: torch.nn.Module, reps: Tensor, v: Tensor) -> np.ndarray:
    """(n, K): ∇_φ logit_k(φ) · v for every row and class (the head in eval mode)."""
    p = next(head.parameters())
    was = head.training
    head.eval()
    x = reps.to(p.device, p.dtype).detach().requires_grad_(True)
    with torch.enable_grad():
        logits = head(x)
        out = []
        for k in range(logits.shape[1]):
            (g,) = torch.autograd.grad(logits[:, k].sum(), x, retain_graph=k + 1 < logits.shape[1])
            out.append(g @ v.to(g.device, g.dtype))
    head.train(was)
    return torch.stack(out, 1).detach().double().cpu().numpy()


@EXPLAINERS.register("tcav")
class TCAV(Explainer):
    name = "tcav"
    needs_representation = True

    def __init__(self, alpha: float = 0.01, max_iter: int = 1000, tol: float = 1e-3, seed: int = 0) -> None:
        self.alpha, self.max_iter, self.tol, self.seed = alpha, max_iter, tol, seed

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        if train.concepts is None:
            raise DataError("TCAV needs the training split's concept labels")
        assert train.reps is not None
        self.head_ = model.head
        self.cavs_ = {c: torch.from_numpy(fit_cav(train.reps, train.concepts, c, model.values, model.null_value,
                                                  self.seed, self.alpha, self.max_iter, self.tol))
                      for c in model.concepts}
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        reps = queries.base.reps
        assert reps is not None
        return per_concept(queries, self.n_classes_, list(self.cavs_), lambda c, rows: np.tanh(
            directional_derivatives(self.head_, rows_of(reps, rows), self.cavs_[c])))
