"""A tokenizer shared with another library: cprobe pads on the right per call, whatever padding side someone else left
on the tokenizer after the adapter was built (nnsight sets left padding), and never changes it for them."""

from __future__ import annotations

import pytest
import torch

from cprobe.data.items import TextItem
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import AgreementFormatter, ClassificationFormatter, ClozeFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from tests.conftest import make_random_model
from tests.unit.test_engine import _examples


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_map_is_unchanged_by_a_tokenizer_left_padded_by_someone_else(arch):
    model, tok = make_random_model(arch)
    adapter = ModelAdapter(model, tok, "mlm" if arch == "bert" else "causal", arch, batch_size=8)
    ex = _examples(24)  # sentences of different lengths: every batch is padded
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    sites = [Site(0, "first"), Site(2), Site(adapter.n_layers)]
    fmt = AgreementFormatter(positions=("target", "first"))
    before = adapter.map(ex, fmt, read=sites, readout=cands)
    tok.padding_side = "left"  # another library sharing the tokenizer (nnsight does this)
    after = adapter.map(ex, fmt, read=sites, readout=cands)
    for s in sites:
        torch.testing.assert_close(after.acts[s], before.acts[s], atol=0, rtol=0)
    torch.testing.assert_close(after.scores, before.scores, atol=0, rtol=0)
    assert tok.padding_side == "left"  # theirs to keep: cprobe pads per call, it does not reset the tokenizer


def test_cloze_and_classification_formatters_pad_right_per_call():
    model, tok = make_random_model("gpt2")
    adapter = ModelAdapter(model, tok, "causal", "gpt2", batch_size=4)
    items = [TextItem(str(i), " ".join(["the", "author"] + ["w1"] * i + ["is", "[Y]"])) for i in range(6)]
    tok.padding_side = "left"
    enc = ClozeFormatter().encode(items, adapter)
    batch = enc.batch(torch.arange(len(items)), torch.arange(len(items)))
    assert bool((batch.attention_mask[:, 0] == 1).all())  # right padding: every row starts with a real token
    last = batch.position("object")
    assert last.tolist() == (batch.attention_mask.sum(1) - 1).tolist()
    texts = [TextItem(str(i), " ".join(["the"] * (i + 1))) for i in range(5)]
    b = ClassificationFormatter().encode(texts, adapter).batch(torch.arange(5), torch.arange(5))
    assert bool((b.attention_mask[:, 0] == 1).all())
