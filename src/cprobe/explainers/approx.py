"""Approximate counterfactuals, "Approx" (CEBaB eq. 6): stand in for the unseen counterfactual with another
unit's training text whose (predicted) concept labels equal those the counterfactual should have — the base
text's predicted labels with ``C`` set to ``c′`` — and return N(φ(x_match)) − N(φ(x_base)).

Labels come from the concept classifier on both sides, as in the paper. The match is drawn at random (seeded)
among the exact matches of other units; ``k > 1`` averages k draws. When no text matches every label, the
candidates with ``C = c′`` that match the most other concepts are used — at most ``max_mismatches`` of them
(LIBERTy's rule, ``max_mismatches: 1``: one mismatch allowed only when no perfect match exists; ``None``: the
fewest, however many) — and when no text qualifies the estimate is zero; both cases are counted in ``fallbacks_``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Self

import numpy as np

from cprobe.errors import ConfigError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries


@EXPLAINERS.register("approx")
class Approx(Explainer):
    name = "approx"
    needs_predicted_concepts = True

    def __init__(self, k: int = 1, seed: int = 0, max_mismatches: int | None = None) -> None:
        if k < 1:
            raise ConfigError(f"approx: k must be >= 1, got {k}")
        if max_mismatches is not None and max_mismatches < 0:
            raise ConfigError(f"approx: max_mismatches must be >= 0 (or null for no limit), got {max_mismatches}")
        self.k, self.seed, self.max_mismatches = k, seed, max_mismatches

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        assert train.predicted is not None
        self.concepts_ = model.concepts
        self.keys_ = [tuple(p.get(c, "") for c in model.concepts) for p in train.predicted]
        self.probs_ = train.probs
        self.groups_ = list(train.groups) if train.groups is not None else [None] * len(train)
        self.index_: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i, key in enumerate(self.keys_):
            self.index_[key].append(i)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        assert queries.base.predicted is not None
        rng = np.random.default_rng(self.seed)
        groups = queries.base.groups if queries.base.groups is not None else [None] * len(queries)
        out = np.zeros((len(queries), self.n_classes_))
        self.fallbacks_ = {"nearest": 0, "none": 0}
        for i in range(len(queries)):
            a, c2 = queries.aspect[i], queries.c_prime[i]
            key = tuple(c2 if c == a else queries.base.predicted[i].get(c, "") for c in self.concepts_)  # C := c′
            g = groups[i]
            cand = [j for j in self.index_.get(key, []) if g is None or self.groups_[j] != g]
            if not cand:
                miss, cand = self._nearest(key, self.concepts_.index(a), g)
                if self.max_mismatches is not None and miss is not None and miss > self.max_mismatches:
                    cand = []
                self.fallbacks_["nearest" if cand else "none"] += 1
            if not cand:
                continue
            pick = rng.choice(cand, size=min(self.k, len(cand)), replace=False)
            out[i] = self.probs_[pick].mean(0) - queries.base.probs[i]
        return out

    def _nearest(self, key: tuple[str, ...], at: int, group: object) -> tuple[int | None, list[int]]:
        """(fewest mismatches, the texts with that many) among other units' texts with the target's value at ``at``."""
        best, cand = None, []
        for other, rows in self.index_.items():
            if other[at] != key[at]:
                continue
            rows = [j for j in rows if group is None or self.groups_[j] != group]
            if not rows:
                continue
            miss = sum(x != y for x, y in zip(other, key))
            if best is None or miss < best:
                best, cand = miss, list(rows)
            elif miss == best:
                cand += rows
        return best, sorted(cand)
