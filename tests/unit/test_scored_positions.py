"""The output head runs at the scored position of each row only (issue 35 item 1): the same scores as the head at
every position, for every family, padded batches, with edits below and at the last layer, and through DAS's gradient;
the head's own work shrinks from n × T rows to n."""

from __future__ import annotations

import pytest
import torch

from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens, TopK, Vocabulary
from cprobe.models.sites import Site
from tests.conftest import make_random_model
from tests.unit.test_engine import _examples

ARCHS = ["bert", "gpt2", "gpt_neox", "llama"]


def _adapter(arch: str) -> ModelAdapter:
    model, tok = make_random_model(arch)
    return ModelAdapter(model, tok, "mlm" if arch == "bert" else "causal", arch, batch_size=8)


def _both(adapter: ModelAdapter, *args, **kwargs):
    adapter.scored_positions = False
    every = adapter.map(*args, **kwargs)
    adapter.scored_positions = True
    return every, adapter.map(*args, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_scores_equal_the_head_at_every_position(arch):
    adapter = _adapter(arch)
    ex = _examples(20)  # sentences of different lengths: every batch is padded
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    fmt = AgreementFormatter()
    g = torch.Generator().manual_seed(1)
    shift = torch.randn(adapter.hidden_size, generator=g)
    for edits in ({}, {Site(1): Apply(lambda h: h + shift)}, {Site(adapter.n_layers): Apply(lambda h: h - shift)}):
        every, rows = _both(adapter, ex, fmt, read=[Site(2)], edits=edits, readout=cands)
        torch.testing.assert_close(rows.scores, every.scores, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rows.acts[Site(2)], every.acts[Site(2)], atol=0, rtol=0)
    for readout in (Vocabulary(), TopK(3)):  # whole-vocabulary readouts at the position too
        every, rows = _both(adapter, ex, fmt, readout=readout)
        torch.testing.assert_close(rows.scores, every.scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_the_head_sees_one_token_per_row(arch, monkeypatch):
    from cprobe.models.head import Capture

    adapter = _adapter(arch)
    ex = _examples(6)
    ids = [[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex]
    seen = []
    # the full head's logits (n, T, V) (log-probabilities), and what the candidates' rows read (n, T, d)
    h = adapter._head.register_forward_hook(lambda _m, _args, out: seen.append(tuple(out.shape)))
    keep = Capture._hook
    monkeypatch.setattr(Capture, "_hook", lambda self, m, args, kw: (seen.append(tuple(args[0].shape)),
                                                                      keep(self, m, args, kw)))
    try:
        for cands in (CandidateTokens(ids), CandidateTokens(ids, normalise=True)):
            adapter.scored_positions = True
            adapter.map(ex, AgreementFormatter(), readout=cands)
            assert seen and all(s[1] == 1 for s in seen), seen  # one position per row
            seen.clear()
            adapter.scored_positions = False
            adapter.map(ex, AgreementFormatter(), readout=cands)
            assert any(s[1] > 1 for s in seen), seen
            seen.clear()
    finally:
        h.remove()


def test_gradients_through_the_scored_rows_equal_the_full_heads():
    """DAS trains through ``run(grad=True)``: the gradient reaching an edit is the same either way."""
    adapter = _adapter("gpt2")
    ex = _examples(8)
    fmt = AgreementFormatter()
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    batch = fmt(ex, adapter, torch.arange(len(ex)))  # one padded batch of 8 rows
    grads = []
    for flag in (False, True):
        adapter.scored_positions = flag
        delta = torch.zeros(adapter.hidden_size, requires_grad=True)
        out = adapter.run(batch, edits={Site(1): lambda v: v + delta}, readout=cands, grad=True)
        out.scores[:, 0].sum().backward()
        grads.append(delta.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_a_row_without_the_scored_position_is_refused_by_the_readout_without_a_host_read():
    """The head's gathered position keeps −1 for such a row, so the readout's own error is raised as on every token."""
    from cprobe.errors import ConfigError

    adapter = _adapter("gpt2")
    ex = _examples(4)
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    batch = AgreementFormatter()(ex, adapter, torch.arange(len(ex)))
    batch.positions[batch.pred] = batch.positions[batch.pred].clone()
    batch.positions[batch.pred][1] = -1
    for flag in (False, True):
        adapter.scored_positions = flag
        with pytest.raises(ConfigError, match="no prediction position"):
            adapter.run(batch, readout=cands)
