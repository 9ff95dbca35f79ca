"""What exists: config options with one-line descriptions, and where each dataset is expected.

Reads YAML files as text (no Hydra, no torch), so ``cprobe list`` answers instantly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cprobe.errors import CprobeError
from cprobe.paths import config_dir, data_dir

GROUPS = ("experiment", "model", "dataset", "probe", "intervention", "split", "sweep", "scm", "debug", "logger",
          "hparams_search")

DATA_FILES = {
    "lgd_agreement/lgd_subset.tsv": (
        "lgd",
        "Linzen et al. (2016) / Gulordava et al. (2018) subset: facebookresearch/colorlessgreenRNNs "
        "data/linzen_testset/subj_agr_filtered.{text,gold} -> lgd_subset.tsv (see ../shared/data/lgd_agreement/SOURCE.md)",
    ),
    "marvin_linzen/by_task": (
        "marvin_linzen",
        "Marvin & Linzen (2018): BeckyMarvin/LM_syneval data/templates/*.pickle converted to by_task/<task>.jsonl",
    ),
    "cebab/test.json": (
        "cebab",
        "Abraham et al. (2022): CEBaBing/CEBaB CEBaB-v1.1.zip -> cebab/{train_exclusive,train_inclusive,"
        "train_observational,dev,test}.json (CC BY 4.0)",
    ),
    "lama/relations.jsonl": (
        "lama",
        "LAMA T-REx (Petroni et al. 2019): facebookresearch/LAMA data.zip -> lama/relations.jsonl + "
        "lama/TREx/<relation>.jsonl (subject aliases from Wikidata in `sub_mentions`); prompt paraphrases (ParaRel / "
        "c-box/causalEval) -> lama/prompts/<relation>.jsonl, one {\"pattern\": ...} a line (docs/prompt_bias.md)",
    ),
    "ravel/ravel_city_entity_attributes.json": (
        "ravel",
        "RAVEL (Huang et al. 2024): explanare/ravel data/ravel_<entity_type>_entity_attributes.json + "
        "ravel_<entity_type>_attribute_to_prompts.json -> ravel/ (dataset.entity_type picks the pair; docs/ravel.md)",
    ),
    "causalgym/templates/syntaxgym.json": (
        "causalgym", "Arora et al. (2024): aryamanarora/causalgym data/templates/syntaxgym.json",
    ),
    "mib/arc_easy.jsonl": (
        "mib (task arc)",
        "ARC-Easy (Clark et al. 2018), MIB's ARC task: allenai/ai2_arc ARC-Easy rows (question, choices.text, "
        "choices.label, answerKey) as JSONL; mib.files.arc.path=mib/arc_easy.jsonl (MCQA's and IOI's MIB files ship "
        "with cprobe; RAVEL's cities are ravel/ above; docs/mib.md)",
    ),
}


def groups() -> list[str]:
    return [g for g in GROUPS if (config_dir() / g).is_dir()]


def describe(path: Path) -> str:
    """The first sentence of the file's leading comment (Hydra directives skipped), never cut mid-sentence."""
    lines = []
    for line in path.read_text().splitlines():
        s = line.strip()
        if s.startswith("# @package"):
            continue
        if not s.startswith("#"):
            break
        lines.append(s.lstrip("#").strip())
    text = " ".join(x for x in lines if x)
    return first_sentence(text)


_ABBREVIATIONS = ("et al.", "e.g.", "i.e.", "vs.", "cf.", "etc.", "Fig.", "Figs.", "App.", "eq.", "No.")


def first_sentence(text: str) -> str:
    """Text up to the first full stop that ends a sentence (not an abbreviation, not inside parentheses)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            if not any(text[: i + 1].endswith(a) for a in _ABBREVIATIONS):
                return text[: i + 1]
    return text


def describe_group(group: str) -> Iterator[tuple[str, str]]:
    d = config_dir() / group
    if not d.is_dir():
        raise CprobeError(f"unknown config group {group!r}; choose from {groups()}")
    for f in sorted(d.glob("*.yaml")):
        yield f.stem, describe(f)


def dataset_status() -> Iterator[str]:
    root = data_dir()
    yield f"data dir: {root}  (set CPROBE_DATA_DIR to change it)"
    yield "  synthetic_sva        built in (the project's grammar): nothing to download"
    yield "  fact_world           built in (a generated fact world, cprobe.data.fact_world): nothing to download"
    for rel, (name, how) in DATA_FILES.items():
        state = "found" if (root / rel).exists() else "MISSING"
        yield f"  {name:<20} {state:<8} {root / rel}"
        yield f"  {'':<20} get it: {how}"
    yield "  generic              your own TSV/CSV/JSONL: dataset=generic dataset.path=FILE (see conf/dataset/generic.yaml)"
