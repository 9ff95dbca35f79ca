"""A causal LM's last-token pass over the prefix's clean key/value cache (issue 35, :mod:`cprobe.models.resume`):
per causal family (GPT-2 absolute positions, GPT-NeoX and Llama rotary; Mistral, Qwen 2/3 and Gemma 2/3 with
sliding-window layers whose window the prefix fits — issue 44), edits at the first, a middle and the last layer of
padded batches of uneven lengths give the full forward's scores and read states (≤ 1e-5, fp32) and DAS's gradients
while the blocks above the edit see one token per row; a prefix wider than the sliding window, a pass edited or read
anywhere else, a family without the capability, ``kv_resume`` off or clean states without the cache take the ordinary
path."""

from __future__ import annotations

import pytest
import torch

from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import dii
from cprobe.models.family import MODEL_FAMILIES
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.multisite import site_batch
from cprobe.models.readouts import CandidateTokens, Vocabulary
from cprobe.models.resume import last_only
from cprobe.models.sites import Batch, Site
from tests.conftest import SLIDING
from tests.unit.test_resume import NARROW, TOL, _adapter, _setup

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

CAUSAL = ["gpt2", "gpt_neox", "llama", *SLIDING]
WIDE = 64
"""A sliding window wider than every test batch: the one-token step is exact."""


class _Tokens:
    """Tokens per row through each block (the hidden states' width its forward is called with)."""

    def __init__(self, adapter: ModelAdapter) -> None:
        self.width: list[int | None] = [None] * adapter.n_layers
        self.handles = [b.register_forward_pre_hook(self._see(i), with_kwargs=True)
                        for i, b in enumerate(adapter._blocks)]

    def _see(self, i: int):
        def hook(_m, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self.width[i] = int(h.shape[1])
        return hook

    def take(self) -> list[int | None]:
        out, self.width = self.width, [None] * len(self.width)
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _take(clean, batch: Batch, adapter: ModelAdapter, items=None):
    items = torch.arange(len(batch)) if items is None else items
    return clean.take(items, batch.input_ids, batch.attention_mask, adapter.name, adapter.device)


@pytest.mark.parametrize("arch", CAUSAL)
def test_last_token_passes_equal_the_full_forward_one_token_through_the_blocks_above(arch):
    adapter, ex, _fmt, batch, cands = _setup(arch, window=WIDE)
    L, T = adapter.n_layers, int(batch.input_ids.shape[1])
    assert bool((batch.positions["target"] == batch.attention_mask.sum(1) - 1).all())  # the causal target is last
    clean = adapter.clean_states(batch, range(1, L + 1), kv=True)
    assert sorted(clean.kv) == list(range(2, L + 1))  # every block above the lowest layer
    shift = torch.randn(adapter.hidden_size, generator=torch.Generator().manual_seed(3))
    seen = _Tokens(adapter)
    try:
        for layer in (1, 2, L):  # the first, a middle and the last layer
            edits = {Site(layer): lambda h: h + shift}
            read = [Site(layer), Site(L), Site(L, stream="block")]
            full = adapter.run(batch, read, edits, cands)
            assert seen.take() == [T] * L
            out = adapter.run(batch, read, edits, cands, resume=_take(clean, batch, adapter))
            # blocks 1 … layer skipped (the pass-through sees the full width, runs nothing), the rest one token
            assert seen.take()[layer:] == [1] * (L - layer)
            torch.testing.assert_close(out.scores, full.scores, **TOL)
            for s in read:
                torch.testing.assert_close(out.acts[s], full.acts[s], **TOL)
    finally:
        seen.remove()


@pytest.mark.parametrize("arch", CAUSAL)
def test_rows_edited_at_other_layers_or_not_at_all_keep_the_cache_path(arch):
    """CausalGym's many-sites batches: a row whose site is at another layer has −1 at this one (site_batch)."""
    adapter, ex, _fmt, batch, cands = _setup(arch, 10, window=WIDE)
    L = adapter.n_layers
    sites = [Site(1), Site(2)]
    row_site = torch.tensor([0, 1] * 5)
    items = torch.arange(10)
    sub, at = site_batch(batch, items, row_site, sites)
    clean = adapter.clean_states(batch, [1, 2], kv=True)
    src = torch.randn(10, adapter.hidden_size, generator=torch.Generator().manual_seed(1))
    a = torch.nn.functional.normalize(torch.randn(adapter.hidden_size), dim=0)
    edits = {s: (lambda h: dii(h, src, a)) for s in at}
    readout = CandidateTokens(cands.ids[items])
    full = adapter.run(sub, edits=edits, readout=readout)
    seen = _Tokens(adapter)
    try:
        out = adapter.run(sub, edits=edits, readout=readout,
                          resume=clean.take(items, sub.input_ids, sub.attention_mask, adapter.name, adapter.device,
                                            [1]))
        assert seen.take()[1:] == [1] * (L - 1)
    finally:
        seen.remove()
    torch.testing.assert_close(out.scores, full.scores, **TOL)


@pytest.mark.parametrize("arch", CAUSAL)
def test_das_gradients_through_the_cache_path_equal_the_full_forward(arch):
    adapter, ex, _fmt, batch, _cands = _setup(arch, window=WIDE)
    L = adapter.n_layers
    layer = 1
    clean = adapter.clean_states(batch, [layer], kv=True)
    src = torch.randn(len(ex), adapter.hidden_size, generator=torch.Generator().manual_seed(5))
    target = torch.randint(0, len(adapter.tok), (len(ex),), generator=torch.Generator().manual_seed(6))

    def grad(resume) -> tuple[torch.Tensor, torch.Tensor]:
        v = torch.nn.Parameter(torch.randn(adapter.hidden_size, generator=torch.Generator().manual_seed(7)))
        edits = {Site(layer): lambda h: dii(h, src, v / v.norm())}
        lp = adapter.run(batch, edits=edits, readout=Vocabulary(), grad=True, resume=resume).scores
        loss = torch.nn.functional.nll_loss(lp.float(), target)
        loss.backward()
        return loss.detach(), v.grad

    seen = _Tokens(adapter)
    try:
        full = grad(None)
        assert seen.take() == [int(batch.input_ids.shape[1])] * L
        got = grad(_take(clean, batch, adapter))
        assert seen.take()[layer:] == [1] * (L - layer)
    finally:
        seen.remove()
    torch.testing.assert_close(got[0], full[0], **TOL)
    torch.testing.assert_close(got[1], full[1], **TOL)


def test_a_pass_edited_or_read_elsewhere_takes_the_ordinary_resumed_path():
    adapter = _adapter("gpt2")
    from tests.unit.test_engine import _examples

    ex = _examples(12)
    fmt = AgreementFormatter(("first",))
    batch = fmt(ex, adapter, torch.arange(len(ex)))
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    L, T = adapter.n_layers, int(batch.input_ids.shape[1])
    clean = adapter.clean_states(batch, [1], kv=True)
    shift = torch.randn(adapter.hidden_size, generator=torch.Generator().manual_seed(2))
    seen = _Tokens(adapter)
    try:
        for edits, read in (({Site(1, "first"): lambda h: h + shift}, []),  # an edit at the first token
                            ({Site(1): lambda h: h + shift}, [Site(2, "first")]),  # a read there
                            ({Site(1): lambda h: h + shift}, [Site(2, "mean")])):  # a pooled read
            full = adapter.run(batch, read, edits, cands)
            seen.take()
            out = adapter.run(batch, read, edits, cands, resume=_take(clean, batch, adapter))
            assert seen.take()[1:] == [T] * (L - 1)  # resumed, every token
            torch.testing.assert_close(out.scores, full.scores, **TOL)
            for s in read:
                torch.testing.assert_close(out.acts[s], full.acts[s], **TOL)
    finally:
        seen.remove()


def test_the_switch_the_family_and_the_clean_states_decide():
    adapter, _ex, _fmt, batch, cands = _setup("gpt_neox", 8)
    L, T = adapter.n_layers, int(batch.input_ids.shape[1])
    edits = {Site(1): lambda h: h + 1.0}
    seen = _Tokens(adapter)
    try:
        plain = adapter.clean_states(batch, [1])  # built without the cache: resumed, every token
        assert plain.kv == {}
        adapter.run(batch, edits=edits, readout=cands, resume=_take(plain, batch, adapter))
        assert seen.take()[1:] == [T] * (L - 1)
        clean = adapter.clean_states(batch, [1], kv=True)
        adapter.kv_resume = False  # compute.kv_resume=false
        assert not adapter.can_kv_resume
        adapter.run(batch, edits=edits, readout=cands, resume=_take(clean, batch, adapter))
        assert seen.take()[1:] == [T] * (L - 1)
        assert adapter.clean_states(batch, [1], kv=True).kv == {}  # nothing kept when it cannot be used
        adapter.kv_resume = True
        adapter.run(batch, edits=edits, readout=cands, resume=_take(clean, batch, adapter))
        assert seen.take()[1:] == [1] * (L - 1)
    finally:
        seen.remove()
    # the capability is declared per family: every listed decoder, no masked LM
    assert all(f.kv_resume == (f.pool == "last") for f in MODEL_FAMILIES.values())
    assert not MODEL_FAMILIES["bert"].kv_resume
    bert = _adapter("bert")
    assert not bert.can_kv_resume
    assert bert.clean_states(batch, [1], kv=True).kv == {}


def test_last_only_finds_each_rows_last_token_or_refuses():
    """A hand-made right-padded batch: lengths 3, 2, 4 → last positions 2, 1, 3."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    pos = {"target": torch.tensor([2, 1, 3]), "first": torch.tensor([0, 0, 0]), "gap": torch.tensor([2, -1, 3])}
    b = Batch(torch.zeros(3, 4, dtype=torch.long), mask, pos, torch.arange(3), pred="target")
    assert last_only(b, [Site(1)], [Site(2)], True).tolist() == [2, 1, 3]
    assert last_only(b, [Site(1, "gap")], [], True).tolist() == [2, 1, 3]  # absent in a row (−1): unedited there
    assert last_only(b, [Site(1, "first")], [], True) is None
    assert last_only(b, [Site(1)], [Site(2, "first")], True) is None
    assert last_only(b, [Site(1)], [Site(2, "mean")], True) is None
    assert last_only(Batch(b.input_ids, mask, pos, b.rows, pred="first"), [Site(1)], [], True) is None
    left = Batch(b.input_ids, torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]]), pos, b.rows, pred="target")
    assert last_only(left, [Site(1)], [], True) is None  # not right-padded


@pytest.mark.parametrize("arch,kv", [("gpt2", True), ("gpt2", False), ("bert", False)])
def test_das_steps_over_many_sites_resume_at_the_lowest_site(arch, kv):
    """CausalGym's DAS forward over K sites (SitesForward: each step's rows K times, copy k edited at site k): given
    the train items' clean states, a step runs only the blocks above the lowest site (one token each over the
    prefix's key/value cache, where every site is at the last token) and scores what the full forward scores."""
    from cprobe.models.multisite import SitesForward
    from tests.unit.test_resume import _Calls

    adapter, ex, _fmt, batch, _cands = _setup(arch)
    L, n = adapter.n_layers, len(ex)
    sites = [Site(2), Site(1)]  # the lowest second: a step resumes at the lowest site's layer, not the first's
    rows, window = torch.arange(n), [(0, n)]
    g = torch.Generator().manual_seed(2)
    h_source = torch.randn(2, n, adapter.hidden_size, generator=g)
    a = torch.nn.functional.normalize(torch.randn(2, adapter.hidden_size, generator=g), dim=-1)
    full = SitesForward(adapter, batch, rows, sites, window)(slice(0, n), h_source, a)
    clean = adapter.clean_states(batch, [1], kv=kv)
    calls, seen = _Calls(adapter), _Tokens(adapter)
    try:
        out = SitesForward(adapter, batch, rows, sites, window, clean)(slice(0, n), h_source, a)
        assert calls.ran() == [i >= 1 for i in range(L)]  # block 1 did not compute
        if kv:
            assert seen.take()[1:] == [1] * (L - 1)
    finally:
        calls.remove()
        seen.remove()
    torch.testing.assert_close(out, full, **TOL)


def test_das_steps_take_k_dimensional_bases():
    """SitesForward with bases (K, d, k) (DAS's k): a (K, d, 1) basis scores what its direction (K, d) scores, and a
    second column moves the scores."""
    from cprobe.models.multisite import SitesForward

    adapter, ex, _fmt, batch, _cands = _setup("gpt2")
    n, d = len(ex), adapter.hidden_size
    forward = SitesForward(adapter, batch, torch.arange(n), [Site(2), Site(1)], [(0, n)])
    g = torch.Generator().manual_seed(2)
    h_source = 3 * torch.randn(2, n, d, generator=g)
    R, _ = torch.linalg.qr(torch.randn(2, d, 2, generator=g))
    one = forward(slice(0, n), h_source, R[:, :, 0])
    torch.testing.assert_close(forward(slice(0, n), h_source, R[:, :, :1]), one, **TOL)
    assert not torch.allclose(forward(slice(0, n), h_source, R), one, **TOL)


@pytest.mark.parametrize("arch", SLIDING)
def test_a_prefix_wider_than_the_sliding_window_resumes_over_every_token(arch, caplog):
    """Rows longer than the window: the one-token step would let the last token attend past its window (the step
    runs at the prefix's width), so the pass resumes over every token instead, with one log line, and is exact — per
    layer kind, edits at a sliding layer (1) and at Gemma's global layer (2); rows that fit the window (a batch of the
    shortest items) still take the cache path."""
    import logging

    adapter, ex, _fmt, batch, cands = _setup(arch)  # window NARROW: shorter than the longest rows
    L, T = adapter.n_layers, int(batch.input_ids.shape[1])
    clean = adapter.clean_states(batch, range(1, L + 1), kv=True)
    shift = torch.randn(adapter.hidden_size, generator=torch.Generator().manual_seed(3))
    seen = _Tokens(adapter)
    try:
        with caplog.at_level(logging.INFO, logger="cprobe.models.resume"):
            for layer in (1, 2):
                edits = {Site(layer): lambda h: h + shift}
                full = adapter.run(batch, [Site(L)], edits, cands)
                seen.take()
                out = adapter.run(batch, [Site(L)], edits, cands, resume=_take(clean, batch, adapter))
                assert seen.take()[layer:] == [T] * (L - layer)  # every token above the edit
                torch.testing.assert_close(out.scores, full.scores, **TOL)
                torch.testing.assert_close(out.acts[Site(L)], full.acts[Site(L)], **TOL)
        assert sum("sliding window" in r.getMessage() for r in caplog.records) == 1
        short = (batch.attention_mask.sum(1) <= NARROW).nonzero().flatten()
        assert len(short) >= 2
        sub = batch.select(short)  # trimmed to its longest row, within the window
        edits = {Site(1): lambda h: h + shift}
        full = adapter.run(sub, [], edits, cands)
        seen.take()
        out = adapter.run(sub, [], edits, cands, resume=_take(clean, sub, adapter, sub.rows))
        assert seen.take()[1:] == [1] * (L - 1)
        torch.testing.assert_close(out.scores, full.scores, **TOL)
    finally:
        seen.remove()
