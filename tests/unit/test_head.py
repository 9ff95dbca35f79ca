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
from cprobe.models import head as head_module
from cprobe.models.head import Head
from cprobe.models.readouts import CandidateTokens, TargetLogProb, Verbaliser
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
    assert c.token_ids(batch_rows).tolist() == [[1, 2]] == n.token_ids(batch_rows).tolist()
    assert not c.normalise and n.normalise  # the rows' logits; their log-probabilities (the streamed normaliser)
    assert c.spec() != n.spec() and n.spec() == {"readout": "candidates", "k": 2}  # log-probs: the old cache key
    v = Verbaliser([3, 4])
    assert v.token_ids(batch_rows).tolist() == [[3, 4]]
    assert Verbaliser([3, 4], normalise=True).token_ids(batch_rows).tolist() == [[3, 4]]
    assert v.spec() != Verbaliser([3, 4], normalise=True).spec()


# ------------------------------------------------------------------------ the streamed normaliser (Head.log_probs)


def test_log_normaliser_hand_computed():
    """W rows (1, 0), (0, 2), (1, 1); b (0, 1, −1); x (1, 2): u = (1, 5, 2); lse = log(e + e⁵ + e²); with cap 2,
    z = 2 tanh(u / 2). d lse / dx = Σ p_v post'(u_v) w_v, post' = 1 − tanh²(u / 2) under the cap."""
    import math

    proj = torch.nn.Linear(2, 3)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
        proj.bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    proj.requires_grad_(False)
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    lse = Head(proj, None).log_normaliser(x)
    assert lse.item() == pytest.approx(math.log(math.e + math.e ** 5 + math.e ** 2), abs=1e-6)
    lse.sum().backward()
    p = [math.e ** u / (math.e + math.e ** 5 + math.e ** 2) for u in (1, 5, 2)]
    torch.testing.assert_close(x.grad, torch.tensor([[p[0] + p[2], 2 * p[1] + p[2]]]))
    z = [2 * math.tanh(u / 2) for u in (1, 5, 2)]
    x.grad = None
    capped = Head(proj, 2.0).log_normaliser(x)
    assert capped.item() == pytest.approx(math.log(sum(math.exp(v) for v in z)), abs=1e-6)
    capped.sum().backward()
    q = [math.exp(v) / sum(math.exp(v) for v in z) for v in z]
    d = [1 - math.tanh(u / 2) ** 2 for u in (1, 5, 2)]
    torch.testing.assert_close(x.grad, torch.tensor([[q[0] * d[0] + q[2] * d[2], 2 * q[1] * d[1] + q[2] * d[2]]]))
    lp = Head(proj, None).log_probs(x.detach(), torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.tensor([[5.0, 1.0]]) - math.log(math.e + math.e ** 5 + math.e ** 2))


@pytest.mark.parametrize("chunk", [1, 7, 1024, 100_000])
@pytest.mark.parametrize("cap,bias", [(None, False), (3.0, False), (None, True)])
def test_streamed_normaliser_equals_the_full_log_softmax_and_its_gradient(monkeypatch, chunk, cap, bias):
    """Over chunks that do and do not divide the vocabulary (V = 1,000), one row per chunk and the whole vocabulary in
    one: the value and the gradient in x equal torch's log-sum-exp of the full logits (soft cap, bias); the head gets
    no gradient and is never asked for one; without a gradient wanted, the same value."""
    monkeypatch.setattr(head_module, "CPU_CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    proj = torch.nn.Linear(16, 1000, bias=bias).requires_grad_(False)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(1000, 16, generator=g))  # logits of a few units, up to ~15: the max moves
        if bias:
            proj.bias.copy_(torch.randn(1000, generator=g))
    head = Head(proj, cap)
    x0 = torch.randn(5, 16, generator=g)
    ids = torch.randint(0, 1000, (5, 2), generator=g)
    x = x0.clone().requires_grad_(True)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5])
    (head.log_probs(x, ids) * weights[:, None]).sum().backward()
    ref_x = x0.clone().requires_grad_(True)
    full = head.post(proj(ref_x)).float().log_softmax(-1)
    (full.gather(1, ids) * weights[:, None]).sum().backward()
    torch.testing.assert_close(head.log_probs(x0, ids), full.detach().gather(1, ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(head.log_normaliser(x0), torch.logsumexp(head.post(proj(x0)), -1), atol=1e-5,
                                   rtol=1e-5)


def test_a_trained_projection_keeps_its_gradient():
    """A head that requires a gradient (a fine-tune of it) takes the plain product: its weight's gradient is there and
    equals the full log-softmax's."""
    proj = torch.nn.Linear(8, 50)
    x = torch.randn(3, 8)
    ids = torch.tensor([[1], [2], [3]])
    Head(proj, None).log_probs(x, ids).sum().backward()
    got = proj.weight.grad.clone()
    proj.weight.grad = None
    proj(x).log_softmax(-1).gather(1, ids).sum().backward()
    torch.testing.assert_close(got, proj.weight.grad)


def split_and_full(ad: ModelAdapter, b, readout, weights: torch.Tensor) -> list:
    """[(scores, gradient)] of ``readout`` through the adapter with an edit ``h + a`` at layer 1 (a = 0), the split
    head first, then the full head (``head_rows`` off); the gradient is of column 0 weighted by ``weights``. Checks
    the projection ran over the vocabulary only the second time."""
    got = []
    for rows in (True, False):
        ad.head_rows = rows
        calls = []
        hook = ad.head.projection.register_forward_hook(lambda *_: calls.append(1))
        a = torch.zeros(ad.hidden_size, requires_grad=True)
        out = ad.run(b, edits={Site(1): lambda h: h + a}, readout=readout, grad=True).scores
        hook.remove()
        assert bool(calls) is not rows
        (out[:, 0] * weights).sum().backward()
        got.append((out.detach(), a.grad))
    ad.head_rows = True
    return got


@pytest.mark.parametrize("model_type", ["gpt2", "bert", "gemma3_text"])
def test_target_log_probs_through_the_model_equal_the_full_heads(model_type):
    """TargetLogProb through the adapter (rows and streamed normaliser, the projection never run over the vocabulary)
    equals the full head's log-softmax at each row's target, and so does its gradient in an edit's parameter."""
    ad = adapter(model_type)
    b = AgreementFormatter()(EXAMPLES, ad, torch.arange(3))
    target = torch.tensor([ad.candidate_id("is"), ad.candidate_id("are"), ad.candidate_id("here")])
    got = split_and_full(ad, b, TargetLogProb(target), torch.tensor([1.0, -1.0, 2.0]))
    assert got[0][0].shape == (3, 1)
    torch.testing.assert_close(got[0][0], got[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0][1], got[1][1], atol=1e-5, rtol=1e-5)
    assert float(got[0][1].abs().sum()) > 0
    torch.testing.assert_close(got[0][0][:, 0], full_logits(ad).log_softmax(-1).gather(1, target[:, None])[:, 0],
                               atol=1e-5, rtol=1e-5)
    # by item through map's batches (2 rows each here), and the targets in the readout's cache key
    ad.batch_size = 2
    torch.testing.assert_close(ad.map(EXAMPLES, AgreementFormatter(), readout=TargetLogProb(target)).scores,
                               got[0][0], atol=1e-5, rtol=1e-5)
    assert TargetLogProb(target).spec() == TargetLogProb(target.clone()).spec() != TargetLogProb(target.flip(0)).spec()


def test_das_trains_the_same_directions_through_the_streamed_loss():
    """DAS over K sites (SitesForward.log_prob: the target's log-probability from the streamed head) learns the
    directions the full (K, b, V) log-softmax learns, and its per-step losses are the same."""
    from cprobe.directions.das import DAS
    from cprobe.models.multisite import SitesForward

    ad = adapter("gemma3_text")
    fmt = AgreementFormatter()
    b = fmt(EXAMPLES, ad, torch.arange(3))
    sites = [Site(1), Site(2)]
    g = torch.Generator().manual_seed(1)
    h = 3 * torch.randn(2, 3, ad.hidden_size, generator=g)
    target = torch.tensor([[ad.candidate_id("is"), ad.candidate_id("are"), ad.candidate_id("here")]] * 2)
    das = DAS(lr=0.05, batch_size=2, epochs=3)
    forward = SitesForward(ad, b, torch.arange(3), sites, das.windows(3))
    streamed = das.fit_many(forward, h, target)
    losses = das.losses_.clone()
    full = das.fit_many(lambda rows, hs, a: forward(rows, hs, a), h, target)  # no log_prob: the full head
    torch.testing.assert_close(das.losses_, losses, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(streamed, das.fit_many(forward, h, target.flip(1)), atol=1e-3)


@pytest.mark.parametrize("scored_positions", [True, False])
@pytest.mark.parametrize("model_type", ["gpt2", "gemma3_text"])
def test_a_continuations_log_probability_streams_the_head_at_each_position(model_type, scored_positions):
    """ContinuationLogProb (a multi-token label: RAVEL's DAS loss) through the adapter: the targets' rows and the
    streamed normaliser at each named position give the full head's value and gradient, a missing position (−1) and a
    pad target (−1) left out, the projection never run over the vocabulary."""
    from dataclasses import replace

    from cprobe.models.readouts import ContinuationLogProb

    ad = adapter(model_type)
    ad.scored_positions = scored_positions
    b = AgreementFormatter()(EXAMPLES, ad, torch.arange(3))
    b = replace(b, positions={**b.positions, "p0": torch.tensor([1, 1, 2]), "p1": torch.tensor([2, -1, 3])})
    targets = torch.tensor([[ad.candidate_id("is"), ad.candidate_id("here")],
                            [ad.candidate_id("are"), ad.candidate_id("is")],
                            [ad.candidate_id("here"), -1]])
    got = split_and_full(ad, b, ContinuationLogProb(["p0", "p1"], targets), torch.ones(3))
    torch.testing.assert_close(got[0][0], got[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0][1], got[1][1], atol=1e-5, rtol=1e-5)
    # by hand from the model's own logits: row 0 both positions, row 1 position 0 only, row 2 its first token only
    with torch.inference_mode():
        logp = ad.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float().log_softmax(-1)
    want = torch.stack([logp[0, 1, targets[0, 0]] + logp[0, 2, targets[0, 1]], logp[1, 1, targets[1, 0]],
                        logp[2, 2, targets[2, 0]]])
    torch.testing.assert_close(got[0][0][:, 0], want, atol=1e-5, rtol=1e-5)


def test_the_streamed_normaliser_refuses_a_second_derivative_and_survives_masked_tokens():
    """create_graph through the streamed normaliser raises (its kept gradient has no derivative of its own) instead of
    dropping the Hessian; a chunk of −inf logits (a masked token's bias) adds nothing, and a row of them all gives
    −inf, as torch's log-sum-exp does; the value alone (no gradient wanted) is the same."""
    proj = torch.nn.Linear(4, 10).requires_grad_(False)
    head = Head(proj, None)
    x = torch.randn(2, 4, requires_grad=True)
    (g,) = torch.autograd.grad(head.log_normaliser(x).sum(), x, create_graph=False)
    assert g.shape == (2, 4)
    with pytest.raises(RuntimeError, match="no second derivative.*head_rows = False"):
        torch.autograd.grad(head.log_normaliser(x).sum(), x, create_graph=True)
    with torch.no_grad():
        proj.bias[:] = -torch.inf
        proj.bias[7] = 0.0
    for chunk in (3, 100):
        head_module.CPU_CHUNK, saved = chunk, head_module.CPU_CHUNK
        try:
            torch.testing.assert_close(head.log_normaliser(x), proj(x)[:, 7], atol=1e-6, rtol=1e-6)
            with torch.no_grad():
                proj.bias[7] = -torch.inf
                assert head.log_normaliser(x).tolist() == [-torch.inf, -torch.inf]
                proj.bias[7] = 0.0
        finally:
            head_module.CPU_CHUNK = saved
