"""RAVEL's plan (explanare/ravel ``src/utils/generate_ravel_instance.py``): which entities, templates and contexts fit
the methods and which are scored, every prompt's answer as tokens, and the interchange pairs by source kind.

**The parts** (:func:`parts`). The entity split (``ravel.split: entity``, the reference's ``gen_entity_test_split``):
the methods are fitted on the ``train`` entities and scored on the ``eval_split`` ones (``test`` or ``val``), both on
the ``train`` templates of RAVEL's context split where the data has it. The context split (``context``,
``gen_context_test_split``): fitted on the ``train`` templates, scored on the ``eval_split`` templates, both on the
``train`` entities. Where the data has no split file (the fact world, a folder without it) the part is drawn, seeded:
``fit_share`` of the entities (of each attribute's templates). The Wikipedia contexts of a part are those of its
split. ``entities`` / ``templates`` cap each part (per attribute), seeded.

**A value's tokens** (:func:`answer_tokens`): what the model writes after the template — the template filled with an
entity, then the value after a space or not (:func:`cprobe.data.ravel.answer_text`), tokenised together; the tokens
after the prompt's own are the value's (where the two tokenisations disagree on the prompt, the value tokenised alone,
as the reference tokenises its labels). The first ``n`` (``answer_tokens``, RAVEL's ``max_new_tokens``) are the label
the metric compares (:func:`cprobe.metrics.ravel.matches`); −1 pads a shorter one.

**The pairs** (:func:`pairs`). A base is a prompt of the part (template p of attribute Q about entity e) the model
answers right. A source entity e′ of the part qualifies when its label of Q after p differs from e's (the reference's
``label != inv_label``) and, for Q = A (Cause), the model answers p about e′ right (its answer there, ``inv_label``,
is what Cause wants). The source prompt about e′ comes from one of RAVEL's kinds (:data:`KINDS`; the reference's
``output``, ``causal`` and ``other`` subsplits, plus cprobe's earlier one):

- ``attribute``: any template of the part querying Q (the reference's ``output``: Q = A for Cause);
- ``other_attribute``: a template of the part querying another attribute (``causal``);
- ``wikipedia``: a Wikipedia context of the part about e′, or one about no particular entity, filled with e′
  (``other``);
- ``same_template``: p itself about e′ (cprobe's earlier Cause source).

Among the qualifying (source prompt, e′), one is drawn per base, weighted by ``1 / (b + c)`` where c counts the
candidates with the same label (the reference balances the labels so: b = 10 in the entity split, 20 in the context
split). Bases are taken in a seeded order interleaving the templates, until ``n_pairs`` per (A, Q, kind).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cprobe.data.ravel import ENTITY_SLOT, answer_text, prompt_item
from cprobe.errors import ConfigError

KINDS = ("attribute", "other_attribute", "wikipedia", "same_template")
"""The source kinds (module doc)."""
REFERENCE_KINDS = ("attribute", "other_attribute", "wikipedia")
"""The reference's three kinds (``output``, ``causal``, ``other``): the default."""
BALANCE = {"entity": 10, "context": 20}
"""The reference's label-balancing constant b of each split (module doc)."""
CONTEXT = -1
"""The attribute index of a Wikipedia context row (it queries nothing)."""


@dataclass
class Part:
    """Entities (indices into the data's entity list), templates per attribute index, and Wikipedia contexts (indices
    into the data's context list) of one side."""

    entities: np.ndarray
    templates: dict[int, list[int]]
    contexts: list[int] = field(default_factory=list)


def _cap(items: Sequence[Any], n: int | None, rng: np.random.Generator) -> list[Any]:
    items = list(items)
    if n is None or len(items) <= n:
        return items
    keep = sorted(rng.choice(len(items), n, replace=False).tolist())
    return [items[i] for i in keep]


def parts(data: Any, attrs: Sequence[str], split: str, eval_split: str, fit_share: float, n_entities: int | None,
          n_templates: int | None, rng: np.random.Generator) -> tuple[Part, Part]:
    """(the fitting part, the scored part) (module doc)."""
    names = list(data.entities)
    n = len(names)

    def drawn(count: int) -> tuple[list[int], list[int]]:
        order = rng.permutation(count)
        k = max(1, min(count - 1, round(fit_share * count)))
        return sorted(order[:k].tolist()), sorted(order[k:].tolist())

    es, ts = data.entity_split, data.template_split
    if split == "entity":
        if es is not None:
            fit_e = [i for i, e in enumerate(names) if es.get(e) == "train"]
            ev_e = [i for i, e in enumerate(names) if es.get(e) == eval_split]
        else:
            fit_e, ev_e = drawn(n)
        temps = {a: [t for t, x in enumerate(data.templates[attr]) if ts is None or ts.get(x) == "train"]
                 for a, attr in enumerate(attrs)}
        fit_t, ev_t = temps, temps
    else:
        fit_e = ev_e = ([i for i, e in enumerate(names) if es.get(e) == "train"] if es is not None else list(range(n)))
        fit_t, ev_t = {}, {}
        for a, attr in enumerate(attrs):
            if ts is not None:
                fit_t[a] = [t for t, x in enumerate(data.templates[attr]) if ts.get(x) == "train"]
                ev_t[a] = [t for t, x in enumerate(data.templates[attr]) if ts.get(x) == eval_split]
            elif len(data.templates[attr]) >= 2:
                fit_t[a], ev_t[a] = drawn(len(data.templates[attr]))
            else:
                raise ConfigError(f"ravel.split=context needs two templates or more of attribute {attr!r} (one to fit, "
                                  f"one to score); it has {len(data.templates[attr])}")
    fit_split, ev_split = ("train", eval_split) if split == "context" or es is not None else (None, None)
    contexts = list(data.contexts or ())
    fit_c = [i for i, c in enumerate(contexts) if fit_split is None or c.split in (None, fit_split)]
    ev_c = [i for i, c in enumerate(contexts) if ev_split is None or c.split in (None, ev_split)]
    fit = Part(np.array(_cap(fit_e, n_entities, rng), dtype=np.int64),
               {a: _cap(t, n_templates, rng) for a, t in fit_t.items()}, fit_c)
    ev = Part(np.array(_cap(ev_e, n_entities, rng), dtype=np.int64),
              {a: _cap(t, n_templates, rng) for a, t in ev_t.items()}, ev_c)
    for name, part in (("fitting", fit), ("scored", ev)):
        if len(part.entities) == 0:
            raise ConfigError(f"the {name} part of ravel.split={split} has no entity (eval_split={eval_split}); "
                              "check the split file or dataset.max_examples")
        empty = [attrs[a] for a, t in part.templates.items() if not t]
        if empty:
            raise ConfigError(f"the {name} part of ravel.split={split} has no template of attribute(s) {empty}")
    return fit, ev


# ----------------------------------------------------------------------------------------------- answers as tokens
def answer_tokens(tok: Any, prompts: Sequence[str], answers: Sequence[str]) -> tuple[list[list[int]], int]:
    """The tokens of each answer as it follows its prompt (module doc), and how many were tokenised alone (the
    prompt's tokens changed when the answer was added)."""
    if not prompts:
        return [], 0
    alone_ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
    joint_ids = tok([p + a for p, a in zip(prompts, answers)], add_special_tokens=False)["input_ids"]
    out, alone = [], []
    for i, (p, j) in enumerate(zip(alone_ids, joint_ids)):
        if len(j) > len(p) and j[:len(p)] == p:
            out.append(list(j[len(p):]))
        else:
            out.append([])
            alone.append(i)
    if alone:
        ids = tok([answers[i] for i in alone], add_special_tokens=False)["input_ids"]
        for i, x in zip(alone, ids):
            out[i] = list(x)
    return out, len(alone)


def label(tokens: Sequence[int], n: int) -> tuple[int, ...]:
    """The first ``n`` tokens, −1 padded to ``n``."""
    t = tuple(int(x) for x in tokens[:n])
    return t + (-1,) * (n - len(t))


class Labels:
    """Every (attribute, template, value)'s label (module doc), computed on the template filled with a fixed entity
    and kept: ``labels[a, t, v]`` → the n-tuple."""

    def __init__(self, data: Any, attrs: Sequence[str], values: Sequence[Sequence[str]], n: int, tok: Any,
                 wanted: Mapping[int, Sequence[int]]) -> None:
        first = next(iter(data.entities))
        keys, prompts, answers = [], [], []
        for a, ts in wanted.items():
            for t in ts:
                text = data.templates[attrs[a]][t]
                prompt = text.replace(ENTITY_SLOT, first)
                for v, value in enumerate(values[a]):
                    keys.append((a, t, v))
                    prompts.append(prompt)
                    answers.append(answer_text(text, value))
        toks, self.alone = answer_tokens(tok, prompts, answers)
        self.n = n
        self.table = {k: label(x, n) for k, x in zip(keys, toks)}

    def __getitem__(self, key: tuple[int, int, int]) -> tuple[int, ...]:
        return self.table[key]


# ----------------------------------------------------------------------------------------------- the prompts
@dataclass
class Prompts:
    """Every prompt of the study (and Wikipedia context rows, attribute :data:`CONTEXT`) with what the clean pass
    found: the entity token's states, and for prompts the model answered, whether it wrote the entity's value."""

    items: list[Any]
    entity: np.ndarray  # (N,) entity index
    attribute: np.ndarray  # (N,) queried attribute index (CONTEXT for a context)
    template: np.ndarray  # (N,) template index (a context's index)
    fit: np.ndarray  # (N,) bool: a prompt of the fitting part
    scored: np.ndarray  # (N,) bool: a prompt of the scored part
    correct: np.ndarray  # (N,) bool: the model writes the entity's value (False where not answered)
    answered: np.ndarray  # (N,) bool: the model's answer was read
    acts: dict[int, Any] = field(default_factory=dict)  # layer -> (N, d) the entity token's states

    def lookup(self) -> dict[tuple[int, int, int], int]:
        """(entity, attribute, template) -> row, for prompts."""
        return {(int(e), int(a), int(t)): i for i, (e, a, t) in enumerate(zip(self.entity, self.attribute,
                                                                              self.template)) if a != CONTEXT}


def prompt_rows(data: Any, attrs: Sequence[str], value: np.ndarray, fit: Part, ev: Part, context_entities: int,
                rng: np.random.Generator, contexts_for: Sequence[str]) -> Prompts:
    """The prompts of both parts (an entity's template where its value is known) and the Wikipedia context rows of the
    parts named in ``contexts_for`` (``fit``, ``scored``): a context about an entity of the part once, filled with it;
    one about no entity filled with up to ``context_entities`` entities of the part (seeded)."""
    names = list(data.entities)
    rows: dict[tuple[int, int, int], list[bool]] = {}
    for flag, part in ((0, fit), (1, ev)):
        for a, ts in part.templates.items():
            for e in part.entities:
                if value[e, a] < 0:
                    continue
                for t in ts:
                    rows.setdefault((int(e), a, t), [False, False])[flag] = True
    items, ent, att, tem, fl, sc = [], [], [], [], [], []
    for (e, a, t), (f, s) in rows.items():
        items.append(prompt_item(names[e], attrs[a], t, data.templates[attrs[a]][t]))
        ent.append(e), att.append(a), tem.append(t), fl.append(f), sc.append(s)
    contexts = list(data.contexts or ())
    index = {n: i for i, n in enumerate(names)}
    for flag, part in ((0, fit), (1, ev)):
        if ("fit", "scored")[flag] not in contexts_for:
            continue
        members = set(part.entities.tolist())
        for c in part.contexts:
            ctx = contexts[c]
            if ctx.entity is not None:
                fill = [index[ctx.entity]] if index.get(ctx.entity) in members else []
            else:
                fill = _cap(sorted(members), context_entities, rng)
            for e in fill:
                items.append(prompt_item(names[e], "wikipedia", c, ctx.text))
                ent.append(e), att.append(CONTEXT), tem.append(c), fl.append(flag == 0), sc.append(flag == 1)
    n = len(items)
    return Prompts(items, np.array(ent, dtype=np.int64), np.array(att, dtype=np.int64), np.array(tem, dtype=np.int64),
                   np.array(fl, dtype=bool), np.array(sc, dtype=bool), np.zeros(n, dtype=bool),
                   np.zeros(n, dtype=bool))


# ----------------------------------------------------------------------------------------------- the pairs
@dataclass
class Pairs:
    """Interchange pairs of one targeted attribute A: base prompt rows, source rows (a prompt or a context), the
    queried attribute, the source kind (index into :data:`KINDS`), the value indices of A (base's, source's: the
    per-pair directions), the label the metric compares (Cause: e′'s A after the base prompt; Isolate: e's own), and
    the base prompts that passed the filter per (queried, kind)."""

    base: np.ndarray
    source: np.ndarray
    queried: np.ndarray
    kind: np.ndarray
    base_a: np.ndarray
    src_a: np.ndarray
    wanted_value: np.ndarray  # the value index (of the queried attribute) whose label is wanted
    candidates: dict[tuple[int, int], int]

    def __len__(self) -> int:
        return len(self.base)

    @staticmethod
    def empty() -> Pairs:
        z = np.zeros(0, dtype=np.int64)
        return Pairs(z, z, z, z, z, z, z, {})

    @staticmethod
    def cat(parts: Sequence[Pairs]) -> Pairs:
        if not parts:
            return Pairs.empty()
        cols = ("base", "source", "queried", "kind", "base_a", "src_a", "wanted_value")
        cands: dict[tuple[int, int], int] = {}
        for p in parts:
            cands.update(p.candidates)
        return Pairs(*(np.concatenate([getattr(p, c) for p in parts]) for c in cols), candidates=cands)


def _sources(P: Prompts, kind: str, e2: np.ndarray, base_row: int, in_part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source rows, their entity) of ``kind`` about the entities ``e2`` for the base prompt ``base_row``."""
    q, t = P.attribute[base_row], P.template[base_row]
    ok = in_part & np.isin(P.entity, e2)
    if kind == "attribute":
        ok &= P.attribute == q
    elif kind == "other_attribute":
        ok &= (P.attribute != q) & (P.attribute != CONTEXT)
    elif kind == "wikipedia":
        ok &= P.attribute == CONTEXT
    else:  # same_template
        ok &= (P.attribute == q) & (P.template == t)
    rows = np.flatnonzero(ok)
    return rows, P.entity[rows]


def eligible(P: Prompts, value: np.ndarray, labels: Labels, a: int, base_row: int, kind: str, entities: np.ndarray,
             in_part: np.ndarray, row_of: Mapping[tuple[int, int, int], int]) -> tuple[np.ndarray, np.ndarray]:
    """(source rows, their entity's value of the queried attribute) that qualify for base ``base_row`` targeting
    attribute ``a`` among the part's ``entities`` (module doc); none unless the base is answered right with e's A
    known."""
    none = np.zeros(0, dtype=np.int64)
    e, q, t = int(P.entity[base_row]), int(P.attribute[base_row]), int(P.template[base_row])
    if not P.correct[base_row] or value[e, a] < 0:
        return none, none
    own = labels[q, t, value[e, q]]
    cand = []
    for x in entities.tolist():
        if x == e or value[x, a] < 0 or value[x, q] < 0 or labels[q, t, value[x, q]] == own:
            continue
        if q == a:  # Cause wants e′'s answer on the base template: the model must give it
            r = row_of.get((x, q, t))
            if r is None or not P.correct[r]:
                continue
        cand.append(x)
    if not cand:
        return none, none
    rows, ents = _sources(P, kind, np.array(cand), base_row, in_part)
    return rows, value[ents, q]


def balanced(labels: np.ndarray, b: float) -> np.ndarray:
    """The reference's draw probabilities of candidates with ``labels``: each weighs ``1 / (b + c)``, c the count of
    its label among them, normalised."""
    counts = Counter(labels.tolist())
    w = np.array([1.0 / (b + counts[x]) for x in labels.tolist()])
    return w / w.sum()


def pairs(P: Prompts, value: np.ndarray, labels: Labels, a: int, queried: Sequence[int], kinds: Sequence[str],
          part: str, n: int, rng: np.random.Generator, balance: int) -> Pairs:
    """Up to ``n`` pairs per (queried attribute, kind) targeting ``a`` on the part ``part`` (``fit`` / ``scored``;
    module doc)."""
    in_part = P.fit if part == "fit" else P.scored
    entities = np.unique(P.entity[in_part & (P.attribute != CONTEXT)])
    row_of = P.lookup()
    out, cands = [], {}
    for q in queried:
        bases = np.flatnonzero(in_part & (P.attribute == q) & P.correct)
        # a seeded order interleaving the templates: each template's bases shuffled, then taken round-robin
        order = rng.permutation(bases)
        rank = np.zeros(len(order), dtype=np.int64)
        seen: Counter = Counter()
        for i, b in enumerate(order):
            rank[i] = seen[P.template[b]]
            seen[P.template[b]] += 1
        order = order[np.argsort(rank, kind="stable")]
        for k, kind in enumerate(kinds):
            got = {c: [] for c in ("base", "source", "queried", "kind", "base_a", "src_a", "wanted_value")}
            passed = 0
            for b in order:
                rows, labs = eligible(P, value, labels, a, int(b), kind, entities, in_part, row_of)
                if len(rows) == 0:
                    continue
                passed += 1
                if len(got["base"]) >= n:
                    continue
                s = int(rows[rng.choice(len(rows), p=balanced(labs, balance))])
                e, e2 = int(P.entity[b]), int(P.entity[s])
                wanted = value[e2, a] if q == a else value[e, q]
                for c, v in (("base", b), ("source", s), ("queried", q), ("kind", KINDS.index(kind)),
                             ("base_a", value[e, a]), ("src_a", value[e2, a]), ("wanted_value", wanted)):
                    got[c].append(int(v))
            cands[q, KINDS.index(kind)] = passed
            out.append(Pairs(*(np.array(got[c], dtype=np.int64) for c in got), candidates={}))
    result = Pairs.cat(out)
    result.candidates = cands
    return result
