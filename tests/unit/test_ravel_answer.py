"""RAVEL's answer by teacher forcing (ContinuationFormatter + GreedyTokens + cprobe.metrics.ravel.matches) agrees
with the reference's rule — generate ``n`` tokens greedily and compare them with the label's first ``n`` tokens,
padding ignored (explanare/ravel ``eval_with_interventions`` + ``compute_metrics``) — on hand-made labels around what
random models of four families really generate; the head gathered at the answer positions gives what the head at
every position gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cprobe.data.ravel import prompt_item
from cprobe.metrics import ravel as M
from cprobe.models.adapter import ModelAdapter
from cprobe.models.formatters import ContinuationFormatter, RegionFormatter
from cprobe.models.readouts import GreedyTokens
from cprobe.tasks.ravel_fit import with_label
from cprobe.tasks.ravel_plan import label
from tests.conftest import WORDS, make_random_model

N = 3
ANSWERS = [f"answer:{j}" for j in range(N)]


def _adapter(arch: str) -> ModelAdapter:
    model, tok = make_random_model(arch, seed=3)
    return ModelAdapter(model, tok, "causal", arch, batch_size=4)


def _prompts(k: int = 6) -> list:
    words = list(WORDS)
    return [prompt_item(words[i], "A", 0, " ".join(words[10 + i: 12 + i + i % 3]) + " %s " + words[20 + i])
            for i in range(k)]


def _generate(adapter: ModelAdapter, items: list, n: int) -> np.ndarray:
    """Greedy decoding, token by token, on each prompt alone (the reference's ``generate``, ``do_sample=False``)."""
    batch = RegionFormatter()(items, adapter, torch.arange(len(items)))
    out = []
    with torch.no_grad():
        for r in range(len(items)):
            ids = batch.input_ids[r, : int(batch.attention_mask[r].sum())][None]
            got = []
            for _ in range(n):
                nxt = int(adapter.model(input_ids=ids).logits[0, -1].argmax())
                got.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
            out.append(got)
    return np.array(out)


def _reference_match(generated: np.ndarray, lab: np.ndarray) -> np.ndarray:
    """compute_metrics' sequence accuracy per row: every label position matches or is padding (< 0)."""
    return np.array([all(g == t or t < 0 for g, t in zip(gen, row)) for gen, row in zip(generated, lab)])


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "gemma3_text"])
def test_teacher_forced_greedy_tokens_match_exactly_when_generation_does(arch):
    adapter = _adapter(arch)
    items = _prompts()
    gen = _generate(adapter, items, N)
    other = (gen + 1) % len(adapter.tok)  # a token the model did not write
    cases = {  # label tokens (the value's, before truncation to N) -> whether the reference's check passes
        "the generation itself": [list(g) for g in gen],
        "a longer value: only its first N tokens are read": [list(g) + [5] for g in gen],
        "a one-token value: the rest is padding": [[g[0]] for g in gen],
        "second token wrong": [[g[0], o[1], g[2]] for g, o in zip(gen, other)],
        "first token wrong": [[o[0], g[1], g[2]] for g, o in zip(gen, other)],
        "last of three wrong": [[g[0], g[1], o[2]] for g, o in zip(gen, other)],
    }
    fmt = ContinuationFormatter(RegionFormatter(), N)
    for name, tokens in cases.items():
        lab = np.array([label(t, N) for t in tokens])
        scored = adapter.map([with_label(it, lab[i]) for i, it in enumerate(items)], fmt,
                             readout=GreedyTokens(ANSWERS)).scores.numpy()
        want = _reference_match(gen, lab)
        np.testing.assert_array_equal(M.matches(scored, lab), want, err_msg=name)
        assert want.all() == (name in ("the generation itself", "a longer value: only its first N tokens are read",
                                       "a one-token value: the rest is padding")), name


def test_the_continuation_follows_the_prompt_and_names_its_positions():
    adapter = _adapter("gpt2")
    items = _prompts(3)
    base = RegionFormatter()(items, adapter, torch.arange(3))
    conts = [(7,), (8, 9, 10), (11, 12)]
    batch = ContinuationFormatter(RegionFormatter(), N)([with_label(it, c) for it, c in zip(items, conts)], adapter,
                                                       torch.arange(3))
    for r, c in enumerate(conts):
        L = int(base.attention_mask[r].sum())
        assert batch.input_ids[r, :L].tolist() == base.input_ids[r, :L].tolist()
        assert batch.input_ids[r, L:L + len(c)].tolist() == list(c) and int(batch.attention_mask[r].sum()) == L + len(c)
        assert [int(batch.positions[a][r]) for a in ANSWERS] == [L - 1 + j if j < len(c) else -1 for j in range(N)]
        assert int(batch.positions["region:1"][r]) == int(base.positions["region:1"][r])  # the entity is where it was
        assert int(batch.positions["last"][r]) == L + len(c) - 1
    assert batch.pred == "answer:0"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_head_at_the_answer_positions_only_gives_the_same_tokens(arch):
    adapter = _adapter(arch)
    items = [with_label(it, (5, 6, 7)[: 1 + i % 3]) for i, it in enumerate(_prompts())]
    fmt = ContinuationFormatter(RegionFormatter(), N)
    seen = []
    h = adapter._head.register_forward_hook(lambda _m, _a, out: seen.append(tuple(out.shape)))
    try:
        rows = adapter.map(items, fmt, readout=GreedyTokens(ANSWERS)).scores
        assert seen and all(s[1] == N for s in seen), seen  # (n, N, V): the answer positions only
        adapter.scored_positions = False
        every = adapter.map(items, fmt, readout=GreedyTokens(ANSWERS)).scores
    finally:
        h.remove()
        adapter.scored_positions = True
    torch.testing.assert_close(rows, every)
    assert (rows[:, 1] == -1).tolist() == [i % 3 == 0 for i in range(len(items))]  # a one-token label: −1 after it


def test_the_continuation_log_probability_is_the_labels_tokens_summed_as_a_two_way_distribution():
    """ContinuationLogProb: class 0's cross-entropy is −Σ_j log p(label_j | prompt, label_<j), padding skipped — DAS's
    loss on a label of several tokens."""
    from cprobe.models.readouts import ContinuationLogProb
    from cprobe.models.sites import Batch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    pos = {"answer:0": torch.tensor([1, 2]), "answer:1": torch.tensor([2, 3]), "answer:2": torch.tensor([3, -1])}
    batch = Batch(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long), pos, torch.arange(2))
    targets = torch.tensor([[4, 0, 6], [2, 5, -1]])
    got = ContinuationLogProb(ANSWERS, targets).scores(logits, batch)
    lp = logits.log_softmax(-1)
    want = torch.stack([lp[0, 1, 4] + lp[0, 2, 0] + lp[0, 3, 6], lp[1, 2, 2] + lp[1, 3, 5]])
    torch.testing.assert_close(got[:, 0], want)
    torch.testing.assert_close(got.exp().sum(1), torch.ones(2))  # a distribution over (the label, anything else)
    torch.testing.assert_close(torch.nn.functional.cross_entropy(got, torch.zeros(2, dtype=torch.long)), -want.mean())
