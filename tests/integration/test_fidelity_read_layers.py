"""The reliability study's downstream read layers checked by value (issue 30): one in-process job (the study's own
``run``, composed by Hydra as a job is) edits layer 1 of a tiny random BERT with LEACE and reads every l′ ≥ 1; every
row is recomputed apart from the study — the oracles refitted on clean states at l′, the edited pass read through the
model's one entry point at l′, completeness (eq. 2) and selectivity (eq. 3) from their formulas.

What it pins: the states read at l′ are l′'s (not the edited layer's), the oracles at l′ are trained on l′'s clean
states, and selectivity compares the edited states at l′ with the original ones at l′ — each an l′ ≠ l case."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cprobe.compute import threads

from tests.conftest import REPO, SHARED_DATA, numeric_threads

pytestmark = pytest.mark.numeric  # rerun by make test-portable (portable kernels, 1 and 2 threads)

EDITED = 1
PROBE = {"name": "linear", "lrs": [0.01], "epochs": 5, "batch_size": 64, "weight_decay": 0.0}
"""The smoke linear probe (conf/probe/smoke.yaml), the study's oracle here."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread (on a loaded 2-core box two threads ran the peer's loop 30x slower), or
    ``CPROBE_TEST_THREADS`` (``make test-portable``)."""
    with threads(numeric_threads(1)):
        yield


def _adapter():
    """A random 3-layer, 32-d BERT over the grammar's words (nothing trained: the values are checked, not learnt)."""
    from transformers import BertConfig, BertForMaskedLM

    from cprobe.data.grammar import GrammarConfig, vocabulary
    from cprobe.models.adapter import ModelAdapter
    from cprobe.models.tiny import build_tokenizer

    tok = build_tokenizer("bert", vocabulary(GrammarConfig()), 64)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64)).eval()
    return ModelAdapter(model, tok, "mlm", "rand_bert_sva", batch_size=64)


def _job(tmp_path, *overrides: str):
    from cprobe.job import JobContext
    from cprobe.pipeline import prepare

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=sva_tiny_reliability", "+debug=smoke", "intervention=leace",
                                           f"layers={EDITED}", "reliability.oracle_probe=linear", *overrides])
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    job = prepare(plain)
    ctx = JobContext(job.cfg, tmp_path / "out", SHARED_DATA, tmp_path / "cache", progress=False)
    (tmp_path / "out").mkdir()
    adapter = _adapter()
    ctx.adapter = lambda model_cfg: adapter  # type: ignore[method-assign]
    return job, ctx, adapter


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from cprobe.tasks import reliability as rel
    from cprobe.tasks import sites

    sites._MEMO.clear()
    job, ctx, adapter = _job(tmp_path_factory.mktemp("read_layers"), "reliability.read_layers=all")
    table = rel.run(ctx, job.task_cfg).table
    return job, ctx, adapter, table


def _by_hand(job, ctx, adapter):
    """Per read layer l′: (completeness, selectivity, the target oracle's accuracy on the edited states), recomputed."""
    from cprobe.extract import extract
    from cprobe.data.registry import load_dataset
    from cprobe.interventions.leace import LEACE
    from cprobe.models.edits import Replace
    from cprobe.models.formatters import AgreementFormatter
    from cprobe.models.sites import Site
    from cprobe.probes import build_probe
    from cprobe.tasks.reliability import _labels

    cfg, rc = job.cfg, job.task_cfg
    L = adapter.n_layers
    data = extract(adapter, load_dataset(cfg["dataset"], SHARED_DATA), [EDITED], "target", ctx.cache).dataset
    fmt = AgreementFormatter(("target",))
    reads = [Site(l, "target") for l in range(EDITED, L + 1)]
    clean_all = adapter.map(list(data.examples), fmt, read=reads).acts  # the clean states, read apart from the study
    splits, _, labels = _labels(cfg, rc, data, 0)
    te, inter, orc = splits["test"], splits["intervention"], splits["oracle"]
    z = labels["z_c"]
    at = reads[0]
    X_new = LEACE().fit(clean_all[at][inter].float(), z[inter]).transform(clean_all[at][te].float())
    out = adapter.map([data.examples[i] for i in te], fmt, read=reads, edits={at: Replace(X_new)}).acts
    want = {}
    for s in reads:
        oracle = {}
        for p in ("z_c", "z_e"):
            rows = orc[labels[p][orc].numpy() >= 0]
            oracle[p] = build_probe({**PROBE, "seed": 0}).fit(clean_all[s][rows].float(), labels[p][rows])
        clean, edited = clean_all[s][te].float(), out[s].float()
        p_c = oracle["z_c"].predict_proba(edited).double()
        completeness = float((1.0 - (p_c[:, 0] - p_c[:, 1]).abs()).mean())  # eq. 2, k = 2
        P, P_hat = oracle["z_e"].predict_proba(clean).double(), oracle["z_e"].predict_proba(edited).double()
        m = torch.maximum(1.0 - P.min(1).values, P.max(1).values)
        s_rows = 1.0 - 0.5 * (P_hat - P).abs().sum(1) / m
        applies = labels["z_e"][te] >= 0
        selectivity = float(s_rows[applies].mean())  # one non-targeted property: rows where z_e applies
        acc = float((p_c.argmax(1) == z[te]).double().mean())
        want[s.layer] = (completeness, selectivity, acc)
    return want


def test_every_read_layer_is_scored_on_its_own_states_by_its_own_oracles(run):
    job, ctx, adapter, table = run
    want = _by_hand(job, ctx, adapter)
    assert table["read_layer"].tolist() == [1, 2, 3] and (table["layer"] == EDITED).all()
    for _, row in table.iterrows():
        c, s, acc = want[int(row["read_layer"])]
        assert row["completeness"] == pytest.approx(c, abs=1e-5), row["read_layer"]
        assert row["selectivity"] == pytest.approx(s, abs=1e-5), row["read_layer"]
        assert row["oracle_acc_edited_z_c"] == pytest.approx(acc, abs=1e-9), row["read_layer"]
    # not vacuous: the three read layers give three different numbers
    assert len({round(v[0], 4) for v in want.values()}) == 3 and len({round(v[1], 4) for v in want.values()}) == 3
