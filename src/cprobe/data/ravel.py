"""RAVEL's data (Huang et al., ACL 2024): entities with several attributes, and prompts querying one attribute of an
entity (``dataset=ravel``: RAVEL's own files; :func:`from_fact_world`: the offline fact world, subjects × relations as
entities × attributes).

RAVEL's layout, five files per entity type in ``dataset.path`` (RAVEL's ``data.tgz``):

- ``ravel_<entity_type>_entity_attributes.json``: ``{entity: {attribute: value}}`` (an empty value: unknown, skipped);
- ``ravel_<entity_type>_attribute_to_prompts.json``: ``{attribute: [template, ...]}``, each template holding the
  entity slot ``%s`` once, its value the text that follows it (:func:`answer_text`: after a space, unless the template
  ends in one or in an opening quote or bracket — RAVEL's JSON-style templates);
- ``ravel_<entity_type>_entity_to_split.json``: ``{entity: train | val | test}`` (RAVEL's entity split);
- ``ravel_<entity_type>_prompt_to_split.json``: ``{template: train | val | test}`` (RAVEL's context split);
- ``wikipedia_<entity_type>_entity_prompts.json``: ``{context with %s: {"split": ..., "entity": name or null}}``
  (RAVEL's Wikipedia contexts: the "other" source prompts).

The first two are required; the other three are read where present (:attr:`RavelData.entity_split`,
:attr:`~RavelData.template_split`, :attr:`~RavelData.contexts`: None when the file is absent, and the study refuses a
setting that needs one in one line). Every attribute needs two values or more among the entities (Cause moves a value
to another one); one that has a single value is refused in one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from cprobe.data.items import OBJECT_SLOT, TextItem
from cprobe.data.lama import SUBJECT_SLOT, FactData
from cprobe.errors import DataError

ENTITY_SLOT = "%s"
"""The entity's place in a RAVEL template."""
REGIONS = ("prefix", "entity", "query")
"""An item's regions: the template before the entity, the entity mention (its last token is the edited site), the
rest of the template (its last token predicts the value)."""
SPLITS = ("train", "val", "test")
"""RAVEL's split names (entity split and context split alike)."""
JOINED = "\"'([{/"
"""A template ending in one of these (or in whitespace) is followed by its value with no space: RAVEL's JSON-style
templates (``{"city": "%s", "country": "``) and ``... is (``."""
FILES = {"entity_attributes": "ravel_{}_entity_attributes.json", "prompts": "ravel_{}_attribute_to_prompts.json",
         "entity_split": "ravel_{}_entity_to_split.json", "template_split": "ravel_{}_prompt_to_split.json",
         "contexts": "wikipedia_{}_entity_prompts.json"}
"""RAVEL's file of each kind, by entity type; the first two are required."""


def answer_text(template: str, value: str) -> str:
    """The value as the model writes it after ``template``: as is after whitespace or an opening quote or bracket
    (:data:`JOINED`), else after a space."""
    return value if not template or template[-1].isspace() or template[-1] in JOINED else " " + value


def template_style(template: str) -> str:
    """``json`` where the value follows the template with no space (:data:`JOINED`; RAVEL's JSON-style templates and
    ``(``), else ``text``."""
    return "json" if template and template[-1] in JOINED else "text"


@dataclass(frozen=True)
class Context:
    """One of RAVEL's Wikipedia contexts: a sentence with the entity slot, its split, and the entity it is about
    (None: any entity fits)."""

    text: str
    split: str | None
    entity: str | None


@dataclass(frozen=True)
class RavelKeys:
    """``dataset=ravel`` keys."""

    path: str = "ravel"
    entity_type: str = "city"
    attributes: list[str] | None = None  # keep only these (null: every attribute with prompts)


@dataclass(frozen=True)
class RavelData:
    """Entities, their attribute values, and the prompt templates of each attribute (``%s``: the entity)."""

    name: str
    source: str
    entities: Mapping[str, Mapping[str, str]]
    templates: Mapping[str, tuple[str, ...]]
    notes: tuple[str, ...] = field(default=())
    entity_split: Mapping[str, str] | None = None  # RAVEL's entity split (None: no file)
    template_split: Mapping[str, str] | None = None  # RAVEL's context split, template -> split (None: no file)
    contexts: tuple[Context, ...] | None = None  # RAVEL's Wikipedia contexts (None: no file)
    files: Mapping[str, str] = field(default_factory=dict)  # kind -> the path it is (or would be) read from

    @property
    def attributes(self) -> list[str]:
        return list(self.templates)

    def values(self, attribute: str) -> list[str]:
        """The attribute's distinct values among the entities, sorted."""
        return sorted({v[attribute] for v in self.entities.values() if attribute in v})

    def subsample(self, n: int, seed: int = 0) -> RavelData:
        """At most ``n`` entities (seeded; order kept) — ``dataset.max_examples``."""
        if len(self.entities) <= n:
            return self
        keep = set(np.random.default_rng(seed).choice(len(self.entities), n, replace=False).tolist())
        note = f"{n} of {len(self.entities)} entities kept (dataset.max_examples)"
        return check_ravel(replace(self, entities={e: v for i, (e, v) in enumerate(self.entities.items()) if i in keep},
                                   notes=(*self.notes, note)))


def check_ravel(data: RavelData) -> RavelData:
    """``data`` when every attribute has a template with one entity slot and two values or more, and the splits and
    contexts it has are RAVEL's; else one line."""
    if not data.templates:
        raise DataError(f"{data.name}: no attribute has prompt templates")
    for a, temps in data.templates.items():
        if not temps:
            raise DataError(f"{data.name}: attribute {a!r} has no prompt template")
        bad = [t for t in temps if t.count(ENTITY_SLOT) != 1]
        if bad:
            raise DataError(f"{data.name}: template {bad[0]!r} of attribute {a!r} must hold the entity slot "
                            f"{ENTITY_SLOT} exactly once")
        values = data.values(a)
        if len(values) < 2:
            raise DataError(f"{data.name}: attribute {a!r} has {len(values)} value ({', '.join(map(repr, values))}) "
                            "among its entities; Cause and Isolate need two or more: drop it (dataset.attributes) "
                            "or add entities")
    for kind, split in (("entity_split", data.entity_split), ("template_split", data.template_split)):
        bad = next(((k, v) for k, v in (split or {}).items() if v not in SPLITS), None)
        if bad:
            raise DataError(f"{data.files.get(kind, kind)}: {bad[0]!r} is in split {bad[1]!r}; RAVEL's splits are "
                            f"{list(SPLITS)}")
    for c in data.contexts or ():
        if c.text.count(ENTITY_SLOT) != 1 or (c.split is not None and c.split not in SPLITS):
            raise DataError(f"{data.files.get('contexts', 'contexts')}: context {c.text[:60]!r} must hold the entity "
                            f"slot {ENTITY_SLOT} exactly once and be in one of the splits {list(SPLITS)} (got "
                            f"{c.split!r})")
    return data


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise DataError(f"RAVEL file not found: {path} (dataset.path holds ravel_<entity_type>_entity_attributes.json "
                        "and ravel_<entity_type>_attribute_to_prompts.json)")
    try:
        out = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(out, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(out).__name__}")
    return out


def _optional(path: Path) -> dict | None:
    return _read_json(path) if path.is_file() else None


def _contexts(raw: Mapping | None, path: Path) -> tuple[Context, ...] | None:
    if raw is None:
        return None
    out = []
    for text, info in raw.items():
        if not isinstance(info, Mapping):
            raise DataError(f"{path}: context {str(text)[:60]!r} must map to {{\"split\": ..., \"entity\": ...}}, got "
                            f"{info!r}")
        entity = info.get("entity")
        out.append(Context(str(text), None if info.get("split") is None else str(info["split"]),
                           None if not entity else str(entity)))
    return tuple(out)


def load_ravel(keys: RavelKeys, root: Path, name: str = "ravel") -> RavelData:
    """RAVEL's files of ``keys.entity_type`` under ``keys.path`` (relative paths: under the data dir ``root``)."""
    base = Path(keys.path).expanduser()
    base = base if base.is_absolute() or base.exists() else Path(root) / base
    files = {k: str(base / f.format(keys.entity_type)) for k, f in FILES.items()}
    attrs = _read_json(Path(files["entity_attributes"]))
    prompts = _read_json(Path(files["prompts"]))
    wanted = list(prompts) if keys.attributes is None else list(keys.attributes)
    unknown = [a for a in wanted if a not in prompts]
    if unknown:
        raise DataError(f"attribute(s) {unknown} of dataset.attributes have no prompts in {base}; it has "
                        f"{sorted(prompts)}")
    entities: dict[str, dict[str, str]] = {}
    for e, vals in attrs.items():
        if not isinstance(vals, Mapping):
            raise DataError(f"entity {e!r}: its attributes must be a JSON object, got {vals!r}")
        kept = {a: str(v).strip() for a, v in vals.items() if a in wanted and str(v or "").strip()}
        if kept:
            entities[str(e)] = kept
    templates = {a: tuple(str(t) for t in prompts[a]) for a in wanted}
    entity_split = _optional(Path(files["entity_split"]))
    template_split = _optional(Path(files["template_split"]))
    return check_ravel(RavelData(
        name, str(base), entities, templates,
        entity_split=None if entity_split is None else {str(k): str(v) for k, v in entity_split.items()},
        template_split=None if template_split is None else {str(k): str(v) for k, v in template_split.items()},
        contexts=_contexts(_optional(Path(files["contexts"])), Path(files["contexts"])), files=files))


def from_fact_world(data: FactData, attributes: Sequence[str] | None = None) -> RavelData:
    """A fact dataset as RAVEL's: relations as attributes (their paraphrases cut before ``[Y]`` as templates), each
    subject as an entity (by its default name) with its objects as values; only entities with a fact for every
    attribute are kept."""
    rels = list(data.relations) if attributes is None else list(attributes)
    unknown = [r for r in rels if r not in data.relations]
    if unknown:
        raise DataError(f"relation(s) {unknown} of ravel.attributes are not in {data.name}; it has "
                        f"{list(data.relations)}")
    by: dict[str, dict[str, str]] = {}
    names: dict[str, str] = {}
    for f in data.facts:
        if f.relation in rels:
            by.setdefault(f.subject, {})[f.relation] = f.object
            names[f.subject] = f.mentions[0]
    entities = {names[s]: v for s, v in by.items() if len(v) == len(rels)}
    templates = {r: tuple(p[:p.index(OBJECT_SLOT)].rstrip().replace(SUBJECT_SLOT, ENTITY_SLOT)
                          for p in data.relations[r].prompts) for r in rels}
    note = f"{len(entities)} of {len(by)} subjects have a fact for every attribute {rels}"
    return check_ravel(RavelData(data.name, data.source, entities, templates, (*data.notes, note)))


def prompt_item(entity: str, attribute: str, template: int, text: str) -> TextItem:
    """The prompt ``text`` (a template of ``attribute``) about ``entity`` as a region-aligned item (:data:`REGIONS`)."""
    i = text.index(ENTITY_SLOT)
    regions = (text[:i], entity, text[i + len(ENTITY_SLOT):])
    return TextItem(id=f"{entity}|{attribute}|{template}", text="".join(regions), regions=regions,
                    region_names=REGIONS, meta={"entity": entity, "attribute": attribute, "template": template})
