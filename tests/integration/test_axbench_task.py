"""The AxBench detection study end to end at smoke size (issue 46 item 4): ``cprobe run +experiment=axbench_detect``
on the tiny causal LM, in process (tests.cli.run), and its bad input as one line before any model pass."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests import cli

RUN = ["run", "+experiment=axbench_detect", "+debug=smoke", "layers=[0,2,4]"]
SWEEP = "axbench.methods=[sae_decoder,sae_axbench,sae_diffmean,das,leace,probe,mean]"  # every family in one line


def _run(root: Path, *extra: str) -> Path:
    r = cli.run(*RUN, *extra, f"paths.output_root={root}", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    (status,) = root.rglob("status.json")
    return status.parent


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("axbench"))


@pytest.fixture(scope="module")
def sweep_job(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("axbench_sweep"), SWEEP)


@pytest.mark.slow
@pytest.mark.numeric  # AUROC bounds through the tiny model trained on this CPU's kernels
def test_every_method_layer_and_pooling_gets_an_auroc(job):
    t = pd.read_parquet(job / "metrics.parquet")
    assert set(t["method"]) == {"mean", "probe", "pca", "lda", "kmeans", "random"}
    assert set(t["layer"]) == {0, 2, 4} and set(t["pooling"]) == {"max", "mean", "last"} and len(t) == 6 * 3 * 3
    assert set(t["concept"]) == {"z_c=pl"} and (t["n_test"] == 120).all()  # +debug=smoke: axbench.max_test
    assert t["auroc"].between(0, 1).all()
    at = t.set_index(["layer", "method", "pooling"])["auroc"]
    # subject number is read at the last prefix token of the tiny causal LM (the agreement position): DiffMean and
    # the probe find it there at the last layer (measured 1.000; the bound leaves room for other CPUs' training)
    assert at[(4, "mean", "last")] > 0.95 and at[(4, "probe", "last")] > 0.95
    assert at[(4, "random", "max")] < at[(4, "mean", "max")]
    recs = pd.read_parquet(job / "records.parquet")
    assert set(recs["metric"]) == {"detection_auroc"} and len(recs) == len(t)
    assert (job / "auroc_by_layer.png").is_file()


@pytest.mark.slow
@pytest.mark.numeric  # AUROC bounds through the tiny model and DAS trained on this CPU's kernels
def test_saes_das_leace_probe_and_mean_are_scored_in_one_run(sweep_job):
    """DAS, trained through the model on the training texts' minimal pairs at each layer, and LEACE, an intervention
    whose edit direction is scored, get rows beside the directions; LEACE's records are an intervention's. The three
    SAE methods share one SAE per layer (cached by content) and carry its quality on the held-out tokens."""
    t = pd.read_parquet(sweep_job / "metrics.parquet")
    saes = {"sae_decoder", "sae_axbench", "sae_diffmean"}
    assert set(t["method"]) == saes | {"das", "leace", "probe", "mean"} and len(t) == 7 * 3 * 3
    assert (t["note"] == "").all() and t["auroc"].between(0, 1).all()
    assert set(t.loc[t["method"] == "leace", "family"]) == {"intervention"}
    assert set(t.loc[t["method"] != "leace", "family"]) == {"direction"}
    at = t.set_index(["layer", "method", "pooling"])["auroc"]
    # DAS is trained to flip the verb from the last prefix token; the tiny model reads subject number there at its
    # last layer, so the learnt direction separates the classes on that token (measured 1.000 at smoke size, and
    # 0.982 max-pooled): the bounds leave room for other CPUs' training and DAS's few steps (70 per layer)
    assert at[(4, "das", "last")] > 0.9 and at[(4, "das", "max")] > 0.8
    # LEACE's edit direction for a binary concept is the class-mean difference: DiffMean's AUROC, up to a few of the
    # 64 × 56 held-out pairs (2.8e-4 each) ordered otherwise by float32 rounding
    assert (at.xs("leace", level="method") - at.xs("mean", level="method")).abs().max() < 1e-3
    recs = pd.read_parquet(sweep_job / "records.parquet")
    assert set(zip(recs["method"], recs["family"])) == {(m, "direction") for m in saes | {"das", "probe", "mean"}} \
        | {("leace", "intervention")}
    quality = recs[recs["metric"].isin(["sae_fvu", "sae_l0", "sae_dead_fraction"])]
    assert set(quality["method"]) == saes and quality["value"].notna().all()  # on the SAE methods' records alone
    q = t[t["method"].isin(saes)].groupby("layer")["sae_fvu"]
    # one SAE per layer, measured on the same held-out tokens: the three methods' figures agree to float32 rounding (the
    # portable kernels order a sum differently for an SAE trained in this process than for its cached copy: 1e-11
    # measured), while another SAE's FVU differs in the third digit
    assert ((q.max() - q.min()) < 1e-7).all()
    assert t.loc[~t["method"].isin(saes), "sae_fvu"].isna().all()


@pytest.mark.parametrize("override, message", [
    ("axbench.test_share=0.001", "concept 'z_c=pl' has one class in the held-out (test_share=0.001) split"),
    ("axbench.concepts=[z_c=dual]", "concept 'z_c=dual' has one class in the training split"),
    ("axbench.concepts=[zz=pl]", "axbench.concepts: unknown property ['zz'] for dataset 'synthetic_sva'"),
    ("axbench.concepts=[z_c]", "'z_c' is not name=value or name!=value"),
    ("axbench.methods=[das] axbench.concepts=[z_e=pl]", "direction method 'das' is trained through the model on "
     "minimal pairs that flip 'z_e': dataset 'synthetic_sva' can emit minimal pairs flipping ['z_c'], not 'z_e'"),
    ("axbench.methods=[das] model=minilm_l6", "model 'minilm_l6' is 'encoder', with no LM head"),
    ("axbench.methods=[pgd]", "intervention 'pgd' exposes no direction (exposes_direction is false)"),
    ("axbench.methods=[vanilla]", "direction method 'vanilla' learns no direction (whole_vector)"),
    ("axbench.methods=[nope]", "unknown method 'nope' in axbench.methods; choose from"),
    ("axbench.methods=[leace] +axbench.params.leace.svd_tol=0", "svd_tol must be > 0"),
    ("axbench.poolings=[min]", "unknown axbench.poolings ['min']; choose from ['max', 'mean', 'last']"),
    ("+axbench.params.probe.lam=-1", "direction method 'probe': probe lam must be > 0, got -1"),
    ("+axbench.params.das.lr=0.1", "axbench.params sets ['das'], which axbench.methods does not list"),
    ("axbench.methods=[sae]", "unknown method 'sae' in axbench.methods; did you mean 'sae_axbench', 'sae_decoder', "
     "'sae_latents', 'sae_diffmean'?"),
    ("axbench.methods=[sae_axbench] +axbench.params.sae_axbench.select=max",
     "unknown SAE select 'max'; choose from ['auroc', 'mean_diff']"),
])
def test_bad_input_is_one_line_and_leaves_nothing(override, message, tmp_path):
    r = cli.run(*RUN, *override.split(), f"paths.output_root={tmp_path}", cwd=tmp_path)
    cli.assert_refused(r, message, tmp_path)


def test_das_on_texts_without_minimal_pairs_is_one_line(tmp_path):
    """CEBaB's reviews have no minimal pairs: DAS is refused before its data or any model loads."""
    r = cli.run("run", "+experiment=axbench_detect_cebab", "axbench.methods=[mean,das]",
                f"paths.output_root={tmp_path}", cwd=tmp_path)
    cli.assert_refused(r, "direction method 'das' is trained through the model on minimal pairs that flip 'food': "
                          "dataset 'cebab' (type 'cebab') cannot emit minimal pairs", tmp_path)


def test_a_loaded_sae_for_another_layer_is_refused_before_the_model_loads(tmp_path):
    """AxBench's SAE loaded from a SAELens folder recorded at another hook than the layer it is set for: one line."""
    from tests.unit.test_axbench_sae import identity_sae
    from tests.unit.test_sae import write_folder

    write_folder(tmp_path / "sae", identity_sae(), hook_name="blocks.1.hook_resid_post")
    out = tmp_path / "out"
    r = cli.run(*RUN, "axbench.methods=[sae_axbench]", f"+axbench.params.sae_axbench.path={tmp_path / 'sae'}",
                "+axbench.params.sae_axbench.layer=4", f"paths.output_root={out}", cwd=tmp_path)
    cli.assert_refused(r, "was trained at hook 'blocks.1.hook_resid_post' (cfg.json hook_name), not at layer 4", out)


def test_a_loaded_sae_of_another_width_stops_the_run_before_any_state_is_read(tmp_path):
    """The width needs the model: checked once it loads, before the token states are read; one line, exit 1, and no
    result is written (the run's status.json records the error)."""
    from tests.unit.test_axbench_sae import identity_sae
    from tests.unit.test_sae import write_folder

    write_folder(tmp_path / "sae", identity_sae())
    out = tmp_path / "out"
    r = cli.run(*RUN, "axbench.methods=[sae_axbench]", f"+axbench.params.sae_axbench.path={tmp_path / 'sae'}",
                f"paths.output_root={out}", cwd=tmp_path)
    lines = [line for line in r.stderr.splitlines() if line.strip().startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "reads states of width 4, but the states here have width" \
        in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr and not list(out.rglob("metrics.*")) and not list(out.rglob("records.*"))
