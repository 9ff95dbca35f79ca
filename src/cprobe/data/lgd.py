"""Linzen, Dupoux & Goldberg (2016) agreement sentences (the 7,489-sentence Gulordava subset)."""

from __future__ import annotations

import logging
from pathlib import Path

from cprobe.data.base import NONE, Dataset, Example
from cprobe.data.io import read_rows, require_file
from cprobe.errors import DataError

log = logging.getLogger(__name__)

_IRREGULAR_SG = {("is", "are"), ("was", "were"), ("has", "have"), ("does", "do")}


def verb_number(correct: str, wrong: str) -> str | None:
    """Subject number implied by a (correct, wrong) verb pair: 'sg' if correct is the 3sg form."""
    for sg, pl in ((correct, wrong), (wrong, correct)):
        if (sg, pl) in _IRREGULAR_SG or sg in (pl + "s", pl + "es") or (pl.endswith("y") and sg == pl[:-1] + "ies"):
            return "sg" if sg == correct else "pl"
    return None


def load_lgd(path: Path, name: str = "lgd") -> Dataset:
    """Read ``lgd_subset.tsv``; props: z_c (from the verb pair), z_e = none (unknown), n_attractors."""
    require_file(path, name)
    examples, unknown = [], 0
    for line, row in read_rows(path, "tsv", quoting="none"):
        try:
            words = tuple(row["sentence"].split())
            target = int(row["verb_index"])
            correct, wrong = row["correct_verb"].lower(), row["wrong_verb"].lower()
            n_attr = int(row["n_attractors"])
        except (KeyError, ValueError) as e:
            raise DataError(f"{path}:{line}: bad or missing column ({e})") from None
        if not 0 <= target < len(words) or words[target].lower() != correct:
            raise DataError(f"{path}:{line}: verb_index {target} does not point at {correct!r}")
        number = verb_number(correct, wrong)
        if number is None:
            unknown += 1
            continue
        examples.append(Example(f"lgd-{row['id']}", words, target, correct, wrong,
                                {"z_c": number, "z_e": NONE, "n_attractors": str(n_attr)}))
    if unknown:
        log.info("lgd: dropped %d rows whose verb pair does not reveal the subject number", unknown)
    return Dataset(name, tuple(examples), ("z_c", "z_e", "n_attractors"), source=str(path))
