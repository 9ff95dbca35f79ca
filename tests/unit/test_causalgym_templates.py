"""CausalGym pair generation: shared fillers, swap doubling, disjoint eval, seeds; pairs as region items for the
core's RegionFormatter (tokenisation, region ends), label token ids."""

from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cprobe.data.causalgym import (
    CONTROL_LABELS,
    TaskTemplate,
    control_pairs,
    load_templates,
    make_pair_splits,
    label_token_ids,
    pair_items,
    sample_pairs,
)
from cprobe.errors import DataError

DATA = Path(os.environ.get("CPROBE_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))
SYNTAXGYM = DATA / "causalgym" / "templates" / "syntaxgym.json"
needs_data = pytest.mark.skipif(not SYNTAXGYM.is_file(), reason=f"CausalGym templates not found at {SYNTAXGYM} "
                                "(set CPROBE_DATA_DIR)")

SPEC = {
    "templates": ["{det} {subject} near the {place.noun} {place.adj}"],
    "label": "subject",
    "result_prepend_space": True,
    "labels": {"sg": ["is", "was"], "pl": ["are", "were"]},
    "variables": {
        "det": ["The", "A"],
        "subject": {"sg": ["cat", "dog", "bird"], "pl": ["cats", "dogs", "birds"]},
        "place.noun": ["tree", "house", "car", "river"],
        "place.adj": ["green", "old", "red", "wide"],
    },
}


@pytest.fixture
def toy() -> TaskTemplate:
    return TaskTemplate.from_spec("toy", SPEC)


def test_regions_follow_the_template(toy: TaskTemplate) -> None:
    assert toy.spans == ("{det}", " {subject}", " near the", " {place.noun}", " {place.adj}")
    assert toy.region_names == ("{det}", "{subject}", "_near_the", "{place.noun}", "{place.adj}")
    assert toy.first_label_region == 1
    assert toy.types == ("sg", "pl")


def test_pairs_share_every_non_label_filler(toy: TaskTemplate) -> None:
    rng = random.Random(0)
    for _ in range(300):
        p = toy.sample_pair(rng)
        assert p.base_type != p.source_type
        assert [p.base[i] for i in (0, 2, 3, 4)] == [p.source[i] for i in (0, 2, 3, 4)]
        assert p.base[1].strip() in SPEC["variables"]["subject"][p.base_type]
        assert p.source[1].strip() in SPEC["variables"]["subject"][p.source_type]
        # dotted variables of one head use one index
        nouns, adjs = SPEC["variables"]["place.noun"], SPEC["variables"]["place.adj"]
        assert nouns.index(p.base[3].strip()) == adjs.index(p.base[4].strip())
        assert p.base_label[0] == " " and p.base_label[1:] in SPEC["labels"][p.base_type]
        assert p.source_label[1:] in SPEC["labels"][p.source_type]
        assert (p.base_class, p.source_class) == (toy.types.index(p.base_type), toy.types.index(p.source_type))
        assert p.base_text == "".join(p.base)


def test_swap_doubling_and_sizes(toy: TaskTemplate) -> None:
    pairs = sample_pairs(toy, 10, seed=3)
    assert len(pairs) == 20
    for k in range(0, 20, 4):  # reference batch layout: p1, p2, swap(p1), swap(p2)
        assert pairs[k + 2] == pairs[k].swap() and pairs[k + 3] == pairs[k + 1].swap()
        assert pairs[k].swap().swap() == pairs[k]
    classes = [p.base_class for p in pairs]
    assert classes.count(0) == classes.count(1) == 10  # swapping balances the labels


def test_seeds_are_reproducible(toy: TaskTemplate) -> None:
    assert sample_pairs(toy, 20, seed=1) == sample_pairs(toy, 20, seed=1)
    assert sample_pairs(toy, 20, seed=1) != sample_pairs(toy, 20, seed=2)


def test_eval_bases_are_never_train_sentences(toy: TaskTemplate) -> None:
    train, eval_ = make_pair_splits(toy, n_train=60, n_eval=20)
    assert (len(train), len(eval_)) == (120, 40)
    seen = {p.base_text for p in train}
    drawn = [p for i, p in enumerate(eval_) if i % 4 < 2]
    assert len(seen) > 40 and not any(p.base_text in seen for p in drawn)


def test_impossible_disjointness_is_an_error() -> None:
    spec = {**SPEC, "variables": {**SPEC["variables"], "det": ["The"], "place.noun": ["tree"], "place.adj": ["old"]}}
    tiny = TaskTemplate.from_spec("tiny", spec)  # only 6 sentences, all drawn into train
    with pytest.raises(DataError, match="tiny"):
        make_pair_splits(tiny, n_train=50, n_eval=5)


def test_control_task_keeps_sentences_and_remaps_labels(toy: TaskTemplate) -> None:
    task, control = make_pair_splits(toy, 10, 5), make_pair_splits(toy, 10, 5, control=True)
    for p, c in zip(task.train + task.eval, control.train + control.eval, strict=True):
        assert (c.base, c.source, c.base_class) == (p.base, p.source, p.base_class)
        assert c.base_label == CONTROL_LABELS[p.base_class] and c.source_label == CONTROL_LABELS[p.source_class]
    assert CONTROL_LABELS == (" dog", " give")
    assert control_pairs(task.train) == control.train


def test_malformed_specs_are_data_errors() -> None:
    with pytest.raises(DataError, match="'place.adj'"):
        TaskTemplate.from_spec("bad", {**SPEC, "variables": {k: v for k, v in SPEC["variables"].items()
                                                           if k != "place.adj"}})
    with pytest.raises(DataError, match="share one index"):
        TaskTemplate.from_spec("bad", {**SPEC, "variables": {**SPEC["variables"], "place.adj": ["old"]}})
    with pytest.raises(DataError, match="label variable"):
        TaskTemplate.from_spec("bad", {**SPEC, "variables": {**SPEC["variables"], "subject": ["cat"]}})


def test_missing_file_and_unknown_task(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.json"):
        load_templates(tmp_path / "nope.json")
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"toy": SPEC}))
    assert load_templates(path, 0, ["toy"])["toy"].name == "toy"
    with pytest.raises(DataError, match=r"unknown CausalGym task\(s\) \['agr'\] in t\.json; choose from \['toy'\]"):
        load_templates(path, 0, ["agr"])


@pytest.fixture(scope="module")
def tokenizer():
    """A small byte-level BPE built in memory (no downloads), GPT-NeoX style."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [p.base_text + p.base_label for p in sample_pairs(TaskTemplate.from_spec("toy", SPEC), 200, 0)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def _format(tokenizer, items, bos: bool = False):
    from types import SimpleNamespace

    from cprobe.models.formatters import RegionFormatter

    # the formatter reads the tokenizer and the start token (model.bos) of a causal LM
    fake = SimpleNamespace(tok=tokenizer, name="toy", kind="causal", bos_id=tokenizer.bos_token_id if bos else None)
    return RegionFormatter()(items, fake, torch.arange(len(items)))


@pytest.mark.parametrize("bos", [False, True])
def test_region_ends_align_with_tokens(toy: TaskTemplate, tokenizer, bos: bool) -> None:
    pairs = sample_pairs(toy, 6, seed=0)
    bases, sources = pair_items(pairs)
    assert [it.text for it in bases] == [p.base_text for p in pairs] and bases[0].region_names == toy.region_names
    assert [it.concepts["type"] for it in sources] == [p.source_type for p in pairs]
    shift = int(bos)
    for items, side in ((bases, "base"), (sources, "source")):
        batch = _format(tokenizer, items, bos)
        pos = torch.stack([batch.positions[f"region:{r}"] for r in range(5)], 1)
        assert pos.shape == (12, 5)
        for i, p in enumerate(pairs):
            regions = p.base if side == "base" else p.source
            n = int(batch.attention_mask[i].sum())
            assert (batch.input_ids[i, 0] == tokenizer.bos_token_id) == bos
            for r in range(5):
                prefix = batch.input_ids[i, shift: int(pos[i, r]) + 1].tolist()
                assert tokenizer.decode(prefix) == "".join(regions[: r + 1])
            assert int(pos[i, -1]) == n - 1 == int(batch.positions["last"][i])
    ids, multi = label_token_ids(tokenizer, [lab for p in pairs for lab in (p.base_label, p.source_label)])
    assert multi == ()
    for p in pairs:
        assert tokenizer.decode([ids[p.base_label]]) == p.base_label
        assert tokenizer.decode([ids[p.source_label]]) == p.source_label


def test_empty_regions_get_no_position(tokenizer) -> None:
    spec = {**SPEC, "templates": ["{det}{subject} near the {place.noun} {place.adj}"],
            "variables": {**SPEC["variables"], "det": ["The", ""],
                          "subject": {"sg": [" cat"], "pl": [" cats"]}}}
    pairs = [p for p in sample_pairs(TaskTemplate.from_spec("gap", spec), 20, 0) if p.base[0] == ""]
    batch = _format(tokenizer, pair_items(pairs)[0])
    assert pairs and (batch.positions["region:0"] == -1).all() and (batch.positions["region:1"] >= 0).all()


def test_multi_token_labels_are_reported_and_score_their_first_token(toy: TaskTemplate, tokenizer) -> None:
    pairs = sample_pairs(toy, 4, seed=0)
    odd = [replace(pairs[0], base_label=" xylophone"), *pairs[1:]]
    ids, multi = label_token_ids(tokenizer, [lab for p in odd for lab in (p.base_label, p.source_label)])
    assert multi == (" xylophone",)
    first = tokenizer(" xylophone", add_special_tokens=False)["input_ids"]
    assert len(first) > 1 and ids[" xylophone"] == first[0]  # the paper scores the first token
    with pytest.raises(DataError, match="no CausalGym pairs"):
        pair_items([])


@needs_data
@pytest.mark.shared
def test_all_29_benchmark_tasks_load_and_split() -> None:
    tasks = load_templates(SYNTAXGYM)
    assert len(tasks) == 29 and "agr_gender" in tasks and "filler_gap_subj" in tasks
    for name, task in tasks.items():
        train, eval_ = make_pair_splits(task)
        assert (len(train), len(eval_)) == (400, 100), name
        seen = {p.base_text for p in train}
        assert not any(p.base_text in seen for i, p in enumerate(eval_) if i % 4 < 2), name
        assert all(p.base_label.startswith(" ") for p in train) or not task.prepend_space, name


@needs_data
@pytest.mark.shared
def test_sampling_matches_the_reference_implementation() -> None:
    """First pairs of the authors' data.py with seed 42 (train split), copied from running it."""
    train, _ = make_pair_splits(load_templates(SYNTAXGYM, 0, ["agr_sv_num_pp"])["agr_sv_num_pp"])
    assert train[0].base == ("The", " ministers", " near", " the", " executive")
    assert train[0].source == ("The", " athlete", " near", " the", " executive")
    assert (train[0].base_label, train[0].source_label) == (" have", " has")
    assert train[1].base == ("The", " authors", " in front of", " the", " secretary")
    assert (train[1].base_label, train[1].source_label) == (" are", " has")
    gss, _ = make_pair_splits(load_templates(SYNTAXGYM, 0, ["gss_subord"])["gss_subord"])
    assert gss[0].base == ("Since", " the", " scientists", " reviewed the contract")
    assert gss[0].source == ("", "The", " scientists", " reviewed the contract")
    assert (gss[0].base_label, gss[0].source_label) == (" they", ".")


@needs_data
@pytest.mark.shared
def test_unknown_real_task_lists_choices() -> None:
    with pytest.raises(DataError, match="choose from .*agr_gender"):
        load_templates(SYNTAXGYM, 0, ["agr_genre"])
