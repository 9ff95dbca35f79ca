"""Concept-effect explainers (CEBaB, Abraham et al. 2022 §4; reused by LIBERTy): one interface, one registry.

An explainer estimates the effect on the explained model's predicted class distribution of setting concept
``C`` of a text from ``c`` to ``c′`` — a vector over the K classes, compared with the true effect of a
human-written (CEBaB) or structural (LIBERTy) counterfactual by :mod:`cprobe.metrics.icace`.

``fit(model, train)`` sees the training split (texts, gold concept labels, the model's predictions, φ(x) and
predicted concept labels where the explainer declares it needs them); ``explain(queries)`` sees only the base
side of each pair and the intervention ``(C, c, c′)`` (the public code's leakage guard). Capabilities, declared as
class attributes, say what a study must compute for an explainer — callers dispatch on them, never on names:

- ``needs_representation``: φ(x) of the training texts and the queries (TCAV, ConceptSHAP, INLP, LEACE);
- ``needs_predicted_concepts``: concept labels predicted by a concept classifier (Approx, S-Learner);
- ``needs_training``: access to the explained model's training regime (CausaLM re-trains φ);
- ``removal_only``: the estimate models only ``c′ = unknown`` (concept removal) and ignores ``c′``;
- ``embedding_space``: the name of an embedding space (``Observed.embeddings``) the explainer matches texts in
  (LIBERTy's ST / PT / FT Match);
- ``needs_concept_probs``: the concept classifier's predicted distributions (``Observed.concept_probs``; ConVecs).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import Tensor, nn

from cprobe.errors import ConfigError, DataError
from cprobe.estimator import Estimator, accept_class
from cprobe.registry import Registry


@dataclass
class Observed:
    """What an explainer may see about a list of texts (all arrays aligned with ``texts``)."""

    texts: Sequence[str]
    probs: np.ndarray  # (n, K) the explained model's predicted distribution N(φ(x))
    concepts: Sequence[dict[str, str]] | None = None  # gold concept labels (training split only)
    reps: Tensor | None = None  # (n, d) φ(x)
    predicted: Sequence[dict[str, str]] | None = None  # concept labels from the concept classifier
    labels: np.ndarray | None = None  # (n,) gold class of the task (training split only)
    groups: Sequence[str] | None = None  # unit ids (CEBaB: original_id): a text never stands in for its own unit
    embeddings: dict[str, Tensor] | None = None  # named embedding spaces (n, d_s) for the matching explainers
    concept_probs: dict[str, np.ndarray] | None = None  # per concept: the concept classifier's distributions (n, m_c)

    def __post_init__(self) -> None:
        n = len(self.texts)
        self.probs = np.asarray(self.probs, dtype=np.float64)
        if self.probs.ndim != 2 or len(self.probs) != n:
            raise DataError(f"probs must be (n={n}, K), got {self.probs.shape}")
        for name in ("concepts", "reps", "predicted", "labels", "groups"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise DataError(f"{name} has {len(v)} rows for {n} texts")
        for what, table in (("embedding space", self.embeddings), ("concept distributions of", self.concept_probs)):
            for key, v in (table or {}).items():
                if len(v) != n:
                    raise DataError(f"{what} {key!r} has {len(v)} rows for {n} texts")

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, idx: Sequence[int]) -> Observed:
        """The rows ``idx``, every field that is set."""
        idx = list(idx)

        def pick(v: Sequence[Any] | None) -> list[Any] | None:
            return None if v is None else [v[i] for i in idx]

        rows = torch.as_tensor(idx, dtype=torch.long)
        return Observed(texts=pick(self.texts), probs=self.probs[idx],
                        reps=None if self.reps is None else self.reps[rows],
                        concepts=pick(self.concepts), predicted=pick(self.predicted),
                        labels=None if self.labels is None else self.labels[idx], groups=pick(self.groups),
                        embeddings=None if self.embeddings is None else {k: v[rows] for k, v in self.embeddings.items()},
                        concept_probs=None if self.concept_probs is None else {k: v[idx] for k, v in
                                                                              self.concept_probs.items()})


@dataclass
class Queries:
    """Pairs to explain: their base side and the intervention ``aspect: c → c′`` per row."""

    base: Observed
    aspect: Sequence[str]
    c: Sequence[str]
    c_prime: Sequence[str]

    def __post_init__(self) -> None:
        n = len(self.base)
        if not len(self.aspect) == len(self.c) == len(self.c_prime) == n:
            raise DataError("queries: aspect, c and c_prime must have one entry per base text")

    def __len__(self) -> int:
        return len(self.base)


@dataclass
class TrainingRegime:
    """What an explainer that re-trains the explained model gets: the classifier (a ``classifier`` ModelAdapter
    over :class:`~cprobe.models.classifier.SequenceClassifier`), its max input length and the job's seed."""

    adapter: Any
    max_length: int = 128
    seed: int = 0


@dataclass
class ExplainedModel:
    """The model being explained, as explainers may access it."""

    head: nn.Module  # φ → logits (K)
    n_classes: int
    concepts: tuple[str, ...]  # concept names
    values: tuple[str, ...]  # concept values in label order (CEBaB: Negative, Positive, unknown)
    null_value: str = "unknown"  # the value meaning "not mentioned"
    regime: TrainingRegime | None = None  # access to the training regime (CausaLM): the classifier itself

    def head_probs(self, reps: Tensor) -> np.ndarray:
        """softmax(N(φ)) of representations (n, d) as float64 (n, K)."""
        p = next(self.head.parameters())
        with torch.inference_mode():
            out = self.head(reps.to(p.device, p.dtype)).float().softmax(-1)
        return out.cpu().double().numpy()


class Explainer(Estimator, ABC):
    """Estimates ICaCE vectors; fit on the training split, then explain queries.

    ``fit`` checks that the study supplied what the explainer's capabilities ask for and records the number of
    classes (``n_classes_``); ``explain`` refuses to run unfitted, checks the queries the same way and that the
    estimate is (n, K) (:class:`cprobe.estimator.Estimator`).
    """

    name: ClassVar[str] = "explainer"
    needs_representation: ClassVar[bool] = False
    needs_predicted_concepts: ClassVar[bool] = False
    needs_training: ClassVar[bool] = False
    removal_only: ClassVar[bool] = False
    embedding_space: ClassVar[str | None] = None
    needs_concept_probs: ClassVar[bool] = False
    min_concepts: ClassVar[int] = 1
    """The fewest concepts a study must explain for this explainer to be defined (ConVecs: 2)."""
    CAPABILITIES = ("needs_representation", "needs_predicted_concepts", "needs_training", "removal_only",
                    "embedding_space", "needs_concept_probs", "min_concepts")
    _needs_fitted = ("explain",)
    _fit_hint = "fit(model, train)"

    def _before(self, method: str, args: tuple, kwargs: dict) -> None:
        if method == "fit":
            model = args[0] if args else kwargs["model"]
            train = args[1] if len(args) > 1 else kwargs["train"]
            check_inputs(self, train, "train")
            self.n_classes_ = model.n_classes
        elif method == "explain":
            queries = args[0] if args else kwargs["queries"]
            check_inputs(self, queries.base, "queries")

    def _after(self, method: str, result: Any, args: tuple, kwargs: dict) -> Any:
        if method != "explain":
            return result
        queries = args[0] if args else kwargs["queries"]
        out = np.asarray(result, dtype=np.float64)
        if out.shape != (len(queries), self.n_classes_):
            raise AssertionError(f"{type(self).__name__} returned {out.shape}, expected "
                                 f"{(len(queries), self.n_classes_)}")
        return out

    @abstractmethod
    def fit(self, model: ExplainedModel, train: Observed) -> Self:
        """Learn whatever the explainer needs from the training split."""

    @abstractmethod
    def explain(self, queries: Queries) -> np.ndarray:
        """(n, K) effect estimates, one row per query."""


def check_inputs(explainer: Explainer, obs: Observed, what: str) -> None:
    if explainer.needs_representation and obs.reps is None:
        raise ConfigError(f"explainer {explainer.name!r} needs the representation φ(x) of the {what}")
    if explainer.needs_predicted_concepts and obs.predicted is None:
        raise ConfigError(f"explainer {explainer.name!r} needs predicted concept labels of the {what}")
    space = explainer.embedding_space
    if space is not None and (obs.embeddings is None or space not in obs.embeddings):
        raise ConfigError(f"explainer {explainer.name!r} needs the {space!r} embeddings of the {what}")
    if explainer.needs_concept_probs and obs.concept_probs is None:
        raise ConfigError(f"explainer {explainer.name!r} needs the concept classifier's distributions of the {what}")


EMBEDDING_SPACES = ("ft", "pt", "st")
"""The embedding spaces the studies compute for ``embedding_space`` (fine-tuned, pre-trained, sentence-transformer)."""


def capability_problems(cls: type) -> list[str]:
    """Contradictions in an explainer class's declared capabilities: flags that are not booleans, an unknown
    embedding space, ``min_concepts`` below 1."""
    flags = [f for f in Explainer.CAPABILITIES if f not in ("embedding_space", "min_concepts")]
    out = [f"{f} must be true or false, got {getattr(cls, f)!r}" for f in flags
           if not isinstance(getattr(cls, f, False), bool)]
    space = getattr(cls, "embedding_space", None)
    if space is not None and space not in EMBEDDING_SPACES:
        out.append(f"embedding_space must be null or one of {list(EMBEDDING_SPACES)}, got {space!r}")
    m = getattr(cls, "min_concepts", 1)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        out.append(f"min_concepts must be an integer >= 1, got {m!r}")
    return out


def accept(obj: Any, ref: str) -> type[Explainer]:
    """``obj`` as an explainer class (an :class:`Explainer` subclass, or a class with ``fit`` and ``explain``,
    adapted), its capabilities checked; a one-line ConfigError otherwise."""
    return accept_class(obj, ref, Explainer, ("fit", "explain"), "explainer", capability_problems)


EXPLAINERS: Registry[type[Explainer]] = Registry("explainer", group="cprobe.explainers", accept=accept)


def check_explainers(names: Sequence[str], settings: dict, where: str) -> None:
    """A study's ``<where>.explainers`` list and ``<where>.explainer.<name>.<key>`` settings: known names, mappings,
    constructor keys that exist — one-line errors before any work."""
    if not names:
        raise ConfigError(f"{where}.explainers is empty; choose from {EXPLAINERS.names()}")
    for name, value in settings.items():  # settings of a registered but unselected explainer: unused
        EXPLAINERS.get(name)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}.explainer.{name} must be a mapping of settings (e.g. {{k: 3}}), got {value!r}")
        for key, v in value.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{where}.explainer.{name}.{key} must be a finite number, got {v}")
    for name in names:
        EXPLAINERS.build({"name": name, **dict(settings.get(name) or {})}, seed=0)


def per_concept(queries: Queries, n_classes: int, concepts: Sequence[str],
                estimate: Callable[[str, np.ndarray], np.ndarray]) -> np.ndarray:
    """(n, K) estimates filled concept by concept: ``estimate(concept, rows)`` for the query rows about it."""
    out = np.zeros((len(queries), n_classes))
    aspects = np.asarray(queries.aspect)
    for concept in concepts:
        rows = np.flatnonzero(aspects == concept)
        if len(rows):
            out[rows] = estimate(concept, rows)
    return out


def rows_of(reps: Tensor, rows: np.ndarray) -> Tensor:
    """The float32 representations of ``rows``."""
    return reps[torch.from_numpy(rows)].float()


def concept_targets(concepts: Sequence[dict[str, str]], concept: str, values: Sequence[str]) -> np.ndarray:
    """Class index of ``concept`` per row in ``values`` (−1 where the label is missing / no majority)."""
    return np.array([values.index(c[concept]) if c.get(concept) in values else -1 for c in concepts], dtype=np.int64)


def probe_accuracy(X_train: Tensor | np.ndarray, z_train: np.ndarray, X_test: Tensor | np.ndarray,
                   z_test: np.ndarray, scale_from: Tensor | np.ndarray | None = None) -> float:
    """Accuracy on (X_test, z_test) of a fresh scikit-learn logistic regression (C = 1, Newton steps) trained on
    (X_train, z_train) — an independent reader of a concept; NaN when the training rows hold fewer than two classes
    or there is no test row. Features are standardised with the statistics of ``scale_from`` (default X_train): an
    erased representation keeps the original states' scale, so the numerical dust of a projection that removed a
    whole subspace is not blown up into a readable signal."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    def dense(X: Tensor | np.ndarray) -> np.ndarray:
        return X.detach().cpu().double().numpy() if isinstance(X, Tensor) else np.asarray(X, dtype=np.float64)

    if len(np.unique(z_train)) < 2 or not len(z_test):
        return float("nan")
    scaler = StandardScaler().fit(dense(X_train if scale_from is None else scale_from))
    probe = LogisticRegression(solver="newton-cholesky", max_iter=100)
    with warnings.catch_warnings():  # separable folds make the Newton line search give up (it falls back to lbfgs)
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe.fit(scaler.transform(dense(X_train)), z_train)
    return float(probe.score(scaler.transform(dense(X_test)), z_test))


def leftover_split(z: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows with a label (z ≥ 0) in three disjoint, per-class stratified parts (seeded): half to fit an eraser on,
    a quarter to train a fresh probe on, a quarter to score it on."""
    z = np.asarray(z)
    rng = np.random.default_rng(seed)
    parts: tuple[list[int], list[int], list[int]] = ([], [], [])
    for c in np.unique(z[z >= 0]):
        r = rng.permutation(np.flatnonzero(z == c))
        a = len(r) // 2
        b = a + (len(r) - a) // 2
        for part, take in zip(parts, (r[:a], r[a:b], r[b:])):
            part.extend(take)
    return tuple(np.sort(np.asarray(p, dtype=np.int64)) for p in parts)  # type: ignore[return-value]


_READ_BEFORE: dict[str, float] = {}
""":func:`leftover`'s accuracy before removal, by the content of its rows and labels: every eraser of one concept in
a job reads the same original states, so their fresh probe of those states is fitted once."""


def _read_before(raw_train: Tensor, z_train: np.ndarray, raw_test: Tensor, z_test: np.ndarray) -> float:
    from cprobe.io import fast_digest

    arrays = [torch.as_tensor(a).detach().cpu().contiguous() for a in (raw_train, z_train, raw_test, z_test)]
    key = "/".join(f"{a.dtype}{tuple(a.shape)}{fast_digest(a)}" for a in arrays)
    if key not in _READ_BEFORE:
        if len(_READ_BEFORE) >= 64:
            _READ_BEFORE.clear()
        _READ_BEFORE[key] = probe_accuracy(raw_train, z_train, raw_test, z_test)
    return _READ_BEFORE[key]


def leftover(reps: Tensor, z: np.ndarray, fit_eraser: Callable[[Tensor, Tensor], Callable[[Tensor], Tensor]] | None,
             seed: int = 0, erased: Tensor | None = None) -> tuple[float, float, float]:
    """How much of a concept a fresh linear probe still reads after a removal, on rows the eraser never saw:
    (accuracy before, accuracy after, majority rate) of a logistic probe trained on one quarter of the labelled rows
    and scored on another (:func:`leftover_split`). ``fit_eraser(X, z)`` is fit on the remaining half and returns the
    transform; an explainer whose eraser cannot be refit cheaply passes the ``erased`` states of every row instead
    (then the eraser saw every row: an in-sample diagnostic).

    Fitting the eraser on the rows the probe is scored on would erase their own class means: held-out accuracy then
    falls *below* chance, an artefact, not evidence of removal.
    """
    z = np.asarray(z)
    fit_rows, train_rows, test_rows = leftover_split(z, seed)
    if erased is None:
        assert fit_eraser is not None
        rows = torch.from_numpy(fit_rows)
        transform = fit_eraser(reps[rows].float(), torch.from_numpy(z[fit_rows]))
        after = transform(reps[torch.from_numpy(np.concatenate([train_rows, test_rows]))].float())
        after_train, after_test = after[: len(train_rows)], after[len(train_rows):]
    else:
        after_train, after_test = erased[torch.from_numpy(train_rows)], erased[torch.from_numpy(test_rows)]
    z_train, z_test = z[train_rows], z[test_rows]
    raw_train = reps[torch.from_numpy(train_rows)]
    before = _read_before(raw_train, z_train, reps[torch.from_numpy(test_rows)], z_test)
    after_acc = probe_accuracy(after_train, z_train, after_test, z_test, scale_from=raw_train)
    majority = float(np.bincount(z_test).max() / len(z_test)) if len(z_test) else float("nan")
    return before, after_acc, majority
