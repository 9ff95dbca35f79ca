"""The LM head at the candidates only (cprobe.models.head): in every listed family the rows of the head a readout
reads equal the full head's logits at those columns (the final norm, BERT's head transform and Gemma's soft cap
included), their differences equal the log-probabilities' differences, the full projection never runs, a derived
family runs the full head, and a skipped soft cap or final norm shows."""

from __future__ import annotations

import pytest
import torch

from cprobe.data.base import Example
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Replace
from cprobe.models.family import MODEL_FAMILIES
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.head import Head
from cprobe.models.readouts import CandidateTokens, Verbaliser
from cprobe.models.sites import Site
from tests.conftest import make_word_tokenizer

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
CAP = 1.0  # a soft cap the logits (scaled to a few units below) reach: tanh is far from linear there
EXAMPLES = [
    Example("a", tuple("the author near the guards is here .".split()), 5, "is", "are"),
    Example("b", tuple("the authors is here".split()), 2, "are", "is"),
    Example("c", tuple("near the author , the guards that like the author are here".split()), 10, "are", "is"),
]


def lm(model_type: str, softcap: float | None = CAP):
    """(model, tokenizer, kind) of a tiny random-init LM of the family ``model_type`` (tests/unit/test_family.py's
    configs with the LM head), its vocabulary projection scaled so the logits are a few units (Gemma 2 and 3 with the
    soft cap ``softcap``)."""
    import transformers as T

    torch.manual_seed(0)
    causal = model_type in ("gpt2", "gpt_neox", *DECODERS)
    tok = make_word_tokenizer("causal" if causal else "mlm")
    V = len(tok)
    if model_type == "gpt2":
        cfg = T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    elif model_type in DECODERS:
        cls = {"llama": T.LlamaConfig, "mistral": T.MistralConfig, "qwen2": T.Qwen2Config, "qwen3": T.Qwen3Config,
               "gemma": T.GemmaConfig, "gemma2": T.Gemma2Config, "gemma3_text": T.Gemma3TextConfig}[model_type]
        extra = {"final_logit_softcapping": softcap} if model_type in ("gemma2", "gemma3_text") else {}
        cfg = cls(vocab_size=V, num_key_value_heads=2, max_position_embeddings=64, head_dim=16, **SMALL, **extra)
    elif model_type == "gpt_neox":
        cfg = T.GPTNeoXConfig(vocab_size=V, max_position_embeddings=64, **SMALL)
    elif model_type == "distilbert":
        cfg = T.DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)
    else:
        cls = {"bert": T.BertConfig, "roberta": T.RobertaConfig, "xlm-roberta": T.XLMRobertaConfig,
               "camembert": T.CamembertConfig}[model_type]
        cfg = cls(vocab_size=V, max_position_embeddings=66, pad_token_id=tok.pad_token_id, **SMALL)
    auto = T.AutoModelForCausalLM if causal else T.AutoModelForMaskedLM
    model = auto.from_config(cfg).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30.0)
        bias = model.get_output_embeddings().bias
        if bias is not None:
            bias.normal_(0, 1.0)  # BERT's output bias starts at 0: random, so that it matters
        for name, p in model.named_parameters():
            if model_type.startswith("gemma") and "norm" in name:
                p.normal_(0, 0.3)  # Gemma's norms start at weight 1 + 0: random, so each matters
    return model, tok, "causal" if causal else "mlm"


def adapter(model_type: str, softcap: float | None = CAP) -> ModelAdapter:
    model, tok, kind = lm(model_type, softcap)
    return ModelAdapter(model, tok, kind, model_type, batch_size=2)


def candidates(ad: ModelAdapter, normalise: bool = False) -> CandidateTokens:
    return CandidateTokens([[ad.candidate_id(e.correct), ad.candidate_id(e.wrong), ad.candidate_id("here")]
                            for e in EXAMPLES], normalise)


def full_logits(ad: ModelAdapter) -> torch.Tensor:
    """The model's own logits (n, V) at each item's target, one unbatched HF forward per item."""
    fmt = AgreementFormatter()
    rows = []
    for i, e in enumerate(EXAMPLES):
        b = fmt([e], ad, torch.tensor([i]))
        with torch.inference_mode():
            logits = ad.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        rows.append(logits[0, b.positions["target"][0]].float())
    return torch.stack(rows)


@pytest.mark.parametrize("scored_positions", [True, False])
@pytest.mark.parametrize("model_type", sorted(MODEL_FAMILIES))
def test_candidate_rows_equal_the_full_heads_columns_in_every_family(model_type, scored_positions):
    ad = adapter(model_type)
    ad.scored_positions = scored_positions
    assert ad.head is not None and MODEL_FAMILIES[model_type].split_head
    cands = candidates(ad)
    calls = []
    ad.head.projection.register_forward_hook(lambda *_: calls.append(1))
    rows = ad.map(EXAMPLES, AgreementFormatter(), readout=cands).scores
    assert calls == []  # the projection over the whole vocabulary never ran
    ref = full_logits(ad)
    torch.testing.assert_close(rows, ref.gather(1, cands.ids), atol=1e-5, rtol=1e-5)
    # the same through the full head (head_rows off), and the log-probabilities where asked for
    ad.head_rows = False
    torch.testing.assert_close(ad.map(EXAMPLES, AgreementFormatter(), readout=cands).scores, rows, atol=1e-5,
                               rtol=1e-5)
    assert calls  # now it ran
    ad.head_rows = True
    lp = ad.map(EXAMPLES, AgreementFormatter(), readout=candidates(ad, normalise=True)).scores
    torch.testing.assert_close(lp, ref.log_softmax(-1).gather(1, cands.ids), atol=1e-5, rtol=1e-5)
    # every comparison between a row's candidates cancels the normaliser
    torch.testing.assert_close(rows[:, :1] - rows[:, 1:], lp[:, :1] - lp[:, 1:], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(rows, lp, atol=1e-2)


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_a_skipped_soft_cap_or_final_norm_shows(model_type):
    """The rows' values need Gemma's soft cap and final norm: without either they are far from the model's logits
    (so the family test above goes red if the head skips them)."""
    ad = adapter(model_type)
    assert ad.head is not None and ad.head.softcap == CAP
    cands = candidates(ad)
    ref = full_logits(ad).gather(1, cands.ids)
    assert float(ref.abs().max()) < CAP  # capped
    L = ad.n_layers
    out = ad.map(EXAMPLES, AgreementFormatter(), read=[Site(L), Site(L, stream="block")])
    normed, raw = out.acts[Site(L)], out.acts[Site(L, stream="block")]
    torch.testing.assert_close(ad.head.rows(normed, cands.ids), ref, atol=1e-5, rtol=1e-5)
    uncapped = Head(ad.head.projection, None).rows(normed, cands.ids)
    assert float((uncapped - ref).abs().max()) > 0.1
    assert float((ad.head.rows(raw, cands.ids) - ref).abs().max()) > 0.1  # the final norm skipped
    # the adapter's pass with the cap dropped: the family test's comparison fails
    ad.head.softcap = None
    rows = ad.map(EXAMPLES, AgreementFormatter(), readout=cands).scores
    assert float((rows - ref).abs().max()) > 0.1


def test_gemma_without_a_cap_in_its_config_caps_nothing():
    ad = adapter("gemma3_text", softcap=None)
    assert ad.head is not None and ad.head.softcap is None
    cands = candidates(ad)
    rows = ad.map(EXAMPLES, AgreementFormatter(), readout=cands).scores
    torch.testing.assert_close(rows, full_logits(ad).gather(1, cands.ids), atol=1e-5, rtol=1e-5)
    assert float(rows.abs().max()) > 1.0


def test_a_derived_family_runs_the_full_head():
    """OPT is not listed: its family is derived from the config and does not declare a split head, so the readout
    reads the full head's logits (whatever the model does after its projection)."""
    import transformers as T

    torch.manual_seed(0)
    tok = make_word_tokenizer("causal")
    model = T.OPTForCausalLM(T.OPTConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                         num_attention_heads=2, max_position_embeddings=64,
                                         word_embed_proj_dim=32)).eval()
    ad = ModelAdapter(model, tok, "causal", "opt", batch_size=2)
    assert ad.head is None
    calls = []
    model.get_output_embeddings().register_forward_hook(lambda *_: calls.append(1))
    cands = candidates(ad)
    rows = ad.map(EXAMPLES, AgreementFormatter(), readout=cands).scores
    assert calls
    torch.testing.assert_close(rows, full_logits(ad).gather(1, cands.ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", ["bert", "gemma2"])
def test_the_head_only_shortcut_takes_the_rows_and_the_soft_cap(model_type):
    """A replaced last-layer state scored alone (no forward): the rows of the head, BERT's transform and Gemma's cap
    included, equal the full forward's; with ``normalise`` the full head gets the cap too."""
    ad = adapter(model_type)
    site = Site(ad.n_layers)
    v = torch.randn(len(EXAMPLES), ad.hidden_size) * 3
    for normalise in (False, True):
        cands = candidates(ad, normalise)
        assert ad._head_only([], {site: Replace(v)}, cands, AgreementFormatter())
        fast = ad.map(EXAMPLES, AgreementFormatter(), edits={site: Replace(v)}, readout=cands).scores
        full = ad.map(EXAMPLES, AgreementFormatter(), edits={site: _NotReplace(v)}, readout=cands).scores
        torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)


class _NotReplace(Replace):
    """A Replace the shortcut does not recognise (forces the full forward)."""


def test_rows_are_differentiable_like_the_full_head():
    ad = adapter("gemma2")
    fmt = AgreementFormatter()
    b = fmt(EXAMPLES, ad, torch.arange(3))
    cands = candidates(ad)
    grads = []
    for rows in (True, False):
        ad.head_rows = rows
        a = torch.zeros(ad.hidden_size, requires_grad=True)
        out = ad.run(b, edits={Site(1): lambda h: h + a}, readout=cands, grad=True)
        (out.scores[:, 0] - out.scores[:, 1]).sum().backward()
        grads.append(a.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)
    assert float(grads[0].abs().sum()) > 0


def test_head_rows_hand_computed():
    """post(x · W[ids]ᵀ + b[ids]) by hand: W rows (1, 0), (0, 2), (1, 1); b (0, 1, −1); cap 2."""
    proj = torch.nn.Linear(2, 3)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
        proj.bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    ids = torch.tensor([[2, 0], [1, 1]])
    plain = torch.tensor([[1 + 2 - 1, 1.0], [-2 + 1, -2 + 1]])
    torch.testing.assert_close(Head(proj, None).rows(x, ids), plain)
    torch.testing.assert_close(Head(proj, 2.0).rows(x, ids), 2.0 * torch.tanh(plain / 2.0))


def test_readout_kinds_and_cache_specs():
    c = CandidateTokens([[1, 2]])
    n = CandidateTokens([[1, 2]], normalise=True)
    batch_rows = AgreementFormatter()(EXAMPLES[:1], adapter("gpt2"), torch.tensor([0]))
    assert c.token_ids(batch_rows).tolist() == [[1, 2]] and n.token_ids(batch_rows) is None
    assert c.spec() != n.spec() and n.spec() == {"readout": "candidates", "k": 2}  # log-probs: the old cache key
    v = Verbaliser([3, 4])
    assert v.token_ids(batch_rows).tolist() == [[3, 4]]
    assert Verbaliser([3, 4], normalise=True).token_ids(batch_rows) is None
    assert v.spec() != Verbaliser([3, 4], normalise=True).spec()
