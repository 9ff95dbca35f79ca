"""Tiny models: offline tokenizers, cached training, corruption recovery, and agreement quality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from cprobe.data.base import NONE, Dataset
from cprobe.data.grammar import GrammarConfig, generate, vocabulary
from cprobe.errors import ConfigError
from cprobe.models import tiny
from cprobe.models.tiny import TinyTrainConfig, build_tokenizer, ensure_tiny_model

GRAMMAR = GrammarConfig(n_sentences=200, seed=1)


def agreement_accuracy(model_dir: Path, examples) -> float:
    """Fraction of examples where the saved model prefers the correct verb form over the wrong one (the training's own
    check, :func:`cprobe.models.tiny._preferences`)."""
    auto = AutoModelForMaskedLM if AutoConfig.from_pretrained(model_dir).model_type == "bert" else AutoModelForCausalLM
    exs = examples.examples if isinstance(examples, Dataset) else tuple(examples)
    return float(tiny._preferences(auto.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir), exs)
                 .float().mean())


SMALL = TinyTrainConfig(layers=1, hidden=32, heads=2, intermediate=64, steps=3, batch_size=8, eval_sentences=40)
AUTO = {"bert": AutoModelForMaskedLM, "neox": AutoModelForCausalLM}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("kind", ["bert", "neox"])
def test_tokenizer_round_trips_offline(kind, tmp_path):
    build_tokenizer(kind, vocabulary(GRAMMAR), 64).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    sentence = " ".join(generate(GRAMMAR).examples[0].words)
    ids = tok(sentence)["input_ids"]
    words = sentence.split()
    if kind == "bert":
        assert tok.convert_ids_to_tokens(ids) == ["[CLS]", *words, "[SEP]"]
        assert tok(f"the {tok.mask_token} .")["input_ids"][2] == tok.mask_token_id
    else:
        assert tok.convert_ids_to_tokens(ids) == ["<|endoftext|>", *words]
        assert tok.bos_token_id == tok.eos_token_id != tok.pad_token_id
    assert tok.unk_token_id not in ids


@pytest.mark.parametrize("kind", ["bert", "neox"])
def test_small_training_saves_a_loadable_dir_and_reuses_it(kind, tmp_path, monkeypatch):
    path = ensure_tiny_model(kind, GRAMMAR, SMALL, tmp_path, progress=False)
    model = AUTO[kind].from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok)
    report = json.loads((path / "training.json").read_text())
    assert 0.0 <= report["heldout_accuracy"] <= 1.0
    assert report["kind"] == kind
    assert 0.0 <= agreement_accuracy(path, generate(GrammarConfig(n_sentences=20, seed=5))) <= 1.0

    mtime = (path / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(tiny, "_train", lambda *a, **k: pytest.fail("retrained a cached model"))
    assert ensure_tiny_model(kind, GRAMMAR, SMALL, tmp_path, progress=False) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert not list(tmp_path.glob(".*tmp-*"))


def test_cache_key_separates_configs_and_extra_sentences_join_the_vocabulary(tmp_path):
    a = ensure_tiny_model("neox", GRAMMAR, SMALL, tmp_path, progress=False)
    b = ensure_tiny_model("neox", GRAMMAR, SMALL, tmp_path, extra_sentences=["Mary said that she"], progress=False)
    assert a != b
    tok = AutoTokenizer.from_pretrained(b)
    assert tok.convert_ids_to_tokens(tok("Mary said that she")["input_ids"]) == [
        "<|endoftext|>", "Mary", "said", "that", "she",
    ]  # fmt: skip
    assert "Mary" not in AutoTokenizer.from_pretrained(a).get_vocab()


@pytest.mark.parametrize("damage", ["truncate_weights", "drop_marker"])
def test_corrupt_dir_is_rebuilt(damage, tmp_path):
    path = ensure_tiny_model("bert", GRAMMAR, SMALL, tmp_path, progress=False)
    if damage == "truncate_weights":
        weights = path / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        (path / "training.json").unlink()
    assert ensure_tiny_model("bert", GRAMMAR, SMALL, tmp_path, progress=False) == path
    AutoModelForMaskedLM.from_pretrained(path)
    assert (path / "training.json").is_file()


def test_bad_train_config_raises_config_error():
    with pytest.raises(ConfigError):
        TinyTrainConfig(hidden=130, heads=4)
    with pytest.raises(ConfigError):
        TinyTrainConfig(steps=0)


def test_training_is_deterministic(tmp_path):
    a = ensure_tiny_model("neox", GRAMMAR, SMALL, tmp_path / "a", progress=False)
    b = ensure_tiny_model("neox", GRAMMAR, SMALL, tmp_path / "b", progress=False)
    wa = AutoModelForCausalLM.from_pretrained(a).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
@pytest.mark.numeric  # trained from scratch on the portable kernels by `make test-portable` (no seeds there)
@pytest.mark.parametrize("name", ["tiny_bert_sva", "tiny_neox_sva"])
def test_default_models_learn_agreement_with_attractors(name):
    """The shipped agreement models (their conf/model configs), in the suite's shared cache: under `make test` the
    checked-in models (tests/data/models), under `make test-portable` trained from scratch on PyTorch's portable
    kernels (CPROBE_TEST_TRAIN_MODELS=1), where a test that needs one while it trains waits on its lock."""
    import os

    from omegaconf import OmegaConf

    repo = Path(__file__).resolve().parents[2]
    node = OmegaConf.to_container(OmegaConf.load(repo / "conf" / "model" / f"{name}.yaml").tiny)
    cache = Path(os.environ.get("CPROBE_CACHE_DIR") or repo / ".cache" / "cprobe-test")
    path = tiny.tiny_model_dir(name, node, cache, progress=False)
    heldout = generate(GrammarConfig(n_sentences=600, seed=424242))
    attractors = heldout.subset([i for i, e in enumerate(heldout.examples) if e.props["z_e"] != NONE])
    assert agreement_accuracy(path, attractors) >= 0.95
