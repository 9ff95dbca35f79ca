"""Top-k matching (LIBERTy, Toker et al. 2026, §6; after Gat et al. 2023): stand in for the counterfactual of x
under C: c → c′ with the k training texts most similar to x among those whose concept C has the value c′, and return

    M(x, c⃗) = mean_{m ∈ top-k} f(m) − f(x)

(k = 3, cosine similarity). The training texts' C values are their gold labels (in LIBERTy the explainer set D_M is
generated, so they are known); a text never matches its own unit. The family differs only in the space in which
similarity is measured — a declared capability, so the study computes only the spaces its explainers need:

- ``st_match``: a sentence-transformer embedding (all-MiniLM-L6-v2, mean-pooled; space ``st``);
- ``pt_match``: the explained model's *pre-trained* encoder at the site the classifier reads (space ``pt``);
- ``ft_match``: the *fine-tuned* explained model at that site, φ(x) (space ``ft``) — the paper's winner;
- ``convecs``: the concatenated predicted distributions of every concept from the concept classifier (the paper's
  ConVecs, new in LIBERTy).

When no training text has C = c′ the estimate is zero (counted in ``fallbacks_["none"]``).
"""

from __future__ import annotations

from typing import ClassVar, Self

import numpy as np

from cprobe.errors import ConfigError, DataError
from cprobe.explainers.base import EXPLAINERS, ExplainedModel, Explainer, Observed, Queries


class Matching(Explainer):
    """Top-k cosine matching in one space (subclasses name it)."""

    space: ClassVar[str] = ""

    def __init__(self, k: int = 3) -> None:
        if k < 1:
            raise ConfigError(f"{self.name}: k must be >= 1, got {k}")
        self.k = k

    def vectors(self, obs: Observed) -> np.ndarray:
        """The texts' vectors in this explainer's space, L2-normalised (cosine = dot product)."""
        assert obs.embeddings is not None
        v = obs.embeddings[self.space].double().cpu().numpy()
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)

    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        if train.concepts is None:
            raise DataError(f"{self.name} needs the training texts' concept labels (the matching pool's C values)")
        self.pool_ = self.vectors(train)
        self.probs_ = train.probs
        self.labels_ = {c: np.array([row.get(c, "") for row in train.concepts], dtype=object) for c in model.concepts}
        self.groups_ = np.array(list(train.groups) if train.groups is not None else [None] * len(train), dtype=object)
        return self

    def explain(self, queries: Queries) -> np.ndarray:
        q = self.vectors(queries.base)
        groups = queries.base.groups if queries.base.groups is not None else [None] * len(queries)
        out = np.zeros((len(queries), self.n_classes_))
        self.fallbacks_ = {"none": 0}
        aspect, c2 = np.asarray(queries.aspect, dtype=object), np.asarray(queries.c_prime, dtype=object)
        for key in dict.fromkeys(zip(aspect, c2)):
            rows = np.flatnonzero((aspect == key[0]) & (c2 == key[1]))
            labels = self.labels_.get(key[0])
            cand = np.flatnonzero(labels == key[1]) if labels is not None else np.array([], dtype=np.int64)
            if len(cand) == 0:
                self.fallbacks_["none"] += len(rows)
                continue
            sims = q[rows] @ self.pool_[cand].T  # (rows, candidates)
            for r, i in enumerate(rows):
                s = sims[r].copy()
                if groups[i] is not None:
                    s[self.groups_[cand] == groups[i]] = -np.inf
                ok = np.isfinite(s)
                if not ok.any():
                    self.fallbacks_["none"] += 1
                    continue
                k = min(self.k, int(ok.sum()))
                best = np.argsort(-s, kind="stable")[:k]
                out[i] = self.probs_[cand[best]].mean(0) - queries.base.probs[i]
        return out


@EXPLAINERS.register("st_match")
class STMatch(Matching):
    name = "st_match"
    space = "st"
    embedding_space = "st"


@EXPLAINERS.register("pt_match")
class PTMatch(Matching):
    name = "pt_match"
    space = "pt"
    embedding_space = "pt"


@EXPLAINERS.register("ft_match")
class FTMatch(Matching):
    name = "ft_match"
    space = "ft"
    embedding_space = "ft"


@EXPLAINERS.register("convecs")
class ConVecs(Matching):
    """Matching over the concatenated concept-classifier distributions (cosine)."""

    name = "convecs"
    needs_concept_probs = True

    def vectors(self, obs: Observed) -> np.ndarray:
        assert obs.concept_probs is not None
        v = np.asarray(obs.concept_probs, dtype=np.float64)
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


__all__ = ["ConVecs", "FTMatch", "Matching", "PTMatch", "STMatch"]
