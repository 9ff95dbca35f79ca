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

from cprobe.causalgym.runner import GymSettings, run_gym_task
from cprobe.data.causalgym import (CONTROL_LABELS, Splits, TaskTemplate, control_pairs, label_token_ids,
                                        make_pair_splits, pair_items)
from cprobe.metrics.odds import control_selectivity
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Interchange
from cprobe.models.formatters import RegionFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
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
COLUMNS = {"cg_task", "condition", "method", "layer", "paper_layer", "stream", "region", "region_idx", "odds", "iia",
           "probe_accuracy", "probe_lam", "task_accuracy", "capable", "unknown_labels", "n_train", "n_eval",
           "degenerate", "fit_s", "eval_s"}
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


def _settings(layers="blocks", **kw) -> GymSettings:
    """The task's own defaults (cg_task.Config) with a small test budget, resolved as a job does."""
    base = dict(methods=ALL_METHODS, n_train=8, n_eval=4, das=cg_task.DASKeys(lr=0.05), probe_lam=1.0,
                random_draws=1, reliability=False)
    if "probe_lams" in kw:
        kw["probe_lam"] = list(kw.pop("probe_lams"))
    if isinstance(kw.get("das"), dict):
        kw["das"] = cg_task.DASKeys(**kw["das"])
    return cg_task.settings_from_cfg({"model": {"name": "toy"}, "layers": layers, "seed": 0},
                                     cg_task.Config(**{**base, **kw}))


class Side:
    """What the core reads of one side (base or source) of some pairs at one site: acts and label scores."""

    def __init__(self, adapter, pairs, layer: int, region: int, side: str = "base", stream: str = "block") -> None:
        items = pair_items(pairs)[0 if side == "base" else 1]
        ids, _ = label_token_ids(adapter.tok, [lab for p in pairs for lab in (p.base_label, p.source_label)])
        self.items, self.fmt, self.site = items, RegionFormatter(prepend_bos=True), Site(layer, f"region:{region}",
                                                                                          stream)
        self.readout = CandidateTokens([[ids[p.base_label], ids[p.source_label]] for p in pairs])
        out = adapter.map(items, self.fmt, read=[self.site], readout=self.readout)
        self.acts, self.scores = out.acts[self.site], out.scores
        self.positions = self.fmt(items, adapter, torch.arange(len(items))).positions[f"region:{region}"]
        self.label_ids = self.readout.ids


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
    splits = make_pair_splits(template, 8, 4)
    same = [replace(p, source=p.base) for p in splits.eval]  # s = b; labels and classes unchanged
    rows = pd.DataFrame(run_gym_task(adapter, template, _settings(layers="all"), splits=Splits(splits.train, same)))
    assert set(rows["method"]) == set(ALL_METHODS)
    np.testing.assert_allclose(rows["odds"], 0.0, atol=1e-4)


def test_vanilla_at_layer0_equals_running_the_source(adapter, template, table):
    pairs = make_pair_splits(template, 8, 4).eval
    r = template.region_names.index("{subject}")
    base, src = Side(adapter, pairs, 0, r), Side(adapter, pairs, 0, r, "source")
    # Subjects are one token each, so the pair differs at exactly that position.
    assert torch.equal(base.positions, src.positions)
    swapped = adapter.map(base.items, base.fmt, edits={base.site: Interchange(src.acts)}, readout=base.readout).scores
    torch.testing.assert_close(swapped, src.scores, atol=1e-5, rtol=0)
    expected = ((base.scores[:, 0] - base.scores[:, 1]) + (src.scores[:, 1] - src.scores[:, 0])).mean().item()
    row = table.query("method == 'vanilla' and condition == 'task' and layer == 0 and region == '{subject}'")
    assert row["odds"].item() == pytest.approx(expected, abs=1e-5)


def test_control_rows_score_the_dog_give_labels(adapter, template, table):
    pairs = control_pairs(make_pair_splits(template, 8, 4).eval)
    r = template.region_names.index("{subject}")
    base, src = Side(adapter, pairs, 0, r), Side(adapter, pairs, 0, r, "source")
    dog, give = (adapter.tok(w, add_special_tokens=False)["input_ids"][0] for w in CONTROL_LABELS)
    assert set(base.label_ids[:, 0].tolist()) == {dog, give} and dog != give
    expected = ((base.scores[:, 0] - base.scores[:, 1]) + (src.scores[:, 1] - src.scores[:, 0])).mean().item()
    row = table.query("method == 'vanilla' and condition == 'control' and layer == 0 and region == '{subject}'")
    assert row["odds"].item() == pytest.approx(expected, abs=1e-5)
    # Selectivity is the overall odds of the per-site difference task − control.
    overall = cg_task.overall_table(table.assign(model="toy"))
    for method in ("das", "probe", "vanilla"):
        part = table[table["method"] == method]
        grid = {c: part[part["condition"] == c].pivot_table(index="layer", columns="region_idx", values="odds")
                for c in ("task", "control")}
        got = overall.set_index("method").loc[method, "selectivity"]
        assert got == pytest.approx(control_selectivity(grid["task"].to_numpy(), grid["control"].to_numpy()))


def test_report_writes_tables_and_figures(table, tmp_path):
    t = table.assign(model="toy", task="causalgym", seed=0)
    cg_task.report(t, tmp_path)
    for stem in ("causalgym_overall", "causalgym_summary"):
        assert (tmp_path / f"{stem}.csv").is_file()
    summary = pd.read_csv(tmp_path / "causalgym_summary.csv")
    assert set(summary["method"]) == set(ALL_METHODS)
    assert (tmp_path / "heatmap_toy_toy_agr.png").is_file()
    assert (tmp_path / "odds_by_layer_toy.png").is_file()
    from tests.conftest import assert_figures_captioned

    assert len(assert_figures_captioned(tmp_path)) == 2  # every figure names its task, model, data, n, seed
    # a model or task name that looks like a path stays one file name inside the output dir
    cg_task.report(t.assign(model="../../../../escaped", cg_task="a/b"), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == [
        "heatmap__.._.._.._escaped_a_b.png", "odds_by_layer__.._.._.._escaped.png"]
    assert not list(tmp_path.parent.glob("escaped*")) and not list(tmp_path.glob("escaped*"))


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
    splits = make_pair_splits(template, 8, 4)
    base_tr, src_ev = Side(adapter, splits.train, 1, r), Side(adapter, splits.eval, 1, r, "source")
    oracle = fit_oracle(base_tr.acts, torch.tensor([p.base_class for p in splits.train]),
                        _settings(oracle_probe=ORACLE))
    src_class = torch.tensor([p.source_class for p in splits.eval])
    expected = counterfactual_completeness(oracle.predict_proba(src_ev.acts), src_class).mean().item()
    got = rel_table.query("method == 'vanilla' and region == '{subject}'")["completeness"].item()
    assert got == pytest.approx(expected, abs=1e-5)


def test_random_draws_average_several_directions(rel_table):
    rnd = rel_table[rel_table["method"] == "random"]
    assert (rnd["n_directions"] == 3).all() and (rnd["odds_draw_sd"] > 0).all()  # three different draws
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
    splits = make_pair_splits(template, 8, 4, 0, 1)
    run_gym_task(adapter, template, _settings(methods=["das"], layers=[1], regions=[0]), splits=splits)
    tr = Side(adapter, splits.train, 1, 0).label_ids
    tr_c = Side(adapter, control_pairs(splits.train), 1, 0).label_ids
    assert len(seen) == 2
    assert torch.equal(seen[0], tr[:, 1]) and not torch.equal(seen[0], tr[:, 0])
    assert torch.equal(seen[1], tr_c[:, 1])


def test_probe_lambda_follows_the_reference_per_model_and_errors_when_unknown():
    """λ = 1/C as the paper's per-model table: models above 70m run both probes (Probe⁰, Probe¹; the summary keeps
    the better); a model outside the table needs an explicit λ (no silent λ = 10)."""
    from cprobe.errors import ConfigError

    def lam(name, **kw):
        g = cg_task.Config(**kw) if kw else cg_task.Config()
        return cg_task.settings_from_cfg({"model": {"name": name}}, g).probe_lams

    assert lam("pythia_14m") == (10.0,) and lam("pythia_70m") == (1e3,) and lam("pythia_160m") == (1e4, 1e5)
    assert lam("pythia_410m") == (1e4, 1e5) and lam("pythia_1_4b") == (1e5, 1e6) and lam("pythia_6_9b") == (1e6, 1e7)
    with pytest.raises(ConfigError, match="no probe λ for model 'gpt2'"):
        lam("gpt2")
    assert lam("gpt2", probe_lam=3.0) == (3.0,) and lam("gpt2", probe_lam=[1.0, 10.0]) == (1.0, 10.0)
    assert lam("gpt2", methods=["das", "mean"]) == (1.0,)  # no probe: nothing to tune
    with pytest.raises(ConfigError, match="probe_lam"):
        lam("gpt2", probe_lam=[])
    for name in cg_task.PAPER_PROBE_LAMS:
        assert (REPO / "conf" / "model" / f"{name}.yaml").is_file()
    assert cg_task.PAPER_PROBE_LAM["pythia_410m"] == 1e5  # the reference's own pick (pick_better_probe)


def test_two_probes_run_as_probe0_probe1_and_the_summary_keeps_the_better(adapter, template):
    rows = pd.DataFrame(run_gym_task(adapter, template, _settings(methods=["probe", "mean"], layers=[1],
                                                                  probe_lams=(1.0, 1e4), control=False)))
    assert set(rows["method"]) == {"probe0", "probe1", "mean"}
    assert set(rows.loc[rows["method"] == "probe0", "probe_lam"]) == {1.0}
    assert set(rows.loc[rows["method"] == "probe1", "probe_lam"]) == {1e4}
    overall = pd.DataFrame({
        "model": ["m"] * 4 + ["n"] * 2, "method": ["probe0", "probe0", "probe1", "probe1", "probe0", "probe1"],
        "cg_task": ["a", "b", "a", "b", "a", "a"], "task_accuracy": 1.0, "capable": True,
        "overall_odds": [1.0, 2.0, 3.0, 1.0, 5.0, 4.0], "selectivity": [0.5, 0.5, 0.1, 0.2, 1.0, 2.0],
        "completeness": np.nan, "oracle_selectivity": np.nan, "seconds": 1.0})
    overall.loc[overall["cg_task"] == "a", "capable"] = False  # m: over task b alone, probe0 (2.0) beats probe1 (1.0)
    overall["capable"] = overall["capable"].astype(bool)
    summary = cg_task.summary_table(overall).set_index(["model", "method"])
    assert summary.loc[("m", "probe"), "capable_probe_pick"] == "probe0"
    assert summary.loc[("m", "probe"), "capable_overall_odds"] == pytest.approx(2.0)
    # m: probe0 averages 1.5, probe1 2.0 -> probe1 (its selectivity too); n: probe0 5 > 4.
    assert summary.loc[("m", "probe"), "probe_pick"] == "probe1"
    assert summary.loc[("m", "probe"), "overall_odds"] == pytest.approx(2.0)
    assert summary.loc[("m", "probe"), "selectivity"] == pytest.approx(0.15)
    assert summary.loc[("n", "probe"), "probe_pick"] == "probe0"
    assert summary.loc[("n", "probe"), "selectivity"] == pytest.approx(1.0)


def test_table1_layout_is_method_by_model_with_odds_and_selectivity():
    overall = pd.DataFrame({
        "model": ["m", "m", "m", "n"], "method": ["das", "das", "mean", "das"], "cg_task": ["a", "b", "a", "a"],
        "task_accuracy": [1.0, 0.5, 1.0, 1.0], "capable": [True, False, True, True],
        "overall_odds": [2.0, 4.0, 1.0, 7.0], "selectivity": [1.0, 3.0, 0.5, 6.0], "completeness": np.nan,
        "oracle_selectivity": np.nan, "seconds": 1.0})
    summary = cg_task.summary_table(overall)
    t1 = cg_task.table1(summary).set_index("method")
    assert list(t1.columns) == ["m odds", "m sel", "n odds", "n sel"]
    assert list(t1.index) == ["das", "mean", "(tasks averaged)"]  # the paper's method order
    assert t1.loc["das", "m odds"] == pytest.approx(3.0) and t1.loc["das", "m sel"] == pytest.approx(2.0)
    assert t1.loc["das", "n odds"] == pytest.approx(7.0) and np.isnan(t1.loc["mean", "n odds"])
    assert t1.loc["(tasks averaged)", "m odds"] == 2
    cap = cg_task.table1(summary, capable_only=True).set_index("method")
    assert cap.loc["das", "m odds"] == pytest.approx(2.0) and cap.loc["(tasks averaged)", "m odds"] == 1


def test_unknown_label_tokens_mark_the_task_not_capable_in_every_table(adapter, tmp_path):
    spec = {**SPEC, "labels": {"singular": ["is"], "plural": ["zorbles"]}}  # not in the toy vocabulary
    odd = TaskTemplate.from_spec("toy_unknown", spec)
    rows = pd.DataFrame(run_gym_task(adapter, odd, _settings(methods=["mean"], layers=[1], control=False)))
    assert not rows["capable"].any() and set(rows["unknown_labels"]) == {" zorbles"}
    good = pd.DataFrame(run_gym_task(adapter, TaskTemplate.from_spec("toy_agr", SPEC),
                                     _settings(methods=["mean"], layers=[1], control=False)))
    good = good.assign(capable=True, task_accuracy=1.0)  # as if the toy model could do it
    t = pd.concat([rows, good]).assign(model="toy")
    overall = cg_task.overall_table(t).set_index("cg_task")
    assert not overall.loc["toy_unknown", "capable"] and overall.loc["toy_agr", "capable"]
    s = cg_task.summary_table(overall.reset_index()).iloc[0]
    assert s["n_tasks"] == 2 and s["n_capable_tasks"] == 1
    assert s["capable_overall_odds"] == pytest.approx(overall.loc["toy_agr", "overall_odds"])


def test_last_layer_reads_the_block_output_by_default_and_resid_after_the_final_norm(adapter, template):
    L = adapter.n_layers
    pairs = make_pair_splits(template, 8, 4).eval
    r = template.region_names.index("{object}")
    block, resid = Side(adapter, pairs, L, r), Side(adapter, pairs, L, r, stream="resid")
    norm = adapter.model.gpt_neox.final_layer_norm
    with torch.no_grad():
        torch.testing.assert_close(norm(block.acts), resid.acts, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(block.acts, resid.acts, atol=1e-3)
    assert cg_task.Config().stream == "block" and _settings().stream == "block"
    kw = dict(methods=["mean", "pca"], layers=[1, L], control=False)
    rb = pd.DataFrame(run_gym_task(adapter, template, _settings(**kw))).set_index(["method", "layer", "region"])
    rr = pd.DataFrame(run_gym_task(adapter, template, _settings(stream="resid", **kw))).set_index(
        ["method", "layer", "region"])
    assert set(rb["stream"]) == {"block"} and set(rr["stream"]) == {"resid"}
    np.testing.assert_allclose(rb.xs(1, level="layer")["odds"], rr.xs(1, level="layer")["odds"], atol=1e-6)
    assert not np.allclose(rb.xs(L, level="layer")["odds"], rr.xs(L, level="layer")["odds"], atol=1e-4)
    assert (rb.reset_index()["paper_layer"] == rb.reset_index()["layer"] - 1).all()
    with pytest.raises(Exception, match="stream"):
        _settings(stream="mlp")


def test_learned_directions_are_saved_as_safetensors_and_load_back(adapter, template, tmp_path):
    dirs: dict = {}
    run_gym_task(adapter, template, _settings(methods=["das", "mean", "random", "vanilla"], layers=[1], regions=[0],
                                              random_draws=3), directions=dirs)
    assert set(dirs) == {"toy_agr/task/das/L1/R0", "toy_agr/control/das/L1/R0", "toy_agr/task/mean/L1/R0",
                         "toy_agr/task/random/L1/R0"}
    assert dirs["toy_agr/task/random/L1/R0"].shape == (3, adapter.hidden_size)
    torch.testing.assert_close(dirs["toy_agr/task/mean/L1/R0"].norm(), torch.tensor(1.0))
    path = tmp_path / "directions.safetensors"
    cg_task.save_directions(dirs, path, model="toy", stream="block")
    back = cg_task.load_directions(path)
    assert set(back) == set(dirs) and all(torch.equal(back[k], dirs[k]) for k in dirs)


def test_heatmaps_are_readable(table, tmp_path, monkeypatch):
    """Every text in the layer × region figure is at least 9 pt; one colour bar states its range; the task,
    control and selectivity maps are all drawn; layer ticks are the paper's block numbers."""
    figs = []
    monkeypatch.setattr(cg_task, "save", lambda fig, path: figs.append(fig))
    part = table.assign(model="toy")
    # a method that has no row at one region (e.g. a supervised method at a one-class site) keeps aligned columns
    part = part[~((part["method"] == "probe") & (part["region"] == "_near_the"))]
    cg_task._heatmaps(part, tmp_path / "h.png", "toy")
    (fig,) = figs
    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(lambda o: hasattr(o, "get_fontsize") and hasattr(o, "get_text"))
             if t.get_text()]
    assert sizes and min(sizes) >= 9
    titles = {ax.get_title() for ax in fig.axes if ax.get_title()}
    assert {"das · task", "das · control", "das · selectivity"} <= titles
    bars = [ax for ax in fig.axes if "scale ±" in ax.get_ylabel()]
    assert len(bars) == 1
    ax = next(a for a in fig.axes if a.get_title() == "das · task")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["emb", "0", "1"]
    probe = next(a for a in fig.axes if a.get_title() == "probe · task")
    assert probe.get_images()[0].get_array().shape == ax.get_images()[0].get_array().shape == (3, 3)
    assert np.ma.getmaskarray(probe.get_images()[0].get_array())[:, 1].all()  # the missing region, its own column


def test_das_parametrization_is_a_config_key_checked_before_the_run():
    from cprobe.errors import ConfigError

    def das(**kw):
        return cg_task.settings_from_cfg({"model": {"name": "pythia_14m"}}, cg_task.Config(das=cg_task.DASKeys(**kw))).das

    assert das()["parametrization"] == "orthogonal" and das(parametrization="normalize")["parametrization"] == "normalize"
    with pytest.raises(ConfigError, match="parametrization"):
        das(parametrization="cayley")


def test_the_experiment_yaml_states_the_task_defaults():
    """CausalGym's defaults live in one place (cg_task.Config); the experiment file shows the same values."""
    import dataclasses

    import yaml

    node = yaml.safe_load((REPO / "conf" / "experiment" / "causalgym.yaml").read_text())["causalgym"]
    defaults = dataclasses.asdict(cg_task.Config())
    assert set(node) == set(defaults)
    for key, value in node.items():
        assert value == defaults[key], key


def test_capable_needs_accuracy_and_known_labels():
    from cprobe.causalgym.runner import CAPABLE_ACCURACY, is_capable

    assert is_capable(CAPABLE_ACCURACY, []) and is_capable(1.0, ())
    assert not is_capable(CAPABLE_ACCURACY - 1e-9, [])
    assert not is_capable(1.0, [" zorbles"])  # an unknown label makes the odds meaningless, whatever the accuracy


def test_das_control_rows_use_the_control_trained_direction(adapter, template):
    dirs: dict = {}
    r = template.region_names.index("{subject}")
    rows = pd.DataFrame(run_gym_task(adapter, template, _settings(methods=["das"], layers=[1], regions=[r]),
                                     directions=dirs))
    a_task, a_ctrl = dirs[f"toy_agr/task/das/L1/R{r}"], dirs[f"toy_agr/control/das/L1/R{r}"]
    assert not torch.allclose(a_task, a_ctrl, atol=1e-3)
    pairs = control_pairs(make_pair_splits(template, 8, 4).eval)
    base, src = Side(adapter, pairs, 1, r), Side(adapter, pairs, 1, r, "source")
    for a, expect_match in ((a_ctrl, True), (a_task, False)):
        out = adapter.map(base.items, base.fmt, edits={base.site: Interchange(src.acts, a)}, readout=base.readout).scores
        expected = ((base.scores[:, 0] - base.scores[:, 1]) + (out[:, 1] - out[:, 0])).mean().item()
        got = rows.query("condition == 'control'")["odds"].item()
        assert (got == pytest.approx(expected, abs=1e-5)) == expect_match


def test_label_using_methods_skip_a_site_with_one_class(adapter, template):
    """Supervised directions need both classes among the train bases; the others still run there."""
    splits = make_pair_splits(template, 8, 4)
    one_class = Splits([p for p in splits.train if p.base_class == 0], splits.eval)
    rows = pd.DataFrame(run_gym_task(adapter, template, _settings(methods=["probe", "mean", "pca"], layers=[1],
                                                                  control=False), splits=one_class))
    assert set(rows["method"]) == {"pca"}


def test_random_draws_are_independent_across_tasks(adapter, template):
    """The chance baseline's seeds include the task: two tasks never score the same random directions."""
    other = TaskTemplate.from_spec("toy_other", SPEC)
    got = []
    for tmpl in (template, other):
        dirs: dict = {}
        run_gym_task(adapter, tmpl, _settings(methods=["random"], layers=[1], regions=[0], control=False,
                                              random_draws=2), directions=dirs)
        got.append(dirs[f"{tmpl.name}/task/random/L1/R0"])
    assert got[0].shape == got[1].shape == (2, adapter.hidden_size)
    assert not torch.allclose(got[0], got[1])


def test_an_unknown_control_label_does_not_make_the_task_unknown(template):
    """A tokenizer without " give" leaves the control task vacuous but the task's own labels known."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from cprobe.models.tiny import build_tokenizer

    words = ["the", "near", "author", "authors", "guard", "guards", "is", "was", "are", "were", *OBJECTS, "dog"]
    tok = build_tokenizer("neox", words, 64)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    ad = ModelAdapter(model, tok, "causal", "no_give", batch_size=8)
    rows = pd.DataFrame(run_gym_task(ad, template, _settings(methods=["mean"], layers=[1])))
    assert set(rows["unknown_labels"]) == {""}
