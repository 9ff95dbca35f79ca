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
    """At layer 0 the entity token's state is its embedding: swapping the whole vector makes a Cause prompt the
    source prompt itself (same template, e′ in e's place), which the filter kept because the model answers it
    right, so Cause is 1 exactly; on a prompt querying B it is the B prompt about e′, whose value differs from e's."""
    acc = table[table["kind"] == "accuracy"].set_index("attribute")["value"]
    van = scores(table, method="vanilla", layer=0)
    assert len(van) == 9 and (van["n"] > 0).all()
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
    key = ["method", "layer", "attribute"]
    per = s[s["attribute"] != "all"].pivot_table(index=key, columns="metric", values="value")
    np.testing.assert_allclose(per["disentangle"], (per["cause"] + per["isolate"]) / 2)
    sc = scores(table)
    iso = sc[sc["metric"] == "isolate"].groupby(key)["value"].mean()
    cause = sc[sc["metric"] == "cause"].set_index(key)["value"]
    np.testing.assert_allclose(per["isolate"], iso.loc[per.index])
    np.testing.assert_allclose(per["cause"], cause.loc[per.index])
    whole = s[s["attribute"] == "all"].pivot_table(index=["method", "layer"], columns="metric", values="value")
    means = per.groupby(level=["method", "layer"]).mean()
    np.testing.assert_allclose(whole.loc[means.index], means[whole.columns])
    # the filter: at most n_pairs per (targeted, queried), out of the base prompts the model answers right
    assert (sc["n"] <= 12).all() and (sc["n"] <= sc["n_candidates"]).all()
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


@pytest.mark.slow
def test_ravel_files_run_end_to_end_on_any_causal_lm(tmp_path):
    """``dataset=ravel`` on the tiny agreement GPT-NeoX, its words as entities and values. It knows no such facts
    (on this CPU its answer follows the template, not the entity, so no Cause pair passes RAVEL's filter): whatever
    passes, a score is NaN exactly where no pair did, and the records are valid."""
    from cprobe.data.grammar import NOUNS

    nouns = [sg for sg, _ in NOUNS[:24]]
    entities = {n: {"mood": ["happy", "tired"][i % 2], "fate": ["left", "won"][(i // 2) % 2]}
                for i, n in enumerate(nouns)}
    prompts = {"mood": ["the %s is", "the %s that is"], "fate": ["the %s was", "the %s that was"]}
    base = write_ravel(tmp_path, entities, prompts)
    out = tmp_path / "out"
    r = cli.run("run", "+experiment=ravel_tiny", "dataset=ravel", f"dataset.path={base}", "model=tiny_neox_sva",
                "layers=[0,1]", "ravel.methods=[mean,vanilla]", "ravel.mdas_weight=null", f"paths.output_root={out}",
                f"hydra.run.dir={out / 'job'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_parquet(out / "job" / "metrics.parquet")
    acc = t[t["kind"] == "accuracy"].set_index("attribute")
    assert sorted(acc.index) == ["fate", "mood"] and (acc["n"] == 48).all()  # 24 entities × 2 templates
    assert set(t["method"]) == {"", "mean", "vanilla"}  # no DAS listed, so no MDAS either
    sc = scores(t)
    assert len(sc) == 2 * 2 * 2 * 2 and (sc["n"] <= sc["n_candidates"]).all()  # methods × layers × A × Q
    assert (sc["value"].isna() == (sc["n"] == 0)).all()
    recs = pd.read_parquet(out / "job" / "records.parquet")
    assert R.problems(recs) == [] and {"cause", "isolate", "task_accuracy"} <= set(recs["metric"])
