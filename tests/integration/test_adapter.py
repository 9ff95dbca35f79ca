"""The adapter reads exactly what HF reports and writes back losslessly, for MLMs and causal LMs."""

from __future__ import annotations

import pytest
import torch

from cprobe.data.base import Example
from cprobe.models.adapter import ModelAdapter
from tests.conftest import make_random_model

ARCHS = ["bert", "gpt_neox", "gpt2", "llama"]

EXAMPLES = [
    Example("a", tuple("the author near the guards is here .".split()), 5, "is", "are"),
    Example("b", tuple("the authors is here".split()), 2, "are", "is"),
    Example("c", tuple("near the author , the guards that like the author are here".split()), 10, "are", "is"),
]


def _adapter(arch: str, batch_size: int = 2) -> ModelAdapter:
    model, tok = make_random_model(arch)
    return ModelAdapter(model, tok, "mlm" if arch == "bert" else "causal", arch, batch_size=batch_size)


def _reference(ad: ModelAdapter, ex: Example):
    """Unbatched HF forward: hidden states tuple and the prediction-position logits."""
    enc = ad.encode([ex])
    with torch.inference_mode():
        res = ad.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_hidden_states=True)
    return res.hidden_states, res.logits[0, enc.pred[0]], enc


@pytest.mark.parametrize("arch", ARCHS)
def test_read_equals_hf_hidden_states(arch):
    ad = _adapter(arch)
    layers = list(range(ad.n_layers + 1))
    states, _ = ad.read(EXAMPLES, layers, desc=None)
    for i, ex in enumerate(EXAMPLES):
        hs, _, enc = _reference(ad, ex)
        for l in layers:
            torch.testing.assert_close(states[l][i], hs[l][0, enc.site[0]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_site_is_mask_or_last_prefix_token(arch):
    ad = _adapter(arch)
    enc = ad.encode(EXAMPLES[:1])
    ids = enc.input_ids[0].tolist()
    if arch == "bert":
        assert ids[enc.site[0]] == ad.tok.mask_token_id
    else:
        assert ad.tok.convert_ids_to_tokens(ids[enc.site[0]]) == "guards"  # last word of the prefix
    assert enc.site[0] == enc.pred[0]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layer_pick", ["first", "middle", "last"])
def test_write_unchanged_state_reproduces_logits(arch, layer_pick):
    ad = _adapter(arch)
    layer = {"first": 0, "middle": 1, "last": ad.n_layers}[layer_pick]
    states, _ = ad.read(EXAMPLES, [layer], desc=None)
    cands = [(ad.candidate_id(e.correct), ad.candidate_id(e.wrong)) for e in EXAMPLES]
    lp = ad.write(EXAMPLES, layer, states[layer], cands)
    for i, ex in enumerate(EXAMPLES):
        _, logits, _ = _reference(ad, ex)
        ref = logits.float().log_softmax(-1)[list(cands[i])]
        torch.testing.assert_close(lp[i], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_write_changes_exactly_the_site(arch):
    """After writing v at (layer, site), re-reading hidden_states[layer] at the site gives v."""
    ad = _adapter(arch)
    layer = 1
    enc = ad.encode(EXAMPLES)
    v = torch.randn(len(EXAMPLES), ad.hidden_size)
    captured = {}
    handle = ad._install(layer, enc.site, lambda h: v)
    try:
        with torch.inference_mode():
            res = ad.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_hidden_states=True)
    finally:
        handle.remove()
    rows = torch.arange(len(EXAMPLES))
    torch.testing.assert_close(res.hidden_states[layer][rows, enc.site], v)
    captured["other"] = res.hidden_states[layer][0, 0]
    base, _ = ad.read(EXAMPLES[:1], [layer], position="first", desc=None)
    torch.testing.assert_close(captured["other"], base[layer][0], atol=1e-5, rtol=1e-5)


def test_forward_with_edit_is_differentiable():
    ad = _adapter("gpt_neox")
    enc = ad.encode(EXAMPLES)
    a = torch.zeros(ad.hidden_size, requires_grad=True)
    lp = ad.forward_with_edit(enc, 2, lambda h: h + a)
    lp[:, 0].sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0


def test_batched_equals_unbatched():
    big = _adapter("gpt2", batch_size=3)
    one = _adapter("gpt2", batch_size=1)
    a, _ = big.read(EXAMPLES, [2], desc=None)
    b, _ = one.read(EXAMPLES, [2], desc=None)
    torch.testing.assert_close(a[2], b[2], atol=1e-5, rtol=1e-5)


def test_bad_layer_is_a_config_error():
    from cprobe.errors import ConfigError

    ad = _adapter("bert")
    with pytest.raises(ConfigError, match="valid layers are 0"):
        ad.read(EXAMPLES, [99], desc=None)
