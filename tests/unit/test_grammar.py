"""The agreement grammar's labels are exact, balanced and reproducible."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from cprobe.data.base import NONE
from cprobe.data.grammar import (
    COPULAS,
    FRAME_VERBS,
    INTRANSITIVE,
    NOUNS,
    PERFECT,
    STRUCTURES,
    TRANSITIVE,
    GrammarConfig,
    generate,
    vocabulary,
)
from cprobe.errors import ConfigError

NUMBER = {form: num for sg, pl in NOUNS for form, num in ((sg, "sg"), (pl, "pl"))}
VERB_NUMBER = {
    form: num
    for sg, pl in (*COPULAS, *PERFECT, *TRANSITIVE, *INTRANSITIVE, *FRAME_VERBS)
    for form, num in ((sg, "sg"), (pl, "pl"))
}
# Index of the subject noun in each template's words (the noun the main verb agrees with).
SUBJECT = {"simple": 1, "pp": 1, "pp_pp": 1, "subj_rel": 1, "obj_rel": 1, "intro_pp": 5, "frame": 5, "frame_pp": 5}


@pytest.fixture(scope="module")
def data():
    return generate(GrammarConfig(n_sentences=3000, seed=3))


def test_every_structure_is_covered(data):
    assert set(SUBJECT) == set(STRUCTURES)
    assert {e.props["structure"] for e in data.examples} == set(STRUCTURES)


def test_z_c_is_the_subject_number_and_the_verb_agrees(data):
    for e in data.examples:
        subject = e.words[SUBJECT[e.props["structure"]]]
        assert e.words[SUBJECT[e.props["structure"]] - 1] == "the"
        assert e.props["z_c"] == NUMBER[subject], e.sentence()
        assert e.words[e.target] == e.correct
        assert VERB_NUMBER[e.correct] == e.props["z_c"] != VERB_NUMBER[e.wrong], e.sentence()
        assert {e.correct, e.wrong} in [{sg, pl} for sg, pl in (*COPULAS, *PERFECT, *TRANSITIVE, *INTRANSITIVE)]


def test_z_e_is_the_closest_preceding_noun_unless_it_is_the_subject(data):
    for e in data.examples:
        subject = SUBJECT[e.props["structure"]]
        nouns = [i for i, w in enumerate(e.prefix) if w in NUMBER]
        closest = nouns[-1]
        expected = NONE if closest == subject else NUMBER[e.words[closest]]
        assert e.props["z_e"] == expected, e.sentence()
        between = [i for i in nouns if subject < i]
        assert e.props["n_attractors"] == str(len(between)), e.sentence()
        assert (e.props["z_e"] == NONE) == (len(between) == 0)


def test_subject_is_not_always_the_first_noun(data):
    late = [e for e in data.examples if e.words[1] in NUMBER and e.words[SUBJECT[e.props["structure"]]] != e.words[1]]
    first_noun_agrees = sum(NUMBER[e.words[1]] == e.props["z_c"] for e in late) / len(late)
    assert len(late) > len(data) / 8
    assert 0.4 < first_noun_agrees < 0.6  # reading the first noun is chance on these


def test_labels_are_balanced_and_independent(data):
    z_c = Counter(e.props["z_c"] for e in data.examples)
    assert abs(z_c["sg"] - z_c["pl"]) < 0.06 * len(data)
    with_attractor = [e for e in data.examples if e.props["z_e"] != NONE]
    joint = Counter((e.props["z_c"], e.props["z_e"]) for e in with_attractor)
    for cell in [("sg", "sg"), ("sg", "pl"), ("pl", "sg"), ("pl", "pl")]:
        assert abs(joint[cell] / len(with_attractor) - 0.25) < 0.03, joint


def test_deterministic_by_seed():
    cfg = GrammarConfig(n_sentences=200, seed=11)
    assert generate(cfg).fingerprint() == generate(cfg).fingerprint()
    assert generate(cfg).fingerprint() != generate(dataclasses.replace(cfg, seed=12)).fingerprint()


def test_words_are_lower_case_and_in_the_vocabulary(data):
    vocab = set(vocabulary(GrammarConfig(n_sentences=3000, seed=3)))
    used = {w for e in data.examples for w in e.words}
    assert used <= vocab
    assert all(w == w.lower() and " " not in w for w in vocab)
    assert vocabulary(GrammarConfig()) == sorted(vocabulary(GrammarConfig()))


def test_n_nouns_limits_the_lexicon():
    cfg = GrammarConfig(n_sentences=300, n_nouns=5)
    nouns = {w for e in generate(cfg).examples for w in e.words if w in NUMBER}
    assert nouns <= {form for pair in NOUNS[:5] for form in pair}
    assert set(vocabulary(cfg)) < set(vocabulary(GrammarConfig()))


def test_structure_mix_selects_templates_and_config_serialises():
    cfg = GrammarConfig(n_sentences=100, structures={"obj_rel": 1.0, "frame": 0.0})
    assert cfg.structures == (("obj_rel", 1.0), ("frame", 0.0))
    assert {e.props["structure"] for e in generate(cfg).examples} == {"obj_rel"}
    json.dumps(dataclasses.asdict(cfg))
    assert GrammarConfig(structures=[["pp", 1]]).structures == (("pp", 1.0),)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_sentences": 0},
        {"n_nouns": 2},
        {"n_nouns": len(NOUNS) + 1},
        {"structures": {"passive": 1.0}},
        {"structures": {"pp": -1.0}},
        {"structures": {"pp": 0.0}},
        {"structures": [("pp", 1.0), ("pp", 2.0)]},
        {"structures": ["pp"]},
    ],
)
def test_bad_config_raises_config_error(kwargs):
    with pytest.raises(ConfigError):
        GrammarConfig(**kwargs)


def test_attractor_agreement_marks_the_verb_with_the_attractor_number_only():
    """The offline Canby setting: the main verb carries a second mark agreeing with the attractor (z_e); the wrong
    form keeps that mark and flips only the subject number; sentences are otherwise those of the plain grammar."""
    from cprobe.data.grammar import ATTRACTOR_MARKS, mark

    cfg = GrammarConfig(n_sentences=600, seed=5, attractor_agreement=True)
    marked, plain = generate(cfg), generate(dataclasses.replace(cfg, attractor_agreement=False))
    vocab = set(vocabulary(cfg))
    seen = Counter()
    for m, p in zip(marked.examples, plain.examples):
        z_e = m.props["z_e"]
        assert m.props == p.props and m.target == p.target
        assert m.correct == mark(p.correct, z_e) and m.wrong == mark(p.wrong, z_e)
        assert m.words[m.target] == m.correct and m.words[: m.target] == p.words[: p.target]
        assert set(m.words) <= vocab
        seen[m.correct[-2:] if z_e != NONE else "none"] += 1
    assert mark("is", "sg") == "is_s" and mark("are", "pl") == "are_p" and mark("is", NONE) == "is"
    assert set(seen) == {*ATTRACTOR_MARKS.values(), "none"}
    assert not any(w.endswith(("_s", "_p")) for w in vocabulary(GrammarConfig()))
