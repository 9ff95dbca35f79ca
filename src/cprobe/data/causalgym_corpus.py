"""Training sentences from CausalGym templates, so the project's tiny LM can do the agreement tasks.

A model config may carry ``tiny.causalgym_corpus: {tasks: [...], n_per_task: N, seed: S}``; YAML
cannot generate sentences, so :func:`template_corpus` (a registered corpus source) adds them to the corpus
(each a filled template followed by its correct label, i.e. the continuation the task scores)
before the model is loaded. Sentences that are base inputs of the paper's default eval split are
never emitted, so the eval items stay unseen. The control labels (" dog"/" give") are put in the
vocabulary with one extra sentence, otherwise a word-level tokenizer would map both to <unk> and
the control task would be vacuous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cprobe.data.causalgym import CONTROL_LABELS, load_templates, make_pair_splits, sample_pairs
from cprobe.errors import ConfigError

DEFAULT_TEMPLATES = "causalgym/templates/syntaxgym.json"


def template_sentences(templates_path: str | Path, tasks: Sequence[str], n_per_task: int, seed: int = 12345,
                       template_index: int = 0) -> list[str]:
    """``2·n_per_task`` sentences per task (both sides of each pair), eval bases excluded."""
    all_tasks = load_templates(templates_path, template_index)
    unknown = [t for t in tasks if t not in all_tasks]
    if unknown:
        raise ConfigError(f"tiny.causalgym_corpus.tasks has unknown task(s) {unknown}; choose from {sorted(all_tasks)}")
    out: list[str] = []
    for i, name in enumerate(tasks):
        tmpl = all_tasks[name]
        held = {p.base_text for p in make_pair_splits(tmpl).eval}
        for p in sample_pairs(tmpl, n_per_task, seed + i, discard=held):
            if p.base_text not in held:
                out.append(" ".join((p.base_text + p.base_label).split()))
    out.append(" ".join(label.strip() for label in CONTROL_LABELS))
    return out


def template_corpus(spec: Mapping[str, Any], data_root: Path) -> list[str]:
    """The sentences of a ``tiny.causalgym_corpus`` node (the corpus source ``causalgym_corpus`` of
    :data:`cprobe.data.registry.CORPORA`): ``tasks``, ``n_per_task``, ``seed``, ``templates`` (under ``data_root``)."""
    tasks = spec.get("tasks")
    if not tasks:
        raise ConfigError("model.tiny.causalgym_corpus.tasks must list CausalGym task names")
    path = Path(spec.get("templates", DEFAULT_TEMPLATES))
    path = path if path.is_absolute() else Path(data_root) / path
    return template_sentences(path, list(tasks), int(spec.get("n_per_task", 2000)), int(spec.get("seed", 12345)))
