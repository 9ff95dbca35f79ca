"""Factual cloze probing data (Cao et al. 2022 on LAMA / T-REx): relations with prompt paraphrases, facts with
subject mentions, and the cloze queries built from them.

:class:`FactData` is what both fact datasets produce — ``dataset=lama`` reads the public file layout
(:func:`load_lama`), ``dataset=fact_world`` generates a world (:mod:`cprobe.data.fact_world`). A query is a
:class:`~cprobe.data.items.TextItem` whose text is one prompt with one mention of the subject filled in at ``[X]`` and
the object slot :data:`~cprobe.data.items.OBJECT_SLOT` (``[Y]``) kept; the model reads it through the
:class:`~cprobe.models.formatters.ClozeFormatter` (masked at ``[Y]`` for an MLM, cut before it for a causal LM).

The LAMA layout, under ``dataset.path`` (relative paths: the data dir):

- ``relations.jsonl`` (LAMA's file): one relation a line, ``{"relation": "P19", "template": "[X] was born in [Y] .",
  "label": ..., "type": "N-1"}``; the template is the relation's *original* prompt;
- ``TREx/<relation>.jsonl`` (LAMA's T-REx triples): ``{"sub_uri", "sub_label", "obj_label", ...}`` plus the
  subject's aliases in ``sub_mentions`` (causalEval's field) or ``aliases`` when you have them;
- ``prompts/<relation>.jsonl`` (optional; causalEval's ``multiple_prompts``): ``{"pattern": "[X] ... [Y] ."}`` per
  paraphrase. The original template always comes first; without the file a relation has only its original prompt.

Relations of a dropped type (``N-M``: several correct objects, where P@1 is not defined) are removed; the
single-token filter over every probed model's vocabulary (:func:`single_token_filter`) runs when the models are
known.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cprobe.data.items import OBJECT_SLOT, TextItem
from cprobe.errors import ConfigError, DataError
from cprobe.paths import safe_name

SUBJECT_SLOT = "[X]"


@dataclass(frozen=True)
class Relation:
    """A relation and its prompt paraphrases (``prompts[0]`` is the original)."""

    id: str
    label: str
    prompts: tuple[str, ...]
    type: str = "N-1"

    def __post_init__(self) -> None:
        if not self.prompts:
            raise DataError(f"relation {self.id}: no prompt")
        for p in self.prompts:
            check_prompt(p, self.id)


def check_prompt(prompt: str, relation: str) -> None:
    if prompt.count(SUBJECT_SLOT) != 1 or prompt.count(OBJECT_SLOT) != 1:
        raise DataError(f"relation {relation}: prompt {prompt!r} must hold {SUBJECT_SLOT} and {OBJECT_SLOT} once each")


def object_last(prompt: str) -> bool:
    """True when nothing but punctuation follows ``[Y]`` (a causal LM reads the same query as an MLM)."""
    tail = prompt[prompt.index(OBJECT_SLOT) + len(OBJECT_SLOT):]
    return not any(ch.isalnum() for ch in tail)


@dataclass(frozen=True)
class Fact:
    """One (subject, relation, object) triple; ``mentions[0]`` is the subject's default name."""

    relation: str
    subject: str
    mentions: tuple[str, ...]
    object: str

    def __post_init__(self) -> None:
        if not self.mentions or any(not m.strip() for m in self.mentions):
            raise DataError(f"fact {self.relation}/{self.subject}: empty subject mention")
        if not self.object.strip():
            raise DataError(f"fact {self.relation}/{self.subject}: empty object")


@dataclass(frozen=True)
class FactData:
    """Relations (in order) and their facts."""

    name: str
    source: str
    relations: Mapping[str, Relation]
    facts: tuple[Fact, ...]
    notes: tuple[str, ...] = ()
    world: Any = None  # the generating world (dataset=fact_world), else None

    def __len__(self) -> int:
        return len(self.facts)

    def of(self, relation: str) -> list[Fact]:
        return [f for f in self.facts if f.relation == relation]

    def keep(self, predicate: Callable[[Fact], bool], note: str | None = None) -> FactData:
        """The facts passing ``predicate``; relations left without a fact are dropped (and named in a note)."""
        facts = tuple(f for f in self.facts if predicate(f))
        alive = {f.relation for f in facts}
        gone = [r for r in self.relations if r not in alive]
        notes = list(self.notes)
        if note and len(facts) < len(self.facts):
            notes.append(note.format(dropped=len(self.facts) - len(facts), total=len(self.facts)))
        if gone:
            notes.append(f"relations without a fact left, dropped: {gone}")
        return replace(self, relations={r: v for r, v in self.relations.items() if r in alive}, facts=facts,
                       notes=tuple(notes))

    def subsample(self, n: int, seed: int = 0) -> FactData:
        """At most ``n`` facts per relation (seeded; order kept) — ``dataset.max_examples``."""
        rng = np.random.default_rng(seed)
        keep: set[int] = set()
        for r in self.relations:
            idx = [i for i, f in enumerate(self.facts) if f.relation == r]
            keep.update(idx if len(idx) <= n else rng.choice(idx, n, replace=False).tolist())
        if len(keep) == len(self.facts):
            return self
        note = f"{len(keep)} of {len(self.facts)} facts kept: at most {n} per relation (dataset.max_examples)"
        return replace(self, facts=tuple(f for i, f in enumerate(self.facts) if i in keep), notes=(*self.notes, note))


def queries(data: FactData, prompts: str = "all", mentions: str = "all") -> list[TextItem]:
    """Every cloze query: relation × prompt × fact × mention (``prompts="original"`` / ``mentions="default"`` keep
    index 0 only). ``meta`` holds the indices the analyses group by."""
    out = []
    for r, rel in data.relations.items():
        facts = data.of(r)
        for p, prompt in enumerate(rel.prompts[:1] if prompts == "original" else rel.prompts):
            for f in facts:
                for m, mention in enumerate(f.mentions[:1] if mentions == "default" else f.mentions):
                    out.append(TextItem(
                        id=f"{r}|{p}|{f.subject}|{m}", text=prompt.replace(SUBJECT_SLOT, mention),
                        slots={"subject": mention, "object": f.object}, outcome=f.object,
                        meta={"relation": r, "prompt": p, "subject": f.subject, "mention": m}))
    return out


# ------------------------------------------------------------------------------------------- the LAMA layout
@dataclass(frozen=True)
class LamaKeys:
    """``dataset=lama`` keys."""

    path: str = "lama"
    relations_file: str = "relations.jsonl"
    triples_dir: str = "TREx"
    prompts_dir: str = "prompts"
    relations: list[str] | None = None  # keep only these relation ids (null: every relation with triples)
    drop_types: list[str] = field(default_factory=lambda: ["N-M"])
    max_mentions: int = 5  # the default name + at most 4 aliases (the paper: at most 5 verbalizations)
    min_prompts: int = 1  # drop relations with fewer prompts


def lama_root(keys: LamaKeys, root: Path) -> Path:
    path = Path(keys.path).expanduser()
    return path if path.is_absolute() or path.exists() else Path(root) / path


_LINE = "\x00line"  # each row's line number, under a key no JSON file of this layout uses


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (blank lines skipped), each with its line number under ``_LINE``."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DataError(f"{path}:{n}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{n}: each line must be a JSON object")
            rows.append({**row, _LINE: n})
    return rows


def read_relations(keys: LamaKeys, root: Path) -> list[dict[str, Any]]:
    """The relation records (checked: a directory, a relations file, ids, templates) — cheap, for validation."""
    if keys.max_mentions < 1:
        raise ConfigError(f"dataset.max_mentions must be >= 1, got {keys.max_mentions}")
    if keys.min_prompts < 1:
        raise ConfigError(f"dataset.min_prompts must be >= 1, got {keys.min_prompts}")
    base = lama_root(keys, root)
    if not base.is_dir():
        raise DataError(f"LAMA directory {base} not found: set dataset.path (see `cprobe data` and docs/prompt_bias.md)")
    rel_file = base / keys.relations_file
    if not rel_file.is_file():
        raise DataError(f"{rel_file} not found: LAMA's relations.jsonl goes there (dataset.relations_file)")
    records = _read_jsonl(rel_file)
    if not records:
        raise DataError(f"{rel_file} holds no relation: one JSON object a line, e.g. "
                        '{"relation": "P19", "template": "[X] was born in [Y] .", "type": "N-1"}')
    for r in records:
        n = r.pop(_LINE)
        if not isinstance(r.get("relation"), str) or not isinstance(r.get("template"), str):
            raise DataError(f"{rel_file}:{n}: a relation needs string fields 'relation' and 'template'")
        try:
            check_prompt(r["template"], r["relation"])
        except DataError as e:
            raise DataError(f"{rel_file}:{n}: {e} (the relation's template)") from None
    ids = [r["relation"] for r in records]
    for n, rid in enumerate(ids, 1):  # a relation id names its triples and prompts files
        if safe_name(rid) != rid:
            raise DataError(f"{rel_file}:{n}: relation id {rid!r} must be a plain name (it names "
                            f"{keys.triples_dir}/<id>.jsonl), not a path")
    if len(set(ids)) != len(ids):
        raise DataError(f"{rel_file}: relation ids repeat")
    if keys.relations is not None:
        unknown = sorted(set(keys.relations) - set(ids))
        if unknown:
            raise ConfigError(f"unknown relation(s) {unknown} in dataset.relations; {rel_file} has {ids}")
    return records


def load_lama(keys: LamaKeys, root: Path, name: str) -> FactData:
    """Relations, prompts and triples in the LAMA layout (module docstring), N-M relations dropped."""
    records = read_relations(keys, root)
    base = lama_root(keys, root)
    notes: list[str] = []
    relations: dict[str, Relation] = {}
    facts: list[Fact] = []
    empty: list[str] = []  # triples files without a line
    dropped = [r["relation"] for r in records if r.get("type") in keys.drop_types]
    if dropped:
        notes.append(f"dropped {len(dropped)} relation(s) of type {keys.drop_types}: {dropped}")
    for rec in records:
        rid = rec["relation"]
        if rid in dropped or (keys.relations is not None and rid not in keys.relations):
            continue
        triples = base / keys.triples_dir / f"{rid}.jsonl"
        if not triples.is_file():
            if keys.relations is not None:
                raise DataError(f"{triples} not found (relation {rid} is listed in dataset.relations)")
            notes.append(f"relation {rid}: no {keys.triples_dir}/{rid}.jsonl, skipped")
            continue
        prompts = [rec["template"]]
        pfile = base / keys.prompts_dir / f"{rid}.jsonl"
        if pfile.is_file():
            for row in _read_jsonl(pfile):
                n = row[_LINE]
                pattern = row.get("pattern", row.get("template"))
                if not isinstance(pattern, str):
                    raise DataError(f"{pfile}:{n}: a prompt line needs a string 'pattern'")
                try:
                    check_prompt(pattern, rid)
                except DataError as e:
                    raise DataError(f"{pfile}:{n}: {e}") from None
                if pattern.strip() not in (p.strip() for p in prompts):
                    prompts.append(pattern.strip())
        if len(prompts) < keys.min_prompts:
            notes.append(f"relation {rid}: {len(prompts)} prompt(s) < dataset.min_prompts={keys.min_prompts}, dropped")
            continue
        relations[rid] = Relation(rid, str(rec.get("label", rid)), tuple(prompts), str(rec.get("type", "N-1")))
        seen: set[str] = set()
        rows = _read_jsonl(triples)
        if not rows:
            empty.append(triples.name)
        for t in rows:
            n = t[_LINE]
            sub, obj = t.get("sub_label"), t.get("obj_label")
            if not isinstance(sub, str) or not isinstance(obj, str):
                raise DataError(f"{triples}:{n}: a triple needs string fields 'sub_label' and 'obj_label'")
            sid = str(t.get("sub_uri") or sub)
            if sid in seen:  # N-1: one object per subject; a repeated subject keeps its first triple
                continue
            seen.add(sid)
            aliases = t.get("sub_mentions", t.get("aliases")) or []
            if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
                raise DataError(f"{triples}:{n}: 'sub_mentions' / 'aliases' must be a list of strings")
            mentions = tuple(dict.fromkeys([sub.strip(), *(a.strip() for a in aliases if a.strip())]))
            facts.append(Fact(rid, sid, mentions[: keys.max_mentions], obj.strip()))
    if empty:
        notes.append(f"empty triples file(s) under {keys.triples_dir}: {empty}")
    if not facts:
        raise DataError(f"no facts under {base / keys.triples_dir} for the kept relations"
                        + (f": {', '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty" if empty else ""))
    return FactData(name, str(base), relations, tuple(facts), tuple(notes))


# --------------------------------------------------------------------------------- the vocabulary filter
def single_token_filter(data: FactData, tokenizers: Mapping[str, Any], token_of: Callable[[Any, str], int | None]
                        ) -> FactData:
    """Keep the facts whose object is one token in *every* tokenizer (the intersection vocabulary, as the paper), by
    the rule ``token_of(tokenizer, word)`` (the adapter's: :meth:`cprobe.models.adapter.ModelAdapter.word_token`)."""
    objects = sorted({f.object for f in data.facts})
    ok = {o for o in objects if all(token_of(t, o) is not None for t in tokenizers.values())}
    if not ok:
        raise DataError(f"no fact's object is a single token in every probed model's vocabulary ({', '.join(tokenizers)}"
                        f"; e.g. {objects[:3]}): probe models that share a vocabulary with the facts")
    return data.keep(lambda f: f.object in ok,
                     "{dropped} of {total} facts dropped: the object is not a single token in every probed model's "
                     f"vocabulary ({', '.join(tokenizers)})")

