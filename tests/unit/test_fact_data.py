"""Fact datasets for prompt-bias probing: the LAMA layout read from small files the tests write, the single-token
filter over several vocabularies, cloze queries, and the generated fact world with its skewed corpora."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cprobe.data.fact_world import FRAMES, CorpusSpec, FactWorldKeys, check_world_keys, generate_world, sample_corpus
from cprobe.data.lama import LamaKeys, load_lama, object_last, queries, single_token_filter
from cprobe.models.adapter import ModelAdapter
from cprobe.errors import ConfigError, DataError
from cprobe.models.tiny import build_tokenizer


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_lama(root: Path) -> Path:
    base = root / "lama"
    write_jsonl(base / "relations.jsonl", [
        {"relation": "P19", "template": "[X] was born in [Y] .", "label": "place of birth", "type": "N-1"},
        {"relation": "P36", "template": "The capital of [X] is [Y] .", "label": "capital", "type": "1-1"},
        {"relation": "P47", "template": "[X] shares border with [Y] .", "label": "shares border", "type": "N-M"},
        {"relation": "P99", "template": "[X] likes [Y] .", "label": "no triples here", "type": "N-1"},
    ])
    write_jsonl(base / "TREx" / "P19.jsonl", [
        {"sub_uri": "Q1", "sub_label": "Albert Einstein", "obj_label": "Ulm",
         "sub_mentions": ["Einstein", "Albert Einstein", "A. Einstein", "Prof. Einstein", "Bertie", "Al"]},
        {"sub_uri": "Q2", "sub_label": "Isaac Newton", "obj_label": "Woolsthorpe"},
        {"sub_uri": "Q1", "sub_label": "Albert Einstein", "obj_label": "Munich"},  # a repeated subject: first kept
    ])
    write_jsonl(base / "TREx" / "P36.jsonl", [{"sub_label": "France", "obj_label": "Paris", "aliases": ["FR"]}])
    write_jsonl(base / "TREx" / "P47.jsonl", [{"sub_label": "France", "obj_label": "Spain"}])
    write_jsonl(base / "prompts" / "P19.jsonl", [{"pattern": "[X] was born in [Y] ."},  # the original: not twice
                                                 {"pattern": "The birthplace of [X] is [Y] ."},
                                                 {"pattern": "[X] is a native of [Y] ."}])
    return base


def test_lama_layout_is_read_with_nm_dropped_and_prompts_original_first(tmp_path):
    write_lama(tmp_path)
    d = load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    assert list(d.relations) == ["P19", "P36"]  # P47 (N-M) dropped; P99 has no triples
    assert d.relations["P19"].prompts == ("[X] was born in [Y] .", "The birthplace of [X] is [Y] .",
                                          "[X] is a native of [Y] .")
    assert d.relations["P36"].prompts == ("The capital of [X] is [Y] .",)
    assert any("N-M" in n and "P47" in n for n in d.notes) and any("P99" in n for n in d.notes)
    (einstein, newton) = d.of("P19")
    assert einstein.object == "Ulm" and einstein.subject == "Q1"  # the repeated Q1 triple is ignored
    assert einstein.mentions == ("Albert Einstein", "Einstein", "A. Einstein", "Prof. Einstein", "Bertie")  # max 5
    assert newton.mentions == ("Isaac Newton",)
    assert d.of("P36")[0].mentions == ("France", "FR") and d.of("P36")[0].subject == "France"
    assert load_lama(LamaKeys(path=str(tmp_path / "lama"), max_mentions=1), Path("/none"), "x").of("P19")[0] \
        .mentions == ("Albert Einstein",)


@pytest.mark.parametrize("keys, message", [
    (LamaKeys(path="nowhere"), "LAMA directory"),
    (LamaKeys(path="lama", relations_file="rel.jsonl"), "rel.jsonl not found"),
    (LamaKeys(path="lama", relations=["P19", "P1"]), "unknown relation(s) ['P1']"),
    (LamaKeys(path="lama", max_mentions=0), "max_mentions must be >= 1"),
])
def test_lama_bad_layouts_fail_with_one_line(tmp_path, keys, message):
    write_lama(tmp_path)
    with pytest.raises((DataError, ConfigError), match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        load_lama(keys, tmp_path, "lama")


def test_lama_malformed_lines_name_the_file_and_line(tmp_path):
    base = write_lama(tmp_path)
    (base / "TREx" / "P36.jsonl").write_text('{"sub_label": "France"}\n')
    with pytest.raises(DataError, match=r"P36.jsonl:1: a triple needs string fields"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    (base / "prompts" / "P19.jsonl").write_text('{"pattern": "[X] [X] was born in [Y] ."}\n')
    with pytest.raises(DataError, match="must hold"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    (base / "prompts" / "P19.jsonl").write_text("not json\n")
    with pytest.raises(DataError, match=r"P19.jsonl:1: not JSON"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")


def test_a_bad_prompt_is_blamed_on_its_own_file_and_line(tmp_path):
    base = write_lama(tmp_path)
    (base / "prompts" / "P19.jsonl").write_text('{"pattern": "[X] was born in [Y] ."}\n\n{"pattern": "[X] [X] [Y]"}\n')
    with pytest.raises(DataError, match=r"prompts/P19.jsonl:3: relation P19: prompt '\[X\] \[X\] \[Y\]' must hold"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    (base / "prompts" / "P19.jsonl").unlink()
    lines = (base / "relations.jsonl").read_text().splitlines()
    lines[1] = json.dumps({"relation": "P36", "template": "The capital of [X] is .", "type": "1-1"})
    (base / "relations.jsonl").write_text("\n".join(lines) + "\n")
    # the template is the relations file's, on line 2 — not the prompts file's (P36 has none)
    with pytest.raises(DataError, match=r"relations.jsonl:2: relation P36: prompt .* must hold .*\(the relation's "
                                        r"template\)"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")


def test_an_empty_relations_file_says_so(tmp_path):
    base = write_lama(tmp_path)
    (base / "relations.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"relations.jsonl holds no relation: one JSON object a line"):
        load_lama(LamaKeys(path="lama"), tmp_path, "lama")


def test_queries_cover_relation_prompt_fact_mention(tmp_path):
    write_lama(tmp_path)
    d = load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    qs = queries(d)
    assert len(qs) == 3 * (5 + 1) + 1 * 2  # P19: 3 prompts x (5 + 1 mentions); P36: 1 prompt x 2 mentions
    q = next(q for q in qs if q.id == "P19|1|Q1|1")
    assert q.text == "The birthplace of Einstein is [Y] ." and q.outcome == "Ulm"
    assert q.meta == {"relation": "P19", "prompt": 1, "subject": "Q1", "mention": 1}
    assert len(queries(d, prompts="original", mentions="default")) == 3
    assert object_last("[X] was born in [Y] .") and not object_last("[Y] is where [X] was born .")


def test_single_token_filter_keeps_the_intersection_of_vocabularies(tmp_path):
    write_lama(tmp_path)
    d = load_lama(LamaKeys(path="lama"), tmp_path, "lama")
    a = build_tokenizer("bert", ["Ulm", "Paris", "Woolsthorpe"], 32)
    b = build_tokenizer("neox", ["Ulm", "Paris"], 32)
    one = ModelAdapter.word_token
    assert one(a, "Ulm") == a.convert_tokens_to_ids("Ulm")
    assert one(b, "Woolsthorpe") is None  # unknown -> UNK -> not in the vocabulary
    assert one(a, "New York") is None  # two tokens
    kept = single_token_filter(d, {"a": a, "b": b}, one)
    assert sorted(f.object for f in kept.facts) == ["Paris", "Ulm"]
    assert any("1 of 3 facts dropped" in n and "a, b" in n for n in kept.notes)
    gone = single_token_filter(d, {"c": build_tokenizer("bert", ["Ulm"], 32)}, one)
    assert list(gone.relations) == ["P19"] and any("P36" in n for n in gone.notes)


def test_subsample_caps_facts_per_relation():
    d = generate_world(FactWorldKeys(n_relations=3, n_entities=30, facts_per_relation=10))
    s = d.subsample(4, seed=0)
    assert Counter(f.relation for f in s.facts) == {"R01": 4, "R02": 4, "R03": 4}
    assert s.subsample(10) is s and d.subsample(10) is d


# ----------------------------------------------------------------------------------------------- the fact world
def small_world(**kw):
    return generate_world(FactWorldKeys(**{"n_relations": 4, "n_entities": 40, "facts_per_relation": 15, **kw}))


def test_the_world_is_deterministic_n_to_1_and_single_word():
    d, again = small_world(), small_world()
    assert d.facts == again.facts and dict(d.relations) == dict(again.relations)
    assert small_world(world_seed=1).facts != d.facts
    assert len(d.relations) == 4 and all(len(r.prompts) == 6 for r in d.relations.values())
    for r in d.relations.values():
        assert r.prompts[0] == FRAMES[0].format(w=r.label)
        assert len({p.split()[p.split().index("[X]") + 1] if p.startswith("[X] ") else p for p in r.prompts}) == 6
        assert all(object_last(p) for p in r.prompts)
    for f in d.facts:
        assert " " not in f.object and all(" " not in m for m in f.mentions) and 1 <= len(f.mentions) <= 4
        assert f.object in d.world.objects[f.relation]
    pairs = [(f.relation, f.subject) for f in d.facts]
    assert len(pairs) == len(set(pairs))  # one object per (relation, subject)
    words = set(d.world.words())
    assert all(w in words for q in queries(d) for w in q.text.replace("[Y]", "").split())


@pytest.mark.parametrize("kw, message", [
    ({"prompts_per_relation": 9}, "prompts_per_relation must be in"),
    ({"facts_per_relation": 50}, "exceeds dataset.n_entities"),
    ({"max_aliases": 5}, "at most 5 mentions"),
    ({"n_relations": 1}, "n_relations must be >= 2"),
])
def test_world_keys_are_checked(kw, message):
    with pytest.raises(ConfigError, match=message):
        check_world_keys(FactWorldKeys(**{"n_relations": 4, "n_entities": 40, "facts_per_relation": 15, **kw}))


def test_corpus_evidence_share_exposure_counts_and_objects():
    d = small_world()
    c = sample_corpus(d, CorpusSpec(sentences=2000, gamma=0.3, skew_seed=1))
    evidence = [i for i, p in enumerate(c.object_word) if p >= 0]
    assert len(c.sentences) == 2000 and len(evidence) == 600
    assert c.fact_counts.sum() == 600 == c.prompt_counts.sum() == c.mention_counts.sum()
    np.testing.assert_array_equal(c.prompt_counts.sum(1), c.fact_counts)
    stated = Counter()
    for i in evidence:
        words = c.sentences[i].split()
        obj = words[c.object_word[i]]
        stated.update(k for k, f in enumerate(d.facts) if f.object == obj and any(m in words for m in f.mentions))
    assert all(stated[k] >= n for k, n in enumerate(c.fact_counts))  # each count is a sentence stating that fact
    assert sample_corpus(d, CorpusSpec(sentences=2000, gamma=0.3, skew_seed=1)).sentences == c.sentences
    assert sample_corpus(d, CorpusSpec(sentences=100, gamma=0.0)).fact_counts.sum() == 0


def test_corpus_skews_follow_zipf_and_differ_by_skew_seed():
    d = small_world()
    spec = CorpusSpec(sentences=20000, gamma=1.0, prompt_skew=2.0, fact_skew=0.0, skew_seed=3)
    c = sample_corpus(d, spec)
    w = 1 / np.arange(1, 7) ** 2.0
    for r in d.relations:  # per relation, its prompts' shares are the Zipf weights in some order
        counts = c.prompt_counts[[i for i, f in enumerate(d.facts) if f.relation == r]].sum(0)
        np.testing.assert_allclose(np.sort(counts)[::-1] / counts.sum(), w / w.sum(), atol=0.03)
    favourite = {r: None for r in d.relations}
    other = sample_corpus(d, CorpusSpec(sentences=20000, gamma=1.0, prompt_skew=2.0, fact_skew=0.0, skew_seed=4))
    for r in favourite:
        rows = [i for i, f in enumerate(d.facts) if f.relation == r]
        favourite[r] = (int(c.prompt_counts[rows].sum(0).argmax()), int(other.prompt_counts[rows].sum(0).argmax()))
    assert any(a != b for a, b in favourite.values())  # each corpus prefers its own prompts
    flat = sample_corpus(d, CorpusSpec(sentences=20000, gamma=1.0, prompt_skew=0.0, fact_skew=0.0))
    assert flat.prompt_counts.sum(0).min() / flat.prompt_counts.sum(0).max() > 0.85  # no skew: uniform
