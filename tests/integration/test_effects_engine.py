"""The concept-effect engine (cprobe.tasks.effects) in both studies, in process, on the tiny fixture worlds: every
registered explainer either runs in CEBaB and in LIBERTy (an estimate per pair, rows in the table) or is refused by
both at validation, with the reason, before any model loads.

One run per study with every explainer at toy budgets (a tiny BERT, a few epochs) keeps this fast; the parametrised
tests then read that run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cprobe.errors import ConfigError
from cprobe.explainers import EXPLAINERS
from cprobe.tasks import task_result
from tests.conftest import REPO

# toy budgets for the slow explainers; every other setting is the study's default
_PROBE = "{name:mlp,lrs:[0.01],epochs:3,widths:[16],n_layers:[1]}"
TOY = {"conceptshap": {"epochs": 2, "hidden": 16}, "causalm": {"epochs": 1, "head_epochs": 2, "batch_size": 16},
       "inlp": {"iterations": 2},
       # interventions as explainers (cprobe.explainers.intervention): required settings, toy budgets
       "via_inlp": {"rank": 2}, "via_alterrep": {"rank": 2}, "via_rlace": {"rank": 1, "max_steps": 50},
       "via_fgsm": {"eps": 0.5, "probe": _PROBE}, "via_pgd": {"eps": 0.5, "steps": 5, "probe": _PROBE},
       "via_autoattack": {"eps": 0.5, "n_queries": 20, "probe": _PROBE}}


def _compose(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    return plain


def _settings(node: str) -> list[str]:
    return [f"++{node}.explainer.{n}.{k}={v}" for n, kv in TOY.items() for k, v in kv.items()]


def _tiny_cebab(root: Path) -> list[str]:
    from tests.cebab_fixtures import tiny_encoder_dir, write_cebab

    write_cebab(root, n_train=30, n_eval=6)
    enc = tiny_encoder_dir(root / "encoder")
    return ["+experiment=cebab", "model=bert_base_uncased", f"model.path={enc}", "model.finetune.lr=3e-3",
            "model.finetune.max_length=64", "cebab.finetune.epochs=2", "cebab.concept_model.epochs=1",
            *_settings("cebab")]


def _tiny_liberty(root: Path) -> list[str]:
    from tests.liberty_fixtures import tiny_encoder_dir, write_scm

    scm = write_scm(root / "tiny.yaml")
    enc = tiny_encoder_dir(root / "encoder")
    return ["+experiment=liberty_cv", f"dataset.scm={scm}", "dataset.n_explained=60", "dataset.n_test=12",
            "dataset.n_explainer=30",
            "model=bert_base_uncased", f"model.path={enc}", "model.finetune.lr=3e-3", "liberty.finetune.epochs=2",
            "liberty.finetune.max_length=64", "liberty.finetune.precision=fp32", "liberty.concept_model.epochs=1",
            "liberty.concept_model.max_length=64", "liberty.concept_model.precision=fp32", "liberty.mc_samples=2000",
            *_settings("liberty")]


WORLDS = {"cebab": _tiny_cebab, "liberty": _tiny_liberty}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[pd.DataFrame, pd.DataFrame, dict]]:
    """Each study once, with every registered explainer: (metrics table, per-pair file, config)."""
    from cprobe.job import JobContext, seed_everything
    from cprobe.pipeline import prepare

    out = {}
    for study, make in WORLDS.items():
        root = tmp_path_factory.mktemp(study)
        plain = _compose(*make(root), f"{study}.explainers=[{','.join(EXPLAINERS.names())}]")
        job = prepare(plain)
        ctx = JobContext(cfg={**plain, "paths": {}}, out_dir=root / "job", data_root=root,
                         cache_root=root / "cache", progress=False)
        (root / "job").mkdir()
        seed_everything(0)
        res = task_result(job.task.run(ctx, job.task_cfg))
        table = res.table
        pairs = pd.read_parquet(root / "job" / f"{study}_pair_effects.parquet")
        if res.items is not None:  # the per-item values the records get are the documented file's
            pd.testing.assert_frame_equal(pd.DataFrame({c: res.items[c] for c in pairs}), pairs, check_dtype=False)
        out[study] = (table, pairs, {"warnings": ctx.warnings, "timings": ctx.timings, "root": root, "cfg": plain})
    return out


@pytest.mark.parametrize("study", sorted(WORLDS))
@pytest.mark.parametrize("name", EXPLAINERS.names())
def test_every_explainer_runs_in_every_study(name, study, runs):
    table, pairs, info = runs[study]
    assert not [w for w in info["warnings"] if f"explainer {name} " in w], info["warnings"]
    est = np.stack(pairs[f"estimate_{name}"])
    true = np.stack(pairs["icace"])
    assert est.shape == true.shape and np.isfinite(est).all()
    scored = table[(table["explainer"] == name) & table["kind"].isin(["icace_error", "ed"])]
    assert len(scored) and np.isfinite(scored["value"]).all()


def test_the_matching_spaces_and_concept_inputs_were_built_only_once_per_job(runs):
    for study in WORLDS:
        timings = runs[study][2]["timings"]
        assert {"embed_pt_s", "embed_st_s", "concept_model_s"} <= set(timings), (study, timings)


def test_a_small_benchmark_runs_with_a_loud_recorded_warning(runs):
    """The tiny LIBERTy world is above the refusal minimum (30 D_M texts) but below the paper's sizes."""
    warnings = runs["liberty"][2]["warnings"]
    assert any("D_M (dataset.n_explainer) has only 30 texts" in w for w in warnings), warnings
    table = runs["liberty"][0]
    diag = table[(table["kind"] == "explainer") & (table["explainer"] == "leace")]
    assert set(diag["metric"]) == {"concept_probe_before", "concept_probe_after", "concept_probe_majority"}


@pytest.mark.parametrize("override, reason", [
    ("liberty.explainers=[random,leace]", "explainer 'leace' models concept removal only"),
    ("liberty.explainers=[inlp]", "explainer 'inlp' models concept removal only"),
    ("liberty.explainers=[causalm]", "explainer 'causalm' models concept removal only"),
    ("liberty.concepts=[race] liberty.explainers=[convecs]", "explainer 'convecs' needs at least 2 concepts"),
    ("cebab.aspects=[food] cebab.explainers=[convecs]", "explainer 'convecs' needs at least 2 concepts"),
    ("cebab.explainers=[random,random]", "lists an explainer twice"),
    ("cebab.explainers=[shap]", "unknown explainer 'shap'; choose from ['approx', "),
])
def test_an_explainer_a_study_cannot_run_is_refused_at_validation(override, reason):
    """Before any model or data loads (prepare() loads neither): one line naming the explainer and why."""
    from cprobe.pipeline import prepare

    experiment = "+experiment=cebab" if override.startswith("cebab") else "+experiment=liberty_cv"
    plain = _compose(experiment, *override.split())
    with pytest.raises(ConfigError, match="") as e:
        prepare(plain)
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_the_default_lists_hold_only_runnable_explainers():
    from cprobe.pipeline import prepare

    for experiment in ("cebab", "liberty_cv", "liberty_violence", "liberty_disease"):
        prepare(_compose(f"+experiment={experiment}"))


@pytest.fixture
def passes(monkeypatch) -> list[int]:
    """The rows of every model pass (``ModelAdapter.stream``) made while the test runs."""
    from cprobe.models.adapter import ModelAdapter

    made: list[int] = []
    real = ModelAdapter.stream

    def counted(self, items, *a, **k):
        made.append(len(items))
        return real(self, items, *a, **k)

    monkeypatch.setattr(ModelAdapter, "stream", counted)
    return made


@pytest.mark.parametrize("study", sorted(WORLDS))
def test_a_rerun_reads_every_model_output_back_from_the_cache(study, runs, passes):
    """The fine-tuned classifier's outputs (f, φ, the ft space), the concept classifier's labels and the pt / st
    embeddings are activation-cache entries: a rerun with other explainers runs no model and gets the same
    numbers."""
    from cprobe.job import JobContext, seed_everything
    from cprobe.pipeline import prepare

    _, pairs, info = runs[study]
    root, first = info["root"], info["cfg"]

    def rerun(cfg: dict, name: str) -> pd.DataFrame:
        ctx = JobContext(cfg={**cfg, "paths": {}}, out_dir=root / name, data_root=root, cache_root=root / "cache",
                         progress=False)
        (root / name).mkdir()
        seed_everything(0)
        job = prepare(cfg)
        job.task.run(ctx, job.task_cfg)
        return pd.read_parquet(root / name / f"{study}_pair_effects.parquet")

    cheap = {**first, study: {**first[study], "explainers": ["approx", "st_match", "pt_match", "ft_match",
                                                             "convecs"]}}
    again = rerun(cheap, "rerun")
    assert passes == []
    for col in ("base_probs", "cf_probs", "icace", "estimate_approx", "estimate_convecs", "estimate_ft_match"):
        np.testing.assert_array_equal(np.stack(again[col]), np.stack(pairs[col]))


def test_the_texts_are_the_key_of_a_cached_reading(runs, tmp_path, passes):
    """One changed text is another entry (the model runs again); the same texts are read back."""
    from cprobe.data.items import TextItem
    from cprobe.job import JobContext
    from cprobe.models.sites import MEAN, Site
    from cprobe.tasks.effects import read_texts

    cfg = runs["cebab"][2]["cfg"]
    ctx = JobContext(cfg={**cfg, "paths": {}}, out_dir=tmp_path, data_root=tmp_path, cache_root=tmp_path / "cache",
                     progress=False)
    encoder = ctx.adapter({**cfg["model"], "kind": "encoder"})
    site = Site(encoder.n_layers, MEAN)
    texts = [TextItem("a", "the food was great"), TextItem("b", "the service was slow")]
    one = read_texts(ctx, encoder, texts, [site], 64, None, "")[0][site]
    assert len(passes) == 1
    other = read_texts(ctx, encoder, [texts[0], TextItem("b", "the food was great great")], [site], 64, None, "")[0][site]
    assert len(passes) == 2
    assert torch.equal(one[0], other[0]) and not torch.equal(one[1], other[1])
    read_texts(ctx, encoder, texts, [site], 64, None, "")
    assert len(passes) == 2
