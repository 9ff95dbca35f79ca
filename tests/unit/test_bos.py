"""The start token as a setting (issue 44 item 4, :mod:`cprobe.models.bos`): ``auto`` takes the tokenizer's BOS unless
it is a chat turn marker (SmolLM2's ``<|im_start|>``), then the document separator; ``none`` and an explicit token;
every formatter (so every study) puts the one chosen token first, once, whatever the tokenizer's own template adds; a
masked LM keeps its [CLS] … [SEP]; bad settings are one line; the job records the token (environment.json)."""

from __future__ import annotations

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.models.adapter import ModelAdapter
from cprobe.models.bos import start_token, turn_marker
from tests.conftest import make_random_model, make_word_tokenizer

CHAT = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>' + '\\n'}}{% endfor %}")


def _tok(bos: str | None, eos: str | None, chat: str | None = None, extra: tuple[str, ...] = ()):
    """A word-level tokenizer over a few words and the given special tokens (no template: adds nothing)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [t for t in dict.fromkeys(["[UNK]", *(x for x in (bos, eos) if x), *extra])]
    vocab = {w: i for i, w in enumerate([*specials, "the", "dog", "runs"])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", bos_token=bos, eos_token=eos,
                                   chat_template=chat)


def test_auto_takes_the_bos_unless_it_opens_a_chat_turn():
    assert start_token(_tok("<s>", "</s>"), "auto", "causal", "m") == "<s>"
    # SmolLM2: BOS <|im_start|> and EOS <|im_end|> both mark turns inside the template's loop → <|endoftext|>
    smol = _tok("<|im_start|>", "<|im_end|>", CHAT, extra=("<|endoftext|>",))
    assert turn_marker(smol, "<|im_start|>") and turn_marker(smol, "<|im_end|>")
    assert not turn_marker(smol, "<|endoftext|>")
    assert start_token(smol, "auto", "causal", "smol") == "<|endoftext|>"
    # a BOS that marks turns and an EOS that does not: the EOS separates documents
    assert start_token(_tok("<|im_start|>", "</s>", CHAT), "auto", "causal", "m") == "</s>"
    # a template that uses the BOS once, before its loop (Gemma, Llama 3): still the BOS
    assert start_token(_tok("<bos>", "<eos>", "{{ bos_token }}{% for message in messages %}<start_of_turn>"
                            "{{ message['content'] }}{% endfor %}"), "auto", "causal", "m") == "<bos>"
    assert start_token(_tok(None, "<|endoftext|>"), "auto", "causal", "m") == "<|endoftext|>"  # Qwen: no BOS


def test_none_an_explicit_token_and_the_one_line_refusals():
    tok = _tok("<|im_start|>", "<|im_end|>", CHAT)
    assert start_token(tok, "none", "causal", "m") is None
    assert start_token(tok, "<|im_end|>", "causal", "m") == "<|im_end|>"
    refusals = [((tok, "auto", "causal", "smol"), "no BOS token and no document separator"),  # nor a separator
                ((tok, "<|endoftext|>", "causal", "m"), "'<|endoftext|>' is not a token of its vocabulary"),
                # a masked LM's inputs are framed by its tokenizer's [CLS] … [SEP]
                ((make_word_tokenizer("mlm"), "none", "mlm", "bert"), "applies to causal LMs")]
    for args, needle in refusals:
        with pytest.raises(ConfigError) as e:
            start_token(*args)
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert "model.bos=none" in str(pytest.raises(ConfigError, start_token, *refusals[0][0]).value)
    assert start_token(make_word_tokenizer("mlm"), "auto", "mlm", "bert") is None


@pytest.mark.parametrize("bos, first", [("auto", "<|endoftext|>"), ("none", None), ("w7", "w7")])
def test_every_formatter_starts_every_row_with_the_one_start_token(bos, first):
    """The tokenizer's own template adds <|endoftext|> (the tiny models' convention): it is never doubled, and with
    ``none`` it is gone. Agreement (probing, reliability), regions (CausalGym), cloze (prompt bias) and plain texts
    (CEBaB, LIBERTy) alike; the positions are the same words' tokens, shifted by the start token."""
    from cprobe.data.base import Example
    from cprobe.data.items import TextItem
    from cprobe.models.formatters import (AgreementFormatter, ClassificationFormatter, ClozeFormatter,
                                          RegionFormatter)

    model, tok = make_random_model("gpt_neox")
    ad = ModelAdapter(model, tok, "causal", "neox", bos=bos)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    want = None if first is None else tok.convert_tokens_to_ids(first)
    shift = int(first is not None)
    words = ["the", "author", "near", "the", "guards", "is", "here"]
    batches = {
        "agreement": AgreementFormatter(("target", "word:1"))(
            [Example("a", tuple(words), 5, "is", "are")], ad, torch.arange(1)),
        "regions": RegionFormatter()([TextItem("r", "the author is", regions=("the author", " is"))], ad,
                                     torch.arange(1)),
        "cloze": ClozeFormatter()([TextItem("c", "the author is [Y] .", slots={"subject": "the author"})], ad,
                                  torch.arange(1)),
        "texts": ClassificationFormatter(16)([TextItem("t", "the author is here")], ad, torch.arange(1)),
    }
    for name, b in batches.items():
        ids = b.input_ids[0][b.attention_mask[0].bool()].tolist()
        if want is None:
            assert eot not in ids and ids[0] == tok.convert_tokens_to_ids("the"), name
        else:
            assert ids[0] == want and ids.count(want) == 1 and (want == eot or eot not in ids), name
            assert ids[1] == tok.convert_tokens_to_ids("the"), name
    a = batches["agreement"]
    assert int(a.positions["target"][0]) == 4 + shift  # the last prefix word ("guards") predicts the verb
    assert int(a.positions["word:1"][0]) == 1 + shift
    assert int(batches["regions"].positions["region:0"][0]) == 1 + shift  # "the author" ends at "author"
    assert int(batches["cloze"].positions["subject"][0]) == 1 + shift
    assert ad.token_lengths(["the author is here"]) == [4 + shift]


def test_a_masked_lm_keeps_its_tokenizer_s_special_tokens():
    model, tok = make_random_model("bert")
    ad = ModelAdapter(model, tok, "mlm", "bert")
    assert ad.bos is None
    from cprobe.data.items import TextItem
    from cprobe.models.formatters import ClassificationFormatter

    b = ClassificationFormatter(16)([TextItem("t", "the author is here")], ad, torch.arange(1))
    assert b.input_ids[0, 0] == tok.cls_token_id and tok.sep_token_id in b.input_ids[0].tolist()
    with pytest.raises(ConfigError, match="applies to causal LMs"):
        ModelAdapter(model, tok, "mlm", "bert", bos="none")


def test_the_job_records_each_model_s_start_token_and_weights(tmp_path):
    """environment.json names every model's weights and start token; the tables (so the records) name weights that
    are not the checkpoint's own in its dtype (a GGUF's, dequantised) and nothing otherwise."""
    import json

    from cprobe.job import JobContext
    from cprobe.report.environment import write_environment

    ctx = JobContext(cfg={}, out_dir=tmp_path, data_root=tmp_path, cache_root=tmp_path)
    ctx.models = {"tiny": {"weights": "float32", "dtype": "float32", "bos": "<|endoftext|>"}}
    assert ctx.weights_column() is None
    ctx.models["g"] = {"weights": "gguf Q4_K_M dequantised to float32", "dtype": "float32", "bos": "<bos>"}
    assert ctx.weights_column() == "g: gguf Q4_K_M dequantised to float32"
    env = json.loads(write_environment(tmp_path, {"model": {"dtype": "float32"}}, ctx.models).read_text())
    assert env["models"]["g"] == {"weights": "gguf Q4_K_M dequantised to float32", "dtype": "float32", "bos": "<bos>"}
    assert env["models"]["tiny"]["bos"] == "<|endoftext|>"


def test_the_start_token_is_part_of_the_activation_cache_key():
    """Other start tokens, other token ids, other states: never read from each other's cache entry."""
    from cprobe.cache import cache_key
    from cprobe.extract import _fields
    from cprobe.models.formatters import AgreementFormatter

    model, tok = make_random_model("gpt_neox")
    keys = {bos: cache_key(_fields(ModelAdapter(model, tok, "causal", "neox", bos=bos), "items", "data",
                                   AgreementFormatter(), None, torch.float32)) for bos in ("auto", "none", "w7")}
    assert len(set(keys.values())) == 3
