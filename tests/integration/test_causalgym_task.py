"""The CausalGym runner and task on a tiny random GPT-NeoX with a word-level tokenizer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from cprobe.tasks.causalgym_engine import run_gym_task
from cprobe.data.causalgym import (CONTROL_LABELS, Splits, TaskTemplate, control_pairs, label_token_ids,
                                        make_pair_splits, pair_items)
from cprobe.metrics.odds import control_selectivity
from cprobe.models.adapter import ModelAdapter
from cprobe.models.edits import Interchange
from cprobe.models.formatters import RegionFormatter
from cprobe.models.readouts import CandidateTokens
from cprobe.models.sites import Site
from cprobe.tasks import causalgym as cg_task
from tests import cli
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


def _settings(layers="blocks", **kw) -> tuple[cg_task.Config, object]:
    """(the task's own defaults (cg_task.Config) with a small test budget, resolved as a job does; the layers)."""
    base = dict(methods=ALL_METHODS, n_train=8, n_eval=4, das=cg_task.DASKeys(lr=0.05), probe_lam=1.0,
                random_draws=1, reliability=False)
    if "probe_lams" in kw:
        kw["probe_lam"] = list(kw.pop("probe_lams"))
    if isinstance(kw.get("das"), dict):
        kw["das"] = cg_task.DASKeys(**kw["das"])
    return cg_task.Config(**{**base, **kw}).resolve({"name": "toy"}), layers


class Side:
    """What the core reads of one side (base or source) of some pairs at one site: acts and label scores."""

    def __init__(self, adapter, pairs, layer: int, region: int, side: str = "base", stream: str = "block") -> None:
        items = pair_items(pairs)[0 if side == "base" else 1]
        ids, _ = label_token_ids(adapter.tok, [lab for p in pairs for lab in (p.base_label, p.source_label)])
        self.items, self.fmt, self.site = items, RegionFormatter(), Site(layer, f"region:{region}",
                                                                                          stream)
        self.readout = CandidateTokens([[ids[p.base_label], ids[p.source_label]] for p in pairs])
        out = adapter.map(items, self.fmt, read=[self.site], readout=self.readout)
        self.acts, self.scores = out.acts[self.site], out.scores
        self.positions = self.fmt(items, adapter, torch.arange(len(items))).positions[f"region:{region}"]
        self.label_ids = self.readout.ids


@pytest.fixture(scope="module")
def table(adapter, template) -> pd.DataFrame:
    return pd.DataFrame(run_gym_task(adapter, template, *_settings(layers="all")))


def test_long_table_has_every_site_method_and_condition(table, template):
    assert COLUMNS <= set(table.columns)
    regions = range(template.first_label_region, len(template.spans))  # paper default: label region on
    assert len(table) == 2 * len(ALL_METHODS) * 3 * len(regions)  # conditions × methods × layers 0..2 × regions
    assert set(table["condition"]) == {"task", "control"}
    assert set(table["region"]) == {"{subject}", "_near_the", "{object}"}
    assert table["odds"].notna().all()
    probe = table[table["method"] == "probe"]
    assert probe.loc[~probe["degenerate"], "probe_accuracy"].between(0, 1).all()
    # Embeddings of the shared word after the subject do not vary: no direction can be fitted there. The object's
    # embedding varies, but every train pair's base and source share their object with opposite labels, so the
    # penalised logistic regression's optimum there is exactly w = 0 (the shared Newton solver reaches it; SAGA stopped
    # at noise): no direction either.
    assert sorted(probe.loc[probe["degenerate"], ["layer", "region"]].drop_duplicates().values.tolist()) == \
        [[0, "_near_the"], [0, "{object}"]]


def test_source_equal_to_base_gives_zero_odds_for_every_method(adapter, template):
    splits = make_pair_splits(template, 8, 4)
    same = [replace(p, source=p.base) for p in splits.eval]  # s = b; labels and classes unchanged
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(layers="all"), splits=Splits(splits.train, same)))
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
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(methods=["mean"], layers=[-1], regions=["{object}"],
                                                                  control=False)))
    assert rows[["layer", "region", "condition"]].drop_duplicates().values.tolist() == [[2, "{object}", "task"]]


@pytest.mark.slow
@needs_shared("causalgym", "templates", "syntaxgym.json")
def test_experiment_end_to_end_on_agreement_templates(tmp_path):
    """`cprobe run +experiment=causalgym` on one agreement task with a tiny, briefly trained model: cold (the model
    trained in the job) and warm (read from the cache) give byte-identical tables. In process (``tests.cli.run``):
    the warm run reads the model from the disk cache, as a new process would."""
    env = {"CPROBE_CACHE_DIR": str(tmp_path / "cache"), "CPROBE_DATA_DIR": str(SHARED_DATA)}
    cmd = ["run", "+experiment=causalgym", f"hydra.run.dir={tmp_path / 'run'}",
           "causalgym.tasks=[agr_sv_num_pp]", "causalgym.n_train=8", "causalgym.n_eval=4", "layers=[1,2]",
           "causalgym.methods=[das,probe,mean,random,leace,mean_diff,pgd]", "causalgym.read_layers=true",
           "model.tiny.train.steps=30", "+model.tiny.train.layers=2",
           "model.tiny.grammar.n_sentences=300", "model.tiny.causalgym_corpus.n_per_task=50",
           "model.tiny.causalgym_corpus.tasks=[agr_sv_num_pp]", "progress=false", "device=cpu"]
    res = cli.run(*cmd, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert set(metrics["cg_task"]) == {"agr_sv_num_pp"} and set(metrics["condition"]) == {"task", "control"}
    overall = pd.read_csv(tmp_path / "run" / "causalgym_overall.csv")
    assert set(overall["method"]) == {"das", "probe", "mean", "random", "leace", "leace_dir", "mean_diff",
                                      "mean_diff_dir", "pgd"}
    assert overall.loc[overall["method"] == "leace", "overall_erasure"].notna().all()
    assert (tmp_path / "run" / "causalgym_read_layers.csv").is_file()
    assert overall["selectivity"].notna().all()
    # warm (the model now cached, nothing trained before the task): the same tables, byte for byte
    warm = [c.replace(str(tmp_path / "run"), str(tmp_path / "warm")) for c in cmd]
    res = cli.run(*warm, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("metrics.csv", "metrics.parquet", "causalgym_overall.csv", "causalgym_summary.parquet",
                 "causalgym_table1.md", "causalgym_table1_capable.csv", "directions.safetensors",
                 "causalgym_read_layers.csv"):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "warm" / name).read_bytes(), name


# ---------------------------------------------------------------------------------- beyond the paper

ORACLE = {"name": "mlp", "n_layers": [1], "widths": [16], "lrs": [1e-2], "epochs": 3}


@pytest.fixture(scope="module")
def rel_table(adapter, template) -> pd.DataFrame:
    s = _settings(methods=["mean", "random", "vanilla"], layers=[1], control=False, reliability=True,
                  oracle_probe=ORACLE, random_draws=3)
    return pd.DataFrame(run_gym_task(adapter, template, *s))


def test_reliability_columns_and_vanilla_completeness_is_the_oracle_on_the_source(adapter, template, rel_table):
    from cprobe.tasks.causalgym_engine import oracle_probe
    from cprobe.metrics.reliability import counterfactual_completeness

    assert {"completeness", "oracle_accuracy", "oracle_selectivity", "n_directions"} <= set(rel_table.columns)
    assert rel_table["completeness"].between(0, 1).all() and rel_table["oracle_accuracy"].between(0, 1).all()
    assert rel_table["oracle_selectivity"].isna().all()  # no non-targeted property in the templates
    # Vanilla writes the source vector: completeness = the oracle's P(source class | f(s)).
    r = template.region_names.index("{subject}")
    splits = make_pair_splits(template, 8, 4)
    base_tr, src_ev = Side(adapter, splits.train, 1, r), Side(adapter, splits.eval, 1, r, "source")
    oracle = oracle_probe(ORACLE, seed=0).fit(base_tr.acts.float(),
                                              torch.tensor([p.base_class for p in splits.train]))
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
    real_fit = DAS.fit_many

    def spy(self, forward, h_source, target, callback=None):
        seen.extend(target.clone())  # one row per trained direction (site × condition)
        return real_fit(self, forward, h_source, target, callback)

    monkeypatch.setattr(DAS, "fit_many", spy)
    splits = make_pair_splits(template, 8, 4, 0, 1)
    run_gym_task(adapter, template, *_settings(methods=["das"], layers=[1], regions=[0]), splits=splits)
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
        return g.resolve({"name": name}).probe_lam

    assert lam("pythia_14m") == (10.0,) and lam("pythia_70m") == (1e3,) and lam("pythia_160m") == (1e4, 1e5)
    assert lam("pythia_410m") == (1e4, 1e5) and lam("pythia_1_4b") == (1e5, 1e6) and lam("pythia_6_9b") == (1e6, 1e7)
    with pytest.raises(ConfigError, match="no probe λ for model 'gpt2'"):
        lam("gpt2")
    assert lam("gpt2", probe_lam=3.0) == (3.0,) and lam("gpt2", probe_lam=[1.0, 10.0]) == (1.0, 10.0)
    assert lam("gpt2", methods=["das", "mean"]) == ()  # no probe: nothing to tune
    with pytest.raises((ConfigError, ValueError), match="probe_lam"):
        lam("gpt2", probe_lam=[])
    for name in cg_task.PAPER_PROBE_LAMS:
        assert (REPO / "conf" / "model" / f"{name}.yaml").is_file()
    assert cg_task.PAPER_PROBE_LAM["pythia_410m"] == 1e5  # the reference's own pick (pick_better_probe)


def test_two_probes_run_as_probe0_probe1_and_the_summary_keeps_the_better(adapter, template):
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(methods=["probe", "mean"], layers=[1],
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
    rows = pd.DataFrame(run_gym_task(adapter, odd, *_settings(methods=["mean"], layers=[1], control=False)))
    assert not rows["capable"].any() and set(rows["unknown_labels"]) == {" zorbles"}
    good = pd.DataFrame(run_gym_task(adapter, TaskTemplate.from_spec("toy_agr", SPEC),
                                     *_settings(methods=["mean"], layers=[1], control=False)))
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
    assert cg_task.Config().stream == "block" and _settings()[0].stream == "block"
    kw = dict(methods=["mean", "pca"], layers=[1, L], control=False)
    rb = pd.DataFrame(run_gym_task(adapter, template, *_settings(**kw))).set_index(["method", "layer", "region"])
    rr = pd.DataFrame(run_gym_task(adapter, template, *_settings(stream="resid", **kw))).set_index(
        ["method", "layer", "region"])
    assert set(rb["stream"]) == {"block"} and set(rr["stream"]) == {"resid"}
    np.testing.assert_allclose(rb.xs(1, level="layer")["odds"], rr.xs(1, level="layer")["odds"], atol=1e-6)
    assert not np.allclose(rb.xs(L, level="layer")["odds"], rr.xs(L, level="layer")["odds"], atol=1e-4)
    assert (rb.reset_index()["paper_layer"] == rb.reset_index()["layer"] - 1).all()
    with pytest.raises(Exception, match="stream"):
        _settings(stream="mlp")


def test_learned_directions_are_saved_as_safetensors_and_load_back(adapter, template, tmp_path):
    dirs: dict = {}
    run_gym_task(adapter, template, *_settings(methods=["das", "mean", "random", "vanilla"], layers=[1], regions=[0],
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
        return vars(cg_task.Config(das=cg_task.DASKeys(**kw)).resolve({"name": "pythia_14m"}).das)

    assert das()["parametrization"] == "orthogonal" and das(parametrization="normalize")["parametrization"] == "normalize"
    with pytest.raises(ConfigError, match="parametrization"):
        das(parametrization="cayley")
    from cprobe.config import parse

    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['k'\] under causalgym.das"):  # the paper's DII is 1-D
        parse(cg_task.Config, {"das": {"k": 2}}, "causalgym")


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
    from cprobe.tasks.causalgym_engine import is_capable
    from cprobe.tasks.causalgym_settings import CAPABLE_ACCURACY

    assert is_capable(CAPABLE_ACCURACY, []) and is_capable(1.0, ())
    assert not is_capable(CAPABLE_ACCURACY - 1e-9, [])
    assert not is_capable(1.0, [" zorbles"])  # an unknown label makes the odds meaningless, whatever the accuracy


def test_das_control_rows_use_the_control_trained_direction(adapter, template):
    dirs: dict = {}
    r = template.region_names.index("{subject}")
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(methods=["das"], layers=[1], regions=[r]),
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
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(methods=["probe", "mean", "pca"], layers=[1],
                                                                  control=False), splits=one_class))
    assert set(rows["method"]) == {"pca"}


def test_random_draws_are_independent_across_tasks(adapter, template):
    """The chance baseline's seeds include the task: two tasks never score the same random directions."""
    other = TaskTemplate.from_spec("toy_other", SPEC)
    got = []
    for tmpl in (template, other):
        dirs: dict = {}
        run_gym_task(adapter, tmpl, *_settings(methods=["random"], layers=[1], regions=[0], control=False,
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
    rows = pd.DataFrame(run_gym_task(ad, template, *_settings(methods=["mean"], layers=[1])))
    assert set(rows["unknown_labels"]) == {""}


# ---------------------------------------------------------------------------------- many sites per pass


def test_one_pass_over_many_sites_scores_as_one_site_at_a_time(adapter, template):
    """The batched forward (every row its own site, many sites per pass) gives each row the scores of a pass with that
    row's DII alone at its site."""
    from cprobe.models.readouts import Vocabulary
    from cprobe.models.multisite import rowwise_dii, site_batch
    from cprobe.models.readouts import NextToken

    splits = make_pair_splits(template, 8, 4)
    base, src = pair_items(splits.train)
    fmt = RegionFormatter()
    batch = fmt(base, adapter, torch.arange(len(base)))
    sites = [Site(1, "region:1", "block"), Site(2, "region:3", "block"), Site(1, "region:3", "block"),
             Site(0, "region:1", "block")]
    acts = adapter.map(src, fmt, read=sites).acts
    items = torch.tensor([0, 3, 5, 5, 2, 7, 1, 0])
    row_site = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    g = torch.Generator().manual_seed(0)
    a = torch.nn.functional.normalize(torch.randn(len(items), adapter.hidden_size, generator=g), dim=-1)
    S = torch.stack([acts[sites[s]][i] for s, i in zip(row_site.tolist(), items.tolist())])
    whole = torch.tensor([False, False, True, False, False, False, False, True])
    b, at = site_batch(batch, items, row_site, sites)
    got = adapter.run(b, edits={s: rowwise_dii(S, a, whole) for s in at}, readout=NextToken()).scores
    for r in range(len(items)):
        site = sites[int(row_site[r])]
        one = batch.select(items[r:r + 1])
        want = adapter.run(one, edits={site: Interchange(S[r:r + 1], None if whole[r] else a[r]).bind(torch.zeros(
            1, dtype=torch.long))}, readout=Vocabulary()).scores[0]
        torch.testing.assert_close(got[r], want, atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
def test_das_over_many_sites_in_one_pass_equals_one_site_at_a_time(adapter, template):
    """The runner's batched DAS (all sites and both conditions per pass) learns the directions of one-site runs
    (tolerance 1e-4 on each coordinate: float summation order over 4 steps; measured ~1e-7), whatever the pass size."""
    r = [template.region_names.index("{subject}"), template.region_names.index("{object}")]
    kw = dict(methods=["das"], layers=[1, 2], regions=r)
    together: dict = {}
    run_gym_task(adapter, template, *_settings(**kw), directions=together)
    alone: dict = {}
    run_gym_task(adapter, template, *_settings(sites_per_pass=1, **kw), directions=alone)
    assert set(together) == set(alone) and len(together) == 2 * 2 * 2  # layers × regions × conditions
    for key in together:
        torch.testing.assert_close(together[key], alone[key], atol=1e-4, rtol=0)


def test_das_training_reads_nothing_back_from_the_device_per_step(adapter, template):
    """Through the real model: the host reads of a DAS pass do not grow with its steps (HF's own mask check aside)."""
    from cprobe.directions.das import DAS
    from cprobe.models.multisite import SitesForward
    from tests.unit.test_directions import _sync_ops

    splits = make_pair_splits(template, 8, 4)
    base, src = pair_items(splits.train)
    fmt = RegionFormatter()
    batch = fmt(base, adapter, torch.arange(len(base)))
    sites = [Site(1, "region:1", "block"), Site(2, "region:3", "block")]
    acts = adapter.map(src, fmt, read=sites).acts
    H = torch.stack([acts[s] for s in sites])
    T = torch.randint(0, len(adapter.tok), (2, len(base)), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(len(base))

    def train(epochs):
        das = DAS(lr=0.05, epochs=epochs)
        forward = SitesForward(adapter, batch, rows, sites, das.windows(len(rows)))  # built before the steps
        return _sync_ops(lambda: das.fit_many(forward, H, T))

    assert train(1) == train(3)


# ---------------------------------------------------------------------------------- resumable, byte-reproducible


def _job(tmp_path, adapter, monkeypatch, out: str, tasks=("toy_agr", "toy_other"), **cg):
    """A CausalGym job on the toy model, as the pipeline runs it: ``run`` → metrics.* → the report's tables (figures
    skipped); the bytes of every table it wrote."""
    import json

    from cprobe import results
    from cprobe.job import JobContext

    templates = tmp_path / "templates.json"
    templates.write_text(json.dumps({"toy_agr": SPEC, "toy_other": SPEC}))
    node = {"templates": str(templates), "tasks": list(tasks),
            "methods": ["das", "probe", "mean", "random", "vanilla", "leace", "mean_diff", "fgsm"],  # + interventions
            "n_train": 8, "n_eval": 4, "probe_lam": 1.0, "random_draws": 2, "reliability": True, "read_layers": True,
            "oracle_probe": ORACLE, "das": {"lr": 0.05}, **cg}
    cfg = {"model": {"name": "toy_neox"}, "layers": [1, 2], "seed": 0, "device": "cpu", "causalgym": node}
    out_dir = tmp_path / out
    out_dir.mkdir(exist_ok=True)
    ctx = JobContext(cfg=cfg, out_dir=out_dir, data_root=tmp_path, cache_root=tmp_path / "cache", progress=False)
    monkeypatch.setattr(JobContext, "adapter", lambda self, m: adapter)
    for figure in ("_heatmaps", "_odds_by_layer"):  # the tables are what must match; figures only cost time here
        monkeypatch.setattr(cg_task, figure, lambda *a, **k: None)
    table = cg_task.run(ctx, cg_task.Config(**{k: v for k, v in node.items() if k != "das"},
                                           das=cg_task.DASKeys(**node["das"])))
    table["task"], table["seed"] = "causalgym", 0
    results.write_job(table, out_dir)
    cg_task.report(table, out_dir)
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir())  # every table; timings.csv is the timings
            if p.suffix in (".csv", ".parquet", ".md", ".safetensors") and p.name != "timings.csv"}


def test_an_interrupted_run_resumes_from_its_finished_tasks_with_identical_tables(tmp_path, adapter, monkeypatch):
    """Per-task results are written as each task finishes; a re-run computes only the missing tasks and its tables
    are byte-identical to an uninterrupted run's (metrics, every causalgym_* table, the directions)."""
    whole = _job(tmp_path, adapter, monkeypatch, "whole")
    real = cg_task.run_gym_task
    ran = []

    def interrupted(adapter, template, *a, **k):
        ran.append(template.name)
        if template.name == "toy_other":
            raise KeyboardInterrupt
        return real(adapter, template, *a, **k)

    monkeypatch.setattr(cg_task, "run_gym_task", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _job(tmp_path, adapter, monkeypatch, "resumed")
    assert ran == ["toy_agr", "toy_other"] and (tmp_path / "resumed" / cg_task.PARTS / "manifest.json").is_file()
    ran.clear()
    monkeypatch.setattr(cg_task, "run_gym_task", lambda adapter, template, *a, **k: ran.append(template.name) or real(
        adapter, template, *a, **k))
    resumed = _job(tmp_path, adapter, monkeypatch, "resumed")
    assert ran == ["toy_other"]  # the finished task was read back, not recomputed
    assert set(resumed) == set(whole) and {"metrics.parquet", "causalgym_overall.csv", "causalgym_summary.parquet",
                                           "causalgym_table1.csv", "directions.safetensors"} <= set(whole)
    for name in whole:
        assert resumed[name] == whole[name], name
    # a changed setting recomputes every task; a longer task list reuses the finished ones
    ran.clear()
    _job(tmp_path, adapter, monkeypatch, "resumed", random_draws=3)
    assert ran == ["toy_agr", "toy_other"]
    ran.clear()
    _job(tmp_path, adapter, monkeypatch, "more", tasks=("toy_agr",), random_draws=3)
    _job(tmp_path, adapter, monkeypatch, "more", random_draws=3)
    assert ran == ["toy_agr", "toy_other"]


def test_a_seed_reproduces_the_tables_byte_for_byte_whatever_ran_before(tmp_path, adapter, monkeypatch):
    """Cold vs warm: a cold run trains a model first (drawing from the global generator), a warm one does not; the
    tables must not care. They carry no wall-clock column (timings go to timings.csv / status.json)."""
    torch.manual_seed(0)
    first = _job(tmp_path, adapter, monkeypatch, "warm")
    torch.manual_seed(99)
    torch.randn(10_000)
    np.random.seed(5)
    second = _job(tmp_path, adapter, monkeypatch, "cold")
    assert first == second
    for stem in ("causalgym_overall", "causalgym_summary", "metrics"):
        cols = pd.read_parquet(tmp_path / "cold" / f"{stem}.parquet").columns
        assert not [c for c in cols if c == "seconds" or c.endswith("_s")], stem
    assert "fit_s" in pd.read_csv(tmp_path / "cold" / "timings.csv").columns


# ---------------------------------------------------------------------------------- bad inputs, before any work


def _validate(tmp_path, *overrides: str, specs=None):
    """The pre-flight validation of a CausalGym job reading ``specs`` as its templates file (data dir = tmp_path)."""
    import json

    from cprobe.pipeline import prepare
    from tests.unit.test_task_uses import _compose

    if specs is not None:
        (tmp_path / "templates.json").write_text(json.dumps(specs))
    cfg, task = _compose("+experiment=causalgym", "causalgym.templates=templates.json", *overrides)
    return prepare(cfg, data_root=tmp_path, overrides=task)


@pytest.mark.parametrize(("specs", "overrides", "needle"), [
    ({}, [], "holds no tasks"),
    ([], [], "must map task names to specs"),
    ({"toy": SPEC}, ["causalgym.tasks=[toy,nope]"], r"unknown CausalGym task\(s\) \['nope'\] in templates.json; "
                                                    r"choose from \['toy'\]"),
    ({"toy": SPEC}, ["causalgym.regions=[verb]"], r"'verb' is not a region of toy; it has"),
    ({"toy": SPEC}, ["causalgym.regions=[7]"], "7 is not a region of toy"),
    ({"toy": SPEC, "other": {**SPEC, "templates": [*SPEC["templates"], "the {subject} by the {object}"]}},
     ["causalgym.template_index=1"], "CausalGym task 'toy' has 1 templates; template_index 1 is out of range"),
    ({"toy": SPEC}, ["causalgym.tasks=[]"], "selects no task"),
])
def test_bad_templates_tasks_regions_and_template_index_fail_validation(tmp_path, specs, overrides, needle):
    """Found before any model loads (so a config error leaves no run dir), in one line."""
    from cprobe.errors import ConfigError

    with pytest.raises(ConfigError, match=needle) as err:
        _validate(tmp_path, *overrides, specs=specs)
    assert "\n" not in str(err.value)


def test_template_index_is_checked_on_the_tasks_asked_for(tmp_path):
    """A task you did not ask for never fails your run (its template_index out of range is not your error)."""
    two = {**SPEC, "templates": [*SPEC["templates"], "the {subject} by the {object}"]}
    job = _validate(tmp_path, "causalgym.template_index=1", "causalgym.tasks=[two]", specs={"toy": SPEC, "two": two})
    assert job.task_cfg.template_index == 1
    with pytest.raises(Exception, match="'toy' has 1 templates"):
        _validate(tmp_path, "causalgym.template_index=1")  # every task: toy is one of them


def test_a_config_error_in_causalgym_leaves_no_run_dir(tmp_path):
    """Through the CLI (in process: tests.cli.run): the empty templates file (today: exit 0, status done, a 0-row table) and an ignored
    intervention are one line, exit 1, and nothing written."""
    (tmp_path / "empty.json").write_text("{}")
    for args, needle in ((["causalgym.templates=" + str(tmp_path / "empty.json")], "holds no tasks"),
                         (["intervention=leace"], "does not use `intervention`")):
        out = tmp_path / "out"
        cli.assert_refused(cli.run("run", "+experiment=causalgym", *args, f"paths.output_root={out}", cwd=REPO), needle,
                           out)


def test_collect_aggregates_a_causalgym_sweep(table, tmp_path):
    """`cprobe collect` reads the jobs' metrics.parquet, which hold no timing columns (they are in timings.csv): the
    report must not need them (it raised KeyError: 'fit_s')."""
    from cprobe import results
    from cprobe.job import write_status
    from cprobe.pipeline import collect

    for k, method in enumerate(("mean", "das")):
        job = tmp_path / f"causalgym.methods=[{method}]"
        job.mkdir()
        part = table[table["method"] == method].assign(model="toy", task="causalgym", seed=0)
        results.write_job(part, job)
        write_status(job, state="done")
    collect(tmp_path)
    overall = pd.read_csv(tmp_path / "causalgym_overall.csv")
    assert set(overall["method"]) == {"mean", "das"} and "seconds" not in overall
    assert (tmp_path / "causalgym_summary.csv").is_file() and (tmp_path / "results.parquet").is_file()


# ---------------------------------------------------------------------------------- on a GPU


@pytest.mark.parametrize("parametrization", ["orthogonal", "normalize"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_das_steps_never_synchronise_with_the_host_on_a_gpu(parametrization):
    """CUDA's sync debug mode raises on any device→host wait inside the training steps (forward, loss, backward, Adam,
    schedule); the losses are read once, after."""
    from cprobe.directions.das import DAS

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    W = torch.randn(5, 32, generator=g).to(dev)
    h_base, h_src = torch.randn(40, 32, generator=g).to(dev), torch.randn(3, 40, 32, generator=g).to(dev)

    def forward(rows, hs, a):  # a pure-torch "model": logits read off the edited vector
        base = h_base[rows.start:rows.stop]
        edited = base + ((hs - base) * a[:, None]).sum(-1, keepdim=True) * a[:, None]
        return edited @ W.T

    das = DAS(seed=0, epochs=3, parametrization=parametrization)
    target = torch.randint(0, 5, (3, 40), generator=g).to(dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        found = das.fit_many(forward, h_src, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert found.device.type == "cuda" and das.losses_.shape == (30, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_causalgym_on_a_gpu_matches_the_cpu(adapter, template):
    """DAS trained and every DII scored on the GPU (model, directions, oracle with the job's device) give the CPU's
    numbers within 1e-3 log-odds (float order differs between devices)."""
    import copy

    gpu = ModelAdapter(copy.deepcopy(adapter.model).to("cuda"), adapter.tok, "causal", "toy_neox", batch_size=8)
    kw = dict(methods=["das", "mean", "random", "vanilla"], layers=[1, 2], reliability=True, oracle_probe=ORACLE)
    cpu_rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(**kw)))
    gpu_rows = pd.DataFrame(run_gym_task(gpu, template, *_settings(**kw), device="cuda"))
    np.testing.assert_allclose(gpu_rows["odds"], cpu_rows["odds"], atol=1e-3)
    np.testing.assert_allclose(gpu_rows["completeness"], cpu_rows["completeness"], atol=1e-2)


def test_the_oracle_probe_is_built_with_the_jobs_seed_and_device(adapter, template, monkeypatch):
    from cprobe.probes import PROBES

    seen = []
    real = PROBES.build
    monkeypatch.setattr(PROBES, "build", lambda cfg, **ctx: seen.append(ctx) or real(cfg, **ctx))
    run_gym_task(adapter, template, *_settings(methods=["mean"], layers=[1], regions=[1], control=False,
                                               reliability=True, oracle_probe=ORACLE), seed=3, device="cpu")
    assert seen == [{"seed": 3, "device": "cpu"}]


def test_the_chance_baselines_draws_are_rows_of_one_edited_pass(adapter, template, monkeypatch):
    """The random baseline's draws are rows of the task's one edited pass, not a pass each: one ``edited_pass`` call
    whose rows are (draws + the other method) × the eval pairs, in ⌈rows / batch_size⌉ forwards; and the first draw's
    rows score what the same direction scores as the only draw (draw k's seed does not depend on the number of
    draws)."""
    import cprobe.tasks.causalgym_engine as eng

    real_pass, real_keep, real_run = eng.edited_pass, eng._keep_scores, adapter.run
    calls, runs, kept = [], [], []

    def counted_pass(ad, batch, items, *args, **kwargs):
        before = len(runs)
        real_pass(ad, batch, items, *args, **kwargs)
        calls.append((len(items), len(runs) - before))

    def keep(jobs, scores, *args):
        kept.append([(r.run.label, s) for (p, r, _, _), s in zip(jobs, scores.split([len(p.ok_ev) for p, *_ in jobs]))])
        real_keep(jobs, scores, *args)

    monkeypatch.setattr(eng, "edited_pass", counted_pass)
    monkeypatch.setattr(eng, "_keep_scores", keep)
    monkeypatch.setattr(adapter, "run", lambda *a, **k: (runs.append(1), real_run(*a, **k))[1])
    for draws in (3, 1):
        run_gym_task(adapter, template, *_settings(methods=["random", "mean"], layers=[1], regions=["{subject}"],
                                                  control=False, random_draws=draws))
    (rows3, forwards3), (rows1, _) = calls
    n_eval = rows1 // 2
    assert rows3 == 4 * n_eval and forwards3 == -(-rows3 // adapter.batch_size)
    three, one = ([s for label, s in k if label == "random"] for k in kept)
    assert len(three) == 3 and len(one) == 1
    torch.testing.assert_close(three[0], one[0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(three[0], three[1])
