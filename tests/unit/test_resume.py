"""Resuming an edited pass at its edited layer (issue 35 items 2–3): per family (masked and causal, absolute and rotary
positions, grouped-query attention), edits at the first, a middle and the last layer of padded batches of uneven lengths, the resumed pass
gives the full forward's scores and read states (≤ 1e-5, fp32) and DAS's gradients, while the blocks below the edit
do not run — the sliding-window families (Mistral, Qwen 2/3, Gemma 2/3) with a window narrower than the batch, so
that their sliding and global layers differ; an unknown family runs the full forward with one log line; states of
another model or other tokens are refused."""

from __future__ import annotations

import logging

import pytest
import torch

from cprobe.errors import ConfigError
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Apply
from cprobe.models.formatters import AgreementFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from tests.conftest import SLIDING, make_random_model
from tests.unit.test_engine import _examples

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

ARCHS = ["bert", "roberta", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"]
TOL = dict(atol=1e-5, rtol=1e-5)
NARROW = 4
"""A sliding window narrower than the test batches (their rows are 5 to 10 tokens long)."""


def _adapter(arch: str, window: int | None = None) -> ModelAdapter:
    model, tok = make_random_model(arch, window=window)
    return ModelAdapter(model, tok, "mlm" if arch in ("bert", "roberta") else "causal", arch, batch_size=8)


def _setup(arch: str, n: int = 12, window: int | None = None):
    """(adapter, items, formatter, padded batch, candidate readout); ``window``: the sliding families' window (None:
    :data:`NARROW`)."""
    adapter = _adapter(arch, (window or NARROW) if arch in SLIDING else None)
    ex = _examples(n)
    fmt = AgreementFormatter()
    batch = fmt(ex, adapter, torch.arange(len(ex)))
    assert bool((batch.attention_mask == 0).any())  # uneven lengths: the batch is padded
    if arch in SLIDING and window is None:
        assert int(batch.attention_mask.sum(1).max()) > NARROW  # the window cuts the longer rows' attention
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    return adapter, ex, fmt, batch, cands


class _Calls:
    """Counts the calls into each block's submodules (a skipped block calls none)."""

    def __init__(self, adapter: ModelAdapter) -> None:
        self.n = [0] * adapter.n_layers
        self.handles = [m.register_forward_hook(self._count(i)) for i, b in enumerate(adapter._blocks)
                        for m in b.modules() if m is not b]

    def _count(self, i: int):
        def hook(*_):
            self.n[i] += 1
        return hook

    def ran(self) -> list[bool]:
        out = [c > 0 for c in self.n]
        self.n = [0] * len(self.n)
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("arch", ARCHS)
def test_resumed_passes_equal_the_full_forward(arch):
    adapter, ex, fmt, batch, cands = _setup(arch)
    L = adapter.n_layers
    clean = adapter.clean_states(batch, range(1, L + 1))
    g = torch.Generator().manual_seed(3)
    shift = torch.randn(adapter.hidden_size, generator=g)
    calls = _Calls(adapter)
    try:
        for layer in (1, 2, L):  # the first, a middle and the last layer
            edits = {Site(layer): lambda h: h + shift}
            read = [Site(layer), Site(L)]
            full = adapter.run(batch, read, edits, cands)
            assert all(calls.ran())
            res = clean.take(torch.arange(len(ex)), batch.input_ids, batch.attention_mask, adapter.name,
                             adapter.device)
            fast = adapter.run(batch, read, edits, cands, resume=res)
            assert calls.ran() == [i >= layer for i in range(L)]  # blocks 1..layer did not compute
            torch.testing.assert_close(fast.scores, full.scores, **TOL)
            for s in read:
                torch.testing.assert_close(fast.acts[s], full.acts[s], **TOL)
            # map: length-sorted sub-batches of the same items, each trimmed to its longest row
            spec = {Site(layer): Apply(lambda h: h + shift)}
            m_full = adapter.map(ex, fmt, read, spec, cands)
            assert all(calls.ran())
            m_fast = adapter.map(ex, fmt, read, spec, cands, resume=clean)
            assert calls.ran() == [i >= layer for i in range(L)]
            torch.testing.assert_close(m_fast.scores, m_full.scores, **TOL)
            for s in read:
                torch.testing.assert_close(m_fast.acts[s], m_full.acts[s], **TOL)
    finally:
        calls.remove()


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_a_pass_resumes_at_its_lowest_site(arch):
    """Two edits (layers 2 and 3) and a read at 2: the pass resumes at 2; a layer-0 edit (embeddings) runs in full;
    states held only above the lowest site give the full forward."""
    adapter, ex, _fmt, batch, cands = _setup(arch)
    clean = adapter.clean_states(batch, [1, 2, 3])
    rows = torch.arange(len(ex))
    calls = _Calls(adapter)
    try:
        for edits, ran in (({Site(3): lambda h: h * 1.5, Site(2): lambda h: h - 0.5}, [False, False, True]),
                           ({Site(0): lambda h: h + 0.1}, [True, True, True])):
            full = adapter.run(batch, [Site(2)], edits, cands)
            calls.ran()
            fast = adapter.run(batch, [Site(2)], edits, cands,
                               resume=clean.take(rows, batch.input_ids, batch.attention_mask, adapter.name,
                                                 adapter.device))
            assert calls.ran() == ran
            torch.testing.assert_close(fast.scores, full.scores, **TOL)
            torch.testing.assert_close(fast.acts[Site(2)], full.acts[Site(2)], **TOL)
        only3 = clean.take(rows, batch.input_ids, batch.attention_mask, adapter.name, adapter.device, layers=[3])
        edits = {Site(2): lambda h: h - 0.5}
        fast = adapter.run(batch, (), edits, cands, resume=only3)
        assert all(calls.ran())
        torch.testing.assert_close(fast.scores, adapter.run(batch, (), edits, cands).scores, atol=0, rtol=0)
    finally:
        calls.remove()


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "bert", "gemma3_text"])
def test_das_gradients_equal_the_full_forward(arch):
    """DAS trains through ``run(grad=True)`` from fixed clean states: the same loss and gradient reach the edit."""
    adapter, ex, _fmt, batch, cands = _setup(arch, 8)
    clean = adapter.clean_states(batch, [2])
    res = clean.take(torch.arange(len(ex)), batch.input_ids, batch.attention_mask, adapter.name, adapter.device)
    grads, losses = [], []
    for r in (None, res):
        delta = torch.zeros(adapter.hidden_size, requires_grad=True)
        out = adapter.run(batch, edits={Site(2): lambda v: v + delta * v}, readout=cands, grad=True, resume=r)
        loss = out.scores[:, 0].sum()
        loss.backward()
        grads.append(delta.grad.clone())
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], **TOL)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)
    assert grads[0].abs().sum() > 0


def test_an_unknown_family_runs_the_full_forward_with_one_log_line(caplog):
    model, tok = make_random_model("gpt2")
    model.config.model_type = "mystery_lm"  # not in MODEL_FAMILIES: its blocks are not known to be resumable
    adapter = ModelAdapter(model, tok, "causal", "mystery", batch_size=8)
    ex = _examples(8)
    batch = AgreementFormatter()(ex, adapter, torch.arange(len(ex)))
    cands = CandidateTokens([[adapter.candidate_id(e.correct), adapter.candidate_id(e.wrong)] for e in ex])
    assert not adapter.can_resume
    clean = adapter.clean_states(batch, [1, 2])
    assert clean.layers == []  # nothing computed
    # hand-made states that would change the numbers if they were used
    res = clean.take(torch.arange(len(ex)), batch.input_ids, batch.attention_mask, adapter.name, adapter.device)
    res.states = {2: torch.zeros(*batch.input_ids.shape, adapter.hidden_size)}
    edits = {Site(2): lambda h: h + 1.0}
    full = adapter.run(batch, (), edits, cands)
    with caplog.at_level(logging.INFO, logger="cprobe.models.resume"):
        for _ in range(3):
            out = adapter.run(batch, (), edits, cands, resume=res)
            torch.testing.assert_close(out.scores, full.scores, atol=0, rtol=0)
    said = [r for r in caplog.records if "cannot resume" in r.getMessage()]
    assert len(said) == 1 and "mystery_lm" in said[0].getMessage()


def test_states_of_another_model_or_other_tokens_are_refused():
    adapter, ex, fmt, batch, cands = _setup("gpt2", 8)
    clean = adapter.clean_states(batch, [1])
    rows = torch.arange(len(ex))
    with pytest.raises(ConfigError, match="of model 'gpt2' cannot resume"):
        clean.take(rows, batch.input_ids, batch.attention_mask, "other", adapter.device)
    with pytest.raises(ConfigError, match="other tokens"):  # another item order
        clean.take(rows.flip(0), batch.input_ids, batch.attention_mask, adapter.name, adapter.device)
    other = fmt(_examples(8, seed=5), adapter, rows)
    with pytest.raises(ConfigError, match="other tokens"):  # another tokenisation / other items
        adapter.map(_examples(8, seed=5), fmt, (), {Site(1): Apply(lambda h: h)}, cands, resume=clean)
    del other
    res = clean.take(rows, batch.input_ids, batch.attention_mask, adapter.name, adapter.device)
    res.model = "other"
    with pytest.raises(ConfigError, match="cannot resume a pass of 'gpt2'"):
        adapter.run(batch, (), {Site(1): lambda h: h}, cands, resume=res)


def test_resume_off_runs_the_full_forward():
    adapter, ex, _fmt, batch, cands = _setup("gpt_neox", 8)
    adapter.resume = False
    assert adapter.clean_states(batch, [1, 2]).layers == []
    clean_on = _adapter("gpt_neox").clean_states(batch, [2])
    res = clean_on.take(torch.arange(len(ex)), batch.input_ids, batch.attention_mask, adapter.name, adapter.device)
    res.states = {2: torch.zeros(*batch.input_ids.shape, adapter.hidden_size)}  # wrong on purpose: must be ignored
    calls = _Calls(adapter)
    try:
        out = adapter.run(batch, (), {Site(2): lambda h: h + 1.0}, cands, resume=res)
        assert all(calls.ran())
    finally:
        calls.remove()
    adapter.resume = True
    torch.testing.assert_close(out.scores, adapter.run(batch, (), {Site(2): lambda h: h + 1.0}, cands).scores,
                               atol=0, rtol=0)


@pytest.mark.parametrize("layer", [1, 2, 3])
def test_reliability_das_trains_through_resumed_passes(tmp_path, layer):
    """The reliability study's DAS (``minimal_pair_training``) runs every step from the base items' clean states at
    the site's layer: the trained direction equals the full forward's."""
    from types import SimpleNamespace

    from cprobe.data.registry import load_dataset
    from cprobe.directions.das import DAS
    from cprobe.tasks.sites import minimal_pair_training

    cfg = {"name": "s", "type": "synthetic", "grammar": {"n_sentences": 40, "seed": 1}, "duplicates": "drop"}
    ds = load_dataset(cfg, tmp_path)
    rows = list(range(12))
    found = []
    for on in (False, True):
        adapter = _adapter("gpt2")
        adapter.resume = on
        n = len(ds.examples)
        ex = SimpleNamespace(scores=torch.zeros(n, 2), candidates=torch.arange(2 * n).view(n, 2) % 20)
        through = minimal_pair_training(adapter, SimpleNamespace(examples=ds.examples), ex, rows, layer, "target",
                                        "z_c", cfg, tmp_path)
        calls = _Calls(adapter)
        das = DAS(lr=0.05, batch_size=4, epochs=2).fit(through.forward, through.h_source, through.target)
        ran = calls.ran()
        calls.remove()
        assert ran == [not on or i >= layer for i in range(adapter.n_layers)]
        found.append((das.a, das.losses))
    torch.testing.assert_close(found[1][0], found[0][0], atol=1e-5, rtol=1e-5)
    assert found[1][1] == pytest.approx(found[0][1], abs=1e-5)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_clean_states_from_the_activation_cache_resume_a_later_job_without_the_blocks_below(arch, tmp_path,
                                                                                          monkeypatch):
    """The reliability study's edited pass resumes from clean states kept in the activation cache
    (``extract.cached_clean_states``): built once — one stopped pass —, read back by the next job, which then runs no
    block at or below the layer; scores equal the full forward's; other tokens or another model are another entry."""
    from cprobe.cache import ActivationCache
    from cprobe.extract import cached_clean_states

    adapter, ex, fmt, batch, cands = _setup(arch)
    cache = ActivationCache(tmp_path)
    shift = torch.randn(adapter.hidden_size, generator=torch.Generator().manual_seed(3))
    spec = {Site(2): Apply(lambda h: h + shift)}
    full = adapter.map(ex, fmt, [Site(3)], spec, cands)
    built = []
    real = ModelAdapter.clean_states
    monkeypatch.setattr(ModelAdapter, "clean_states", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    first = cached_clean_states(adapter, batch, 2, cache)
    assert built == [1] and sorted(first.states) == [2]
    calls = _Calls(adapter)
    try:
        again = cached_clean_states(adapter, batch, 2, cache)
        assert built == [1] and torch.equal(again.states[2], first.states[2])
        got = adapter.map(ex, fmt, [Site(3)], spec, cands, resume=again)
        assert calls.ran() == [False, False, True]  # blocks 1 and 2 did not compute
    finally:
        calls.remove()
    torch.testing.assert_close(got.scores, full.scores, **TOL)
    torch.testing.assert_close(got.acts[Site(3)], full.acts[Site(3)], **TOL)
    other = fmt(ex[:-1], adapter, torch.arange(len(ex) - 1))
    cached_clean_states(adapter, other, 2, cache)  # other tokens: another entry, built
    assert built == [1, 1]
    adapter.name = f"{arch}-other"
    cached_clean_states(adapter, batch, 2, cache)  # another model: another entry
    assert built == [1, 1, 1]
    from cprobe.cache import cache_entries

    listed = [d for k, _, _, d in cache_entries(tmp_path) if "clean states" in d]
    assert sorted(listed) == sorted([f"{arch} clean states at layer 2 n={len(ex)}",
                                     f"{arch} clean states at layer 2 n={len(ex) - 1}",
                                     f"{arch}-other clean states at layer 2 n={len(ex)}"])
    assert cached_clean_states(adapter, batch, 0, cache) is None  # layer 0: nothing to skip
    assert cached_clean_states(adapter, batch, 2, ActivationCache(tmp_path, enabled=False)) is None


def test_the_resume_base_declares_what_it_reads_of_the_adapter():
    """``Resuming`` reads attributes that only the adapter defines: each is declared on it (issue 51), and the
    adapter defines every one it declares."""
    import ast
    import inspect

    from cprobe.models import resume

    src = ast.parse(inspect.getsource(resume.Resuming))
    own = {n.name for n in ast.walk(src) if isinstance(n, ast.FunctionDef)}
    own |= {t.attr for n in ast.walk(src) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    read = {n.attr for n in ast.walk(src)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}
    declared = set(resume.Resuming.__annotations__)
    assert read - own - declared == set(), "read but neither set nor declared"
    assert len(declared) == 13
    adapter = _adapter("gpt2")
    assert all(hasattr(adapter, name) for name in declared)
