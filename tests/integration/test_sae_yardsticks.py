"""SAE methods on every yardstick with no study changed: the ``sae_decoder`` and ``sae_axbench`` directions and the
``sae_latents`` intervention in CausalGym (on the tiny random GPT-NeoX of test_causalgym_task.py), two SAE
interventions in the reliability study (the tiny BERT), each row with its SAE's quality on held-out states, and
``via_sae_latents`` / ``via_sae_decoder_direction`` in CEBaB and LIBERTy (their tests' tiny worlds); and the LM loss an
SAE adds spliced into a model (cprobe.sae.splice)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cprobe.data.items import TextItem
from cprobe.models.formatters import RegionFormatter
from cprobe.models.sites import Site
from cprobe.sae.dictionary import SAE
from cprobe.sae.splice import loss_added
from cprobe.tasks.causalgym_engine import run_gym_task
from tests import cli
from tests.cli import REPO
from tests.integration.test_causalgym_task import _settings, adapter, template  # noqa: F401
from tests.integration.test_cebab_task import _tiny as cebab_tiny
from tests.integration.test_cebab_task import world as cebab_world  # noqa: F401
from tests.integration.test_liberty_task import _tiny as liberty_tiny
from tests.integration.test_liberty_task import world as liberty_world  # noqa: F401

SMALL = {"d_sae": 32, "k": 4, "epochs": 10, "latents": 2}  # what a unit budget trains on a few hundred states


def test_causalgym_scores_the_sae_as_a_direction_and_as_an_intervention(adapter, template):  # noqa: F811
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(
        methods=["mean", "sae_decoder", "sae_axbench", "sae_latents"], layers=[1, 2],
        interventions={"sae_latents": SMALL})))
    by = {m: rows[rows["method"] == m] for m in ("mean", "sae_decoder", "sae_axbench", "sae_latents")}
    assert len(by["sae_decoder"]) == len(by["mean"]) == len(by["sae_latents"]) == len(by["sae_axbench"]) > 0
    assert by["sae_decoder"]["odds"].notna().all() and by["sae_latents"]["odds"].notna().all()
    assert not by["sae_latents"]["odds"].equals(by["sae_decoder"]["odds"])  # two different edits
    # every SAE method's row carries its SAE's quality on the eval pairs' states at the site (held out), no other row
    sae_rows = rows[rows["method"] != "mean"]
    assert sae_rows[["sae_fvu", "sae_l0", "sae_dead_fraction"]].notna().all().all()
    assert (sae_rows["sae_n"] == sae_rows["n_eval"]).all() and sae_rows["sae_dead_fraction"].between(0, 1).all()
    assert by["mean"][["sae_fvu", "sae_l0"]].isna().all().all()


@pytest.mark.slow
def test_the_reliability_study_runs_both_sae_interventions(tmp_path):
    r = cli.run("run", "-m", "+experiment=sva_tiny_reliability", "intervention=sae_latents,sae_decoder_direction",
                "++intervention.latents=2", "--smoke", f"hydra.sweep.dir={tmp_path}", "progress=false", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results.csv")
    assert sorted(t["method"]) == ["sae_decoder_direction", "sae_latents"]
    for col in ("completeness", "selectivity", "reliability"):
        assert t[col].between(0, 1).all(), t[["method", col]]
    # each row reports its SAE's quality on the test split (held out); both methods fit the same SAE (cached by
    # content) and measure it on the same states
    q = t[["sae_fvu", "sae_l0", "sae_dead_fraction"]]
    assert q.notna().all().all() and (q["sae_l0"] > 0).all() and (q["sae_l0"] <= 16).all()  # TopK k=16
    assert q["sae_fvu"].iloc[0] == pytest.approx(q["sae_fvu"].iloc[1], rel=1e-6)
    assert (t["sae_n"] == t["n_test"]).all() and "fit_sae_fvu" not in t


def _explainer_settings(study: str) -> list[str]:
    return [f"++{study}.explainer.{name}.{k}={v}" for name in ("via_sae_latents", "via_sae_decoder_direction")
            for k, v in SMALL.items()]


@pytest.mark.slow
def test_cebab_estimates_effects_through_the_sae_methods(cebab_world, tmp_path):  # noqa: F811
    r = cli.run("run", *cebab_tiny(cebab_world), "cebab.task=2way", "cebab.finetune.epochs=2",
                "cebab.explainers=[random,via_sae_latents,via_sae_decoder_direction]", *_explainer_settings("cebab"),
                f"paths.output_root={tmp_path}", "progress=false", cwd=tmp_path,
                env={"CPROBE_DATA_DIR": str(cebab_world[0])})
    assert r.returncode == 0, r.stderr[-3000:]
    (f,) = list(tmp_path.rglob("metrics.parquet"))
    t = pd.read_parquet(f)
    err = t[(t["kind"] == "icace_error") & (t["aspect"] == "all")]
    assert {"via_sae_latents", "via_sae_decoder_direction"} <= set(err["explainer"])
    assert err["value"].notna().all()


@pytest.mark.slow
def test_liberty_estimates_effects_through_the_sae_methods(liberty_world, tmp_path):  # noqa: F811
    r = cli.run("run", *liberty_tiny(liberty_world), "liberty.finetune.epochs=2",
                "liberty.explainers=[random,via_sae_latents,via_sae_decoder_direction]",
                *_explainer_settings("liberty"),
                f"paths.output_root={tmp_path}", "progress=false", cwd=tmp_path,
                env={"CPROBE_DATA_DIR": str(liberty_world[2])})
    assert r.returncode == 0, r.stderr[-3000:]
    (f,) = list(tmp_path.rglob("metrics.parquet"))
    ed = pd.read_parquet(f).query("kind == 'ed'")
    assert {"via_sae_latents", "via_sae_decoder_direction"} <= set(ed["explainer"])
    assert ed["value"].notna().all()


# ------------------------------------------------------------------------------------ spliced into a model
def test_the_loss_added_is_zero_for_an_exact_sae_and_positive_for_a_lossy_one(adapter):  # noqa: F811
    model = adapter
    items = [TextItem(f"t{i}", t, regions=(t,)) for i, t in enumerate(["the author is", "the guards near the guard"])]
    d = model.model.config.hidden_size
    eye = torch.eye(d)
    # f = [relu(x), relu(−x)] and x̂ = relu(x) − relu(−x) = x exactly
    exact = SAE(W_enc=torch.cat([eye, -eye], 1), b_enc=torch.zeros(2 * d), W_dec=torch.cat([eye, -eye], 0),
                b_dec=torch.zeros(d), activation="relu")
    site = Site(1, "last")
    # the spliced pass sees the same state values: equal up to float rounding in the KL's sum
    assert loss_added(model, items, RegionFormatter(), site, exact) == pytest.approx(0.0, abs=1e-9)
    lossy = SAE(W_enc=exact.W_enc, b_enc=exact.b_enc, W_dec=torch.zeros(2 * d, d), b_dec=torch.zeros(d),
                activation="relu")  # reconstructs every state as 0
    assert loss_added(model, items, RegionFormatter(), site, lossy) > 1e-4


def test_an_sae_of_another_model_is_refused_before_the_study_runs(tmp_path):
    """The job's model name reaches the setting `model` (conf/intervention/sae_latents.yaml): a released SAE recorded
    for another model is one line, exit 1, nothing under the output root."""
    from tests.unit.test_sae import hand_sae, write_folder

    write_folder(tmp_path / "sae", hand_sae(), model_name="google/gemma-2-2b", hook_name="blocks.3.hook_resid_post")
    out = tmp_path / "out"
    r = cli.run("run", "+experiment=sva_tiny_reliability", "intervention=sae_latents",
                f"intervention.path={tmp_path / 'sae'}", f"paths.output_root={out}", cwd=REPO)
    cli.assert_refused(r, "was trained on model 'google/gemma-2-2b' (cfg.json model_name), not 'tiny_bert_sva'", out)


SAELENS = REPO / "tests" / "data" / "saelens"  # folders SAELens itself wrote (README there)


@pytest.mark.parametrize(("args", "message"), [
    # the reliability study at layer 4 with SAELens's SAE of blocks.2.hook_resid_post (layer 3)
    (["+experiment=sva_tiny_reliability", "intervention=sae_latents", f"intervention.path={SAELENS / 'standard'}",
      "layers=4"], "was trained at hook 'blocks.2.hook_resid_post' (cfg.json hook_name), not at layer 4"),
    # an SAE of another hook than the residual stream
    (["+experiment=sva_tiny_reliability", "intervention=sae_latents", f"intervention.path={SAELENS / 'mlp_out'}",
      "layers=3"], "was trained at hook 'blocks.2.hook_mlp_out' (cfg.json hook_name), not at layer 3"),
    # one folder per layer (a pattern: quoted for Hydra), with none for layer 2
    (["+experiment=sva_tiny_reliability", "intervention=sae_decoder_direction", "layers=2",
      f"intervention.path='{SAELENS / 'layers' / 'layer_{layer}'}'"], "layers/layer_2 lacks cfg.json"),
    # a multi-layer AxBench run: the study's model is checked at every layer, not only the width
    (["+experiment=axbench_detect", "+debug=smoke", "layers=[0,2,4]", "axbench.methods=[sae_decoder]",
      f"+axbench.params.sae_decoder.path={SAELENS / 'standard'}"],
     "was trained on model 'tiny_bert_sva' (cfg.json model_name), not 'tiny_neox_sva'"),
])
def test_an_saelens_folder_for_another_site_is_refused_before_the_study_runs(tmp_path, args, message):
    out = tmp_path / "out"
    r = cli.run("run", *args, f"paths.output_root={out}", cwd=REPO)
    cli.assert_refused(r, message, out)


def test_causalgym_loads_one_saelens_folder_per_layer_and_refuses_one_at_every_layer(adapter, template,  # noqa: F811
                                                                                     tmp_path):
    """The issue's case: a multi-layer CausalGym run. Each layer reads its own folder (``{layer}``) and runs; one
    folder recorded at layer 1 is refused at layer 2 (before, only its width was checked there)."""
    from cprobe.errors import ConfigError
    from cprobe.sae import saelens

    d, g = adapter.hidden_size, torch.Generator().manual_seed(0)
    for layer in (1, 2):
        (tmp_path / f"layer_{layer}").mkdir()
        saelens.save(SAE(W_enc=torch.randn(d, 16, generator=g), b_enc=torch.zeros(16), W_dec=torch.randn(16, d,
                         generator=g), b_dec=torch.zeros(d), activation="topk", k=4, model_name="toy",
                         hook_name=saelens.layer_hook(layer)), tmp_path / f"layer_{layer}")
    pattern = {"sae_latents": {"path": str(tmp_path / "layer_{layer}"), "latents": 2}}
    rows = pd.DataFrame(run_gym_task(adapter, template, *_settings(methods=["sae_latents"], layers=[1, 2],
                                                                   interventions=pattern)))
    assert sorted(set(rows["layer"])) == [1, 2] and rows["odds"].notna().all()
    assert not rows["degenerate"].any()  # every site's SAE was loaded and fitted (a refusal there is degenerate)
    one = {"sae_latents": {"path": str(tmp_path / "layer_1")}}
    with pytest.raises(ConfigError, match=r"hook 'blocks.0.hook_resid_post' \(cfg.json hook_name\), not at layer 2"):
        run_gym_task(adapter, template, *_settings(methods=["sae_latents"], layers=[1, 2], interventions=one))


@pytest.mark.slow
def test_ravel_scores_every_sae_method_with_its_quality_on_held_out_states(tmp_path):
    """RAVEL's own SAE method (``sae_features``: its chosen latents interchanged) beside cprobe's and AxBench's SAE
    directions (fitted per value pair, ``sae_axbench`` with each state its own text), each row with its SAE's quality
    on the scored entities' states; the site's layer reaches every SAE method."""
    r = cli.run("run", "+experiment=ravel_tiny", "layers=[0]", "ravel.mdas_weight=null",
                "ravel.methods=[sae_decoder,sae_axbench,sae_diffmean,sae_features,vanilla]",
                "ravel.features.sae_features.d_sae=64", "ravel.features.sae_features.epochs=5",
                f"paths.output_root={tmp_path}", f"hydra.run.dir={tmp_path / 'job'}", "progress=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_parquet(tmp_path / "job" / "metrics.parquet")
    sc = t[t["kind"] == "score"]
    assert set(sc["method"]) == {"sae_decoder", "sae_axbench", "sae_diffmean", "sae_features", "vanilla"}
    assert sc.loc[sc["method"] == "vanilla", "value"].notna().any()
    saes = sc[sc["method"].str.startswith("sae_")]
    assert saes[["sae_fvu", "sae_l0"]].notna().all().all() and sc.loc[sc["method"] == "vanilla", "sae_fvu"].isna().all()
    feats = sc[sc["method"] == "sae_features"]
    assert (feats["n_features"] >= 0).all() and feats["sae_l0"].gt(0).all()
