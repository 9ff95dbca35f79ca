"""A study's table is the same with its edited passes resumed at the edited layer and with full forwards
(``compute.resume``; issue 35 item 3): CausalGym — every method's DAS training and DII scoring, the oracles'
completeness and the read-layers heat-map — on a tiny random GPT-NeoX of 3 layers (sites at the first, the middle
and the last layer, padded batches)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from cprobe.data.causalgym import CONTROL_LABELS, TaskTemplate
from cprobe.models.adapter import ModelAdapter
from cprobe.tasks import causalgym as cg_task
from cprobe.tasks.causalgym_engine import run_gym_task

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

OBJECTS = [f"w{i}" for i in range(10)]
SPEC = {
    "templates": ["the {subject} near the {object}", "the {subject} near the old {object} of the {object}"],
    "label": "subject",
    "result_prepend_space": True,
    "labels": {"singular": ["is", "was"], "plural": ["are", "were"]},
    "variables": {"subject": {"singular": ["author", "guard"], "plural": ["authors", "guards"]}, "object": OBJECTS},
}
TIMES = {"fit_s", "eval_s"}


def _adapter() -> ModelAdapter:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from cprobe.models.tiny import build_tokenizer

    words = ["the", "near", "old", "of", "author", "authors", "guard", "guards", "is", "was", "are", "were", *OBJECTS,
             *(w.strip() for w in CONTROL_LABELS)]
    tok = build_tokenizer("neox", words, 64)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3,
                                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    return ModelAdapter(model, tok, "causal", "toy_neox3", batch_size=8)


def _equal_tables(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for col in a.columns:
        if col in TIMES:
            continue
        for x, y in zip(a[col], b[col]):
            if isinstance(x, float) and isinstance(y, float):
                assert (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-5 * max(1.0, abs(x)), (col, x, y)
            elif isinstance(x, dict):
                assert x.keys() == y.keys()
                for k in x:
                    assert (math.isnan(x[k]) and math.isnan(y[k])) or abs(x[k] - y[k]) <= 1e-5, (col, k, x, y)
            else:
                assert x == y, (col, x, y)


@pytest.mark.parametrize("read_layers", [False, True])
def test_causalgym_table_equal_with_resume_on_and_off(read_layers):
    template = TaskTemplate.from_spec("toy_agr", SPEC)
    config = cg_task.Config(methods=["das", "probe", "mean", "random", "vanilla", "leace"], n_train=8, n_eval=6,
                            das=cg_task.DASKeys(lr=0.05), probe_lam=1.0, random_draws=2, read_layers=read_layers,
                            sites_per_pass=3, regions="all").resolve({"name": "toy"})
    tables, calls = [], []
    for on in (False, True):
        adapter = _adapter()
        adapter.resume = on
        ran = [0]
        h = adapter._blocks[0].mlp.register_forward_hook(lambda *_: ran.__setitem__(0, ran[0] + 1))
        try:
            tables.append(pd.DataFrame(run_gym_task(adapter, template, config, "blocks", seed=0)))
        finally:
            h.remove()
        calls.append(ran[0])
    assert set(tables[0]["layer"]) == {1, 2, 3}
    _equal_tables(tables[1], tables[0])
    assert calls[1] < calls[0]  # resumed: block 1 ran in the reads and clean passes, not in every edited pass


@pytest.mark.parametrize("arch", ["bert", "roberta", "gpt2", "gpt_neox", "llama"])
def test_reliability_sequential_refits_resume_with_the_same_states(arch):
    """Reliability's sequential multi-site fit (sites at the first, the middle and the last layer; items of 3 to 9
    words, so padded batches): with ``compute.resume`` the two refit passes start from the fitting items' clean
    states at the first site's layer. Each refit's states (what its eraser is fitted on) equal the full forward's
    within 1e-5, and block 1 runs once per item (the clean states) instead of once per refit pass — counted, so the
    test fails if the refits silently stop resuming."""
    import random

    from cprobe.data.items import TextItem
    from cprobe.interventions.leace import LEACE
    from cprobe.models.formatters import ClassificationFormatter
    from cprobe.models.sites import Site
    from cprobe.tasks.sites import fit_sites
    from tests.conftest import WORDS, make_random_model

    rng = random.Random(0)
    items = [TextItem(str(i), " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))) for i in range(40)]
    z = torch.tensor([i % 2 for i in range(len(items))])
    fmt = ClassificationFormatter(32)
    sites = [Site(1, "last"), Site(2, "last"), Site(3, "last")]
    seen, calls = {}, {}
    for on in (False, True):
        model, tok = make_random_model(arch)
        adapter = ModelAdapter(model, tok, "mlm" if arch in ("bert", "roberta") else "causal", arch, batch_size=8)
        adapter.resume = on
        clean = adapter.map(items, fmt, read=sites).acts
        rows = [0]
        # a projection (Linear, GPT-2's Conv1D) inside block 1: it computes only when the block really runs (a
        # skipped block's own hooks still fire)
        lin = next(m for m in adapter._blocks[0].modules()
                   if m is not adapter._blocks[0] and getattr(m, "weight", None) is not None and m.weight.dim() == 2)
        h = lin.register_forward_hook(lambda _m, args, _o: rows.__setitem__(0, rows[0] + len(args[0])))
        got: dict[Site, torch.Tensor] = {}

        def fit(s, X, upstream):
            got[s] = X.clone()
            return LEACE().fit(X, z)
        try:
            fit_sites(adapter, items, fmt, sites, clean, fit, "sequential")
        finally:
            h.remove()
        seen[on], calls[on] = got, rows[0]
    for s in sites[1:]:
        assert (seen[True][s] - seen[False][s]).abs().max().item() <= 1e-5, s
    assert calls[False] == 2 * len(items)  # block 1 in each of the two full refit passes
    assert calls[True] == len(items)  # block 1 once, in the clean pass; the refits resume above it
