"""Structural causal models (LIBERTy): declaration and validation, the sampler against every equation, do(),
abduction–action–prediction counterfactuals and the Monte-Carlo true effects against the paper's Table 17."""

from __future__ import annotations

import numpy as np
import pytest

from cprobe.data.scm import SCM, Noise, true_effects
from cprobe.errors import ConfigError


def tiny(**over) -> dict:
    d = {"name": "tiny", "label": "y", "variables": {
        "a": {"values": ["lo", "hi"], "distribution": [0.3, 0.7]},
        "b": {"values": ["0", "1", "2"], "terms": {"a": 1.2}, "noise": {"mean": 0.1, "sd": 0.4}},
        "y": {"values": ["n", "p"], "intercept": -0.4, "terms": {"b": 0.5, "a=hi": 0.3}, "noise": {"sd": 0.2}},
    }}
    d.update(over)
    return d


# ----------------------------------------------------------------------------------------------- declaration
def test_built_in_scms_load_in_topological_order():
    for name, label, n in (("cv", "quality", 9), ("violence", "violence", 8), ("disease", "disease", 8)):
        scm = SCM.load(name)
        assert scm.label == label and len(scm.variables) == n and scm.label not in scm.concepts
        seen: set[str] = set()
        for k, v in scm.variables.items():
            assert set(v.parents) <= seen, k
            seen.add(k)
    cv = SCM.load("cv")
    assert cv.descendants("gender") == ("education", "socioeconomic", "experience", "volunteering", "certificates",
                                        "quality")
    assert cv.descendants("quality") == () and SCM.load("disease").null_value == "Absent"
    assert SCM.load("disease").descendants("light_sensitivity") == ("headache",)


@pytest.mark.parametrize("patch, message", [
    ({"b": {"values": ["0", "1"], "terms": {"c": 1.0}}}, "variable 'b': unknown parent 'c'"),
    ({"y": {"values": ["n", "p"], "terms": {"a=mid": 1.0}}}, "variable 'y': indicator 'a=mid': 'mid' is not a value of 'a'"),
    ({"y": {"values": ["n", "p"], "terms": {"a=2": 1.0}}}, "'2' is not a value of 'a'"),
    ({"a": {"values": ["lo", "hi"], "distribution": [0.5, 0.6]}}, "variable 'a': distribution [0.5, 0.6] must be"),
    ({"a": {"values": ["lo", "hi"], "distribution": [1.0]}}, "variable 'a': distribution must be `uniform` or 2"),
    ({"a": {"values": ["lo"], "distribution": "uniform"}}, "variable 'a' needs `values:`"),
    ({"a": {"values": ["lo", "hi"]}}, "variable 'a': give either `distribution:`"),
    ({"b": {"values": ["0", "1"], "terms": {"a": 1.0}, "noise": {"mean": 0, "sd": -1}}}, "noise sd must be >= 0"),
    ({"b": {"values": ["0", "1"], "terms": {"a": 1.0}, "noize": {}}}, "variable 'b': unknown key(s) ['noize']"),
    ({"b": {"values": ["0", "0"], "terms": {"a": 1.0}}}, "variable 'b' lists a value twice"),
    ({"b": {"values": ["0", "1"], "terms": {"a": "x"}}}, "the weight of 'a' must be a number"),
])
def test_a_malformed_declaration_is_one_line_naming_the_variable(patch, message):
    d = tiny()
    d["variables"] = {**d["variables"], **patch}
    with pytest.raises(ConfigError) as e:
        SCM.from_dict(d)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_cycle_and_an_unknown_label_are_errors():
    d = tiny()
    d["variables"]["a"] = {"values": ["lo", "hi"], "terms": {"y": 1.0}}
    with pytest.raises(ConfigError, match=r"cycle: (a → b → y → a|b → y → a → b|y → a → b → y)"):
        SCM.from_dict(d)
    with pytest.raises(ConfigError, match="label 'z' is not a variable"):
        SCM.from_dict(tiny(label="z"))
    with pytest.raises(ConfigError, match="unknown SCM 'cvv'; choose from .*'cv'"):
        SCM.load("cvv")


def test_noise_may_be_given_as_a_variance():
    d = tiny()
    d["variables"]["b"]["noise"] = {"mean": 0.1, "var": 0.16}
    assert SCM.from_dict(d).variables["b"].noise_sd == pytest.approx(0.4)


# ----------------------------------------------------------------------------------------------- the sampler
def _by_hand(scm: SCM, noise: Noise, values: dict[str, np.ndarray], key: str) -> np.ndarray:
    """An independent evaluation of one equation: min(m−1, max(0, round(intercept + Σ w·term + ε)))."""
    v = scm.variables[key]
    out = []
    for i in range(len(noise)):
        z = v.intercept + noise.eps[key][i]
        for t in v.terms:
            x = values[t.parent][i]
            z += t.weight * (float(x == t.level) if t.level is not None else float(x))
        out.append(min(len(v.values) - 1, max(0, int(np.floor(z + 0.5)))))
    return np.array(out)


@pytest.mark.parametrize("name", ["cv", "violence", "disease"])
def test_the_sampler_matches_every_equation(name):
    scm = SCM.load(name)
    values, noise = scm.sample(3000, seed=1)
    for key, v in scm.variables.items():
        if v.is_root:
            freq = np.bincount(values[key], minlength=len(v.values)) / 3000
            np.testing.assert_allclose(freq, v.distribution, atol=0.035)
        else:
            np.testing.assert_array_equal(values[key], _by_hand(scm, noise, values, key))
            assert abs(noise.eps[key].mean() - v.noise_mean) < 0.05 and abs(noise.eps[key].std() - v.noise_sd) < 0.05


def test_a_hand_computed_unit():
    scm = SCM.from_dict(tiny())
    noise = Noise({"a": np.array([0.2, 0.9])}, {"b": np.array([0.35, -0.3]), "y": np.array([0.0, 0.05])})
    v = scm.solve(noise)
    # unit 0: u=0.2 < 0.3 → a=lo(0); b = round(0 + 0.35) = 0; y = round(−0.4 + 0 + 0 + 0) = 0
    # unit 1: a=hi(1); b = round(1.2 − 0.3) = 1; y = round(−0.4 + 0.5 + 0.3 + 0.05) = round(0.45) = 0
    assert v["a"].tolist() == [0, 1] and v["b"].tolist() == [0, 1] and v["y"].tolist() == [0, 0]
    cf = scm.counterfactual(noise, {"b": 2})  # y = round(−0.4 + 1.0 + 0.3·a + ε): unit 0 0.6 → 1, unit 1 0.95 → 1
    assert cf["b"].tolist() == [2, 2] and cf["y"].tolist() == [1, 1] and cf["a"].tolist() == [0, 1]


def test_do_cuts_the_parents_and_keeps_the_non_descendants():
    scm = SCM.load("cv")
    values, noise = scm.sample(2000, seed=2)
    cut = scm.solve(noise, {"education": "Doctorate"})
    assert (cut["education"] == 3).all()  # whatever race, age and gender say
    for k in ("race", "gender", "age"):
        np.testing.assert_array_equal(cut[k], values[k])
    for k in scm.descendants("education"):  # re-solved from the new education with the same noise
        np.testing.assert_array_equal(cut[k], _by_hand(scm, noise, cut, k))
    assert (cut["quality"] != values["quality"]).any()
    with pytest.raises(ConfigError, match="do\\(education\\): 'PhD' is not a value of 'education'"):
        scm.solve(noise, {"education": "PhD"})
    with pytest.raises(ConfigError, match="unknown variable 'salary'"):
        scm.solve(noise, {"salary": 1})


@pytest.mark.parametrize("name", ["cv", "violence", "disease"])
def test_a_counterfactual_to_the_factual_value_reproduces_the_unit(name):
    scm = SCM.load(name)
    values, noise = scm.sample(500, seed=3)
    saved = {k: v.copy() for k, v in noise.eps.items()}
    for c in scm.concepts:
        same = scm.counterfactual(noise, {c: values[c]})
        for k in scm.variables:
            np.testing.assert_array_equal(same[k], values[k])
    for k, v in saved.items():  # abduction reuses the stored noise and never redraws it
        np.testing.assert_array_equal(noise.eps[k], v)
    # one unit's noise round-trips through its stored (JSON-able) row
    one = Noise.from_rows([noise.row(7)])
    for k in scm.variables:
        assert scm.solve(one)[k][0] == values[k][7]


# ----------------------------------------------------------------------------------------------- true effects
def test_true_effect_by_hand():
    # y copies a exactly: changing a always flips y → Σ|Δ onehot| = 2; b is not an ancestor of y → 0
    scm = SCM.from_dict({"name": "copy", "label": "y", "variables": {
        "a": {"values": ["0", "1"], "distribution": "uniform"},
        "b": {"values": ["0", "1"], "distribution": "uniform"},
        "y": {"values": ["0", "1"], "terms": {"a": 1.0}}}})
    assert true_effects(scm, 2000) == {"a": 2.0, "b": 0.0}


PAPER = {  # Toker et al. Table 17 "True Effect"
    "cv": {"race": .636, "gender": .369, "age": .913, "education": 1.357, "socioeconomic": .209, "volunteering": .586,
           "experience": .866, "certificates": .599},
    "violence": {"race": .484, "gender": 1.271, "age": 1.154, "seniority": .560, "department": 1.232,
                 "license": .572, "tenure": .613},
}


@pytest.mark.parametrize("name", ["cv", "violence"])
def test_monte_carlo_true_effects_reproduce_the_papers_table_17(name):
    effects = true_effects(SCM.load(name), 200_000, seed=0)
    for concept, paper in PAPER[name].items():
        if (name, concept) == ("violence", "age"):  # the printed equations give 0.84 (docs/liberty.md)
            assert effects[concept] == pytest.approx(0.84, abs=0.02)
            continue
        assert effects[concept] == pytest.approx(paper, abs=0.05), concept
    ranked = sorted(effects, key=effects.get, reverse=True)
    assert ranked[0] == ("education" if name == "cv" else "gender")


# the printed equations (digest B.4 = the paper's Tables 7–9): (intercept, {term: weight}, noise mean, noise sd)
PRINTED = {
    "cv": {"education": (0, {"race": .4, "age": .4, "gender": .4}, .35, .5),
           "socioeconomic": (0, {"education": .45, "age": .25}, .25, .35),
           "experience": (0, {"age": .5, "education": .3}, 0, .5),
           "volunteering": (0, {"education": .2, "socioeconomic": .3}, -.35, .2),
           "certificates": (0, {"education": .15, "experience": .15}, 0, .3),
           "quality": (0, {"education": .3, "volunteering": .3, "certificates": .3, "experience": .3}, 0, .3)},
    "violence": {"tenure": (0, {"age": .8}, .05, .5),
                 "license": (0, {"gender": .3, "race": .3, "age": .2}, 0, .5),
                 "department": (0, {"gender": .5, "race": .4, "age": .4}, .2, .5),
                 "seniority": (0, {"age": .4, "gender": .1, "race": .1, "tenure": .3, "license": .3}, 0, .5),
                 "violence": (.8, {"gender": .5, "department": .5, "age": -.2, "race": -.2, "license": -.2,
                                   "tenure": -.2, "seniority": -.2}, .3, .2)},
    "disease": {"dizziness": (0, {"disease=0": .9}, -.1, .6), "light_sensitivity": (0, {"disease=0": .9}, .2, .5),
                "nasal_congestion": (0, {"disease=1": .7, "disease=2": .4}, 0, .7),
                "facial_pain": (0, {"disease=1": .8}, .2, .6),
                "fever": (0, {"disease=1": .4, "disease=2": .6}, 0, .6),
                "weakness": (0, {"disease=2": .7}, .2, .6),
                "headache": (0, {"disease=0": .7, "disease=1": .4, "light_sensitivity": .3, "nasal_congestion": .3},
                             -.1, .5)},
}
ROOTS = {"cv": {"race": [.25] * 4, "gender": [.5, .5], "age": [.25, .5, .25]},
         "violence": {"gender": [.5, .5], "age": [.25, .5, .25], "race": [.25] * 4},
         "disease": {"disease": [1 / 3] * 3}}


@pytest.mark.parametrize("name", ["cv", "violence", "disease"])
def test_the_built_in_scms_are_the_papers_printed_equations(name):
    scm = SCM.load(name)
    assert set(scm.variables) == set(PRINTED[name]) | set(ROOTS[name])
    for key, probs in ROOTS[name].items():
        assert scm.variables[key].distribution == pytest.approx(tuple(probs))
    for key, (intercept, terms, mean, sd) in PRINTED[name].items():
        v = scm.variables[key]
        got = {t.parent + ("" if t.level is None else f"={t.level}"): t.weight for t in v.terms}
        assert got == pytest.approx(terms) and v.intercept == intercept, key
        assert (v.noise_mean, v.noise_sd) == pytest.approx((mean, sd)), key
    sizes = {"cv": [4, 2, 3, 4, 3, 3, 2, 2, 3], "violence": [2, 3, 4, 3, 3, 4, 4, 3], "disease": [3] * 8}
    assert [len(v.values) for v in scm.variables.values()] == sizes[name]


def test_more_malformed_declarations_are_one_line_errors():
    from cprobe.data.realiser import TemplateRealiser

    with pytest.raises(ConfigError, match="label \\['y'\\] is not a variable"):
        SCM.from_dict(tiny(label=["y"]))
    d = tiny()
    d["variables"]["b"]["noise"] = 0
    with pytest.raises(ConfigError, match="variable 'b': noise must be"):
        SCM.from_dict(d)
    text = {"expresses": ["a"], "openings": ["Hi."], "closings": ["Bye."], "personas": ["I knit."],
            "phrases": ["It is lo."]}
    with pytest.raises(ConfigError, match="text.phrases must map"):
        TemplateRealiser(SCM.from_dict(tiny(text=text)))
    with pytest.raises(ConfigError, match="text.expresses must list"):
        TemplateRealiser(SCM.from_dict(tiny(text={**text, "expresses": "ab"})))
