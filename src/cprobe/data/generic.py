"""A user's own agreement file, defined purely in config (path + column mapping); see conf/dataset/generic.yaml.

Three layouts:

- **one row per item**: a sentence column plus the correct and wrong verb forms; the verb slot is the word
  at a ``target`` column's 0-based index, or the word equal to ``mask_marker``;
- **paired rows** (``pair_by`` + ``label``): a grammatical and an ungrammatical sentence in two rows sharing
  the ``pair_by`` value (one column, or a list of columns that together key a pair), the ``label`` column telling
  which is which (``label_values``); the verb slot is the one word where they differ (or the ``target`` column),
  and its two forms are the correct and wrong verbs;
- **paired verb forms** (``pair_by`` + ``label`` + ``columns.verb``): the two rows share one sentence and differ
  only in a verb-form column, the slot given by an index column (``columns.target``): Gulordava et al. (2018)'s
  ``generated.tab`` — ``pair_by=[pattern,constr_id,sent_id]``, ``label=class``, ``columns.verb=form``,
  ``columns.target=len_prefix``, ``columns.sentence=sent``. A sentence that stops before the slot (a prefix) gets
  the verb appended.

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
    pair_by: str | list[str] | None = None
    label: str | None = None
    label_values: Mapping[str, Any] = field(default_factory=lambda: {"correct": "1", "wrong": "0"})


COLUMN_ROLES = ("sentence", "correct", "wrong", "target", "id", "verb")


def load_generic(path: Path, cfg: GenericConfig, name: str = "generic") -> Dataset:
    unknown = sorted(set(cfg.columns) - set(COLUMN_ROLES))
    if unknown:
        raise ConfigError(f"dataset {name!r}: unknown dataset.columns role(s) {unknown}; roles: {list(COLUMN_ROLES)}")
    if "sentence" not in cfg.columns:
        raise ConfigError(f"dataset {name!r}: dataset.columns.sentence must name the sentence column of {path.name}")
    paired = cfg.pair_by is not None or cfg.label is not None
    if paired and (cfg.pair_by is None or cfg.label is None):
        raise ConfigError(f"dataset {name!r}: the paired-rows layout needs both dataset.pair_by and dataset.label")
    keys = pair_keys(cfg, name)
    if "verb" in cfg.columns and not paired:
        raise ConfigError(f"dataset {name!r}: dataset.columns.verb is the paired verb-forms layout's: set "
                          "dataset.pair_by and dataset.label too")
    if "verb" in cfg.columns and "target" not in cfg.columns:
        raise ConfigError(f"dataset {name!r}: the paired verb-forms layout (dataset.columns.verb) needs the slot's "
                          "index column: dataset.columns.target")
    if paired and set(cfg.label_values) != {"correct", "wrong"}:
        raise ConfigError(f"dataset {name!r}: dataset.label_values must map 'correct' and 'wrong' to label values")
    if not paired:
        missing = [k for k in ("correct", "wrong") if k not in cfg.columns]
        if missing:
            raise ConfigError(f"dataset {name!r}: dataset.columns must map {missing} to column names of {path.name} "
                              "(or use the paired-rows layout: dataset.pair_by and dataset.label)")
    require_file(path, name)
    need = [cfg.columns[k] for k in COLUMN_ROLES if k in cfg.columns and (not paired or k in ("sentence", "target",
                                                                                              "verb"))]
    need += list(cfg.properties.values()) + ([*keys, cfg.label] if paired else [])
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


def pair_keys(cfg: GenericConfig, name: str) -> list[str]:
    """The columns that key a pair (``pair_by``: one column or a list of them)."""
    if cfg.pair_by is None:
        return []
    keys = [cfg.pair_by] if isinstance(cfg.pair_by, str) else list(cfg.pair_by)
    if not keys or any(not isinstance(k, str) or not k for k in keys) or len(set(keys)) != len(keys):
        raise ConfigError(f"dataset {name!r}: dataset.pair_by must be a column name or a list of distinct column "
                          f"names, got {cfg.pair_by!r}")
    return keys


def _target(path: Path, line: int, row: Mapping[str, str], words: list[str], cfg: GenericConfig,
            slot_after: bool = False) -> int | None:
    """The target column's 0-based word index (``slot_after``: the index just past the words is a slot too, for a
    prefix the verb is appended to)."""
    if "target" not in cfg.columns:
        return None
    raw = row[cfg.columns["target"]]
    try:
        target = int(raw)
    except (TypeError, ValueError):
        try:  # "11.0", as spreadsheets write integers
            f = float(raw)
            if not f.is_integer():
                raise ValueError
            target = int(f)
        except (TypeError, ValueError):
            raise DataError(f"{path}:{line}: target index {raw!r} is not an integer (0-based word index)") from None
    if slot_after and target == len(words):
        return target
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
    keys = pair_keys(cfg, name)
    shown = keys[0] if len(keys) == 1 else "(" + ",".join(keys) + ")"
    groups: dict[tuple[str, ...], dict[str, tuple[int, Mapping[str, str], list[str]]]] = {}
    inverse = {_label(v): k for k, v in cfg.label_values.items()}
    for line, row, words in rows:
        key, label = tuple(str(row[k]).strip() for k in keys), _label(row[cfg.label])
        role = inverse.get(label)
        if role is None:
            raise DataError(f"{path}:{line}: label {label!r} is neither of dataset.label_values "
                            f"{dict(cfg.label_values)}")
        group = groups.setdefault(key, {})
        if role in group:
            raise DataError(f"{path}:{line}: a second {role!r} row for {shown}={_key_text(key)!r} "
                            f"(first at line {group[role][0]})")
        group[role] = (line, row, words)
    examples = []
    verbs = "verb" in cfg.columns
    for key, group in groups.items():
        if set(group) != {"correct", "wrong"}:
            (line, _, _), = group.values()
            raise DataError(f"{path}:{line}: {shown}={_key_text(key)!r} has no "
                            f"{'wrong' if 'correct' in group else 'correct'} row to pair with")
        (gl, grow, good), (bl, brow, bad) = group["correct"], group["wrong"]
        ex_id = f"{name}-{_key_text(key)}"
        if verbs:
            examples.append(_verb_pair(path, (gl, grow, good), (bl, brow, bad), cfg, shown, key, ex_id))
            continue
        target = _target(path, gl, grow, good, cfg)
        if target is None:
            diff = [i for i, (a, b) in enumerate(zip(good, bad)) if a != b]
            if len(good) != len(bad) or len(diff) != 1:
                raise DataError(f"{path}:{gl}: the sentences of {shown}={_key_text(key)!r} must differ in exactly "
                                "one word (or set a target column)")
            target = diff[0]
        if target >= len(bad) or good[target] == bad[target]:
            raise DataError(f"{path}:{gl}: the correct and wrong forms of {shown}={_key_text(key)!r} are identical")
        examples.append(Example(ex_id, tuple(good), target, good[target], bad[target], _props(grow, cfg)))
    return examples


def _key_text(key: tuple[str, ...]) -> str:
    return key[0] if len(key) == 1 else "/".join(key)


def _verb_pair(path: Path, good_row: tuple, bad_row: tuple, cfg: GenericConfig, shown: str, key: tuple[str, ...],
               ex_id: str) -> Example:
    """The paired verb-forms layout: two rows with one sentence, the forms in ``columns.verb``, the slot in
    ``columns.target`` (a sentence that ends at the slot — a prefix — gets the verb appended)."""
    (gl, grow, good), (bl, brow, bad) = good_row, bad_row
    if good != bad:
        raise DataError(f"{path}:{bl}: the rows of {shown}={_key_text(key)!r} must share one sentence (line {gl} "
                        "differs); the verb-forms layout reads the forms from dataset.columns.verb")
    target = _target(path, gl, grow, good, cfg, slot_after=True)
    if _target(path, bl, brow, bad, cfg, slot_after=True) != target:
        raise DataError(f"{path}:{bl}: the rows of {shown}={_key_text(key)!r} give different slots "
                        f"({cfg.columns['target']})")
    correct, wrong = (str(r[cfg.columns["verb"]]).strip() for r in (grow, brow))
    if not correct or not wrong:
        raise DataError(f"{path}:{gl}: empty verb form in {cfg.columns['verb']!r}")
    if correct == wrong:
        raise DataError(f"{path}:{gl}: the correct and wrong forms of {shown}={_key_text(key)!r} are identical "
                        f"({correct!r})")
    words = list(good)
    if target == len(words):
        words.append(correct)
    else:
        words[target] = correct
    return Example(ex_id, tuple(words), target, correct, wrong, _props(grow, cfg))
