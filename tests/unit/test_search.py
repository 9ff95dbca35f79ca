"""The hparams_search= group in process (no job runs): the search space from Hydra's sweep syntax, the objective read
from records, the winner, and every refusal at validation (before any directory exists)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import optuna
import optuna.distributions as D
import pandas as pd
import pytest

import cprobe.pipeline  # noqa: F401  (the config resolvers)
from cprobe import search
from cprobe.errors import ConfigError
from cprobe.records import COLUMNS
from tests.conftest import REPO, needs_shared


def _sweeper(tmp_path: Path, *overrides: str) -> SimpleNamespace:
    """What the sweeper holds after Hydra's setup: the config loader and the multirun's master config."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(REPO / "conf")))
    if not any(o.startswith("hydra.sweep.dir=") for o in overrides):
        overrides = (*overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    cfg = loader.load_configuration("config", overrides=list(overrides), run_mode=RunMode.MULTIRUN)
    return SimpleNamespace(hydra_context=SimpleNamespace(config_loader=loader), config=cfg)


def _prepare(tmp_path: Path, *overrides: str, sweeps: tuple[str, ...] = ()) -> search.Search:
    s = _sweeper(tmp_path, *overrides)
    task = [o for o in overrides if not o.lstrip("+").startswith("hydra.")]  # Hydra passes the task's overrides
    return search.prepare(s, [*task, *sweeps])


RELIABILITY = ("+experiment=sva_tiny_reliability", "hparams_search=reliability")


def test_the_reliability_search_takes_the_interventions_own_hyperparameter_and_direction(tmp_path):
    s = _prepare(tmp_path, *RELIABILITY, "intervention=inlp")
    assert s.direction == "maximize" and "metrics registry" in s.direction_from
    assert s.space == {"intervention.rank": D.IntDistribution(0, 40)} and s.opts.n_trials == 20
    s = _prepare(tmp_path, *RELIABILITY, "intervention=pgd")
    assert s.space == {"intervention.eps": D.FloatDistribution(0.005, 5.0, log=True)}
    s = _prepare(tmp_path, *RELIABILITY, "intervention=inlp", sweeps=("intervention.rank=range(0,6)",))
    assert s.space == {"intervention.rank": D.IntDistribution(0, 5)}  # the command line's sweep wins


@pytest.mark.parametrize("text,dist", [
    ("range(0,41)", D.IntDistribution(0, 40)),
    ("range(2,11,3)", D.IntDistribution(2, 8, step=3)),
    ("interval(0.0,8.0)", D.FloatDistribution(0.0, 8.0)),
    ("tag(log,interval(0.005,5.0))", D.FloatDistribution(0.005, 5.0, log=True)),
    ("int(interval(1,9))", D.IntDistribution(1, 9)),
    ("choice(32,64,128)", D.CategoricalDistribution([32, 64, 128])),
    ("a,b", D.CategoricalDistribution(["a", "b"])),
])
def test_hydra_sweep_syntax_becomes_an_optuna_distribution(text, dist):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (o,) = OverridesParser.create().parse_overrides([f"k={text}"])
    assert search.distribution("k", o) == dist


def _job(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    base = {c: "" for c in COLUMNS}
    base.update(layer=4, read_layer=4, n=10, seed=0, setting="{}", slice="{}", study="reliability")
    pd.DataFrame([{**base, **r} for r in rows]).to_parquet(d / "records.parquet")
    (d / "status.json").write_text(json.dumps({"state": "done"}))
    return d


def test_objective_is_the_whole_data_record_unless_where_says_otherwise(tmp_path):
    job = _job(tmp_path, "j", [
        {"metric": "oracle_selectivity", "value": 0.8},
        {"metric": "oracle_selectivity", "slice": '{"property":"z_e"}', "value": 0.6},
        {"metric": "reliability", "layer": 2, "value": 0.5}, {"metric": "reliability", "layer": 3, "value": 0.7},
        {"metric": "reliability", "layer": 4, "method": "x", "value": 0.9}])
    opts = search.SearchOptions
    assert search.objective(job, opts(metric="oracle_selectivity")) == (0.8, 1, "")
    assert search.objective(job, opts(metric="oracle_selectivity", where={"slice": {"property": "z_e"}})) == \
        (0.6, 1, "")
    assert search.objective(job, opts(metric="reliability"))[0] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert search.objective(job, opts(metric="reliability", reduce="max"))[0] == 0.9
    assert search.objective(job, opts(metric="reliability", where={"method": "x"}))[0] == 0.9
    assert search.objective(job, opts(metric="reliability", where={"layer": 3}))[0] == 0.7
    value, n, why = search.objective(job, opts(metric="iia"))
    assert value is None and why == "no iia record"


def test_the_winner_is_the_best_finished_trial_in_the_registry_direction(tmp_path):
    space = {"intervention.rank": D.IntDistribution(0, 40)}
    for direction, best in (("maximize", 2), ("minimize", 0)):
        study = optuna.create_study(direction=direction)
        for i, (rank, v) in enumerate([(3, 0.2), (7, 0.5), (9, 0.9), (11, None)]):
            study.add_trial(optuna.trial.create_trial(
                params={"intervention.rank": rank}, distributions=space, value=v,
                state=optuna.trial.TrialState.COMPLETE if v is not None else optuna.trial.TrialState.FAIL,
                user_attrs={"job": f"intervention.rank={rank}"}))
        s = search.Search(search.SearchOptions(), direction, "test", [], space, "reliability", tmp_path)
        out = search.write_summary(s, study)
        assert out["best"]["number"] == best and out["failed"] == [3]
        assert json.loads((tmp_path / "search.json").read_text())["best"]["job"] == out["best"]["job"]
        assert f"trial {best} (intervention.rank=" in (tmp_path / "search.md").read_text()
    assert "highest" not in out["why"] and "lowest reliability, 0.2" in out["why"]


@pytest.mark.parametrize("extra,needle", [
    (("intervention=inlp", "hydra.sweeper.metric=nope"), "unknown metric 'nope' for hydra.sweeper.metric; choose from"),
    (("intervention=inlp", "hydra.sweeper.metric=iia"),
     "metric 'iia' is not recorded by the reliability study (the causalgym and mib studies record it); reliability "
     "records ["),
    (("intervention=inlp", "hydra.sweeper.metric=delta_task_accuracy"),
     "metric 'delta_task_accuracy' has no better direction in the metrics registry; set hydra.sweeper.direction="),
    (("intervention=inlp", "+hydra.sweeper.params.intervention.depth='range(1,3)'"),
     "intervention 'inlp' has no hyperparameter 'depth'; it has ['C', 'l2', 'max_iter', 'rank']"),
    (("intervention=leace",), "intervention 'leace' has no hyperparameter (hparam: null): name a search space"),
    (("intervention=inlp", "hydra.sweeper.n_trials=0"), "n_trials and n_jobs must be >= 1"),
    (("intervention=inlp", "+hydra.sweeper.params.intervention.rank=3"), "is one value, not a search space"),
    (("intervention=inlp", "hydra.sweeper.hparam_ranges.inlp='range(-5,3)'"), "rank must be a non-negative integer"),
])
def test_bad_searches_are_refused_at_validation(tmp_path, extra, needle):
    with pytest.raises(ConfigError) as e:
        _prepare(tmp_path, *RELIABILITY, *extra)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "sweep").exists()


def test_an_explicit_direction_makes_a_neutral_metric_searchable(tmp_path):
    s = _prepare(tmp_path, *RELIABILITY, "intervention=inlp", "hydra.sweeper.metric=delta_task_accuracy",
                 "hydra.sweeper.direction=maximize")
    assert (s.direction, s.direction_from) == ("maximize", "hydra.sweeper.direction")


@pytest.mark.parametrize("preset,experiment,extra", [
    ("probing", "sva_tiny", ("probe=mlp",)),
    pytest.param("causalgym", "causalgym", ("causalgym.methods=[probe]",), marks=needs_shared("causalgym")),
    pytest.param("cebab", "cebab", ("cebab.explainers=[s_learner]",), marks=needs_shared("cebab")),
    ("liberty", "liberty_cv", ("liberty.explainers=[st_match]",)),
])
def test_every_studys_search_validates(tmp_path, preset, experiment, extra):
    """One search per study's headline metric; each composes and passes the job's own validation."""
    from cprobe.metrics.registry import METRICS

    s = _prepare(tmp_path, f"+experiment={experiment}", f"hparams_search={preset}", *extra)
    assert METRICS[s.opts.metric].headline and s.study_name in METRICS[s.opts.metric].studies and s.space


def test_unknown_search_lists_the_valid_ones():
    from hydra import compose, initialize_config_dir

    from cprobe._hydra import explain_error

    with pytest.raises(Exception) as e, initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        compose("config", overrides=["+experiment=sva_tiny", "hparams_search=nope"])
    assert explain_error(e.value) == ("unknown hparams_search 'nope'; choose from ['causalgym', 'cebab', 'liberty', "
                                      "'probing', 'reliability'] (hparams_search=NAME; `cprobe list hparams_search` "
                                      "describes them)")
