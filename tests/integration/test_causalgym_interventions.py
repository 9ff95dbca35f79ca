"""The interventions of cprobe.interventions as CausalGym methods, on the tiny random GPT-NeoX of
test_causalgym_task.py: dispatch by capability, eraser scores, rank-1 directions as DIIs, the same edited states as
the reliability study's path, and the oracle's downstream read layers."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest
import torch

from cprobe.data.causalgym import make_pair_splits, pair_items
from cprobe.directions import DIRECTIONS
from cprobe.directions.base import Direction
from cprobe.errors import ConfigError
from cprobe.interventions import INTERVENTIONS
from cprobe.metrics.odds import log_odds_ratio
from cprobe.models.edits import Replace
from cprobe.models.formatters import RegionFormatter
from cprobe.tasks import causalgym as cg_task
from cprobe.tasks import causalgym_engine as engine
from cprobe.tasks import causalgym_settings as settings
from cprobe.tasks.causalgym_engine import run_gym_task, site_of
from tests.integration.test_causalgym_task import ORACLE, Side, _settings, adapter, template  # noqa: F401

INTERVENTION_NAMES = ["leace", "mean_diff", "inlp", "rlace", "alterrep", "fgsm", "pgd", "autoattack"]
FAST = {"rlace": {"rank": 1, "max_steps": 50, "eval_every": 25}, "autoattack": {"eps": 0.5, "n_queries": 20, "n_iter": 5}}


@pytest.fixture(scope="module")
def table(adapter, template) -> pd.DataFrame:  # noqa: F811
    s = _settings(methods=["mean", "random", *INTERVENTION_NAMES], layers=[1, 2], reliability=True,
                  oracle_probe=ORACLE, read_layers=True, interventions={**settings.DEFAULT_INTERVENTIONS, **FAST})
    return pd.DataFrame(run_gym_task(adapter, template, *s))


def test_every_intervention_runs_at_every_site_with_its_declared_kind(table):
    sites = table.loc[table["method"] == "mean", ["layer", "region", "condition"]].drop_duplicates()
    for name in INTERVENTION_NAMES:
        rows = table[table["method"] == name]
        assert len(rows) == len(sites), name  # every (layer, region) and both conditions, like a direction
        assert set(rows["edit"]) == {INTERVENTIONS.get(name).kind}, name
        assert rows["odds"].notna().all() and rows["iia"].between(0, 1).all(), name
        null = INTERVENTIONS.get(name).kind == "nullifying"
        assert rows["erasure"].notna().all() == null and rows["erasure"].isna().all() != null, name
    # the rank-1 ones also run their direction as a DII; the nonlinear attacks do not
    dirs = {m[:-4] for m in table["method"] if m.endswith("_dir")}
    assert dirs == {n for n in INTERVENTION_NAMES if INTERVENTIONS.get(n).exposes_direction}
    assert dirs == {"leace", "mean_diff", "inlp", "rlace", "alterrep"}
    assert set(table.loc[table["method"].str.endswith("_dir"), "edit"]) == {"dii"}


def test_a_rank1_erasers_direction_as_a_dii_scores_as_the_same_vector_given_as_a_direction_method(
        adapter, template, monkeypatch):  # noqa: F811
    """LEACE's direction (``leace_dir`` rows) and a direction method returning the very same vector (fitted the same
    way on the same activations) give the same odds, IIA and completeness at every site and condition."""

    class LeaceDirection(Direction):
        supervised = True

        def fit(self, X, y=None):
            self.a = INTERVENTIONS.build({"name": "leace"}).fit(X.float(), y).edit_direction()
            return self

    monkeypatch.setitem(DIRECTIONS._items, "leace_vector", LeaceDirection)
    s = _settings(methods=["leace", "leace_vector"], layers=[1, 2], reliability=True, oracle_probe=ORACLE)
    rows = pd.DataFrame(run_gym_task(adapter, template, *s))
    keys = ["condition", "layer", "region"]
    a = rows[rows["method"] == "leace_dir"].set_index(keys).sort_index()
    b = rows[rows["method"] == "leace_vector"].set_index(keys).sort_index()
    assert len(a) == len(b) > 0 and (a.index == b.index).all()
    for col in ("odds", "iia", "completeness"):
        assert a[col].to_numpy() == pytest.approx(b[col].to_numpy(), abs=1e-5), col
    assert (a["odds"].abs() > 1e-4).any()  # not a vacuous equality
    # and the eraser's own rows are not the DII's: erasing is another edit
    assert not rows.loc[rows["method"] == "leace", "odds"].to_numpy() == pytest.approx(a["odds"].to_numpy())


@pytest.mark.parametrize("name", ["leace", "mean_diff", "pgd"])
def test_an_intervention_edits_as_through_the_reliability_studys_path(adapter, template, monkeypatch, name):  # noqa: F811
    """The same numbers through the bridge as through the home study: fitted on the same states and labels and
    built by the same factory, the reliability study's path (``INTERVENTIONS.build(cfg, seed=, device=)``, ``fit``
    or ``use_probe``, ``transform`` with z′ = the other class (``counterfactual_targets``), the edited states written
    back with ``Replace``) gives the edited states CausalGym writes at the site, and the same log odds-ratio."""
    from cprobe.metrics.reliability import counterfactual_targets

    captured = []
    real = engine._intervene

    def spy(run, *a, **k):
        out = real(run, *a, **k)
        bound = inspect.signature(real).bind(run, *a, **k).arguments
        captured.append((bound["layer"], bound["region"], out[0]))  # the site, the run with its edited states
        return out

    monkeypatch.setattr(engine, "_intervene", spy)
    s = _settings(methods=[name], layers=[1], control=False, reliability=False, oracle_probe=ORACLE)
    rows = pd.DataFrame(run_gym_task(adapter, template, *s))
    layer, region = 1, template.region_names.index("{subject}")
    edited = next(r.edited for lr, rg, r in captured if (lr, rg) == (layer, region))

    # the reliability study's path on the same data
    splits = make_pair_splits(template, 8, 4)
    base_tr = Side(adapter, splits.train, layer, region)
    base_ev = Side(adapter, splits.eval, layer, region)
    z_tr = torch.tensor([p.base_class for p in splits.train])
    z_ev = torch.tensor([p.base_class for p in splits.eval])
    method = INTERVENTIONS.build({"name": name, **s[0].intervention_params(name)}, seed=0, device=None)
    if method.needs_probe:  # the study's interventional probe: its own object, fitted on the intervention split
        method.use_probe(engine.oracle_probe(ORACLE, seed=1).fit(base_tr.acts.float(), z_tr))
    else:
        method.fit(base_tr.acts, z_tr)
    rows_, z_goal = counterfactual_targets(z_ev, 2)
    assert (z_goal == torch.tensor([p.source_class for p in splits.eval])).all()  # z′ = the source's class
    X_new = method.transform(base_ev.acts, z_goal) if method.kind == "counterfactual" else method.transform(
        base_ev.acts)
    assert edited == pytest.approx(X_new, abs=1e-5)

    written = adapter.map(pair_items(splits.eval)[0], RegionFormatter(),
                          edits={site_of(layer, region, "block"): Replace(X_new)}, readout=base_ev.readout)
    clean = base_ev.scores
    odds = log_odds_ratio(clean[:, 0], clean[:, 1], written.scores[:, 0], written.scores[:, 1]).mean().item()
    got = rows.query("method == @name and layer == @layer and region == '{subject}'")["odds"].item()
    assert got == pytest.approx(odds, abs=1e-4)


def test_the_eraser_score_is_the_mean_reduction_of_the_absolute_log_odds(adapter, template, table):  # noqa: F811
    """``erasure`` of LEACE at a site = mean(|m| − |m*|) recomputed from a write-back of its edited states."""
    from cprobe.metrics.odds import erasure

    layer, region = 2, template.region_names.index("{subject}")
    splits = make_pair_splits(template, 8, 4)
    base_tr, base_ev = Side(adapter, splits.train, layer, region), Side(adapter, splits.eval, layer, region)
    eraser = INTERVENTIONS.build({"name": "leace"}).fit(base_tr.acts, torch.tensor([p.base_class
                                                                                   for p in splits.train]))
    out = adapter.map(pair_items(splits.eval)[0], RegionFormatter(),
                      edits={site_of(layer, region, "block"): Replace(eraser.transform(base_ev.acts))},
                      readout=base_ev.readout)
    expected = erasure(base_ev.scores[:, 0], base_ev.scores[:, 1], out.scores[:, 0], out.scores[:, 1]).mean().item()
    got = table.query("method == 'leace' and layer == @layer and region == '{subject}' and condition == 'task'")
    assert got["erasure"].item() == pytest.approx(expected, abs=1e-4)


def test_read_layers_reads_the_edited_pass_downstream(table):
    """``completeness_l<l'>``: NaN below the edited layer; at l' = l the oracle reads the edited state itself, so it
    equals ``completeness`` (the oracle on the edited states computed apart from the pass)."""
    assert {"completeness_l1", "completeness_l2"} <= set(table.columns)
    assert table.loc[table["layer"] == 2, "completeness_l1"].isna().all()
    assert table.loc[table["layer"] == 1, "completeness_l2"].notna().all()
    for lr in (1, 2):
        at = table[(table["layer"] == lr) & (table["method"] != "random")]
        assert at[f"completeness_l{lr}"].to_numpy() == pytest.approx(at["completeness"].to_numpy(), abs=1e-4)
    reads = cg_task.read_layers_table(table.assign(model="toy"))
    assert set(zip(reads["layer"], reads["read_layer"])) == {(1, 1), (1, 2), (2, 2)}


def test_random_stays_near_zero_beside_the_interventions(table):
    assert table.loc[table["method"] == "random", "odds"].abs().max() < 0.2


def test_overall_and_summary_report_the_erasure(table):
    overall = cg_task.overall_table(table.assign(model="toy"))
    leace = overall[overall["method"] == "leace"].iloc[0]
    assert leace["edit"] == "nullifying" and pd.notna(leace["overall_erasure"])
    assert pd.notna(leace["erasure_selectivity"]) and pd.notna(leace["overall_erased_fraction"])
    assert overall.loc[overall["method"] == "mean_diff", "overall_erasure"].isna().all()
    summary = cg_task.summary_table(overall)
    assert set(INTERVENTION_NAMES) <= set(summary["method"])


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(methods=["mean", "x"]), r"unknown method 'x' in causalgym.methods; choose from \[.*'autoattack'.*'das'"),
    (dict(methods=["pgd"], interventions={"pgd": {"eps": -1}}), r"bad causalgym.interventions.pgd: .*eps"),
    (dict(methods=["inlp"], interventions={"inlp": {"rnk": 1}}), r"unknown key\(s\) \['rnk'\]"),
    (dict(methods=["mean"], interventions={"nope": {}}), r"unknown intervention 'nope' in causalgym.interventions"),
    (dict(methods=["leace"], read_layers=True, reliability=False), r"read_layers needs causalgym.reliability"),
])
def test_bad_methods_and_intervention_settings_are_one_line_errors(kw, needle):
    with pytest.raises((ValueError, ConfigError), match=needle) as err:
        cg_task.Config(**{"probe_lam": 1.0, **kw}).resolve({"name": "toy"})
    assert "\n" not in str(err.value)


def test_a_setting_given_in_the_config_replaces_only_that_key():
    config = cg_task.Config(methods=["pgd"], interventions={"pgd": {"eps": 0.25}})
    assert config.intervention_params("pgd") == {**settings.DEFAULT_INTERVENTIONS["pgd"], "eps": 0.25}


def test_a_bad_interventional_probe_fails_validation_before_any_model_loads(tmp_path):
    from tests.integration.test_causalgym_task import SPEC, _validate

    with pytest.raises(ConfigError, match=r"causalgym.interventional_probe: .*nope") as err:
        _validate(tmp_path, "causalgym.methods=[pgd]", "causalgym.interventional_probe={name: nope}",
                  specs={"toy": SPEC})
    assert "\n" not in str(err.value)
    _validate(tmp_path, "causalgym.methods=[pgd,leace]", specs={"toy": SPEC})


def test_records_name_each_interventions_family_and_the_read_layer(table, tmp_path, monkeypatch):
    """In the shared result schema: an intervention's rows carry its kind as family, the erasure its own metric, and
    each downstream read a record with read_layer = l' (layer = the edited l); the table comes back from them."""
    from cprobe.records import from_records, to_records

    t = table.assign(model="toy")
    recs = to_records(t, cg_task.RECORDS, "causalgym", 0, "cfg")
    fam = recs.drop_duplicates("method").set_index("method")["family"]
    assert fam["leace"] == "nullifying" and fam["pgd"] == "counterfactual" and fam["mean"] == "direction"
    assert fam["leace_dir"] == "direction"
    assert recs.loc[(recs["method"] == "leace") & (recs["metric"] == "erasure"), "value"].notna().all()
    reads = recs[(recs["metric"] == "oracle_completeness") & recs["read_layer"].notna()
                 & (recs["read_layer"] != recs["layer"])]
    assert set(zip(reads["layer"], reads["read_layer"])) == {(1, 2)}
    back = from_records(recs, cg_task.RECORDS)
    pd.testing.assert_frame_equal(back[t.columns].reset_index(drop=True), t.reset_index(drop=True),
                                  check_dtype=False)
    for figure in ("_heatmaps", "_odds_by_layer"):  # only the read-layers figure is new here
        monkeypatch.setattr(cg_task, figure, lambda *a, **k: None)
    cg_task.report(t, tmp_path)  # the read-layers table and its figure (captioned: the suite is strict)
    assert (tmp_path / "causalgym_read_layers.csv").is_file() and (tmp_path / "read_layers_toy.png").is_file()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_interventions_on_a_gpu_match_the_cpu(adapter, template):  # noqa: F811
    """Fitted, applied and scored on the GPU (model, interventions, oracles and reads on the job's device): the CPU's
    numbers within float-order differences (the attacks are left out: their probe is trained on each device)."""
    import copy

    from cprobe.models.adapter import ModelAdapter

    gpu = ModelAdapter(copy.deepcopy(adapter.model).to("cuda"), adapter.tok, "causal", "toy_neox", batch_size=8)
    kw = dict(methods=["leace", "mean_diff", "inlp", "alterrep"], layers=[1, 2], reliability=True,
              oracle_probe=ORACLE, read_layers=True)
    cpu_rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(**kw)))
    gpu_rows = pd.DataFrame(run_gym_task(gpu, template, *_settings(**kw), device="cuda"))
    assert gpu_rows["odds"].to_numpy() == pytest.approx(cpu_rows["odds"].to_numpy(), abs=1e-3)
    assert gpu_rows["erasure"].to_numpy() == pytest.approx(cpu_rows["erasure"].to_numpy(), abs=1e-3, nan_ok=True)
    assert gpu_rows["completeness_l2"].to_numpy() == pytest.approx(cpu_rows["completeness_l2"].to_numpy(), abs=1e-2,
                                                                   nan_ok=True)


def test_a_site_whose_states_do_not_vary_leaves_the_state_and_is_flagged(adapter, template):  # noqa: F811
    """Embeddings of the shared word after the subject are one vector: nothing to fit. The eraser leaves the state
    (odds 0, flagged ``degenerate``); its ``_dir`` row falls back to a chance direction like a direction
    method's; the other sites are fitted."""
    s = _settings(methods=["leace"], layers=[0], control=False)
    rows = pd.DataFrame(run_gym_task(adapter, template, *s)).set_index(["method", "region"])
    assert rows.loc[("leace", "_near_the"), "degenerate"]
    assert rows.loc[("leace", "_near_the"), "odds"] == pytest.approx(0.0, abs=1e-5)
    assert rows.loc[("leace", "_near_the"), "erasure"] == pytest.approx(0.0, abs=1e-6)
    assert rows.loc[("leace_dir", "_near_the"), "degenerate"]
    assert not rows.loc[("leace", "{subject}"), "degenerate"]


def test_an_intervention_that_trains_through_the_model_is_refused(monkeypatch):
    """Dispatch on the capability: CausalGym trains a causal method itself (its direction), never through an
    intervention's ``fit``."""

    class Through(INTERVENTIONS.get("leace")):
        needs_model = True

    monkeypatch.setitem(INTERVENTIONS._items, "through_model", Through)
    with pytest.raises(ValueError, match=r"intervention 'through_model' trains through the model \(needs_model\)"):
        cg_task.Config(methods=["through_model"])
