"""The studies' last-token passes over the prefix's clean key/value cache (issue 35, :mod:`cprobe.models.resume`):
CausalGym's DII scoring gives its last-region rows passes of their own and DAS's all-last passes run one token above
the edited layer — the table equals the one with ``kv_resume`` off within 1e-5, and one-token passes happen (so the
path cannot silently stop being used); the reliability study's DAS at a causal LM's target trains through it."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cprobe.data.causalgym import TaskTemplate
from cprobe.tasks import causalgym as cg_task
from cprobe.tasks.causalgym_engine import run_gym_task
from tests.integration.test_resume_studies import SPEC, _adapter, _equal_tables

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)


def _one_token_passes(adapter) -> tuple[list[int], object]:
    seen = [0, 0]  # passes through the last block with one token per row, with more

    def hook(_m, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        seen[int(h.shape[1] > 1)] += 1
    return seen, adapter._blocks[-1].register_forward_pre_hook(hook, with_kwargs=True)


def test_causalgym_last_region_rows_run_one_token_with_the_same_table():
    template = TaskTemplate.from_spec("toy_agr", SPEC)
    config = cg_task.Config(methods=["das", "mean", "vanilla"], n_train=8, n_eval=6, das=cg_task.DASKeys(lr=0.05),
                            probe_lam=1.0, sites_per_pass=1, regions="all").resolve({"name": "toy"})
    tables, seen = [], []
    for kv in (False, True):
        adapter = _adapter()
        adapter.kv_resume = kv
        count, h = _one_token_passes(adapter)
        try:
            tables.append(pd.DataFrame(run_gym_task(adapter, template, config, "blocks", seed=0)))
        finally:
            h.remove()
        seen.append(count)
    _equal_tables(tables[1], tables[0])
    assert seen[0][0] == 0 and seen[1][0] > 0  # off: never one token; on: the last region's passes
    assert seen[1][1] < seen[0][1]  # and fewer full-width passes through the last block


@pytest.mark.parametrize("layer", [1, 3])
def test_reliability_das_at_a_causal_target_trains_over_the_prefix_cache(tmp_path, layer):
    """The reliability study's DAS (``minimal_pair_training``) at a causal LM's target (its last prefix token): every
    step runs that token alone above the site's layer, and the trained direction and losses equal ``kv_resume``
    off's within 1e-5."""
    from types import SimpleNamespace

    from cprobe.data.registry import load_dataset
    from cprobe.directions.das import DAS
    from cprobe.tasks.sites import minimal_pair_training
    from tests.unit.test_resume import _adapter as random_adapter

    cfg = {"name": "s", "type": "synthetic", "grammar": {"n_sentences": 40, "seed": 1}, "duplicates": "drop"}
    ds = load_dataset(cfg, tmp_path)
    rows = list(range(12))
    found, seen = [], []
    for kv in (False, True):
        adapter = random_adapter("gpt2")
        adapter.kv_resume = kv
        n = len(ds.examples)
        ex = SimpleNamespace(scores=torch.zeros(n, 2), candidates=torch.arange(2 * n).view(n, 2) % 20)
        through = minimal_pair_training(adapter, SimpleNamespace(examples=ds.examples), ex, rows, layer, "target",
                                        "z_c", cfg, tmp_path)
        count, h = _one_token_passes(adapter)
        try:
            das = DAS(lr=0.05, batch_size=4, epochs=2).fit(through.forward, through.h_source, through.target)
        finally:
            h.remove()
        found.append((das.a, das.losses))
        seen.append(count)
    if layer < 3:
        assert seen[0][0] == 0 and seen[1][1] == 0 and seen[1][0] == seen[0][1] > 0  # every step: one token
    torch.testing.assert_close(found[1][0], found[0][0], atol=1e-5, rtol=1e-5)
    assert found[1][1] == pytest.approx(found[0][1], abs=1e-5)

