"""CausaLM (CEBaB eq. 10, App. E; Feder et al. 2021): counterfactual representations by adversarial training.

Per concept C, a copy of the explained model's encoder is trained so that φ_C^CF(x) *forgets* C while keeping
what else it knew: an adversarial head predicts C's label through a gradient-reversal layer (weight λ, the
paper's 0.1), a control head keeps one other concept (the paper's single confounder), and — in place of CausaLM's masked-LM objective, which needs an
MLM head the offline encoder does not ship — a preservation loss keeps φ_C^CF(x) close (MSE) to the factual
φ(x). A copy of the head N′ is then trained on the frozen φ_C^CF (the paper's factual/fine-tuning phase: Adam
lr 1e-3, 50 epochs, batch 256) and the estimate is the TReITE

    softmax N′(φ_C^CF(x)) − softmax N(φ(x))                                          (eq. 10)

which models removal only (``c′ = unknown``).

**The control concept** (``control``): ``reference`` (default) is the pairing of the reference's released CEBaB
models (``causalm.<treated>__<control>``: food→service, service→food, ambiance→food, noise→food); a treated concept
that table does not name (LIBERTy's) gets the most informative other one. ``mi`` picks, for every concept, the other
concept with the highest mutual information of the training labels (the paper's wording, "the most correlated
confounder"; on CEBaB's train_exclusive: food→service, service→ambiance, ambiance→noise, noise→ambiance).
``control_`` records the choice.

Cost: ``epochs`` full passes of the encoder per concept — the
most expensive explainer by far (docs/cebab.md has the measured time); it is therefore not in the default
explainer list and runs with ``cebab.explainers=[...,causalm]``. ``leftover_[C]`` = (accuracy before, after,
majority rate) of a fresh logistic probe for C trained on a quarter of the training rows' φ and φ_C^CF and scored on
another quarter (``diagnose``; the counterfactual encoder itself was trained on every row — refitting it per fold
would cost another CausaLM run): adversarial removal is leaky (Elazar & Goldberg 2018), and this says how much of C
is left.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Self

import numpy as np
import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError
from cprobe.explainers.base import (EXPLAINERS, ExplainedModel, Explainer, Observed, Queries, concept_targets,
                                    leftover, per_concept)
from cprobe.explainers.inlp import retrain_head


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, lam: float) -> Tensor:  # type: ignore[override]
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return -ctx.lam * grad, None


def grad_reverse(x: Tensor, lam: float = 1.0) -> Tensor:
    """Identity forward; multiplies the gradient by −λ backward (Ganin & Lempitsky's gradient reversal)."""
    return _Reverse.apply(x, lam)


def causalm_loss(phi: Tensor, target: Tensor, adv: nn.Module, ctl: nn.Module, z_treated: Tensor,
                 z_control: Tensor | None, adversarial_weight: float, preserve_weight: float) -> Tensor:
    """One batch's objective: preserve·MSE(φ, φ_factual) + CE(adv(GRL_λ(φ)), C) + CE(ctl(φ), control).

    Minimising it trains both heads to predict their concept while the encoder gets −λ times the adversary's
    gradient (it moves φ to make the adversary wrong). Labels of −1 are ignored; a term with no labelled row is 0.
    """
    loss = preserve_weight * nn.functional.mse_loss(phi, target)
    if bool((z_treated >= 0).any()):
        loss = loss + nn.functional.cross_entropy(adv(grad_reverse(phi, adversarial_weight)), z_treated,
                                                  ignore_index=-1)
    if z_control is not None and bool((z_control >= 0).any()):
        loss = loss + nn.functional.cross_entropy(ctl(phi), z_control, ignore_index=-1)
    return loss


def mutual_information(a: np.ndarray, b: np.ndarray) -> float:
    """Mutual information (nats) of two label arrays over the rows where both are labelled (≥ 0)."""
    keep = (a >= 0) & (b >= 0)
    a, b = a[keep], b[keep]
    if not len(a):
        return 0.0
    joint = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(joint, (a, b), 1)
    joint /= joint.sum()
    pa, pb = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log(joint[nz] / (pa @ pb)[nz])).sum())


REFERENCE_CONTROL = {"food": "service", "service": "food", "ambiance": "food", "noise": "food"}
"""The control concept of each treated aspect in the reference's released CausaLM models (CEBaB's public code)."""


def control_concepts(concepts: Sequence[str], labels: dict[str, np.ndarray], rule: str = "reference"
                     ) -> dict[str, str | None]:
    """The control concept of every treated concept (module doc): the reference's table, or mutual information."""
    out: dict[str, str | None] = {}
    for concept in concepts:
        others = [c for c in concepts if c != concept]
        ref = REFERENCE_CONTROL.get(concept)
        if rule == "reference" and ref in others:
            out[concept] = ref
        else:
            out[concept] = max(others, key=lambda o: mutual_information(labels[concept], labels[o])) if others else None
    return out


@EXPLAINERS.register("causalm")
class CausaLM(Explainer):
    name = "causalm"
    needs_training = True
    removal_only = True

    def __init__(self, epochs: int = 3, lr: float = 2e-5, batch_size: int = 48, adversarial_weight: float = 0.1,
                 preserve_weight: float = 1.0, head_epochs: int = 50, head_lr: float = 1e-3,
                 head_batch_size: int = 256, seed: int = 0, diagnose: bool = True,
                 control: str = "reference") -> None:
        if epochs < 1 or batch_size < 1:
            raise ConfigError("causalm: epochs and batch_size must be >= 1")
        if control not in ("reference", "mi"):
            raise ConfigError(f"causalm: control must be 'reference' (the reference's released pairs) or 'mi' (mutual "
                              f"information), got {control!r}")
        self.control, self.epochs, self.lr, self.batch_size = control, epochs, lr, batch_size
        self.adversarial_weight, self.preserve_weight = adversarial_weight, preserve_weight
        self.head_epochs, self.head_lr, self.head_batch_size = head_epochs, head_lr, head_batch_size
        self.seed, self.diagnose = seed, diagnose

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        if model.regime is None or train.concepts is None or train.reps is None:
            raise ConfigError("causalm needs the explained model's training regime, concept labels and φ(x)")
        self.model_ = model
        y = np.asarray(train.labels if train.labels is not None else train.probs.argmax(1))
        labels = {c: concept_targets(train.concepts, c, model.values) for c in model.concepts}
        self.encoders_, self.heads_, self.leftover_ = {}, {}, {}
        self.control_ = control_concepts(model.concepts, labels, self.control)
        for concept in model.concepts:
            control = self.control_[concept]
            enc = self._counterfactual_encoder(model, train, labels[concept],
                                               labels[control] if control else None, len(model.values))
            self.encoders_[concept] = enc
            X = self._features(enc, list(train.texts))
            if self.diagnose:
                self.leftover_[concept] = leftover(train.reps, labels[concept], None, self.seed, erased=X)
            keep = torch.from_numpy(y >= 0)
            self.heads_[concept] = retrain_head(model.head, X[keep], torch.from_numpy(y)[keep], self.head_epochs,
                                                self.head_lr, self.head_batch_size, self.seed)
        return self

    def _counterfactual_encoder(self, model: ExplainedModel, train: Observed, treated: np.ndarray,
                                control: np.ndarray | None, k: int) -> nn.Module:
        from cprobe.data.items import TextItem
        from cprobe.models.formatters import ClassificationFormatter
        from cprobe.models.placement import require_resident
        from cprobe.progress import track

        regime = model.regime
        adapter = regime.adapter
        require_resident(adapter.model, "CausaLM's counterfactual fine-tuning")
        clf = copy.deepcopy(adapter.model)  # SequenceClassifier: features() is φ
        dev = adapter.device
        d = clf.config.hidden_size
        torch.manual_seed(self.seed)
        adv, ctl = nn.Linear(d, k).to(dev), nn.Linear(d, k).to(dev)
        params = list(clf.base_model.parameters())
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.Adam(params + list(adv.parameters()) + list(ctl.parameters()), lr=self.lr)
        fmt = ClassificationFormatter(regime.max_length)
        target = train.reps.float()
        t_z, c_z = torch.from_numpy(treated), torch.from_numpy(control) if control is not None else None
        gen = torch.Generator().manual_seed(self.seed)
        n = len(train)
        items = [TextItem(str(i), t) for i, t in enumerate(train.texts)]
        clf.train()
        with torch.enable_grad():
            for _ in track(range(self.epochs), "causalm counterfactual encoder", True):
                order = torch.randperm(n, generator=gen)
                for s in range(0, n, self.batch_size):
                    rows = order[s: s + self.batch_size]
                    batch = fmt([items[int(i)] for i in rows], adapter, rows).to(dev)
                    phi = clf.features(batch.input_ids, batch.attention_mask).float()
                    loss = causalm_loss(phi, target[rows].to(dev), adv, ctl, t_z[rows].to(dev),
                                        None if c_z is None else c_z[rows].to(dev), self.adversarial_weight,
                                        self.preserve_weight)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
        clf.eval()
        for p in params:
            p.requires_grad_(False)
        return clf

    def _features(self, clf: nn.Module, texts: Sequence[str]) -> Tensor:
        from cprobe.data.items import TextItem
        from cprobe.models.adapter import ModelAdapter
        from cprobe.models.classifier import classify

        base = self.model_.regime.adapter
        adapter = ModelAdapter(clf, base.tok, "classifier", f"{base.name}+causalm", batch_size=base.batch_size,
                               max_length=base.max_length)
        items = [TextItem(str(i), t) for i, t in enumerate(texts)]
        phi, _ = classify(adapter, items, self.model_.regime.max_length)
        return phi

    def explain(self, queries: Queries) -> np.ndarray:
        def estimate(concept: str, rows: np.ndarray) -> np.ndarray:
            X = self._features(self.encoders_[concept], [queries.base.texts[i] for i in rows])
            head = ExplainedModel(self.heads_[concept], self.n_classes_, (), ())
            return head.head_probs(X) - queries.base.probs[rows]

        return per_concept(queries, self.n_classes_, list(self.encoders_), estimate)
