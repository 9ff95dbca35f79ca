"""RAVEL's data (cprobe.data.ravel): RAVEL's own files read by ``dataset=ravel`` (small files the tests write), the
fact world as entities × attributes, the one-line refusals, and a prompt as a region-aligned item."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cprobe.data.fact_world import FactWorldKeys, generate_world
from cprobe.data.ravel import (ENTITY_SLOT, Context, RavelKeys, answer_text, from_fact_world, load_ravel, prompt_item,
                               template_style)
from cprobe.data.registry import load_dataset
from cprobe.errors import DataError

CITIES = {"Paris": {"Country": "France", "Continent": "Europe", "Language": "French"},
          "Lyon": {"Country": "France", "Continent": "Europe", "Language": ""},  # unknown: skipped
          "Tokyo": {"Country": "Japan", "Continent": "Asia", "Language": "Japanese"},
          "Osaka": {"Country": "Japan", "Continent": "Asia", "Language": "Japanese"}}
PROMPTS = {"Country": ["%s is a city in the country of", "The country of %s is"],
           "Continent": ["%s is a city on the continent of"], "Language": ["People in %s speak"]}


def write_ravel(root: Path, entities: dict = CITIES, prompts: dict = PROMPTS, kind: str = "city",
                entity_split: dict | None = None, prompt_split: dict | None = None, contexts: dict | None = None) -> Path:
    """RAVEL's files in ``root/ravel``: the two required ones, and the split files and Wikipedia contexts where given."""
    base = root / "ravel"
    base.mkdir(parents=True, exist_ok=True)
    (base / f"ravel_{kind}_entity_attributes.json").write_text(json.dumps(entities))
    (base / f"ravel_{kind}_attribute_to_prompts.json").write_text(json.dumps(prompts))
    for name, content in ((f"ravel_{kind}_entity_to_split.json", entity_split),
                          (f"ravel_{kind}_prompt_to_split.json", prompt_split),
                          (f"wikipedia_{kind}_entity_prompts.json", contexts)):
        if content is not None:
            (base / name).write_text(json.dumps(content))
    return base


def test_ravel_files_are_read_by_path_and_entity_type(tmp_path):
    write_ravel(tmp_path)
    data = load_dataset({"name": "ravel", "type": "ravel", "path": "ravel", "entity_type": "city"}, tmp_path)
    assert data.attributes == ["Country", "Continent", "Language"]
    assert data.entities["Lyon"] == {"Country": "France", "Continent": "Europe"}  # the empty value is unknown
    assert data.values("Country") == ["France", "Japan"] and data.values("Language") == ["French", "Japanese"]
    assert data.templates["Country"] == ("%s is a city in the country of", "The country of %s is")
    picked = load_ravel(RavelKeys(path=str(tmp_path / "ravel"), attributes=["Language", "Country"]), Path("/none"))
    assert picked.attributes == ["Language", "Country"]  # an absolute path needs no data dir
    country = load_ravel(RavelKeys(path=str(tmp_path / "ravel"), attributes=["Country"]), Path("/none"))
    sub = country.subsample(3, seed=0)  # dataset.max_examples: entities, seeded, order kept
    assert len(sub.entities) == 3 and list(sub.entities) == [e for e in CITIES if e in sub.entities]
    assert country.subsample(9) is country


@pytest.mark.parametrize("entities, prompts, message", [
    ({**CITIES, "Tokyo": {**CITIES["Tokyo"], "Continent": "Europe"},
      "Osaka": {**CITIES["Osaka"], "Continent": "Europe"}}, PROMPTS,
     "attribute 'Continent' has 1 value ('Europe') among its entities; Cause and Isolate need two or more"),
    (CITIES, {**PROMPTS, "Language": ["People speak"]}, "must hold the entity slot %s exactly once"),
    (CITIES, {**PROMPTS, "Language": []}, "attribute 'Language' has no prompt template"),
])
def test_bad_ravel_files_are_one_line(tmp_path, entities, prompts, message):
    write_ravel(tmp_path, entities, prompts)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        load_ravel(RavelKeys(), tmp_path)
    assert "\n" not in str(e.value)


def test_missing_files_and_unknown_attributes_are_named(tmp_path):
    with pytest.raises(DataError, match="ravel_city_entity_attributes.json"):
        load_ravel(RavelKeys(), tmp_path)
    write_ravel(tmp_path)
    with pytest.raises(DataError, match=r"attribute\(s\) \['Height'\] of dataset.attributes have no prompts"):
        load_ravel(RavelKeys(attributes=["Height"]), tmp_path)


def test_the_fact_world_as_entities_with_every_attribute():
    world = generate_world(FactWorldKeys(n_relations=3, n_entities=12, facts_per_relation=10, objects_per_relation=3,
                                         prompts_per_relation=2, max_aliases=1))
    data = from_fact_world(world)
    # only the subjects with a fact for every relation, each by its default name, its objects as values
    full = {f.subject for f in world.facts if sum(g.subject == f.subject for g in world.facts) == 3}
    assert len(data.entities) == len(full)
    for f in world.facts:
        if f.subject in full:
            assert data.entities[f.mentions[0]][f.relation] == f.object
    # templates: the paraphrases cut before [Y], the subject slot as RAVEL's
    assert data.templates["R01"][0] == world.relations["R01"].prompts[0].split("[Y]")[0].rstrip().replace("[X]",
                                                                                                       ENTITY_SLOT)
    with pytest.raises(DataError, match=r"relation\(s\) \['R09'\] of ravel.attributes are not in"):
        from_fact_world(world, ["R01", "R09"])


def test_a_prompt_is_three_regions_with_the_entity_in_the_middle():
    it = prompt_item("Paris", "Country", 1, "The country of %s is")
    assert it.regions == ("The country of ", "Paris", " is") and it.text == "The country of Paris is"
    assert it.region_names == ("prefix", "entity", "query") and it.meta["template"] == 1
    first = prompt_item("Paris", "Country", 0, "%s is a city in the country of")
    assert first.regions[0] == "" and first.regions[1] == "Paris"


def test_the_splits_and_the_wikipedia_contexts_are_read_where_present(tmp_path):
    es = {"Paris": "train", "Lyon": "test", "Tokyo": "val", "Osaka": "train"}
    ps = {t: "train" for ts in PROMPTS.values() for t in ts}
    ctx = {"She was born in %s in 1970.": {"split": "train", "entity": "Paris"},
           "The mayor of %s spoke": {"split": "test", "entity": None}}
    write_ravel(tmp_path, entity_split=es, prompt_split=ps, contexts=ctx)
    data = load_ravel(RavelKeys(), tmp_path)
    assert data.entity_split == es and data.template_split == ps
    assert data.contexts == (Context("She was born in %s in 1970.", "train", "Paris"),
                             Context("The mayor of %s spoke", "test", None))
    bare = load_ravel(RavelKeys(path=str(write_ravel(tmp_path / "bare"))), Path("/none"))
    assert bare.entity_split is None and bare.template_split is None and bare.contexts is None
    assert bare.files["contexts"].endswith("wikipedia_city_entity_prompts.json")  # where it would be read


@pytest.mark.parametrize("extra, message", [
    ({"entity_split": {"Paris": "dev"}}, "'Paris' is in split 'dev'; RAVEL's splits are"),
    ({"contexts": {"no slot here": {"split": "train", "entity": None}}}, "must hold the entity slot %s exactly once"),
    ({"contexts": {"x %s": "train"}}, "must map to"),
])
def test_bad_split_and_context_files_are_one_line(tmp_path, extra, message):
    write_ravel(tmp_path, **extra)
    with pytest.raises(DataError, match=message.replace("(", r"\(")) as e:
        load_ravel(RavelKeys(), tmp_path)
    assert "\n" not in str(e.value)


def test_the_value_follows_a_json_style_template_with_no_space():
    """RAVEL's JSON-style templates end in a quote or an opening bracket: the model writes the value right after."""
    assert answer_text(' "continent": "Asia"}, {"city": "%s", "country": "', "France") == "France"
    assert answer_text("The latitude of %s is (", "49") == "49"
    assert answer_text("SF has a latitude of 37.7749° N. %s has a latitude of ", "49") == "49"
    assert answer_text("%s is a city in the country of", "France") == " France"
    assert answer_text("Photo taken in %s,", "France") == " France"
    assert answer_text("Bangkok: Asia/Bangkok. %s:", "Europe/Paris") == " Europe/Paris"
    assert [template_style(t) for t in ('{"city": "%s", "lat": "', "The latitude of %s is (", "%s is in")] == \
        ["json", "json", "text"]
