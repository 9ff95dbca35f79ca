"""CausalGym minimal-pair generation from task templates (Arora et al. 2024, §3.2).

A template such as ``"The {subject} that {verbed} the {object}"`` is split into ordered
*regions* (each variable, and the literal text between variables). A pair fills the label
variable(s) with options of two different types and every other variable with one shared
option, so base and source differ only in the feature under study. Interventions are aligned
at the last token of each region, which is why pairs keep their region strings.

Sampling replays the reference implementation's sequence of draws from Python's ``random``
(types, then regions left to right, then labels), so a seed gives the same pairs as the
authors' ``data.py``. As there, an eval pair is redrawn while its base sentence occurs in
train; its swapped copy may still have a train sentence as base (for ``cleft`` every
pseudo-cleft sentence is in train, so no stricter rule can be met).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from cprobe.data.items import TextItem
from cprobe.errors import DataError

# Split after every "}", before every " {", and before a "{" not preceded by a space: each
# variable (with its leading space) becomes its own region.
_SPLIT = re.compile(r"(?<=\})|(?= \{)|(?<! )(?=\{)")
_VAR = re.compile(r"\{(.+?)\}")

CONTROL_LABELS: tuple[str, str] = (" dog", " give")
"""Control-task labels (§5.2): the first type predicts " dog", the second " give"."""

_MAX_RESAMPLES = 1000


@dataclass(frozen=True)
class Pair:
    """A base/source minimal pair with region-aligned sentences and next-token labels.

    ``base``/``source`` are the region strings (joined they give the sentence); region ``i``
    of both sentences comes from the same template span ``region_names[i]``. Class ids index
    the task's types in file order (the label classes of the probing methods).
    """

    base: tuple[str, ...]
    source: tuple[str, ...]
    base_type: str
    source_type: str
    base_label: str
    source_label: str
    base_class: int
    source_class: int
    region_names: tuple[str, ...]

    @property
    def base_text(self) -> str:
        return "".join(self.base)

    def swap(self) -> Pair:
        """The same pair with base and source exchanged (inputs, types and labels)."""
        return Pair(
            base=self.source,
            source=self.base,
            base_type=self.source_type,
            source_type=self.base_type,
            base_label=self.source_label,
            source_label=self.base_label,
            base_class=self.source_class,
            source_class=self.base_class,
            region_names=self.region_names,
        )


def _region_name(span: str) -> str:
    var = _VAR.findall(span)
    return "{" + var[0] + "}" if var else span.replace(" ", "_")


@dataclass(frozen=True)
class TaskTemplate:
    """One CausalGym task: a template, its label variable(s), label types and fillers."""

    name: str
    template: str
    label_vars: tuple[str, ...]
    labels: Mapping[str, tuple[str, ...]]
    variables: Mapping[str, Any]
    prepend_space: bool
    spans: tuple[str, ...]

    @classmethod
    def from_spec(cls, name: str, spec: Mapping[str, Any], template_index: int = 0) -> TaskTemplate:
        """Validate a JSON task spec. One template is used for all pairs, so regions line up."""
        try:
            templates = list(spec["templates"])
            label = spec["label"]
            labels = {str(t): tuple(v) for t, v in spec["labels"].items()}
            variables = dict(spec["variables"])
            prepend_space = bool(spec["result_prepend_space"])
        except (KeyError, TypeError, AttributeError) as err:
            raise DataError(f"CausalGym task {name!r} is malformed ({err!r}); it needs templates, label, "
                            "labels, variables and result_prepend_space") from None
        if not 0 <= template_index < len(templates):
            raise DataError(f"CausalGym task {name!r} has {len(templates)} templates; "
                            f"template_index {template_index} is out of range")
        if len(labels) < 2 or any(len(v) == 0 for v in labels.values()):
            raise DataError(f"CausalGym task {name!r} needs at least two label types, each with labels")
        label_vars = tuple(label) if isinstance(label, list) else (label,)
        spans = tuple(s for s in _SPLIT.split(templates[template_index]) if s)
        for span in spans:
            for var in _VAR.findall(span):
                if var not in variables:
                    raise DataError(f"CausalGym task {name!r}: template variable {var!r} has no fillers")
        for var in label_vars:
            options = variables.get(var)
            if not isinstance(options, Mapping) or any(not options.get(t) for t in labels):
                raise DataError(f"CausalGym task {name!r}: label variable {var!r} needs fillers for "
                                f"every type {list(labels)}")
        heads: dict[str, int] = {}
        for var, options in variables.items():
            if var in label_vars:
                continue
            if not isinstance(options, list) or not options:
                raise DataError(f"CausalGym task {name!r}: variable {var!r} must be a non-empty list")
            if "." in var and heads.setdefault(var.split(".")[0], len(options)) != len(options):
                raise DataError(f"CausalGym task {name!r}: dotted variables of {var.split('.')[0]!r} "
                                "must have equally many options (they share one index)")
        if not any(_VAR.findall(s) and _VAR.findall(s)[0] in label_vars for s in spans):
            raise DataError(f"CausalGym task {name!r}: the template uses no label variable {label_vars}")
        return cls(name, templates[template_index], label_vars, labels, variables, prepend_space, spans)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self.labels)

    @property
    def region_names(self) -> tuple[str, ...]:
        """``{var}`` for variable regions, the literal text (spaces as ``_``) otherwise; may repeat."""
        return tuple(_region_name(s) for s in self.spans)

    @property
    def first_label_region(self) -> int:
        """Index of the first region holding a label variable; the paper intervenes from here on."""
        return next(i for i, s in enumerate(self.spans) if (v := _VAR.findall(s)) and v[0] in self.label_vars)

    def sample_pair(self, rng: random.Random) -> Pair:
        """Draw one pair: two different types, per-type label fillers, shared other fillers."""
        types = self.types
        base_type = rng.choice(types)
        source_type = base_type
        while source_type == base_type:
            source_type = rng.choice(types)
        base, source = list(self.spans), list(self.spans)
        shared_index: dict[str, int] = {}
        for i, span in enumerate(self.spans):
            found = _VAR.findall(span)
            if not found:
                continue
            var = found[0]
            slot = "{" + var + "}"
            if var in self.label_vars:
                base[i] = span.replace(slot, rng.choice(self.variables[var][base_type]))
                source[i] = span.replace(slot, rng.choice(self.variables[var][source_type]))
                continue
            options = self.variables[var]
            if "." in var:
                head = var.split(".")[0]
                if head not in shared_index:
                    shared_index[head] = rng.randint(0, len(options) - 1)
                filler = options[shared_index[head]]
            else:
                filler = rng.choice(options)
            base[i] = source[i] = span.replace(slot, filler)
        space = " " if self.prepend_space else ""
        base_label = space + rng.choice(self.labels[base_type])
        source_label = space + rng.choice(self.labels[source_type])
        return Pair(
            base=tuple(base),
            source=tuple(source),
            base_type=base_type,
            source_type=source_type,
            base_label=base_label,
            source_label=source_label,
            base_class=types.index(base_type),
            source_class=types.index(source_type),
            region_names=self.region_names,
        )


def load_templates(path: str | Path, template_index: int = 0,
                   tasks: Sequence[str] | None = None) -> dict[str, TaskTemplate]:
    """The tasks of a templates JSON file (e.g. ``<data>/causalgym/templates/syntaxgym.json``): every task, or the
    named ``tasks`` in that order (only those are checked, so a bad ``template_index`` names a task you asked for).

    A missing, unreadable or empty file, or an unknown task name, is a one-line error listing what is there."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"CausalGym templates file {path} not found; set CPROBE_DATA_DIR to the folder "
                        "holding causalgym/templates/ (`cprobe data` says where)")
    try:
        specs = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"CausalGym templates file {path} is not valid JSON ({err})") from None
    if not isinstance(specs, dict):
        raise DataError(f"CausalGym templates file {path} must map task names to specs")
    if not specs:
        raise DataError(f"CausalGym templates file {path} holds no tasks (an empty mapping); it needs at least one "
                        "task spec (templates, label, labels, variables, result_prepend_space)")
    names = list(specs) if tasks is None else list(tasks)
    unknown = [t for t in names if t not in specs]
    if unknown:
        raise DataError(f"unknown CausalGym task(s) {unknown} in {path.name}; choose from {sorted(specs)}")
    return {name: TaskTemplate.from_spec(name, specs[name], template_index) for name in names}


def sample_pairs(
    template: TaskTemplate,
    n_pairs: int,
    seed: int,
    discard: Iterable[str] = (),
    pairs_per_batch: int = 2,
) -> list[Pair]:
    """``n_pairs`` pairs doubled by swapping, in the reference order ``[p1, p2, p1', p2', ...]``.

    A pair is redrawn while its base sentence is in ``discard``. Batches of
    ``pairs_per_batch`` pairs followed by their swaps mirror the reference's 4-item batches,
    which keeps the random stream, and hence the pairs, identical to it.
    """
    rng = random.Random(seed)
    banned = frozenset(discard)
    out: list[Pair] = []
    while len(out) < 2 * n_pairs:
        fresh = [_draw(template, rng, banned) for _ in range(min(pairs_per_batch, n_pairs - len(out) // 2))]
        out.extend(fresh + [p.swap() for p in fresh])
    return out


def _draw(template: TaskTemplate, rng: random.Random, banned: frozenset[str]) -> Pair:
    pair = template.sample_pair(rng)
    tries = 0
    while pair.base_text in banned:
        tries += 1
        if tries > _MAX_RESAMPLES:
            raise DataError(f"CausalGym task {template.name!r} cannot yield an eval base sentence "
                            f"outside train after {_MAX_RESAMPLES} draws; lower n_train/n_eval or add fillers")
        pair = template.sample_pair(rng)
    return pair


class Splits(NamedTuple):
    train: list[Pair]
    eval: list[Pair]


def make_pair_splits(
    template: TaskTemplate,
    n_train: int = 200,
    n_eval: int = 50,
    train_seed: int = 42,
    eval_seed: int = 1,
    control: bool = False,
) -> Splits:
    """Train (2·n_train items) and eval (2·n_eval) sets; drawn eval bases are never train sentences.

    Defaults are the paper's (200→400 train, 50→100 eval; seeds 42 and 1 as in the reference).
    ``control`` gives the same pairs with the " dog"/" give" control labels.
    """
    train = sample_pairs(template, n_train, train_seed)
    seen = {p.base_text for p in train}
    eval_ = sample_pairs(template, n_eval, eval_seed, discard=seen)
    if control:
        return Splits(control_pairs(train), control_pairs(eval_))
    return Splits(train, eval_)


def control_pairs(pairs: Sequence[Pair]) -> list[Pair]:
    """Relabel pairs for the control task: class 0 → " dog", class 1 → " give"."""
    if any(max(p.base_class, p.source_class) >= len(CONTROL_LABELS) for p in pairs):
        raise DataError("the dog/give control task needs binary tasks (two label types)")
    return [replace(p, base_label=CONTROL_LABELS[p.base_class], source_label=CONTROL_LABELS[p.source_class])
            for p in pairs]


def pair_items(pairs: Sequence[Pair]) -> tuple[list[TextItem], list[TextItem]]:
    """The bases and the sources of ``pairs`` as region-aligned :class:`TextItem` lists (same order).

    An item's ``concepts`` hold its label type, its ``outcome`` the next-token label; the model-side
    tokenisation is :class:`cprobe.models.formatters.RegionFormatter`'s (positions ``region:r``, ``last``).
    """
    if not pairs:
        raise DataError("no CausalGym pairs")

    def item(i: int, side: str, regions: tuple[str, ...], type_: str, label: str) -> TextItem:
        return TextItem(id=f"{i}.{side}", text="".join(regions), concepts={"type": type_}, outcome=label,
                        regions=tuple(regions), region_names=pairs[0].region_names)

    bases = [item(i, "base", p.base, p.base_type, p.base_label) for i, p in enumerate(pairs)]
    sources = [item(i, "source", p.source, p.source_type, p.source_label) for i, p in enumerate(pairs)]
    return bases, sources


def label_token_ids(tokenizer: Any, labels: Iterable[str]) -> tuple[dict[str, int], tuple[str, ...]]:
    """Each label's first token id (the reference scores the first token), and the labels longer than one token."""
    ids: dict[str, int] = {}
    multi = []
    for label in sorted(set(labels)):
        toks = tokenizer(label, add_special_tokens=False)["input_ids"]
        if not toks:
            raise DataError(f"label {label!r} tokenises to nothing")
        ids[label] = toks[0]
        if len(toks) > 1:
            multi.append(label)
    return ids, tuple(multi)
