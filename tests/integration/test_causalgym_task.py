"""The CausalGym runner and task on a tiny random GPT-NeoX with a word-level tokenizer."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cprobe.causalgym.runner import GymSettings, intervene, read_sites, run_gym_task
from cprobe.causalgym.templates import (CONTROL_LABELS, Splits, TaskTemplate, control_pairs, make_splits,
                                        tokenize_pairs)
from cprobe.metrics.odds import selectivity
from cprobe.models.adapter import ModelAdapter
from cprobe.tasks import causalgym as cg_task
from tests.conftest import REPO, SHARED_DATA, needs_shared

OBJECTS = [f"w{i}" for i in range(10)]
SPEC = {
    "templates": ["the {subject} near the {object}"],
    "label": "subject",
    "result_prepend_space": True,
    "labels": {"singular": ["is", "was"], "plural": ["are", "were"]},
    "variables": {"subject": {"singular": ["author", "guard"], "plural": ["authors", "guards"]}, "object": OBJECTS},
}
COLUMNS = {"cg_task", "condition", "method", "layer", "region", "region_idx", "odds", "iia", "probe_accuracy",
           "task_accuracy", "n_train", "n_eval", "degenerate", "fit_s", "eval_s"}
ALL_METHODS = ["das", "probe", "mean", "lda", "pca", "kmeans", "random", "vanilla"]


@pytest.fixture(scope="module")
def template() -> TaskTemplate:
    return TaskTemplate.from_spec("toy_agr", SPEC)


@pytest.fixture(scope="module")
def adapter() -> ModelAdapter:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from cprobe.models.tiny import build_tokenizer

    words = ["the", "near", "author", "authors", "guard", "guards", "is", "was", "are", "were", *OBJECTS,
             *(w.strip() for w in CONTROL_LABELS)]
    tok = build_tokenizer("neox", words, 64)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    return ModelAdapter(model, tok, "causal", "toy_neox", batch_size=8)


def _settings(**kw) -> GymSettings:
    base = dict(methods=ALL_METHODS, n_train=8, n_eval=4, das={"lr": 0.05}, probe_lam=1.0)
    return GymSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def table(adapter, template) -> pd.DataFrame:
    return pd.DataFrame(run_gym_task(adapter, template, _settings(layers="all")))


def test_long_table_has_every_site_method_and_condition(table, template):
    assert COLUMNS <= set(table.columns)
    regions = range(template.first_label_region, len(template.spans))  # paper default: label region on
    assert len(table) == 2 * len(ALL_METHODS) * 3 * len(regions)  # conditions × methods × layers 0..2 × regions
    assert set(table["condition"]) == {"task", "control"}
    assert set(table["region"]) == {"{subject}", "_near_the", "{object}"}
    assert table["odds"].notna().all()
    probe = table[table["method"] == "probe"]
    assert probe.loc[~probe["degenerate"], "probe_accuracy"].between(0, 1).all()
    # Embeddings of the shared word after the subject do not vary: no direction can be fitted there.
    assert probe.loc[probe["degenerate"], ["layer", "region"]].drop_duplicates().values.tolist() == [[0, "_near_the"]]


def test_source_equal_to_base_gives_zero_odds_for_every_method(adapter, template):
    splits = make_splits(template, 8, 4)
    same = [replace(p, source=p.base) for p in splits.eval]  # s = b; labels and classes unchanged
    rows = pd.DataFrame(run_gym_task(adapter, template, _settings(layers="all"), splits=Splits(splits.train, same)))
    assert set(rows["method"]) == set(ALL_METHODS)
    np.testing.assert_allclose(rows["odds"], 0.0, atol=1e-4)


def test_vanilla_at_layer0_equals_running_the_source(adapter, template, table):
    ev = tokenize_pairs(adapter.tok, make_splits(template, 8, 4).eval, prepend_bos=True)
    r = template.region_names.index("{subject}")
    # Subjects are one token each, so the pair differs at exactly that position.
    assert torch.equal(ev.base_pos[:, r], ev.source_pos[:, r])
    labels = [(ev.base_label_ids, ev.source_label_ids)]
    src, (clean_src,) = read_sites(adapter, ev.source_ids, ev.source_mask, ev.source_pos, ev.source_last, [0], labels)
    _, (clean_base,) = read_sites(adapter, ev.base_ids, ev.base_mask, ev.base_pos, ev.base_last, [0], labels)
    (swapped,) = intervene(adapter, ev.base_ids, ev.base_mask, ev.base_pos[:, r], ev.base_last, 0, src[0][:, r], None,
                           labels)
    torch.testing.assert_close(swapped[0], clean_src[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(swapped[1], clean_src[1], atol=1e-5, rtol=0)
    expected = ((clean_base[0] - clean_base[1]) + (clean_src[1] - clean_src[0])).mean().item()
    row = table.query("method == 'vanilla' and condition == 'task' and layer == 0 and region == '{subject}'")
    assert row["odds"].item() == pytest.approx(expected, abs=1e-5)


def test_control_rows_score_the_dog_give_labels(adapter, template, table):
    ev = tokenize_pairs(adapter.tok, control_pairs(make_splits(template, 8, 4).eval), prepend_bos=True)
    dog, give = (adapter.tok(w, add_special_tokens=False)["input_ids"][0] for w in CONTROL_LABELS)
    assert set(ev.base_label_ids.tolist()) == {dog, give} and dog != give
    labels = [(ev.base_label_ids, ev.source_label_ids)]
    _, (clean_src,) = read_sites(adapter, ev.source_ids, ev.source_mask, ev.source_pos, ev.source_last, [0], labels)
    _, (clean_base,) = read_sites(adapter, ev.base_ids, ev.base_mask, ev.base_pos, ev.base_last, [0], labels)
    expected = ((clean_base[0] - clean_base[1]) + (clean_src[1] - clean_src[0])).mean().item()
    row = table.query("method == 'vanilla' and condition == 'control' and layer == 0 and region == '{subject}'")
    assert row["odds"].item() == pytest.approx(expected, abs=1e-5)
    # Selectivity is the overall odds of the per-site difference task − control.
    overall = cg_task.overall_table(table.assign(model="toy"))
    for method in ("das", "probe", "vanilla"):
        part = table[table["method"] == method]
        grid = {c: part[part["condition"] == c].pivot_table(index="layer", columns="region_idx", values="odds")
                for c in ("task", "control")}
        got = overall.set_index("method").loc[method, "selectivity"]
        assert got == pytest.approx(selectivity(grid["task"].to_numpy(), grid["control"].to_numpy()))


def test_report_writes_tables_and_figures(table, tmp_path):
    t = table.assign(model="toy", task="causalgym", seed=0)
    cg_task.report(t, tmp_path)
    for stem in ("causalgym_overall", "causalgym_summary"):
        assert (tmp_path / f"{stem}.csv").is_file()
    summary = pd.read_csv(tmp_path / "causalgym_summary.csv")
    assert set(summary["method"]) == set(ALL_METHODS)
    assert (tmp_path / "heatmap_toy_toy_agr.png").is_file()
    assert (tmp_path / "odds_by_layer_toy.png").is_file()


def test_layers_and_regions_are_configurable(adapter, template):
    rows = pd.DataFrame(run_gym_task(adapter, template, _settings(methods=["mean"], layers=[-1], regions=["{object}"],
                                                                  control=False)))
    assert rows[["layer", "region", "condition"]].drop_duplicates().values.tolist() == [[2, "{object}", "task"]]


@pytest.mark.slow
@needs_shared("causalgym", "templates", "syntaxgym.json")
def test_experiment_end_to_end_on_agreement_templates(tmp_path):
    """`cprobe run +experiment=causalgym` on one agreement task with a tiny, briefly trained model."""
    env = {**os.environ, "CPROBE_CACHE_DIR": str(tmp_path / "cache"), "CPROBE_DATA_DIR": str(SHARED_DATA),
           "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "cprobe"), "run", "+experiment=causalgym", f"hydra.run.dir={tmp_path / 'run'}",
           "causalgym.tasks=[agr_sv_num_pp]", "causalgym.n_train=8", "causalgym.n_eval=4", "layers=[1,2]",
           "causalgym.methods=[das,probe,mean,random]", "model.tiny.train.steps=30", "+model.tiny.train.layers=2",
           "model.tiny.grammar.n_sentences=300", "model.tiny.causalgym_corpus.n_per_task=50",
           "model.tiny.causalgym_corpus.tasks=[agr_sv_num_pp]", "progress=false", "device=cpu"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert set(metrics["cg_task"]) == {"agr_sv_num_pp"} and set(metrics["condition"]) == {"task", "control"}
    overall = pd.read_csv(tmp_path / "run" / "causalgym_overall.csv")
    assert set(overall["method"]) == {"das", "probe", "mean", "random"}
    assert overall["selectivity"].notna().all()


# ---------------------------------------------------------------------------------- beyond the paper

ORACLE = {"name": "mlp", "n_layers": [1], "widths": [16], "lrs": [1e-2], "epochs": 3}


@pytest.fixture(scope="module")
def rel_table(adapter, template) -> pd.DataFrame:
    s = _settings(methods=["mean", "random", "vanilla"], layers=[1], control=False, reliability=True,
                  oracle_probe=ORACLE, random_draws=3)
    return pd.DataFrame(run_gym_task(adapter, template, s))


def test_reliability_columns_and_vanilla_completeness_is_the_oracle_on_the_source(adapter, template, rel_table):
    from cprobe.causalgym.runner import fit_oracle
    from cprobe.metrics.reliability import counterfactual_completeness

    assert {"completeness", "oracle_accuracy", "oracle_selectivity", "n_directions"} <= set(rel_table.columns)
    assert rel_table["completeness"].between(0, 1).all() and rel_table["oracle_accuracy"].between(0, 1).all()
    assert rel_table["oracle_selectivity"].isna().all()  # no non-targeted property in the templates
    # Vanilla writes the source vector: completeness = the oracle's P(source class | f(s)).
    r = template.region_names.index("{subject}")
    splits = make_splits(template, 8, 4)
    tr, ev = (tokenize_pairs(adapter.tok, p, prepend_bos=True) for p in (splits.train, splits.eval))
    base_tr, _ = read_sites(adapter, tr.base_ids, tr.base_mask, tr.base_pos, tr.base_last, [1])
    src_ev, _ = read_sites(adapter, ev.source_ids, ev.source_mask, ev.source_pos, ev.source_last, [1])
    oracle = fit_oracle(base_tr[1][:, r], tr.base_class, _settings(oracle_probe=ORACLE))
    expected = counterfactual_completeness(oracle.predict_proba(src_ev[1][:, r]), ev.source_class).mean().item()
    got = rel_table.query("method == 'vanilla' and region == '{subject}'")["completeness"].item()
    assert got == pytest.approx(expected, abs=1e-5)


def test_random_draws_average_several_directions(rel_table):
    rnd = rel_table[rel_table["method"] == "random"]
    assert (rnd["n_directions"] == 3).all() and rnd["odds_draw_sd"].notna().all()
    assert (rel_table.loc[rel_table["method"] != "random", "n_directions"] == 1).all()


def test_overall_completeness_averages_decodable_sites_only():
    rows = pd.DataFrame({
        "model": "m", "cg_task": "t", "method": "mean", "condition": "task", "layer": [1, 1, 2, 2],
        "region_idx": [0, 1, 0, 1], "odds": [1.0, 2.0, 3.0, 4.0], "iia": 1.0, "task_accuracy": 1.0,
        "probe_accuracy": np.nan, "fit_s": 0.0, "eval_s": 0.0, "oracle_accuracy": [0.95, 0.5, 1.0, 0.9],
        "completeness": [0.8, 0.1, 0.6, 0.4], "oracle_selectivity": np.nan,
    })
    rec = cg_task.overall_table(rows).iloc[0]
    assert rec["completeness"] == pytest.approx((0.8 + 0.6 + 0.4) / 3) and rec["n_decodable_sites"] == 3
    assert np.isnan(rec["oracle_selectivity"]) and rec["overall_odds"] == pytest.approx(3.0)


def test_summary_averages_capable_tasks_separately():
    """Table 1 means over every task, and over the tasks the model can do (accuracy ≥ 0.9) only."""
    overall = pd.DataFrame({
        "model": "m", "method": "das", "cg_task": ["a", "b", "c"], "task_accuracy": [0.95, 0.5, 0.9],
        "overall_odds": [2.0, 8.0, 4.0], "selectivity": [1.0, 0.0, 0.5], "completeness": np.nan,
        "oracle_selectivity": np.nan, "seconds": 1.0})
    row = cg_task.summary_table(overall).iloc[0]
    assert row["n_tasks"] == 3 and row["overall_odds"] == pytest.approx(14 / 3)
    assert row["n_capable_tasks"] == 2
    assert row["capable_overall_odds"] == pytest.approx(3.0) and row["capable_selectivity"] == pytest.approx(0.75)


def test_das_is_trained_toward_each_conditions_source_label(adapter, template, monkeypatch):
    """DAS's target is y_s of the source input; the control condition retrains DAS on the control labels."""
    from cprobe.directions.das import DAS

    seen = []
    real_fit = DAS.fit

    def spy(self, forward, h_source, target, callback=None):
        seen.append(target.clone())
        return real_fit(self, forward, h_source, target, callback)

    monkeypatch.setattr(DAS, "fit", spy)
    splits = make_splits(template, 8, 4, 0, 1)
    run_gym_task(adapter, template, _settings(methods=["das"], layers=[1], regions=[0]), splits=splits)
    tr = tokenize_pairs(adapter.tok, splits.train)
    tr_c = tokenize_pairs(adapter.tok, control_pairs(splits.train))
    assert len(seen) == 2
    assert torch.equal(seen[0], tr.source_label_ids) and not torch.equal(seen[0], tr.base_label_ids)
    assert torch.equal(seen[1], tr_c.source_label_ids)


def test_probe_lambda_follows_the_reference_per_model_and_errors_when_unknown():
    """λ = 1/C as the reference's picked probe: 410m uses Probe¹ (1e5), other Pythias Probe⁰; a model outside the
    table needs an explicit λ (no silent λ = 10)."""
    from cprobe.errors import ConfigError

    def lam(name, **kw):
        g = cg_task.Config(**kw) if kw else cg_task.Config()
        return cg_task.settings_from_cfg({"model": {"name": name}}, g).probe_lam

    assert lam("pythia_14m") == 10.0 and lam("pythia_70m") == 1e3 and lam("pythia_160m") == 1e4
    assert lam("pythia_410m") == 1e5 and lam("pythia_1_4b") == 1e5 and lam("pythia_6_9b") == 1e6
    with pytest.raises(ConfigError, match="no probe λ for model 'gpt2'"):
        lam("gpt2")
    assert lam("gpt2", probe_lam=3.0) == 3.0
    assert lam("gpt2", methods=["das", "mean"]) == 1.0  # no probe: nothing to tune
    for name in cg_task.PAPER_PROBE_LAMS:
        assert (REPO / "conf" / "model" / f"{name}.yaml").is_file()
