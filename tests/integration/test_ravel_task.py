"""The RAVEL study (cprobe.tasks.ravel) through the CLI: the smoke experiment on the tiny fact-world model, checked
where the interchange's answer is known without a fit, its records, and the one-line refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cprobe import records as R
from cprobe.metrics.registry import unregistered
from tests import cli
from tests.unit.test_ravel_data import CITIES, PROMPTS, write_ravel

N_LAYERS = 2  # conf/model/fact_neox_ravel.yaml


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("ravel")
    r = cli.run("run", "+experiment=ravel_tiny", f"paths.output_root={out}", f"hydra.run.dir={out / 'job'}", cwd=out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "job"


@pytest.fixture(scope="module")
def table(job):
    return pd.read_parquet(job / "metrics.parquet")


def scores(t: pd.DataFrame, **where) -> pd.DataFrame:
    t = t[t["kind"] == "score"]
    for k, v in where.items():
        t = t[t[k] == v]
    return t


@pytest.mark.slow
def test_the_whole_vector_swap_at_the_embeddings_is_the_source_prompt(table):
    """At layer 0 the entity token's state is its embedding: swapping the whole vector makes a Cause prompt the base
    template about e′ — whatever prompt the source state came from (every source kind) — which the filter kept because
    the model answers it right, so Cause is 1 exactly; on a prompt querying B it is the B prompt about e′, whose value
    differs from e's."""
    acc = table[(table["kind"] == "accuracy") & (table["style"] == "all")].set_index("attribute")["value"]
    van = scores(table, method="vanilla", layer=0)
    assert len(van) == 3 * 3 * 2 and set(van["source"]) == {"attribute", "other_attribute"} and (van["n"] > 0).all()
    assert (van.loc[van["metric"] == "cause", "value"] == 1.0).all()
    # Isolate: only where the model got the B prompt about e′ wrong can it still say e's value
    assert (van.loc[van["metric"] == "isolate", "value"] <= 1 - acc.min() + 1e-12).all()


@pytest.mark.slow
def test_the_top_layer_at_the_entity_token_is_read_by_nothing(table):
    """A causal LM's last-layer state at a token before the last feeds no later computation: every method's edit
    there leaves every answer as it was (Cause 0: e′'s value differs from e's; Isolate 1)."""
    top = scores(table, layer=N_LAYERS)
    assert set(top["method"]) == {"das", "mdas", "mean", "pca", "random", "vanilla"}
    assert (top.loc[top["metric"] == "cause", "value"] == 0.0).all()
    assert (top.loc[top["metric"] == "isolate", "value"] == 1.0).all()


@pytest.mark.slow
def test_the_summaries_are_the_means_of_the_scores_and_the_records_are_registered(table, job):
    s = table[table["kind"] == "summary"]
    key = ["method", "layer", "attribute", "source"]
    per = s[s["attribute"] != "all"].pivot_table(index=key, columns="metric", values="value")
    np.testing.assert_allclose(per["disentangle"], (per["cause"] + per["isolate"]) / 2)
    sc = scores(table)
    iso = sc[sc["metric"] == "isolate"].groupby(key)["value"].mean()
    cause = sc[sc["metric"] == "cause"].set_index(key)["value"]
    kinds = per.xs("attribute", level="source", drop_level=False).index.union(
        per.xs("other_attribute", level="source", drop_level=False).index)
    np.testing.assert_allclose(per.loc[kinds, "isolate"], iso.loc[kinds])
    np.testing.assert_allclose(per.loc[kinds, "cause"], cause.loc[kinds])
    # source "all": the mean over the kinds (the reference's mean over its tasks)
    over = per.drop(index="all", level="source").groupby(level=["method", "layer", "attribute"]).mean()
    np.testing.assert_allclose(per.xs("all", level="source")[["cause", "isolate"]], over.loc[
        per.xs("all", level="source").index, ["cause", "isolate"]])
    # attribute "all": the mean over the attributes where both are defined, which it names
    whole = s[s["attribute"] == "all"]
    assert (whole["attributes"] == "R01,R02,R03").all()
    wide = whole.pivot_table(index=["method", "layer", "source"], columns="metric", values="value")
    means = per.groupby(level=["method", "layer", "source"]).mean()
    np.testing.assert_allclose(wide.loc[means.index], means[wide.columns])
    # the filter: at most n_pairs per (targeted, queried, kind), out of the base prompts the model answers right
    assert (sc["n"] <= 6).all() and (sc["n"] <= sc["n_candidates"]).all()
    recs = pd.read_parquet(job / "records.parquet")
    assert {"cause", "isolate", "disentangle", "task_accuracy"} <= set(recs["metric"])
    assert unregistered(recs["metric"].unique()) == [] and R.problems(recs) == []
    board = pd.read_csv(job / "leaderboard.csv")
    assert {"cause", "isolate", "disentangle"} <= set(board.columns) | set(board.get("metric", []))


@pytest.mark.parametrize("override, message", [
    (["ravel.methods=[fgsm]"], "intervention 'fgsm' cannot run in ravel.methods"),
    (["ravel.methods=[nope]"], "unknown method 'nope' in ravel.methods; choose from"),
    (["ravel.attributes=[R01]"], "Isolate needs two attributes or more"),
    (["model=fact_zoo_smoke"], "the ravel task probes one model"),
])
def test_bad_settings_are_one_line_before_any_model_loads(tmp_path, override, message):
    r = cli.run("run", "+experiment=ravel_tiny", *override, f"paths.output_root={tmp_path / 'out'}", cwd=tmp_path)
    cli.assert_refused(r, message, tmp_path / "out")


def test_a_ravel_file_with_a_one_valued_attribute_is_one_line(tmp_path):
    one = {e: {**v, "Continent": "Europe"} for e, v in CITIES.items()}
    base = write_ravel(tmp_path, one, PROMPTS)
    r = cli.run("run", "+experiment=ravel_tiny", "dataset=ravel", f"dataset.path={base}", "model=tiny_neox_sva",
                f"paths.output_root={tmp_path / 'out'}", cwd=tmp_path)
    cli.assert_refused(r, "attribute 'Continent' has 1 value ('Europe') among its entities", tmp_path / "out")


def _sva_entities() -> tuple[dict, dict]:
    """The tiny agreement GPT-NeoX's nouns as entities: after "the author that the guard likes" it writes "has", after
    "the authors ..." "have" (its own agreement), so both attributes are answered from the entity's number."""
    from cprobe.data.grammar import NOUNS

    entities = {}
    for sg, pl in NOUNS[:12]:
        entities[sg] = {"aux": "has", "near": "has"}
        entities[pl] = {"aux": "have", "near": "have"}
    prompts = {"aux": ["the %s that the guard likes", "the %s that the pilots see"],
               "near": ["the %s near the guard", "the %s near the pilots"]}
    return entities, prompts


@pytest.mark.slow
def test_ravel_files_run_end_to_end_on_any_causal_lm(tmp_path):
    """``dataset=ravel`` on the tiny agreement GPT-NeoX, its nouns as entities and the verbs it writes as values:
    whatever passes the filter, a score is NaN exactly where no pair did, and the records are valid."""
    base = write_ravel(tmp_path, *_sva_entities())
    out = tmp_path / "out"
    r = cli.run("run", "+experiment=ravel_tiny", "dataset=ravel", f"dataset.path={base}", "model=tiny_neox_sva",
                "layers=[0,1]", "ravel.methods=[mean,vanilla]", "ravel.mdas_weight=null", f"paths.output_root={out}",
                f"hydra.run.dir={out / 'job'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_parquet(out / "job" / "metrics.parquet")
    acc = t[(t["kind"] == "accuracy") & (t["style"] == "all")].set_index("attribute")
    assert sorted(acc.index) == ["aux", "near"] and (acc["n"] == 12 * 2).all()  # scored half × 2 templates
    assert (acc["value"] > 0.5).all()
    assert set(t["method"]) == {"", "mean", "vanilla"}  # no DAS listed, so no MDAS either
    sc = scores(t)
    assert len(sc) == 2 * 2 * 2 * 2 * 2 and (sc["n"] <= sc["n_candidates"]).all()  # methods × layers × A × Q × kinds
    assert (sc["value"].isna() == (sc["n"] == 0)).all()
    recs = pd.read_parquet(out / "job" / "records.parquet")
    assert R.problems(recs) == [] and {"cause", "isolate", "task_accuracy"} <= set(recs["metric"])


@pytest.mark.parametrize("case, message", [
    ("no_slot", "must hold the entity slot %s exactly once"),
    ("missing_file", "RAVEL file not found"),
    ("no_contexts", "ravel.sources lists wikipedia, but"),
])
def test_bad_ravel_folders_are_one_line_before_any_model_loads(tmp_path, case, message):
    entities, prompts = _sva_entities()
    if case == "no_slot":
        prompts = {**prompts, "near": ["the guard near the pilots"]}
    base = write_ravel(tmp_path, entities, prompts)
    if case == "missing_file":
        (base / "ravel_city_attribute_to_prompts.json").unlink()
    extra = ["ravel.sources=[attribute,wikipedia]"] if case == "no_contexts" else []
    r = cli.run("run", "+experiment=ravel_tiny", "dataset=ravel", f"dataset.path={base}", "model=tiny_neox_sva",
                *extra, f"paths.output_root={tmp_path / 'out'}", cwd=tmp_path)
    cli.assert_refused(r, message, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("own_dir", [False, True], ids=["default_run_dir", "users_folder"])
def test_an_attribute_the_model_never_answers_is_refused_and_nothing_is_written(tmp_path, own_dir):
    """Found only once the model has answered: still one line, exit code 1, and no run directory left; run in a
    folder the user made (``hydra.run.dir``, empty: a folder holding their files is refused before anything runs), the
    folder stays, empty."""
    entities, prompts = _sva_entities()
    entities = {e: {**v, "mood": ("glad", "sad")[i % 2]} for i, (e, v) in enumerate(entities.items())}
    base = write_ravel(tmp_path, entities, {**prompts, "mood": ["the %s feels"]})
    out, mine = tmp_path / "out", tmp_path / "mine"
    mine.mkdir()
    r = cli.run("run", "+experiment=ravel_tiny", "dataset=ravel", f"dataset.path={base}", "model=tiny_neox_sva",
                "layers=[1]", "ravel.methods=[vanilla]", "ravel.mdas_weight=null", f"paths.output_root={out}",
                *([f"hydra.run.dir={mine}"] if own_dir else []), cwd=tmp_path)
    cli.assert_refused(r, "attribute 'mood': none of its 2 values occurs among the model's answers", out)
    assert mine.is_dir() and not list(mine.iterdir())


@pytest.mark.slow
def test_k_dimensional_das_spanning_the_state_is_the_whole_swap(tmp_path):
    """``ravel.das.k`` = d: DAS's subspace is the whole state, so its interchange is the whole-vector swap's, pair for
    pair (k-dimensional DAS through the study, its dimension on the rows)."""
    out = tmp_path / "out"
    r = cli.run("run", "+experiment=ravel_tiny", "layers=[0]", "ravel.methods=[das,vanilla]", "ravel.das.k=64",
                "ravel.mdas_weight=null", "ravel.n_train=8", f"paths.output_root={out}", f"hydra.run.dir={out / 'job'}",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    sc = scores(pd.read_parquet(out / "job" / "metrics.parquet"))
    das, van = (sc[sc["method"] == m].set_index(["attribute", "queried", "source"]) for m in ("das", "vanilla"))
    assert (das["n_features"] == 64).all() and len(das) == 18
    np.testing.assert_array_equal(das.loc[van.index, "value"], van["value"])
    assert (das.loc[das["metric"] == "cause", "value"] == 1.0).all()
