"""A user's own agreement file, defined purely in config (path + column mapping)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cprobe.data.base import NONE, Dataset, Example
from cprobe.data.io import read_rows, require_file
from cprobe.errors import ConfigError, DataError

REQUIRED = ("sentence", "correct", "wrong")


def load_generic(path: Path, columns: Mapping[str, str], properties: Mapping[str, str], fmt: str = "auto",
                 mask_marker: str = "***mask***", name: str = "generic") -> Dataset:
    """Columns map ``sentence``/``correct``/``wrong`` (and optionally ``target``, a word index, and ``id``)
    to file columns; without ``target`` the sentence must contain ``mask_marker`` at the verb slot.
    ``properties`` maps property names (z_c, z_e, ...) to columns; empty cells mean "none"."""
    missing = [k for k in REQUIRED if k not in columns]
    if missing:
        raise ConfigError(f"dataset {name!r}: dataset.columns must map {missing} to column names of {path.name}")
    require_file(path, name)
    examples = []
    for line, row in read_rows(path, fmt):
        need = [columns[k] for k in (*REQUIRED, *(("target",) if "target" in columns else ()))] + list(
            properties.values())
        absent = [c for c in need if c not in row]
        if absent:
            raise DataError(f"{path}:{line}: missing column(s) {absent}; have {sorted(row)}")
        words = str(row[columns["sentence"]]).split()
        if "target" in columns:
            try:
                target = int(row[columns["target"]])
            except ValueError:
                raise DataError(f"{path}:{line}: target index {row[columns['target']]!r} is not an integer") from None
        elif mask_marker in words:
            target = words.index(mask_marker)
        else:
            raise DataError(f"{path}:{line}: no {mask_marker!r} in the sentence and no target column configured")
        correct, wrong = str(row[columns["correct"]]).strip(), str(row[columns["wrong"]]).strip()
        if not 0 <= target < len(words) or not correct or not wrong:
            raise DataError(f"{path}:{line}: target index {target} outside the sentence or empty verb forms")
        words[target] = correct
        props = {p: (str(row[c]).strip() or NONE) for p, c in properties.items()}
        ex_id = str(row[columns["id"]]) if "id" in columns else f"{name}-{line}"
        examples.append(Example(ex_id, tuple(words), target, correct, wrong, props))
    return Dataset(name, tuple(examples), tuple(properties))
