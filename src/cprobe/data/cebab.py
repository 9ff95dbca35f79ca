"""CEBaB (Abraham et al. 2022): restaurant reviews with human-written aspect edits (``dataset=cebab``).

The files are CEBaB v1.1's JSON lists (``train_exclusive|train_inclusive|train_observational``, ``dev``,
``test``) under the data dir. Every record becomes a :class:`~cprobe.data.items.TextItem`:

- ``text`` = ``description``; ``outcome`` = ``review_majority`` ("1".."5" or "no majority");
- ``concepts`` = the four aspects' majority labels, normalised to ``Negative|Positive|unknown`` — ``""`` (the
  aspect was not annotated: an original is validated only for the aspects its edits touch) and ``"no majority"``
  are kept as themselves so callers can drop them where the paper does;
- ``meta`` = ``original_id``, ``is_original``, ``edit_type``, ``edit_goal``.

**Labels** (:func:`encode_rating`): 5-way one class per star, 3-way 1–2★ / 3★ / 4–5★, 2-way 1–2★ / 4–5★ with
3★ dropped; "no majority" is dropped everywhere (the paper drops it from train; dev and test hold none).

**Edit pairs** (:func:`edit_pairs`, the public code's ``get_intervention_pairs``): within each original's group,
original → edit, edit → original, and edit → edit for two edits of the same ``edit_type``; the intervened aspect
is the edit type, ``c``/``c′`` are the two texts' validated majority labels for it, and a pair is kept only when
both are one of Negative/Positive/unknown and differ. Both directions are kept (the public code's rule; the
paper's Table 3c counts do not follow from it on v1.1 — docs/cebab.md).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cprobe.data.items import CounterfactualPair, TextItem
from cprobe.errors import ConfigError, DataError

ASPECTS: tuple[str, ...] = ("food", "service", "ambiance", "noise")
VALUES: tuple[str, ...] = ("Negative", "Positive", "unknown")
"""Aspect values in class-index order (the paper's and the public code's 3-way concept labels)."""
TRAIN_VARIANTS = ("exclusive", "inclusive", "observational")
TASKS: dict[str, int] = {"2way": 2, "3way": 3, "5way": 5}
VALUE_CHANGES: tuple[tuple[str, str], ...] = (("Negative", "Positive"), ("Negative", "unknown"),
                                              ("Positive", "unknown"))
"""The three unordered directions of the paper's tables (the reverse of each is its negative)."""
_REQUIRED = ("id", "original_id", "is_original", "description", "review_majority")


@dataclass(frozen=True)
class CebabKeys:
    """The ``dataset`` node of ``dataset=cebab``."""

    path: str = "cebab"  # directory under the data dir holding the v1.1 JSON files
    train: Literal["exclusive", "inclusive", "observational"] = "exclusive"


@dataclass(frozen=True)
class CebabData:
    """The three splits as TextItems (train = the chosen train variant)."""

    name: str
    source: str
    splits: dict[str, tuple[TextItem, ...]]
    notes: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return sum(len(v) for v in self.splits.values())

    def subsample(self, n: int, seed: int = 0) -> CebabData:
        """The training split cut to ``n`` texts (seeded; ``dataset.max_examples``); dev and test stay whole."""
        import numpy as np

        train = self.splits["train"]
        if len(train) <= n:
            return self
        keep = sorted(np.random.default_rng(seed).choice(len(train), n, replace=False).tolist())
        return CebabData(self.name, self.source, {**self.splits, "train": tuple(train[i] for i in keep)},
                         (*self.notes, f"training split subsampled to {n} of {len(train)} texts"))


def short_value(value: str) -> str:
    return {"Negative": "Neg", "Positive": "Pos", "unknown": "Unk"}.get(value, value)


def direction_name(c: str, c_prime: str) -> str:
    """``Neg→Pos`` style names of a change ``c → c′``."""
    return f"{short_value(c)}→{short_value(c_prime)}"


def encode_rating(rating: str | None, task: str) -> int | None:
    """Class index of a review-majority rating under ``task`` (2way/3way/5way), None when dropped."""
    if task not in TASKS:
        raise ConfigError(f"unknown CEBaB task {task!r}; choose from {sorted(TASKS)}")
    if rating is None or rating not in ("1", "2", "3", "4", "5"):
        return None
    star = int(rating)
    if task == "5way":
        return star - 1
    if task == "3way":
        return 0 if star <= 2 else 1 if star == 3 else 2
    return None if star == 3 else int(star >= 4)


RATINGS = ("1", "2", "3", "4", "5", "no majority")
ASPECT_LABELS = (*VALUES, "no majority", "")
"""What an aspect majority may be: a label, "no majority", or "" / null (the aspect was not annotated)."""


def _item(rec: dict[str, Any], where: str) -> TextItem:
    """One record as a TextItem; a malformed field is a one-line DataError naming it (``where`` names the record)."""
    missing = [k for k in _REQUIRED if k not in rec]
    if missing:
        raise DataError(f"{where}: lacks field(s) {missing}; is this a CEBaB v1.1 file?")
    text = rec["description"]
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where}: description is {text!r}; expected the review's text")
    rating = rec["review_majority"]
    if isinstance(rating, int) and not isinstance(rating, bool) and 1 <= rating <= 5:
        rating = str(rating)
    if rating not in RATINGS:
        raise DataError(f"{where}: review_majority is {rating!r}; expected one of {list(RATINGS)}")
    concepts = {}
    for a in ASPECTS:
        v = rec.get(f"{a}_aspect_majority")
        v = "" if v is None else v
        if v not in ASPECT_LABELS:
            raise DataError(f"{where}: {a}_aspect_majority is {v!r}; expected one of {list(ASPECT_LABELS)} or null")
        concepts[a] = v
    for key in ("id", "original_id"):
        if not isinstance(rec[key], (str, int)) or isinstance(rec[key], bool) or str(rec[key]) == "":
            raise DataError(f"{where}: {key} is {rec[key]!r}; expected an id")
    if not isinstance(rec["is_original"], bool):
        raise DataError(f"{where}: is_original is {rec['is_original']!r}; expected true or false")
    return TextItem(
        id=str(rec["id"]), text=text, concepts=concepts, outcome=rating,
        meta={"original_id": str(rec["original_id"]), "is_original": rec["is_original"],
              "edit_type": rec.get("edit_type"), "edit_goal": rec.get("edit_goal")})


def _line_of(text: str, index: int) -> int | None:
    """The line on which the ``index``-th record of a JSON list starts (None when the file is not a plain list)."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    for i in range(index + 1):
        while text[pos] in " \t\r\n,":
            pos += 1
        if i == index:
            return text.count("\n", 0, pos) + 1
        try:
            _, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
    return None


def read_split(path: Path) -> tuple[TextItem, ...]:
    """One CEBaB JSON list as TextItems; a missing or malformed file, or a malformed record (a null description, a
    NaN rating, an unknown aspect label...), is a one-line DataError naming the file, record and line."""
    if not path.is_file():
        raise DataError(f"CEBaB file {path} not found; put CEBaB v1.1's JSON files (CEBaBing/CEBaB, CEBaB-v1.1.zip) "
                        "under the data dir's cebab/ or set dataset.path (see `cprobe data`)")
    try:
        text = path.read_text(encoding="utf-8")
        records = json.loads(text)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} as JSON ({e})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path}: expected a JSON list of records (CEBaB v1.1 format)")
    items = []
    for i, rec in enumerate(records):
        try:
            items.append(_item(rec, ""))
        except DataError as e:
            line = _line_of(text, i)
            where = f"{path}, record {i}{f' (line {line})' if line else ''}, id {rec.get('id', '?')!r}"
            raise DataError(f"{where}{e}") from None
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        from collections import Counter

        dup = next(i for i, c in Counter(ids).items() if c > 1)
        raise DataError(f"{path}: duplicated record id {dup!r}")
    return tuple(items)


def load_cebab(cfg: CebabKeys, root: Path, name: str = "cebab") -> CebabData:
    """train (the chosen variant), dev and test."""
    if cfg.train not in TRAIN_VARIANTS:
        raise ConfigError(f"unknown CEBaB train variant {cfg.train!r}; choose from {list(TRAIN_VARIANTS)}")
    base = Path(cfg.path).expanduser()
    base = base if base.is_absolute() else Path(root) / base
    splits = {"train": read_split(base / f"train_{cfg.train}.json"), "dev": read_split(base / "dev.json"),
              "test": read_split(base / "test.json")}
    return CebabData(name, str(base), splits)


def labelled(items: Sequence[TextItem], task: str) -> tuple[list[TextItem], list[int]]:
    """The items with a class under ``task`` and their class indices ("no majority", 3★ for 2-way dropped)."""
    keep, y = [], []
    for it in items:
        c = encode_rating(it.outcome, task)
        if c is not None:
            keep.append(it)
            y.append(c)
    return keep, y


def aspect_label(item: TextItem, aspect: str) -> int | None:
    """Class index of an aspect's majority label in :data:`VALUES`, None when unannotated / no majority."""
    v = item.concepts.get(aspect, "")
    return VALUES.index(v) if v in VALUES else None


def edit_pairs(items: Sequence[TextItem]) -> list[CounterfactualPair]:
    """Edit pairs of one split (see the module doc), in a deterministic order."""
    groups: dict[str, list[TextItem]] = defaultdict(list)
    for it in items:
        groups[str(it.meta["original_id"])].append(it)
    pairs: list[CounterfactualPair] = []
    for oid in sorted(groups):
        group = sorted(groups[oid], key=lambda it: it.id)
        originals = [it for it in group if it.meta["is_original"]]
        edits = [it for it in group if not it.meta["is_original"]]
        candidates: list[tuple[TextItem, TextItem, str]] = []
        for o in originals:
            for e in edits:
                aspect = str(e.meta["edit_type"])
                candidates += [(o, e, aspect), (e, o, aspect)]
        for e1 in edits:
            for e2 in edits:
                if e1 is not e2 and e1.meta["edit_type"] == e2.meta["edit_type"]:
                    candidates.append((e1, e2, str(e1.meta["edit_type"])))
        for base, cf, aspect in candidates:
            if aspect not in ASPECTS:
                continue
            c, c2 = base.concepts.get(aspect, ""), cf.concepts.get(aspect, "")
            if c in VALUES and c2 in VALUES and c != c2:
                pairs.append(CounterfactualPair(f"{base.id}>{cf.id}", base, cf, (aspect,)))
    return pairs


def pair_frame(pairs: Sequence[CounterfactualPair]):
    """One row per pair: pair id, aspect, c, c′, canonical direction (``Neg→Pos``...), its sign (+1 when the
    pair runs the canonical way, −1 for the reverse), base / counterfactual ratings."""
    import pandas as pd

    rows = []
    for p in pairs:
        (aspect, (c, c2)), = p.changes.items()
        sign = 1 if (c, c2) in VALUE_CHANGES else -1
        a, b = (c, c2) if sign == 1 else (c2, c)
        rows.append({"pair": p.id, "aspect": aspect, "c": c, "c_prime": c2, "direction": direction_name(a, b),
                     "sign": sign, "base_rating": p.base.outcome, "cf_rating": p.source.outcome,
                     "original_id": p.base.meta["original_id"]})
    return pd.DataFrame(rows, columns=["pair", "aspect", "c", "c_prime", "direction", "sign", "base_rating",
                                       "cf_rating", "original_id"])
