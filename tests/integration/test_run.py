"""The one model entry point: reads equal HF hidden states, edits change exactly their site, readouts score
what they claim, for masked LMs, causal LMs and a sequence classifier (tiny random models)."""

from __future__ import annotations

import pytest
import torch

from cprobe.data.base import Example
from cprobe.data.items import TextItem
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Interchange, Replace
from cprobe.models.formatters import AgreementFormatter, ClassificationFormatter, ClozeFormatter, RegionFormatter
from cprobe.models.readouts import CandidateTokens, ClassHead, TopK, Verbaliser, Vocabulary
from cprobe.models.sites import Site
from tests.conftest import make_random_model, make_word_tokenizer

ARCHS = ["bert", "gpt_neox", "gpt2", "llama"]
EXAMPLES = [
    Example("a", tuple("the author near the guards is here .".split()), 5, "is", "are"),
    Example("b", tuple("the authors is here".split()), 2, "are", "is"),
    Example("c", tuple("near the author , the guards that like the author are here".split()), 10, "are", "is"),
]


def _adapter(arch: str, batch_size: int = 2) -> ModelAdapter:
    model, tok = make_random_model(arch)
    return ModelAdapter(model, tok, "mlm" if arch == "bert" else "causal", arch, batch_size=batch_size)


def _hf(ad: ModelAdapter, items, formatter):
    """Unbatched reference: HF hidden_states and logits for each item, plus its batch."""
    out = []
    for i, it in enumerate(items):
        b = formatter([it], ad, torch.tensor([i]))
        with torch.inference_mode():
            res = ad.model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)
        out.append((res.hidden_states, res.logits[0], b))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_map_reads_hf_hidden_states_at_every_layer_in_input_order(arch):
    ad = _adapter(arch)
    fmt = AgreementFormatter(("target", "first"))
    sites = [Site(l, p) for l in range(ad.n_layers + 1) for p in ("target", "first")]
    out = ad.map(EXAMPLES, fmt, read=sites)
    for i, (hs, _, b) in enumerate(_hf(ad, EXAMPLES, fmt)):
        for s in sites:
            torch.testing.assert_close(out.acts[s][i], hs[s.layer][0, b.positions[s.position][0]], atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
@pytest.mark.parametrize("arch", ARCHS)
def test_early_stop_and_single_batch_agree_with_full_pass(arch):
    ad, one = _adapter(arch, batch_size=3), _adapter(arch, batch_size=1)
    fmt = AgreementFormatter()
    a = ad.map(EXAMPLES, fmt, read=[Site(1)])  # stops after block 1
    b = one.map(EXAMPLES, fmt, read=[Site(1), Site(ad.n_layers)])
    torch.testing.assert_close(a.acts[Site(1)], b.acts[Site(1)], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layer_pick", ["first", "middle", "last"])
def test_replacing_a_site_by_its_own_state_reproduces_the_scores(arch, layer_pick):
    ad = _adapter(arch)
    layer = {"first": 0, "middle": 1, "last": ad.n_layers}[layer_pick]
    fmt = AgreementFormatter()
    cands = CandidateTokens([[ad.candidate_id(e.correct), ad.candidate_id(e.wrong)] for e in EXAMPLES])
    clean = ad.map(EXAMPLES, fmt, read=[Site(layer)], readout=cands)
    edited = ad.map(EXAMPLES, fmt, edits={Site(layer): Replace(clean.acts[Site(layer)])}, readout=cands)
    torch.testing.assert_close(edited.scores, clean.scores, atol=1e-4, rtol=1e-4)
    logp = ad.map(EXAMPLES, fmt, readout=CandidateTokens(cands.ids, normalise=True)).scores
    for i, (_, logits, b) in enumerate(_hf(ad, EXAMPLES, fmt)):
        at = logits[b.positions["target"][0]].float()
        torch.testing.assert_close(clean.scores[i], at[cands.ids[i]], atol=1e-4, rtol=1e-4)  # the candidates' logits
        torch.testing.assert_close(logp[i], at.log_softmax(-1)[cands.ids[i]], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_head_only_shortcut_equals_the_full_forward(arch):
    ad = _adapter(arch)
    fmt = AgreementFormatter()
    site = Site(ad.n_layers)
    v = torch.randn(len(EXAMPLES), ad.hidden_size)
    cands = CandidateTokens([[ad.candidate_id(e.correct), ad.candidate_id(e.wrong)] for e in EXAMPLES])
    assert ad._head_only([], {site: Replace(v)}, cands, fmt)
    fast = ad.map(EXAMPLES, fmt, edits={site: Replace(v)}, readout=cands)
    # the full forward: the same write through an EditSpec that is not a plain Replace
    full = ad.map(EXAMPLES, fmt, edits={site: _NotReplace(v)}, readout=cands)
    torch.testing.assert_close(fast.scores, full.scores, atol=1e-4, rtol=1e-4)


class _NotReplace(Replace):
    """A Replace the shortcut does not recognise (forces the full forward)."""


@pytest.mark.parametrize("arch", ARCHS)
def test_edit_changes_exactly_its_site_and_reads_see_it(arch):
    ad = _adapter(arch)
    fmt = AgreementFormatter(("target", "first"))
    v = torch.randn(len(EXAMPLES), ad.hidden_size)
    clean = ad.map(EXAMPLES, fmt, read=[Site(1, "first"), Site(1)])
    out = ad.map(EXAMPLES, fmt, read=[Site(1), Site(1, "first")], edits={Site(1): Replace(v)})
    torch.testing.assert_close(out.acts[Site(1)], v)
    torch.testing.assert_close(out.acts[Site(1, "first")], clean.acts[Site(1, "first")], atol=1e-5, rtol=1e-5)


def test_block_stream_is_the_raw_output_of_the_last_block():
    ad = _adapter("gpt_neox")
    fmt = AgreementFormatter()
    L = ad.n_layers
    out = ad.map(EXAMPLES, fmt, read=[Site(L), Site(L, stream="block")])
    normed = ad._final_norm(out.acts[Site(L, stream="block")])
    torch.testing.assert_close(normed, out.acts[Site(L)], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out.acts[Site(L)], out.acts[Site(L, stream="block")])
    below = ad.map(EXAMPLES, fmt, read=[Site(L - 1), Site(L - 1, stream="block")])
    torch.testing.assert_close(below.acts[Site(L - 1)], below.acts[Site(L - 1, stream="block")])


def test_grad_flows_to_what_an_edit_closes_over():
    ad = _adapter("gpt_neox")
    fmt = AgreementFormatter()
    b = fmt(EXAMPLES, ad, torch.arange(3))
    a = torch.zeros(ad.hidden_size, requires_grad=True)
    out = ad.run(b, edits={Site(2): lambda h: h + a}, readout=Vocabulary(), grad=True)
    out.scores[:, 0].sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0


def test_interchange_with_source_equal_to_base_is_the_identity_and_vanilla_swaps():
    ad = _adapter("gpt2")
    fmt = AgreementFormatter()
    cands = CandidateTokens([[ad.candidate_id(e.correct), ad.candidate_id(e.wrong)] for e in EXAMPLES])
    clean = ad.map(EXAMPLES, fmt, read=[Site(2)], readout=cands)
    a = torch.nn.functional.normalize(torch.randn(ad.hidden_size), dim=0)
    same = ad.map(EXAMPLES, fmt, edits={Site(2): Interchange(clean.acts[Site(2)], a)}, readout=cands)
    torch.testing.assert_close(same.scores, clean.scores, atol=1e-4, rtol=1e-4)
    src = torch.randn(len(EXAMPLES), ad.hidden_size)
    swapped = ad.map(EXAMPLES, fmt, read=[Site(2)], edits={Site(2): Interchange(src)})
    torch.testing.assert_close(swapped.acts[Site(2)], src)


def test_region_formatter_positions_are_last_tokens_of_regions():
    ad = _adapter("gpt_neox")
    items = [TextItem("x", "the author near the guards", regions=("the author", " near", " the guards")),
             TextItem("y", "the authors is", regions=("the authors", "", " is"))]
    b = RegionFormatter()(items, ad, torch.arange(2))
    toks = [ad.tok.convert_ids_to_tokens(r) for r in b.input_ids.tolist()]
    assert toks[0][0] == "<|endoftext|>"
    assert [toks[0][int(b.positions[f"region:{r}"][0])] for r in range(3)] == ["author", "near", "guards"]
    assert int(b.positions["region:1"][1]) == -1 and toks[1][int(b.positions["region:2"][1])] == "is"
    assert int(b.positions["last"][1]) == 3


@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])
def test_cloze_reads_the_object_position_and_top_k_matches_the_vocabulary(arch):
    ad = _adapter(arch)
    items = [TextItem("q1", "the author near the guards is [Y] .", slots={"subject": "author"}, outcome="here"),
             TextItem("q2", "the guards like [Y] .", slots={"subject": "guards"}, outcome="the")]
    fmt = ClozeFormatter()
    b = fmt(items, ad, torch.arange(2))
    toks = [ad.tok.convert_ids_to_tokens(r) for r in b.input_ids.tolist()]
    obj = b.positions["object"].tolist()
    if arch == "bert":
        assert [toks[i][obj[i]] for i in range(2)] == ["[MASK]", "[MASK]"]
    else:
        assert [toks[i][obj[i]] for i in range(2)] == ["is", "like"]  # the prompt is cut before [Y]
    assert [toks[i][int(b.positions["subject"][i])] for i in range(2)] == ["author", "guards"]
    vocab = ad.map(items, fmt, readout=Vocabulary()).scores
    top = ad.map(items, fmt, readout=TopK(5)).scores
    torch.testing.assert_close(top, vocab.topk(5, dim=-1).indices)
    gold = torch.tensor([ad.tok.convert_tokens_to_ids(it.outcome) for it in items])
    assert TopK(5).accuracy(top, gold) == float((vocab.argmax(-1) == gold).float().mean())
    # reading and writing at any layer: a layer-1 write at the subject changes the object's scores
    sub = ad.map(items, fmt, read=[Site(1, "subject")]).acts[Site(1, "subject")]
    moved = ad.map(items, fmt, edits={Site(1, "subject"): Replace(sub + 5.0 * torch.randn_like(sub))}, readout=Vocabulary()).scores
    assert not torch.allclose(moved, vocab)


def test_verbaliser_scores_fixed_label_words():
    ad = _adapter("gpt2")
    fmt = ClassificationFormatter()
    items = [TextItem("a", "the author is"), TextItem("b", "the guards are here")]
    ids = [ad.tok.convert_tokens_to_ids(w) for w in ("here", "the")]
    v = ad.map(items, fmt, readout=Verbaliser(ids)).scores  # the label words' logits
    lp = ad.map(items, fmt, readout=Verbaliser(ids, normalise=True)).scores  # their log-probabilities
    full = ad.map(items, fmt, readout=Vocabulary()).scores
    torch.testing.assert_close(lp, full[:, ids])
    torch.testing.assert_close(v[:, 0] - v[:, 1], lp[:, 0] - lp[:, 1], atol=1e-5, rtol=1e-5)
    assert Verbaliser(ids).accuracy(v, torch.tensor([0, 1])) == Verbaliser(ids).accuracy(lp, torch.tensor([0, 1]))


def test_class_head_readout_on_a_sequence_classifier_reads_and_writes_any_layer():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    tok = make_word_tokenizer("mlm")
    model = BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64, num_labels=3))
    ad = ModelAdapter(model, tok, "classifier", "tiny-cls")
    items = [TextItem("a", "the author is here"), TextItem("b", "the guards are here , near the author")]
    fmt = ClassificationFormatter(max_length=16)
    out = ad.map(items, fmt, read=[Site(l, "cls") for l in range(3)], readout=ClassHead())
    with torch.inference_mode():
        ref = model(**tok([it.text for it in items], return_tensors="pt", padding=True)).logits.log_softmax(-1)
    torch.testing.assert_close(out.scores, ref, atol=1e-5, rtol=1e-5)
    assert out.scores.shape == (2, 3)
    same = ad.map(items, fmt, edits={Site(1, "cls"): Replace(out.acts[Site(1, "cls")])}, readout=ClassHead())
    torch.testing.assert_close(same.scores, out.scores, atol=1e-5, rtol=1e-5)
    moved = ad.map(items, fmt, edits={Site(2, "cls"): Replace(torch.randn(2, 32) * 3)}, readout=ClassHead())
    assert not torch.allclose(moved.scores, out.scores)


@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])
def test_site_is_the_mask_or_the_last_prefix_token(arch):
    ad = _adapter(arch)
    b = AgreementFormatter()(EXAMPLES[:1], ad, torch.tensor([0]))
    ids, site = b.input_ids[0].tolist(), int(b.position("target")[0])
    if arch == "bert":
        assert ids[site] == ad.tok.mask_token_id
    else:
        assert ad.tok.convert_ids_to_tokens(ids[site]) == "guards"  # the last word of the prefix


def test_a_layer_out_of_range_is_a_config_error():
    from cprobe.errors import ConfigError

    ad = _adapter("bert")
    with pytest.raises(ConfigError, match="valid layers are 0"):
        ad.map(EXAMPLES, AgreementFormatter(), read=[Site(99)])
