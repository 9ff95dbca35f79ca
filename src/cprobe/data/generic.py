"""A user's own agreement file, defined purely in config (path + column mapping); see conf/dataset/generic.yaml.

Two layouts:

- **one row per item**: a sentence column plus the correct and wrong verb forms; the verb slot is the word
  at a ``target`` column's 0-based index, or the word equal to ``mask_marker``;
- **paired rows** (``pair_by`` + ``label``): a grammatical and an ungrammatical sentence in two rows sharing
  the ``pair_by`` value, the ``label`` column telling which is which (``label_values``); the verb slot is the
  one word where they differ (or the ``target`` column), and its two forms are the correct and wrong verbs.

``strip_tokens`` removes tokens such as ``<eos>`` from every sentence (tokenised corpora with end markers);
empty property cells mean "none" (not applicable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cprobe.data.base import NONE, Dataset, Example
from cprobe.data.io import read_rows, require_file
from cprobe.errors import ConfigError, DataError


@dataclass(frozen=True)
class GenericConfig:
    """The keys of a ``dataset=generic`` config (documented in conf/dataset/generic.yaml)."""

    path: str | None = None
    format: str = "auto"
    quoting: str = "csv"
    mask_marker: str = "***mask***"
    strip_tokens: Sequence[str] = ()
    columns: Mapping[str, str] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)
    pair_by: str | None = None
    label: str | None = None
    label_values: Mapping[str, Any] = field(default_factory=lambda: {"correct": "1", "wrong": "0"})


COLUMN_ROLES = ("sentence", "correct", "wrong", "target", "id")


def load_generic(path: Path, cfg: GenericConfig, name: str = "generic") -> Dataset:
    unknown = sorted(set(cfg.columns) - set(COLUMN_ROLES))
    if unknown:
        raise ConfigError(f"dataset {name!r}: unknown dataset.columns role(s) {unknown}; roles: {list(COLUMN_ROLES)}")
    if "sentence" not in cfg.columns:
        raise ConfigError(f"dataset {name!r}: dataset.columns.sentence must name the sentence column of {path.name}")
    paired = cfg.pair_by is not None or cfg.label is not None
    if paired and (cfg.pair_by is None or cfg.label is None):
        raise ConfigError(f"dataset {name!r}: the paired-rows layout needs both dataset.pair_by and dataset.label")
    if paired and set(cfg.label_values) != {"correct", "wrong"}:
        raise ConfigError(f"dataset {name!r}: dataset.label_values must map 'correct' and 'wrong' to label values")
    if not paired:
        missing = [k for k in ("correct", "wrong") if k not in cfg.columns]
        if missing:
            raise ConfigError(f"dataset {name!r}: dataset.columns must map {missing} to column names of {path.name} "
                              "(or use the paired-rows layout: dataset.pair_by and dataset.label)")
    require_file(path, name)
    need = [cfg.columns[k] for k in COLUMN_ROLES if k in cfg.columns and (not paired or k in ("sentence", "target"))]
    need += list(cfg.properties.values()) + ([cfg.pair_by, cfg.label] if paired else [])
    strip = set(cfg.strip_tokens)
    rows = []
    for line, row in read_rows(path, cfg.format, cfg.quoting):
        absent = [c for c in need if c not in row]
        if absent:
            raise DataError(f"{path}:{line}: missing column(s) {absent}; have {sorted(row)}")
        words = [w for w in str(row[cfg.columns["sentence"]]).split() if w not in strip]
        if not words:
            raise DataError(f"{path}:{line}: empty sentence")
        rows.append((line, row, words))
    examples = _paired(path, rows, cfg, name) if paired else [_single(path, line, row, words, cfg, name)
                                                               for line, row, words in rows]
    return Dataset(name, tuple(examples), tuple(cfg.properties), source=str(path))


def _target(path: Path, line: int, row: Mapping[str, str], words: list[str], cfg: GenericConfig) -> int | None:
    if "target" not in cfg.columns:
        return None
    raw = row[cfg.columns["target"]]
    try:
        target = int(raw)
    except ValueError:
        raise DataError(f"{path}:{line}: target index {raw!r} is not an integer (0-based word index)") from None
    if not 0 <= target < len(words):
        raise DataError(f"{path}:{line}: target index {target} outside the sentence's {len(words)} words "
                        "(0-based, counted after strip_tokens)")
    return target


def _label(value: Any) -> str:
    """Label cells compare as text ("1" == 1, "true" == True)."""
    return str(value).strip().lower()


def _props(row: Mapping[str, str], cfg: GenericConfig) -> dict[str, str]:
    return {p: (str(row[c]).strip() or NONE) for p, c in cfg.properties.items()}


def _single(path: Path, line: int, row: Mapping[str, str], words: list[str], cfg: GenericConfig,
            name: str) -> Example:
    target = _target(path, line, row, words, cfg)
    if target is None:
        if cfg.mask_marker not in words:
            raise DataError(f"{path}:{line}: no {cfg.mask_marker!r} in the sentence and no target column configured")
        target = words.index(cfg.mask_marker)
    correct, wrong = str(row[cfg.columns["correct"]]).strip(), str(row[cfg.columns["wrong"]]).strip()
    if not correct or not wrong:
        raise DataError(f"{path}:{line}: empty verb form")
    if correct == wrong:
        raise DataError(f"{path}:{line}: the correct and wrong forms are identical ({correct!r})")
    words[target] = correct
    ex_id = str(row[cfg.columns["id"]]) if "id" in cfg.columns else f"{name}-{line}"
    return Example(ex_id, tuple(words), target, correct, wrong, _props(row, cfg))


def _paired(path: Path, rows: list, cfg: GenericConfig, name: str) -> list[Example]:
    groups: dict[str, dict[str, tuple[int, Mapping[str, str], list[str]]]] = {}
    order: list[str] = []
    inverse = {_label(v): k for k, v in cfg.label_values.items()}
    for line, row, words in rows:
        key, label = str(row[cfg.pair_by]), _label(row[cfg.label])
        role = inverse.get(label)
        if role is None:
            raise DataError(f"{path}:{line}: label {label!r} is neither of dataset.label_values "
                            f"{dict(cfg.label_values)}")
        group = groups.setdefault(key, {})
        if key not in order:
            order.append(key)
        if role in group:
            raise DataError(f"{path}:{line}: a second {role!r} row for {cfg.pair_by}={key!r} "
                            f"(first at line {group[role][0]})")
        group[role] = (line, row, words)
    examples = []
    for key in order:
        group = groups[key]
        if set(group) != {"correct", "wrong"}:
            (line, _, _), = group.values()
            raise DataError(f"{path}:{line}: {cfg.pair_by}={key!r} has no {'wrong' if 'correct' in group else 'correct'} "
                            "row to pair with")
        (gl, grow, good), (_, _, bad) = group["correct"], group["wrong"]
        target = _target(path, gl, grow, good, cfg)
        if target is None:
            diff = [i for i, (a, b) in enumerate(zip(good, bad)) if a != b]
            if len(good) != len(bad) or len(diff) != 1:
                raise DataError(f"{path}:{gl}: the sentences of {cfg.pair_by}={key!r} must differ in exactly one word "
                                "(or set a target column)")
            target = diff[0]
        if target >= len(bad) or good[target] == bad[target]:
            raise DataError(f"{path}:{gl}: the correct and wrong forms of {cfg.pair_by}={key!r} are identical")
        examples.append(Example(f"{name}-{key}", tuple(good), target, good[target], bad[target], _props(grow, cfg)))
    return examples
