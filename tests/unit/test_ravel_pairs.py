"""RAVEL's interchange pairs (cprobe.tasks.ravel._pairs) on hand-made prompts: the filter (only prompts the model
answers right), e′ with another value of the targeted attribute, the base's own template for Cause, another value of
the queried attribute for Isolate, and an unknown value never paired."""

from __future__ import annotations

import numpy as np
import torch

from cprobe.tasks.ravel import _pairs, _Prompts

# 5 entities × 2 attributes (A = 0, B = 1) × 2 templates; value[e] = (A, B); entity 4's A is unknown (−1)
VALUE = np.array([[0, 0], [1, 1], [0, 1], [1, 0], [-1, 0]])


def prompts(wrong: set[tuple[int, int, int]] = frozenset()) -> _Prompts:
    ent, att, tem = zip(*[(e, a, t) for e in range(5) for a in range(2) for t in range(2) if VALUE[e, a] >= 0])
    correct = np.array([(e, a, t) not in wrong for e, a, t in zip(ent, att, tem)])
    n = len(ent)
    return _Prompts([None] * n, np.array(ent), np.array(att), np.array(tem), torch.zeros(n, 2, dtype=torch.long),
                    torch.zeros(n, 2, dtype=torch.long), correct, {})


def test_cause_pairs_swap_in_another_value_on_the_base_template():
    P = prompts(wrong={(3, 0, 1)})  # entity 3 answers A wrong on template 1: neither base nor source there
    p = _pairs(P, VALUE, 0, np.arange(5), 10, np.random.default_rng(0), [0])
    # bases: the A prompts answered right (entities 0..3 × 2 templates, one wrong) = 7; each has a source
    assert p.candidates == {0: 7} and len(p.base) == 7
    for b, s in zip(p.base, p.source):
        eb, es = P.entity[b], P.entity[s]
        assert VALUE[es, 0] != VALUE[eb, 0] and P.template[s] == P.template[b] and P.attribute[s] == 0
        assert P.correct[b] and P.correct[s]
    np.testing.assert_array_equal(p.src_a, VALUE[P.entity[p.source], 0])
    np.testing.assert_array_equal(p.base_a, VALUE[P.entity[p.base], 0])
    # entity 0 (A = 0) on template 1 can only take entity 1: entity 3's template-1 prompt is wrong
    (row,) = [i for i, b in enumerate(p.base) if P.entity[b] == 0 and P.template[b] == 1]
    assert P.entity[p.source[row]] == 1


def test_isolate_pairs_need_another_value_of_the_queried_attribute_too():
    P = prompts()
    p = _pairs(P, VALUE, 0, np.arange(5), 10, np.random.default_rng(1), [1])
    # bases: B prompts of entities whose A is known (entity 4's is not: skipped), 2 templates each
    assert p.candidates == {1: 10} and len(p.base) == 8 and 4 not in set(P.entity[p.base])
    for b, s in zip(p.base, p.source):
        eb, es = P.entity[b], P.entity[s]
        assert VALUE[es, 0] != VALUE[eb, 0] and VALUE[es, 1] != VALUE[eb, 1] and P.attribute[s] == 0
    # (A, B): 0 = (0,0) pairs only with 1 = (1,1); 2 = (0,1) only with 3 = (1,0)
    partner = {0: 1, 1: 0, 2: 3, 3: 2}
    assert all(partner[P.entity[b]] == P.entity[s] for b, s in zip(p.base, p.source))
    np.testing.assert_array_equal(p.base_q, VALUE[P.entity[p.base], 1])


def test_at_most_n_pairs_and_only_the_pool():
    P = prompts()
    p = _pairs(P, VALUE, 0, np.array([0, 1]), 1, np.random.default_rng(0), [0, 1])
    assert len(p.base) == 2 and sorted(p.queried) == [0, 1]
    assert set(P.entity[np.concatenate([p.base, p.source])]) <= {0, 1}
