"""The one dataset type every task reads: words, a target slot, candidates, named properties.

A sentence is stored as whitespace words plus the index of the *target word* (the verb slot).
Masked LMs see the sentence with that word replaced by their mask token and are read/scored
at the mask; causal LMs see only the prefix ``words[:target]`` and are read/scored at its last
token (predicting the next word). Properties are categorical strings; ``"none"`` means
"not applicable" (e.g. Z_e when no attractor precedes the verb).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cprobe.errors import DataError

NONE = "none"


@dataclass(frozen=True)
class Example:
    """One agreement item."""

    id: str
    words: tuple[str, ...]
    target: int
    correct: str
    wrong: str
    props: Mapping[str, str] = field(default_factory=dict)

    @property
    def prefix(self) -> tuple[str, ...]:
        return self.words[: self.target]

    def sentence(self, fill: str | None = None) -> str:
        """The sentence with the target slot filled (by the correct verb unless ``fill``)."""
        w = list(self.words)
        w[self.target] = self.correct if fill is None else fill
        return " ".join(w)


@dataclass(frozen=True)
class Dataset:
    """An ordered, immutable collection of examples with named categorical properties."""

    name: str
    examples: tuple[Example, ...]
    properties: tuple[str, ...]
    source: str = ""  # where the examples came from (a file under the data dir, or "built-in")
    notes: tuple[str, ...] = ()  # what loading changed (e.g. duplicates dropped), for the log and the tables

    def __post_init__(self) -> None:
        if not self.examples:
            raise DataError(f"dataset {self.name!r} is empty after filtering; check its path and filters")

    def __len__(self) -> int:
        return len(self.examples)

    def values(self, prop: str) -> list[str]:
        """Sorted distinct values of ``prop``, excluding ``"none"``."""
        self._check(prop)
        return sorted({e.props.get(prop, NONE) for e in self.examples} - {NONE})

    def labels(self, prop: str, values: Sequence[str] | None = None) -> np.ndarray:
        """Integer labels for ``prop`` (index into ``values``); -1 where the value is "none"."""
        values = list(values) if values is not None else self.values(prop)
        index = {v: i for i, v in enumerate(values)}
        return np.array([index.get(e.props.get(prop, NONE), -1) for e in self.examples], dtype=np.int64)

    def subset(self, idx: Iterable[int], name: str | None = None) -> Dataset:
        return Dataset(name or self.name, tuple(self.examples[i] for i in idx), self.properties, self.source,
                       self.notes)

    def with_notes(self, *notes: str) -> Dataset:
        return Dataset(self.name, self.examples, self.properties, self.source, (*self.notes, *notes))

    def fingerprint(self) -> str:
        """Content hash of the exact ordered examples (the activation-cache key uses it)."""
        h = hashlib.sha256()
        for e in self.examples:
            h.update(json.dumps([e.id, e.words, e.target, e.correct, e.wrong, sorted(e.props.items())]).encode())
            h.update(b"\n")
        return h.hexdigest()[:16]

    def _check(self, prop: str) -> None:
        if prop not in self.properties:
            raise DataError(f"dataset {self.name!r} has no property {prop!r}; it has {list(self.properties)}")


class DatasetSource:
    """A dataset class of your own, usable by ``dataset=`` (``dataset=custom dataset.type=NAME_OR_PATH``): its
    constructor's keyword arguments are the config keys (checked like a built-in dataset's), ``load`` returns the
    items with their named properties. Declare the properties the items carry as ``properties`` (a tuple, or a method
    of the instance returning one), so a study naming another property is refused before any data is read; leave it
    None when only the data can tell. Items are checked like every dataset's (unique ids, correct != wrong,
    duplicates) and subsampled by ``dataset.max_examples``."""

    properties: tuple[str, ...] | None = None

    def load(self, root: Path, name: str) -> Dataset:  # pragma: no cover - the interface
        """The items; ``root`` is the data dir (resolve relative paths against it), ``name`` the config's name."""
        raise NotImplementedError
