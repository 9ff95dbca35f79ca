"""MIB's tasks built offline (cprobe.data.mib): causal models, counterfactual kinds, labels, positions and checkers,
hand-checked against MIB's task definitions."""

from __future__ import annotations

import random

import pytest

from cprobe.data import mib as M
from cprobe.errors import ConfigError, DataError
from tests.conftest import needs_shared

RAVEL_FILES = {"cities": "ravel/ravel_city_entity_attributes.json", "n_cities": 30}


def _mcqa_inputs(**over):
    x = {"question": ("yellow", "banana"), "symbol0": "Q", "symbol1": "W", "symbol2": "E", "symbol3": "R",
         "choice0": "red", "choice1": "yellow", "choice2": "blue", "choice3": "green"}
    return {**x, **over}


def test_mcqa_causal_model_and_interchange_labels_by_hand():
    t = M.build_task("mcqa")
    base = _mcqa_inputs()
    assert t.model.run(base)["answer_pointer"] == 1 and t.model.run(base)["answer"] == " W"
    # the source's right answer sits at position 3, with other letters
    src = _mcqa_inputs(choice1="red", choice0="pink", choice3="yellow", symbol0="A", symbol1="B", symbol2="C",
                       symbol3="D")
    assert t.label(base, src, "answer_pointer") == " R"  # the base's letter at the source's position
    assert t.label(base, src, "answer") == " D"  # the source's letter itself
    with pytest.raises(ConfigError, match=r"unknown variable 'colour' of MIB task 'mcqa'; choose from"):
        t.label(base, src, "colour")


def test_mcqa_prompt_regions_end_at_the_right_letter_and_its_period():
    t = M.build_task("mcqa")
    item = t.item(_mcqa_inputs(), "x")
    assert item.text == ("Question: The banana is yellow. What color is the banana?\nQ. red\nW. yellow\nE. blue\n"
                         "R. green\nAnswer:")
    assert item.regions[1] == "W" and item.regions[2] == "." and item.outcome == " W"
    assert [t.position(p) for p in t.positions] == ["region:1", "region:2", "last"]


@pytest.mark.parametrize("kind", ["answerPosition", "randomLetter", "answerPosition_randomLetter"])
def test_mcqa_counterfactual_kinds(kind):
    t = M.build_task("mcqa")
    for p in M.pairs(t, kind, 20, 3):
        b, s = p.base_inputs, p.source_inputs
        rb, rs = t.model.run(b), t.model.run(s)
        letters_b = [b[f"symbol{i}"] for i in range(4)]
        letters_s = [s[f"symbol{i}"] for i in range(4)]
        assert rb["answer_pointer"] is not None and rs["answer_pointer"] is not None
        assert s["question"] == b["question"]
        if kind == "answerPosition":  # the right choice moved, the letters kept
            assert letters_s == letters_b and rs["answer_pointer"] != rb["answer_pointer"]
        elif kind == "randomLetter":  # four new letters, the choices kept
            assert not set(letters_s) & set(letters_b)
            assert [s[f"choice{i}"] for i in range(4)] == [b[f"choice{i}"] for i in range(4)]


def test_pairs_are_seeded():
    t = M.build_task("mcqa")
    a = [p.base.text + p.source.text for p in M.pairs(t, "randomLetter", 5, 7)]
    assert a == [p.base.text + p.source.text for p in M.pairs(t, "randomLetter", 5, 7)]
    assert a != [p.base.text + p.source.text for p in M.pairs(t, "randomLetter", 5, 8)]


def test_arithmetic_ones_carry_flips_the_carry_and_keeps_the_tens():
    t = M.build_task("arithmetic")
    for p in M.pairs(t, "ones_carry", 50, 0):
        b, s = p.base_inputs, p.source_inputs
        assert t.model.run(b)["ones_carry"] != t.model.run(s)["ones_carry"]
        assert (b["op1_tens"], b["op2_tens"]) == (s["op1_tens"], s["op2_tens"])
        assert 10 <= 10 * b["op1_tens"] + b["op1_ones"] <= 99
    base = {"op1_tens": 4, "op1_ones": 9, "op2_tens": 5, "op2_ones": 7}  # 49 + 57 = 106
    src = {"op1_tens": 4, "op1_ones": 3, "op2_tens": 5, "op2_ones": 3}  # no carry
    assert t.output(t.model.run(base)) == "106" and t.label(base, src, "ones_carry") == "096"
    assert t.item(base, "x").regions == ("Q: How much is 49 plus 57", "? A: ")


def test_checkers_as_mib_writes_them():
    arith = M.build_task("arithmetic").check
    assert arith("96 is it", "096") and arith("096", "096") and not arith("97", "096") and not arith("no", "1")
    mcqa = M.build_task("mcqa").check
    assert mcqa(" W", " W") and mcqa("W", " W") and not mcqa(" Q", " W")
    assert M._ravel_check(" the United States", " United States") and M._ravel_check(" us", " United States")
    assert M._ravel_check(" Korea", " South Korea") and not M._ravel_check(" France", " Spain")


def test_ioi_kinds_rearrange_the_base_names():
    t = M.build_task("ioi")
    for kind, (a, b, c) in M.IOI_KINDS.items():
        p = M.pairs(t, kind, 1, 0)[0]
        x, y = p.base_inputs, p.source_inputs
        assert x["name_C"] == x["name_A"] != x["name_B"]
        assert (y["name_A"], y["name_B"], y["name_C"]) == (x[a], x[b], x[c])
        assert p.base.regions[0].endswith(x["name_C"]) and p.base.outcome == " " + x["name_B"]
    p = M.pairs(t, "s2_io_flip", 1, 0)[0]  # the source's output is the base's subject
    assert t.label(p.base_inputs, p.source_inputs, "output_token") == " " + p.base_inputs["name_A"]
    assert t.label(p.base_inputs, p.source_inputs, "output_position") == " " + p.base_inputs["name_B"]


def test_ravel_prompts_and_isolate_labels(tmp_path):
    cities = {"Paris": {"Continent": "Europe", "Country": "France", "Language": "French"},
              "Tokyo": {"Continent": "Asia", "Country": "Japan", "Language": "Japanese"},
              "Lima": {"Continent": "South America", "Country": ""}}
    f = tmp_path / "cities.json"
    f.write_text(__import__("json").dumps(cities))
    t = M.build_task("ravel", {"cities": str(f)})  # Lima has no Country: left out
    base = {"entity": "Paris", "queried_attribute": "Country"}
    assert t.item(base, "b").regions == ("Q: What is the country of ", "Paris", "? A:")
    assert t.label(base, {"entity": "Tokyo", "queried_attribute": "wikipedia"}, "Country") == " Japan"
    assert t.label(base, {"entity": "Tokyo", "queried_attribute": "Language"}, "Continent") == " France"
    p = M.pairs(t, "wikipedia", 1, 0)[0]
    assert p.source.text.startswith("Q: What is ") and p.source.outcome == ""


def test_bad_input_is_one_line():
    with pytest.raises(ConfigError, match=r"^unknown MIB task 'mcq'; choose from \['arc', 'arithmetic', 'ioi', "):
        M.build_task("mcq")
    with pytest.raises(ConfigError, match=r"^unknown token position 'entity' of MIB task 'mcqa'"):
        M.check_names("mcqa", positions=["entity"])
    with pytest.raises(ConfigError, match=r"^unknown counterfactual kind 'random' of MIB task 'mcqa'"):
        M.check_names("mcqa", kinds=["random"])
    with pytest.raises(ConfigError, match=r"set mib.files.ravel.cities"):
        M.build_task("ravel")
    with pytest.raises(DataError, match=r"no file"):
        M.build_task("arc", {"path": "/no/such.jsonl"})


def test_arc_rows_from_a_file(tmp_path):
    f = tmp_path / "arc.jsonl"
    f.write_text('{"question": "Which is hot?", "choices": {"text": ["ice", "sun", "snow", "rain"], '
                 '"label": ["A", "B", "C", "D"]}, "answerKey": "B"}\n'
                 '{"question": "Three?", "choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]}, '
                 '"answerKey": "A"}\n')
    t = M.build_task("arc", {"path": str(f)})
    p = M.pairs(t, "answerPosition_randomLetter", 1, 0)[0]
    assert p.base.outcome == " B" and p.base.regions[1] == "B"
    rs = t.model.run(p.source_inputs)
    assert rs["answer_pointer"] != 1 and p.source_inputs[f"choice{rs['answer_pointer']}"] == "sun"


@needs_shared("ravel", "ravel_city_entity_attributes.json")
def test_corpus_sentences_end_with_the_expected_output():
    from tests.conftest import SHARED_DATA

    data_root = SHARED_DATA
    sents = M.corpus({"seed": 0, "tasks": {"mcqa": {"n": 6}, "ravel": {"n": 4, **RAVEL_FILES}}}, data_root)
    assert len(sents) == 10
    assert all(s.split("\nAnswer:")[1] in {f" {a}" for a in M.ALPHABET} for s in sents[:6])
    assert sents == M.corpus({"seed": 0, "tasks": {"mcqa": {"n": 6}, "ravel": {"n": 4, **RAVEL_FILES}}}, data_root)


def test_region_of_matches_every_sample():
    rng = random.Random(0)
    for name in ("mcqa", "arithmetic", "ioi"):
        t = M.build_task(name)
        for kind in t.kinds:
            b, s = t.sample(kind, rng)
            assert t.render(b)[1] == t.render(s)[1]  # the region names do not depend on the sample
