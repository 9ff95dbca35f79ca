"""RAVEL's pair generation (cprobe.tasks.ravel_plan) on hand-made prompts, against the reference's definitions
(explanare/ravel ``generate_ravel_instance.py``: ``gen_entity_test_split``, ``gen_context_test_split``): which bases
and sources qualify per source kind, the label rule (Cause wants e′'s answer on the base template, so the model must
give it; Isolate only needs e′'s queried value to differ), the label balancing, and the two splits."""

from __future__ import annotations

import numpy as np
import pytest

from cprobe.data.ravel import Context, RavelData
from cprobe.tasks.ravel_plan import CONTEXT, KINDS, Prompts, balanced, eligible, pairs, parts

# 5 entities × 2 attributes (A = 0, B = 1); value[e] = (A, B); entity 4's A is unknown (−1)
VALUE = np.array([[0, 0], [1, 1], [0, 1], [1, 0], [-1, 0]])


class Labels:
    """Each value's label is its own index as one token (padded to two)."""

    n = 2

    def __getitem__(self, key):
        a, t, v = key
        return (v, -1)


def prompts(wrong=frozenset(), contexts=()) -> Prompts:
    """Every (entity, attribute, template) of 2 templates where the value is known, then ``contexts`` rows (entity,
    context index); every prompt answered, ``wrong`` ones wrong; all in both parts."""
    rows = [(e, a, t) for e in range(5) for a in range(2) for t in range(2) if VALUE[e, a] >= 0]
    rows += [(e, CONTEXT, c) for e, c in contexts]
    ent, att, tem = (np.array(x) for x in zip(*rows))
    is_prompt = att != CONTEXT
    correct = np.array([r not in wrong for r in rows]) & is_prompt
    n = len(rows)
    return Prompts([None] * n, ent, att, tem, np.ones(n, bool), np.ones(n, bool), correct, is_prompt)


def row(P, e, a, t):
    return int(np.flatnonzero((P.entity == e) & (P.attribute == a) & (P.template == t))[0])


def sources(P, base, a, kind):
    rows, _ = eligible(P, VALUE, Labels(), a, base, kind, np.unique(P.entity), np.ones(len(P.entity), bool),
                       P.lookup())
    return sorted((int(P.entity[r]), int(P.attribute[r]), int(P.template[r])) for r in rows)


def test_cause_sources_per_kind_need_another_value_and_the_model_right_on_the_base_template():
    # base: entity 0 (A = 0) on A's template 1; e′ with A = 1: entities 1 and 3, but the model gets 3's template-1
    # A prompt wrong, so only entity 1 qualifies (its answer there is what Cause wants)
    P = prompts(wrong={(3, 0, 1)}, contexts=[(1, 0), (3, 0), (0, 1)])
    b = row(P, 0, 0, 1)
    # attribute (the reference's "output"): any template of A about e′, its own correctness not asked
    assert sources(P, b, 0, "attribute") == [(1, 0, 0), (1, 0, 1)]
    # other_attribute ("causal"): a template of another attribute about e′
    assert sources(P, b, 0, "other_attribute") == [(1, 1, 0), (1, 1, 1)]
    # wikipedia ("other"): a context about e′
    assert sources(P, b, 0, "wikipedia") == [(1, CONTEXT, 0)]
    # same_template (cprobe's earlier source): the base's own template about e′
    assert sources(P, b, 0, "same_template") == [(1, 0, 1)]


def test_isolate_sources_need_only_another_value_of_the_queried_attribute():
    P = prompts(wrong={(3, 0, 1)})
    # base: entity 0 (A = 0, B = 0) querying B on template 0: e′ with B ≠ 0 are 1 and 2 (2 shares A = 0: RAVEL does not
    # ask A to differ there); 3 and 4 share B; the model's answers about e′ are not asked
    b = row(P, 0, 1, 0)
    assert sources(P, b, 0, "attribute") == [(1, 1, 0), (1, 1, 1), (2, 1, 0), (2, 1, 1)]
    assert sources(P, b, 0, "same_template") == [(1, 1, 0), (2, 1, 0)]
    # entity 4's A is unknown: as a base it moves nothing, as a source it has no A to carry
    assert sources(P, row(P, 4, 1, 0), 0, "attribute") == []
    assert all(e != 4 for e, _, _ in sources(P, row(P, 1, 1, 0), 0, "attribute"))


def test_a_base_the_model_gets_wrong_has_no_source():
    P = prompts(wrong={(0, 0, 1)})
    assert sources(P, row(P, 0, 0, 1), 0, "attribute") == []


def test_labels_that_agree_on_the_read_tokens_do_not_pair():
    class Shared(Labels):
        def __getitem__(self, key):
            return (0, -1) if key[2] in (0, 1) else (key[2], -1)  # values 0 and 1 read the same tokens

    P = prompts()
    rows, _ = eligible(P, VALUE, Shared(), 0, row(P, 0, 0, 0), "attribute", np.arange(5), np.ones(len(P.entity), bool),
                       P.lookup())
    assert len(rows) == 0


def test_pairs_take_at_most_n_per_queried_attribute_and_kind_and_count_the_bases():
    P = prompts()
    got = pairs(P, VALUE, Labels(), 0, [0, 1], ["attribute", "same_template"], "scored", 3, np.random.default_rng(0), 10)
    assert len(got) == 2 * 2 * 3
    for q in (0, 1):
        for k in (KINDS.index("attribute"), KINDS.index("same_template")):
            assert ((got.queried == q) & (got.kind == k)).sum() == 3
    # Cause: bases are the A prompts of entities 0..3 (8), each with a source; wanted = e′'s A
    cause = got.queried == 0
    assert got.candidates[0, KINDS.index("attribute")] == 8
    np.testing.assert_array_equal(got.wanted_value[cause], VALUE[P.entity[got.source[cause]], 0])
    np.testing.assert_array_equal(got.src_a[cause], VALUE[P.entity[got.source[cause]], 0])
    # Isolate: wanted = the base's own B
    np.testing.assert_array_equal(got.wanted_value[~cause], VALUE[P.entity[got.base[~cause]], 1])
    # the templates are interleaved: the first bases of a (queried, kind) come from both templates
    first = got.base[(got.queried == 0) & (got.kind == KINDS.index("attribute"))][:2]
    assert set(P.template[first]) == {0, 1}


def test_sources_are_drawn_balanced_over_their_labels():
    """The reference weighs a candidate by 1 / (b + c), c its label's count among the candidates (b = 10 in the entity
    split, 20 in the context split)."""
    labels = np.array([1] * 9 + [2])
    p = balanced(labels, 10)
    np.testing.assert_allclose(p[:9], 1 / 19 / (9 / 19 + 1 / 11))
    np.testing.assert_allclose(p[9], 1 / 11 / (9 / 19 + 1 / 11))
    np.testing.assert_allclose(balanced(labels, 0)[9], 0.5)  # b = 0: every label weighs the same in sum


def _data(entity_split=None, template_split=None, contexts=None):
    ents = {f"c{i}": {"A": str(i % 2), "B": str(i % 3)} for i in range(8)}
    temps = {"A": ("%s a", "%s aa", "%s aaa"), "B": ("%s b", "%s bb")}
    return RavelData("t", "t", ents, temps, entity_split=entity_split, template_split=template_split,
                     contexts=contexts)


def test_the_entity_split_fits_on_train_entities_and_scores_the_eval_split_on_train_templates():
    es = {f"c{i}": ("train", "train", "train", "test", "test", "val", "val", "train")[i] for i in range(8)}
    ts = {"%s a": "train", "%s aa": "test", "%s aaa": "train", "%s b": "train", "%s bb": "val"}
    ctx = (Context("x %s", "train", None), Context("y %s", "test", "c3"), Context("z %s", "val", None))
    fit, ev = parts(_data(es, ts, ctx), ["A", "B"], "entity", "test", 0.5, None, None, np.random.default_rng(0))
    assert fit.entities.tolist() == [0, 1, 2, 7] and ev.entities.tolist() == [3, 4]
    assert fit.templates == ev.templates == {0: [0, 2], 1: [0]}
    assert fit.contexts == [0] and ev.contexts == [1]
    # caps: seeded subsets of each part
    fit2, _ = parts(_data(es, ts, ctx), ["A", "B"], "entity", "test", 0.5, 2, 1, np.random.default_rng(0))
    assert len(fit2.entities) == 2 and set(fit2.entities) <= {0, 1, 2, 7} and len(fit2.templates[0]) == 1


def test_the_context_split_fits_on_train_templates_and_scores_the_eval_templates_on_train_entities():
    es = {f"c{i}": ("train", "train", "train", "test", "test", "val", "val", "train")[i] for i in range(8)}
    ts = {"%s a": "train", "%s aa": "test", "%s aaa": "val", "%s b": "train", "%s bb": "test"}
    fit, ev = parts(_data(es, ts), ["A", "B"], "context", "test", 0.5, None, None, np.random.default_rng(0))
    assert fit.entities.tolist() == ev.entities.tolist() == [0, 1, 2, 7]
    assert fit.templates == {0: [0], 1: [0]} and ev.templates == {0: [1], 1: [1]}


def test_without_split_files_the_parts_are_drawn():
    fit, ev = parts(_data(), ["A", "B"], "entity", "test", 0.5, None, None, np.random.default_rng(0))
    assert sorted(fit.entities.tolist() + ev.entities.tolist()) == list(range(8)) and len(fit.entities) == 4
    fit, ev = parts(_data(), ["A", "B"], "context", "test", 0.5, None, None, np.random.default_rng(0))
    assert all(not set(fit.templates[a]) & set(ev.templates[a]) for a in (0, 1))
    with pytest.raises(Exception, match="two templates or more"):
        parts(RavelData("t", "t", _data().entities, {"A": ("%s a",), "B": ("%s b", "%s bb")}), ["A", "B"], "context",
              "test", 0.5, None, None, np.random.default_rng(0))
