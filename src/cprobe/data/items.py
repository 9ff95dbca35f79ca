"""General items for studies beyond agreement: a text with named concepts and an outcome, and
counterfactual pairs of such texts.

The agreement studies use :class:`cprobe.data.base.Example` (words + verb slot + correct/wrong forms).
Everything else is a :class:`TextItem`:

- a CEBaB review: ``text``, ``concepts`` = aspect labels, ``outcome`` = the review-majority rating;
- a LIBERTy text generated from a structural causal model: ``concepts`` = the SCM's concept values,
  ``outcome`` = the label variable, ``meta`` = the exogenous noise that produced it;
- a CausalGym sentence: ``regions`` (template spans, joined = ``text``), ``concepts`` = {"type": ...},
  ``outcome`` = the next-token label;
- a cloze query (LAMA-style): ``text`` holds the prompt with the subject filled and the object slot marked
  by :data:`OBJECT_SLOT`, ``slots`` = {"subject": mention, "object": gold}, ``outcome`` = the gold object.

A :class:`CounterfactualPair` is (base, source) with the concepts that differ between them (the
intervention ``do(C = c')`` applied to the base's unit): a CEBaB edit pair, a LIBERTy structural
counterfactual, a CausalGym base/source pair.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cprobe.errors import DataError

OBJECT_SLOT = "[Y]"
"""Marks the object position in a cloze item's text (LAMA's convention)."""


@dataclass(frozen=True)
class TextItem:
    """One model input with named categorical concepts and an outcome label."""

    id: str
    text: str
    concepts: Mapping[str, str] = field(default_factory=dict)
    outcome: str | None = None
    slots: Mapping[str, str] = field(default_factory=dict)
    regions: tuple[str, ...] = ()
    region_names: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.regions:
            if "".join(self.regions) != self.text:
                raise DataError(f"item {self.id}: its regions do not join to its text")
            if self.region_names and len(self.region_names) != len(self.regions):
                raise DataError(f"item {self.id}: {len(self.regions)} regions but {len(self.region_names)} names")

    def key(self) -> list[Any]:
        """A JSON-able identity of the item's content (fingerprints use it)."""
        return [self.id, self.text, sorted(self.concepts.items()), self.outcome, sorted(self.slots.items()),
                list(self.regions), list(self.region_names)]


@dataclass(frozen=True)
class CounterfactualPair:
    """A base input and a source (counterfactual / edited) input that differs in ``intervened`` concepts."""

    id: str
    base: TextItem
    source: TextItem
    intervened: tuple[str, ...]

    def __post_init__(self) -> None:
        missing = [c for c in self.intervened if c not in self.base.concepts or c not in self.source.concepts]
        if missing:
            raise DataError(f"pair {self.id}: intervened concept(s) {missing} missing from base or source")

    @property
    def changes(self) -> dict[str, tuple[str, str]]:
        """``{concept: (c, c')}``: the base's value and the source's value of each intervened concept."""
        return {c: (self.base.concepts[c], self.source.concepts[c]) for c in self.intervened}

    def swap(self) -> CounterfactualPair:
        """The reverse pair: ``c' -> c``."""
        return CounterfactualPair(f"{self.id}~swap", self.source, self.base, self.intervened)


def fingerprint(items: Iterable[TextItem | CounterfactualPair]) -> str:
    """Content hash of an ordered sequence of items or pairs (cache keys use it)."""
    h = hashlib.sha256()
    for it in items:
        key = ([it.id, it.base.key(), it.source.key(), list(it.intervened)] if isinstance(it, CounterfactualPair)
               else it.key())
        h.update(json.dumps(key, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]
