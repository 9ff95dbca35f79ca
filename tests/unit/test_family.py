"""The one model-family record (cprobe.models.family): every listed family resolves on a tiny random-init HF model of
that family built here (blocks, final norm, position offset, pooling, pooler), the adapter reads and writes through
it exactly, an unknown family is derived from its config or refused in one line, and the hub configs of the Llama,
Mistral, Qwen and GPT-2-medium checkpoints compose and name a family the record knows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cprobe.errors import ConfigError
from cprobe.models.family import MODEL_FAMILIES, Family, family_of, pool_of
from tests.conftest import REPO, make_word_tokenizer

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def tiny(model_type: str):
    """(config, base model) of a tiny random-init model of the family ``model_type``."""
    import transformers as T

    torch.manual_seed(0)
    if model_type == "gpt2":
        cfg = T.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    elif model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"):
        cls = {"llama": T.LlamaConfig, "mistral": T.MistralConfig, "qwen2": T.Qwen2Config, "qwen3": T.Qwen3Config,
               "gemma": T.GemmaConfig, "gemma2": T.Gemma2Config, "gemma3_text": T.Gemma3TextConfig}[model_type]
        cfg = cls(vocab_size=64, num_key_value_heads=2, max_position_embeddings=64, head_dim=16, **SMALL)
    elif model_type == "gpt_neox":
        cfg = T.GPTNeoXConfig(vocab_size=64, max_position_embeddings=64, **SMALL)
    else:
        cls = {"bert": T.BertConfig, "roberta": T.RobertaConfig, "xlm-roberta": T.XLMRobertaConfig,
               "camembert": T.CamembertConfig}.get(model_type)
        if cls is None:
            cfg = T.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                     max_position_embeddings=64)
        else:
            cfg = cls(vocab_size=64, max_position_embeddings=66, **SMALL)
    assert cfg.model_type == model_type
    return cfg, T.AutoModel.from_config(cfg)


@pytest.mark.parametrize("model_type", sorted(MODEL_FAMILIES))
def test_every_family_resolves_on_a_tiny_model_of_it(model_type):
    from cprobe.models.adapter import ModelAdapter, model_positions

    fam = MODEL_FAMILIES[model_type]
    cfg, model = tiny(model_type)
    assert family_of(cfg) is fam and not fam.derived
    kind = "causal" if fam.pool == "last" else "encoder"
    adapter = ModelAdapter(model, make_word_tokenizer("mlm" if kind == "encoder" else "causal"), "encoder", "t")
    blocks = model
    for part in fam.blocks.split("."):
        blocks = getattr(blocks, part)
    assert adapter._blocks is blocks and len(blocks) == 2
    assert (adapter._final_norm is None) == (fam.final_norm is None)
    if fam.final_norm:
        assert adapter._final_norm is getattr(model, fam.final_norm)
    n = getattr(cfg, "max_position_embeddings", None) or cfg.n_positions
    assert model_positions(cfg) == n - fam.position_offset
    assert fam.pooler == (model_type == "bert")  # BertForSequenceClassification reads the pooler; RoBERTa does not
    if fam.pooler:
        assert getattr(model, "pooler", None) is not None
    assert pool_of(cfg) == ("last" if model_type in ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3",
                                                     "gemma", "gemma2", "gemma3_text") else "first")


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "gpt2", "gemma2", "gemma3_text"])
def test_a_decoder_family_reads_and_writes_exactly_and_pools_its_last_token(model_type):
    """The adapter reads the residual stream at the last real token and writing it back changes nothing; a
    sequence classifier on the family reads that same token (not token 0)."""
    from cprobe.data.items import TextItem
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.classifier import classify, phi_site, wrap
    from cprobe.models.edits import Replace
    from cprobe.models.formatters import ClassificationFormatter
    from cprobe.models.sites import Site

    cfg, model = tiny(model_type)
    tok = make_word_tokenizer("causal")
    enc = ModelAdapter(model, tok, "encoder", "t", batch_size=2)
    items = [TextItem(str(i), t) for i, t in enumerate(["the author is here .", "the guards near that author were",
                                                        "w1 w2 w3"])]
    fmt = ClassificationFormatter(16)
    site = Site(1, "last")
    read = enc.map(items, fmt, read=[site]).acts[site]
    again = enc.map(items, fmt, read=[Site(2, "last")], edits={site: Replace(read)}).acts[Site(2, "last")]
    torch.testing.assert_close(again, enc.map(items, fmt, read=[Site(2, "last")]).acts[Site(2, "last")])
    clf = wrap(enc, 3)
    assert clf.model.pool == "last" and phi_site(clf).position == "last"
    phi, _ = classify(clf, items, 16)
    last = enc.map(items, fmt, read=[Site(2, "last")]).acts[Site(2, "last")]
    torch.testing.assert_close(phi, last, atol=1e-5, rtol=1e-5)


def test_an_unknown_family_is_derived_from_its_config_or_refused_in_one_line():
    from transformers import PretrainedConfig

    dec = PretrainedConfig(architectures=["FooForCausalLM"])
    dec.model_type = "foo"
    fam = family_of(dec)
    assert fam == Family("foo", None, None, 0, "last", False, derived=True, resumable=False, split_head=False)
    assert pool_of(dec) == "last"
    enc = PretrainedConfig(architectures=["FooForMaskedLM"])
    enc.model_type = "foo"
    assert pool_of(enc) == "first"
    mystery = PretrainedConfig()
    mystery.model_type = "foo"
    assert family_of(mystery).derived and family_of(mystery).pool is None
    with pytest.raises(ConfigError, match=r"unknown model family 'foo'.*set finetune.pool=first") as e:
        pool_of(mystery)
    assert "\n" not in str(e.value)
    # a family the auto mappings know but MODEL_FAMILIES does not: derived from the mapping
    electra = PretrainedConfig()
    electra.model_type = "electra"
    assert pool_of(electra) == "first"


def test_an_unknown_family_s_blocks_are_found_on_the_module():
    """A derived family has no blocks path: the adapter finds the one ModuleList with a block per layer."""
    import transformers as T

    from cprobe.models.adapter import ModelAdapter

    cfg = T.ElectraConfig(vocab_size=64, embedding_size=32, **SMALL, max_position_embeddings=64)
    model = T.AutoModel.from_config(cfg)
    assert cfg.model_type not in MODEL_FAMILIES
    adapter = ModelAdapter(model, make_word_tokenizer("mlm"), "encoder", "t")
    assert adapter._blocks is model.encoder.layer and adapter._final_norm is None


HUB = {"llama_3_2_1b": "llama", "mistral_7b": "mistral", "qwen2_5_0_5b": "qwen2", "gpt2_medium": "gpt2",
       "gpt2": "gpt2", "bert_base_uncased": "bert", "roberta_base": "roberta"}


@pytest.mark.parametrize("name, model_type", sorted(HUB.items()))
def test_hub_configs_of_each_family_compose_and_their_family_resolves(name, model_type, tmp_path):
    """The checkpoints cannot be downloaded here: the config composes and validates, and a tiny random-init model of
    its family resolves to the record the real one would use."""
    from cprobe.pipeline import prepare

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=cebab", f"model={name}", f"paths.cache_dir={tmp_path}"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    prepare(plain)
    assert plain["model"]["source"] == "hub" and plain["model"]["path"]
    config, _ = tiny(model_type)
    assert family_of(config) is MODEL_FAMILIES[model_type]


def test_the_recipe_in_the_architecture_doc_names_the_record():
    doc = (REPO / "docs" / "architecture.md").read_text()
    recipe = doc[doc.index("**Add a model family.**"):].split("\n\n")[0]
    assert "models/family.py" in recipe and "MODEL_FAMILIES" in recipe and "_BLOCKS" not in doc
    assert Path(REPO / "src" / "cprobe" / "models" / "family.py").is_file()


def test_a_bert_classifier_reads_the_pooler_and_other_encoders_the_first_token(tmp_path):
    """φ as the CEBaB reference reads it: BERT's pooler_output (dense + tanh over [CLS]); RoBERTa's raw <s> state;
    ``finetune.pool=first`` gives BERT's raw [CLS]. The cache key names the φ trained."""
    import json

    from cprobe.data.items import TextItem
    from cprobe.io import read_metadata
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.classifier import FinetuneConfig, classify, finetuned_classifier, wrap
    from cprobe.models.formatters import ClassificationFormatter

    items = [TextItem(str(i), t) for i, t in enumerate(["the author is here .", "the guards were here", "w1 w2"])]
    tok = make_word_tokenizer("mlm")
    for model_type, expected in (("bert", "pooler"), ("roberta", "first")):
        cfg, model = tiny(model_type)
        enc = ModelAdapter(model, tok, "encoder", "t", batch_size=2)
        clf = wrap(enc, 3)
        assert clf.model.pool == expected
        phi, logp = classify(clf, items, 16)
        batch = ClassificationFormatter(16)(items, clf, torch.arange(3))
        with torch.inference_mode():
            out = clf.model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
            want = out.pooler_output if expected == "pooler" else out.last_hidden_state[:, 0]
            torch.testing.assert_close(phi, want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logp, clf.model.head(want).log_softmax(-1), atol=1e-5, rtol=1e-5)
    cfg, model = tiny("bert")
    enc = ModelAdapter(model, tok, "encoder", "t", batch_size=2)
    raw, _ = classify(wrap(enc, 3, pool="first"), items, 16)
    pooled, _ = classify(wrap(enc, 3), items, 16)
    assert (raw - pooled).abs().max() > 1e-3
    ft = FinetuneConfig(epochs=1, batch_size=2, max_length=16)
    a, _ = finetuned_classifier(enc, items, torch.tensor([0, 1, 2]), 1, 3, ft, 0, tmp_path, "t", False)
    b, _ = finetuned_classifier(enc, items, torch.tensor([0, 1, 2]), 1, 3, FinetuneConfig(epochs=1, batch_size=2,
                                max_length=16, pool="first"), 0, tmp_path, "t", False)
    assert a.name != b.name and a.model.pool == "pooler" and b.model.pool == "first"
    saved = {json.loads(read_metadata(p)["config"])["pool"] for p in tmp_path.glob("t-*.safetensors")}
    assert saved == {"pooler", "first"}
    no_pooler = type(model)(cfg, add_pooling_layer=False)
    with pytest.raises(ConfigError, match="has no pooler; set finetune.pool=first"):
        wrap(ModelAdapter(no_pooler, tok, "encoder", "t"), 3)


def test_gemma3_s_shape_as_the_adapter_reads_it():
    """Gemma 3 (issue 44): sliding-window and global layers, embeddings scaled by √d inside the embedding module (so
    layer 0 is the scaled state), four norms per block, the head tied to the embeddings, the final norm at layer L."""
    from cprobe.data.items import TextItem
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.family import sliding_window
    from cprobe.models.formatters import ClassificationFormatter
    from cprobe.models.sites import Site
    from tests.conftest import make_random_model

    model, tok = make_random_model("gemma3_text", window=4)
    ad = ModelAdapter(model, tok, "causal", "g3", bos="none")
    assert model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert sliding_window(model.config) == 4
    for block in ad._blocks:
        assert sorted(n for n, _ in block.named_children() if n.endswith("layernorm")) == [
            "input_layernorm", "post_attention_layernorm", "post_feedforward_layernorm", "pre_feedforward_layernorm"]
    assert ad._head is model.lm_head and model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert ad._final_norm is model.model.norm
    items = [TextItem("a", "the author is here")]
    fmt = ClassificationFormatter(16)
    batch = fmt(items, ad, torch.arange(1))
    last = int(batch.positions["last"][0])
    acts = ad.map(items, fmt, read=[Site(0, "last"), Site(3, "last"), Site(3, "last", stream="block")]).acts
    emb = model.model.embed_tokens.weight[batch.input_ids[0, last]]
    torch.testing.assert_close(acts[Site(0, "last")][0], emb * 32 ** 0.5, atol=1e-5, rtol=1e-5)  # √d, d = 32
    with torch.no_grad():
        normed = model.model.norm(acts[Site(3, "last", stream="block")])
    torch.testing.assert_close(acts[Site(3, "last")], normed, atol=1e-6, rtol=1e-6)  # one norm over 32 values


def test_the_sliding_window_is_read_from_the_config():
    import transformers as T

    from cprobe.models.family import sliding_window

    assert sliding_window(T.MistralConfig(sliding_window=7)) == 7  # no layer types: every layer slides
    assert sliding_window(T.MistralConfig(sliding_window=None)) is None
    assert sliding_window(T.Qwen2Config(sliding_window=7)) is None  # use_sliding_window off: all layers global
    assert sliding_window(T.Qwen2Config(sliding_window=7, use_sliding_window=True, max_window_layers=1,
                                        num_hidden_layers=2)) == 7
    assert sliding_window(T.Gemma3TextConfig(sliding_window=9, num_hidden_layers=2,
                                             layer_types=["full_attention"] * 2)) is None
    assert sliding_window(T.Gemma2Config(sliding_window=9, num_hidden_layers=2)) == 9
    assert sliding_window(T.LlamaConfig()) is None
