"""Marvin & Linzen (2018) agreement minimal pairs; condition names give exact subject/attractor numbers.

Z_e is the number of the closest noun before the verb when that noun is not the subject; per task
that is the second noun of the condition (prepositional/relative attractors) or nothing (the closest
noun is the subject itself). Tasks whose intervening noun's number is not in the condition
(long_vp_coord) and non-agreement tasks (reflexives, NPIs) are not offered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cprobe.data.base import NONE, Dataset, Example
from cprobe.data.io import read_rows, require_file
from cprobe.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# task -> does the second noun of the condition sit closest before the verb (True) or not (False)
ZE_FROM_SECOND = {
    "simple_agrmt": False,
    "sent_comp": False,
    "vp_coord": False,
    "prep_anim": True,
    "prep_inanim": True,
    "subj_rel": True,
    "obj_rel_across_anim": True,
    "obj_rel_across_inanim": True,
    "obj_rel_no_comp_across_anim": True,
    "obj_rel_no_comp_across_inanim": True,
    "obj_rel_within_anim": False,
    "obj_rel_within_inanim": False,
    "obj_rel_no_comp_within_anim": False,
    "obj_rel_no_comp_within_inanim": False,
}
TASKS = tuple(ZE_FROM_SECOND)
_NUM = {"sing": "sg", "plur": "pl"}


def parse_condition(condition: str) -> list[str]:
    """Noun numbers in order of the condition name: 'sing_MS_MV_plur_ES' -> ['sg', 'pl']."""
    return [_NUM[t] for t in condition.split("_") if t in _NUM]


def load_marvin_linzen(root: Path, tasks: Sequence[str] = TASKS, name: str = "marvin_linzen") -> Dataset:
    bad = [t for t in tasks if t not in ZE_FROM_SECOND]
    if bad:
        raise ConfigError(f"unknown Marvin & Linzen agreement task(s) {bad}; choose from {list(TASKS)}")
    examples = []
    for task in tasks:
        path = require_file(root / "by_task" / f"{task}.jsonl", name)
        for line, row in read_rows(path, "jsonl"):
            try:
                good, bad_s, cond = row["grammatical"].split(), row["ungrammatical"].split(), row["condition"]
            except (KeyError, AttributeError):
                raise DataError(f"{path}:{line}: needs 'grammatical', 'ungrammatical' and 'condition'") from None
            diff = [i for i, (a, b) in enumerate(zip(good, bad_s)) if a != b]
            nums = parse_condition(cond)
            if len(good) != len(bad_s) or len(diff) != 1 or not nums:
                raise DataError(f"{path}:{line}: not a one-word minimal pair with a numbered condition")
            t = diff[0]
            z_e = nums[1] if ZE_FROM_SECOND[task] and len(nums) > 1 else NONE
            examples.append(Example(
                f"ml-{task}-{line}", tuple(good), t, good[t], bad_s[t],
                {"z_c": nums[0], "z_e": z_e, "n_attractors": str(int(z_e != NONE)), "task": task},
            ))
    return Dataset(name, tuple(examples), ("z_c", "z_e", "n_attractors", "task"), source=str(root))
