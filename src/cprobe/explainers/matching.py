"""Top-k matching (LIBERTy, Toker et al. 2026, §6 / App. D.2; after Gat et al. 2023): stand in for the
counterfactual of x under C: c → c′ with the k training texts most similar to x among those whose concept C has the
value c′, and return

    M(x, c⃗) = mean_{m ∈ top-k} f(m) − f(x)

(k = 3, cosine similarity; a text never matches its own unit; fewer than k candidates: all of them). The family
differs in the space similarity is measured in — a declared capability, so the study computes only the spaces its
explainers need — and in which labels say "C = c′":

- ``st_match``: a sentence-transformer's mean-pooled embedding (all-MiniLM-L6-v2; space ``st``);
- ``pt_match``: the explained model's *pre-trained* encoder, mean-pooled (space ``pt``);
- ``ft_match``: the *fine-tuned* explained model's encoder, mean-pooled (space ``ft``) — the paper's winner;
  these three select candidates by the training texts' gold labels (LIBERTy's D_M is generated, so they are known;
  the paper does not say);
- ``convecs``: concept-based (the paper's ConVecs): candidates whose *predicted* C is c′ (the paper's methods in this
  family assume no access to gold labels), ranked by cosine over the concatenated predicted distributions of the
  *remaining* concepts (from the concept classifier).

When no training text qualifies the estimate is zero (counted in ``fallbacks_["none"]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Self

import numpy as np

from cprobe.errors import ConfigError, DataError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries


def unit_rows(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (cosine similarity = dot product); zero rows stay zero."""
    v = np.asarray(v, dtype=np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


class Matching(Explainer):
    """Top-k cosine matching in one space (subclasses name it: the ``embedding_space`` capability)."""

    use_predicted: ClassVar[bool] = False  # select candidates by predicted (not gold) concept labels

    def __init__(self, k: int = 3) -> None:
        if k < 1:
            raise ConfigError(f"{self.name}: k must be >= 1, got {k}")
        self.k = k

    def vectors(self, obs: Observed, concept: str) -> np.ndarray:
        """The texts' vectors in this explainer's space for a change of ``concept``, L2-normalised."""
        assert obs.embeddings is not None
        return unit_rows(obs.embeddings[self.embedding_space].double().cpu().numpy())

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        labels = train.predicted if self.use_predicted else train.concepts
        if labels is None:
            raise DataError(f"{self.name} needs the training texts' {'predicted' if self.use_predicted else 'gold'} "
                            "concept labels (the matching pool's C values)")
        self.train_ = train
        self.labels_ = {c: np.array([row.get(c, "") for row in labels], dtype=object) for c in model.concepts}
        self.groups_ = np.array(list(train.groups) if train.groups is not None else [None] * len(train), dtype=object)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        groups: Sequence[object] = queries.base.groups if queries.base.groups is not None else [None] * len(queries)
        out = np.zeros((len(queries), self.n_classes_))
        self.fallbacks_ = {"none": 0}
        aspect, c2 = np.asarray(queries.aspect, dtype=object), np.asarray(queries.c_prime, dtype=object)
        spaces: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key in dict.fromkeys(zip(aspect, c2)):
            rows = np.flatnonzero((aspect == key[0]) & (c2 == key[1]))
            labels = self.labels_.get(key[0])
            cand = np.flatnonzero(labels == key[1]) if labels is not None else np.array([], dtype=np.int64)
            if len(cand) == 0:
                self.fallbacks_["none"] += len(rows)
                continue
            if key[0] not in spaces:
                spaces[key[0]] = (self.vectors(queries.base, key[0]), self.vectors(self.train_, key[0]))
            q, pool = spaces[key[0]]
            sims = q[rows] @ pool[cand].T  # (rows, candidates)
            for r, i in enumerate(rows):
                s = sims[r].copy()
                if groups[i] is not None:
                    s[self.groups_[cand] == groups[i]] = -np.inf
                ok = np.isfinite(s)
                if not ok.any():
                    self.fallbacks_["none"] += 1
                    continue
                best = np.argsort(-s, kind="stable")[: min(self.k, int(ok.sum()))]
                out[i] = self.train_.probs[cand[best]].mean(0) - queries.base.probs[i]
        return out


@EXPLAINERS.register("st_match")
class STMatch(Matching):
    name = "st_match"
    embedding_space = "st"


@EXPLAINERS.register("pt_match")
class PTMatch(Matching):
    name = "pt_match"
    embedding_space = "pt"


@EXPLAINERS.register("ft_match")
class FTMatch(Matching):
    name = "ft_match"
    embedding_space = "ft"


@EXPLAINERS.register("convecs")
class ConVecs(Matching):
    """Concept-based matching: predicted C = c′, cosine over the other concepts' predicted distributions."""

    name = "convecs"
    min_concepts = 2  # it ranks by the *other* concepts' predicted distributions
    needs_concept_probs = True
    needs_predicted_concepts = True
    use_predicted = True

    def vectors(self, obs: Observed, concept: str) -> np.ndarray:
        assert obs.concept_probs is not None
        others = [obs.concept_probs[c] for c in obs.concept_probs if c != concept]
        if not others:
            raise DataError("convecs needs at least one concept besides the intervened one")
        return unit_rows(np.concatenate(others, axis=1))


__all__ = ["ConVecs", "FTMatch", "Matching", "PTMatch", "STMatch", "unit_rows"]
