"""The LIBERTy study on a tiny SCM and a tiny BERT encoder: the mean-pooled site, the CLI's bad-input errors, and
the study end to end (a 2-seed sweep + collect) with its tables recomputed from the per-pair file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cprobe.data.liberty import LibertyKeys, generate
from cprobe.data.scm import SCM
from cprobe.models.formatters import ClassificationFormatter
from cprobe.models.load import load_adapter
from cprobe.models.sites import MEAN, Site
from tests import cli
from tests.liberty_fixtures import check_pair_effects, metric_value, tiny_encoder_dir, write_scm



@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("liberty")
    return write_scm(root / "tiny.yaml"), tiny_encoder_dir(root / "encoder"), root


def test_the_mean_site_is_the_masked_mean_of_the_last_layer(world):
    scm_path, enc_dir, _ = world
    enc = load_adapter({"name": "tiny_enc", "path": str(enc_dir), "kind": "encoder", "batch_size": 4}, Path("/none"))
    data = generate(SCM.load(scm_path), LibertyKeys(n_explained=20, n_explainer=10), "tiny", 0)
    items = list(data.splits["train"])[:7]
    site = Site(enc.n_layers, MEAN)
    got = enc.map(items, ClassificationFormatter(64), read=[site]).acts[site]
    for i, it in enumerate(items):  # one text at a time: no padding at all
        ids = enc.tok(it.text, return_tensors="pt").to(enc.device)  # where device=auto put the model
        with torch.inference_mode():
            h = enc.model(**ids).last_hidden_state[0]
        torch.testing.assert_close(got[i], h.mean(0).cpu(), atol=1e-5, rtol=1e-5)
    from cprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="can be read but not edited"):
        from cprobe.models.edits import Replace

        enc.map(items, ClassificationFormatter(64), edits={site: Replace(torch.zeros(7, 32))})


# ----------------------------------------------------------------------------------------------- the CLI
def cprobe(*args: str, cwd: Path, data: Path) -> cli.Result:
    """``cprobe *args`` in process (tests.cli.run) with ``data`` as the data dir."""
    return cli.run(*args, cwd=cwd, env={"CPROBE_DATA_DIR": str(data)})


def _tiny(world) -> list[str]:
    scm_path, enc_dir, _ = world
    return ["+experiment=liberty_cv", f"dataset.scm={scm_path}", "dataset.n_explained=120", "dataset.n_test=30",
            "dataset.n_explainer=60",
            "model=bert_base_uncased", f"model.path={enc_dir}", "model.finetune.lr=3e-3",
            "liberty.finetune.max_length=64", "liberty.concept_model.max_length=64", "liberty.mc_samples=20000"]


@pytest.mark.parametrize("override, message", [
    ("liberty.explainers=[random,shap]", "unknown explainer 'shap'; choose from"),
    ("liberty.concepts=[a,y]", "unknown concept(s) ['y'] of SCM tiny; choose from ['a', 'b', 'c']"),
    ("dataset.scm=cvv", "unknown SCM 'cvv'; choose from"),
    ("dataset=lgd", "the liberty task needs a LIBERTy dataset"),
    ("liberty.distances=[l1]", "unknown distance 'l1'"),
    ("dataset.test_share=1.5", "dataset.test_share must lie in (0, 1)"),
    ("liberty.st_model=nonesuch", "unknown model config 'nonesuch' for liberty.st_model"),
    ("dataset.texts=nope.jsonl", "dataset.texts: nope.jsonl not found"),
    ("dataset.realiser=gpt4o", "unknown realiser 'gpt4o'; choose from ['template']"),
    ("liberty.explainer.approx.max_mismatches=-1", "max_mismatches must be >= 0"),
    ("liberty.finetune.lr=nan", "lr must be a finite number, got nan"),
    ("liberty.concept_model.lr=-0.001", "liberty.concept_model: lr must be > 0, got -0.001"),
    ("dataset.n_explainer=10", "D_M (dataset.n_explainer) has 10 texts, below the minimum of 30"),
    ("dataset.n_test=4", "test texts (dataset.n_test) has 4 texts, below the minimum of 10"),
    ("liberty.max_pool=10", "liberty.max_pool must be >= 30 (or null for all), got 10"),
])
def test_bad_input_is_one_line_and_leaves_nothing(override, message, world, tmp_path):
    """In process: the CLI's own code path (tests.cli.run)."""
    args = [a for a in _tiny(world) if not a.startswith("dataset.")] if override.startswith("dataset=") else \
        _tiny(world)
    r = cli.run("run", *args, override, f"paths.output_root={tmp_path}", cwd=tmp_path,
                env={"CPROBE_DATA_DIR": str(world[2])})
    cli.assert_refused(r, message, tmp_path)


@pytest.mark.slow
def test_the_study_runs_end_to_end_and_a_sweep_aggregates(world, tmp_path):
    out = tmp_path / "out"
    r = cprobe("run", "-m", *_tiny(world), "seed=0,1", "liberty.finetune.epochs=10", "liberty.finetune.batch_size=16", "liberty.concept_model.epochs=4",
               "liberty.explainer.conceptshap.epochs=2", "liberty.explainer.conceptshap.hidden=16",
               f"paths.output_root={out}", "progress=false", cwd=tmp_path, data=world[2])
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted(p.parent for p in out.rglob("status.json"))
    assert len(runs) == 2
    t = pd.concat([pd.read_parquet(d / "metrics.parquet") for d in runs])
    assert set(t["kind"]) >= {"classifier", "ed", "of", "importance", "global_of", "sensitivity", "explainer"}
    ed = t[t["kind"] == "ed"]
    names = {"random", "approx", "convecs", "st_match", "pt_match", "ft_match", "tcav", "conceptshap"}
    assert set(ed["explainer"]) == names  # liberty_cv's list: the removal-only explainers are refused on CV
    assert set(ed["distance"]) == {"l2", "cosine", "normdiff", "mean"} and len(ed) == 2 * 8 * 4
    acc = t[(t["kind"] == "classifier") & (t["explainer"] == "explained") & (t["metric"] == "accuracy")]
    assert (acc["value"] > 0.6).all()  # it learned something from the texts
    # every number recomputed from the per-pair file
    job = runs[0]
    pairs = pd.read_parquet(job / "liberty_pair_effects.parquet")
    mine = pd.read_parquet(job / "metrics.parquet")

    def value(kind, explainer, **kw):
        return metric_value(mine, kind, explainer, **kw)

    check_pair_effects(job)  # the same check on the README's run: tests/smoke/test_studies_collect.py
    # the SCM's true effect: c and a reach y (a through b); the label is a descendant
    scm_rows = mine[(mine["kind"] == "sensitivity") & (mine["explainer"] == "scm")]
    assert set(scm_rows["concept"]) == {"a", "b", "c"} and (scm_rows["value"] > 0).all()
    assert np.isfinite(value("of", "ft_match")) and value("ed", "random", distance="cosine") == pytest.approx(1, abs=.2)
    # the same benchmark for both seeds (dataset.seed), different explained-model seeds
    other = pd.read_parquet(runs[1] / "liberty_pair_effects.parquet")
    assert list(other["pair"]) == list(pairs["pair"])
    # aggregate the sweep
    sweep = runs[0].parent
    r = cprobe("collect", str(sweep), cwd=tmp_path, data=world[2])
    assert r.returncode == 0, r.stderr[-2000:]
    local = pd.read_csv(sweep / "liberty_local.csv")
    assert set(local["explainer"]) == names and local.shape[1] == 2  # explainer + one (SCM · model) column
    assert all(" / " in c for c in local.iloc[:, 1])
    g = pd.read_csv(sweep / "liberty_global_of_long.csv")
    assert (g["seeds"] == 2).all()
    wide = pd.read_csv(sweep / "liberty_global_of.csv")  # Table 16: explainer rows, (SCM · model) columns
    assert set(wide["explainer"]) == names and wide.shape[1] == 2
    col = wide.columns[1]
    for _, r in g.iterrows():
        assert wide.set_index("explainer").loc[r["explainer"], col] == pytest.approx(r["mean"], abs=5e-4)
    sens = pd.read_csv(sweep / "liberty_sensitivity.csv")
    assert set(sens["explainer"]) == {"model", "scm"} and {"a", "b", "c"} <= set(sens.columns)
    assert (sweep / "liberty_global_of.png").is_file() and (sweep / "liberty_sensitivity_tiny.png").is_file()
    from tests.conftest import assert_figures_captioned

    assert len(assert_figures_captioned(sweep)) >= 2  # every figure names its concepts, model, data, n, seed
    top = pd.read_csv(sweep / "liberty_top3.csv")
    assert set(top["explainer"]) >= {"gold", "ft_match"}


@pytest.mark.slow
def test_a_users_own_texts_run_through_the_same_study(world, tmp_path):
    import json

    scm_path, _, root = world
    scm = SCM.load(scm_path)
    data = generate(scm, LibertyKeys(n_explained=100, n_explainer=40), "tiny", 3)
    rows = [{"id": it.id, "text": it.text, "split": split, **it.concepts, "y": it.outcome}
            for split in ("train", "test", "explainer") for it in data.splits[split]]
    rows += [{"id": p.source.id, "text": p.source.text, "split": "counterfactual", **p.source.concepts,
              "y": p.source.outcome, "base_id": p.base.id, "intervened": p.intervened[0]} for p in data.pairs]
    (root / "mine.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    r = cprobe("run", *_tiny(world), "dataset.texts=mine.jsonl", "liberty.explainers=[random,ft_match]",
               "liberty.finetune.epochs=1", f"paths.output_root={out}", "progress=false", cwd=tmp_path, data=root)
    assert r.returncode == 0, r.stderr[-3000:]
    (job,) = [p.parent for p in out.rglob("status.json")]
    pairs = pd.read_parquet(job / "liberty_pair_effects.parquet")
    assert sorted(pairs["pair"]) == sorted(p.id for p in data.pairs)  # the file's pairs, not a generated benchmark
