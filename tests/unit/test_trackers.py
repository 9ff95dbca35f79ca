"""The logger= group in process (no job runs): records as tracker metrics, the group's composition and validation,
and that a logger never changes what a job writes (config hash, config id)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import cprobe.pipeline  # noqa: F401  (the config resolvers)
from cprobe import trackers
from cprobe.trackers import lifecycle
from cprobe._hydra import explain_error
from cprobe.errors import ConfigError
from cprobe.pipeline import prepare
from cprobe.records import COLUMNS, config_id
from cprobe.trackers.base import clean_key, flatten, points, shared_tags
from tests.conftest import REPO


def _compose(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def _records(rows: list[dict]) -> pd.DataFrame:
    base = {c: "" for c in COLUMNS}
    base.update(layer=pd.NA, read_layer=pd.NA, n=pd.NA, seed=0, setting="{}", slice="{}", study="probing")
    return pd.DataFrame([{**base, **r} for r in rows])


def test_points_key_by_the_fields_that_vary_and_step_by_layer():
    r = _records([
        {"metric": "probe_accuracy", "method": "mlp", "layer": 1, "slice": '{"property":"z_c"}', "value": 0.9},
        {"metric": "probe_accuracy", "method": "mlp", "layer": 2, "slice": '{"property":"z_c"}', "value": 0.95},
        {"metric": "probe_accuracy", "method": "mlp", "layer": 2, "slice": '{"property":"z_e"}', "value": 0.6},
        {"metric": "probe_accuracy", "method": "linear", "layer": 2, "slice": '{"property":"z_e"}', "value": 0.55},
        {"metric": "task_accuracy", "method": "mlp", "value": 1.0},  # no layer: step 0
        {"metric": "task_accuracy", "method": "mlp", "value": float("nan")},  # NaN: not a point
    ])
    got = {(p.key, p.step): p.value for p in points(r)}
    assert got == {("probe_accuracy/method:mlp/property:z_c", 1): 0.9,
                   ("probe_accuracy/method:mlp/property:z_c", 2): 0.95,
                   ("probe_accuracy/method:mlp/property:z_e", 2): 0.6,
                   ("probe_accuracy/method:linear/property:z_e", 2): 0.55,
                   ("task_accuracy", 0): 1.0}
    assert shared_tags(r) == {"study": "probing", "seed": "0"}  # method varies: not a tag


def test_points_never_lose_a_record_that_collides():
    r = _records([{"metric": "iia", "layer": 3, "value": 0.1}, {"metric": "iia", "layer": 3, "value": 0.2},
                  {"metric": "iia", "value": 0.3}])  # equal fields twice; and one without a layer among layered ones
    got = sorted((p.key, p.step, p.value) for p in points(r))
    assert got == [("iia", 3, 0.1), ("iia/2", 3, 0.2), ("iia/layer:none", 0, 0.3)]


def test_keys_and_params_are_what_trackers_accept():
    assert clean_key('slice/{"a":"b c"}') == "slice/__a_:_b c__"  # { " } out; : and space kept
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": "x", "f": {}}) == \
        {"a.b": "1", "a.c": "[1, 2]", "d": "null", "e": "x", "f": "{}"}


def test_logger_group_composes_several_and_never_changes_the_job():
    """`'logger=[csv,mlflow]'` selects both; the results' identity (config id, the resume hash) ignores loggers."""
    plain = _compose("+experiment=sva_tiny_reliability", "logger=[csv,mlflow,tensorboard,wandb]")
    assert sorted(plain["logger"]) == ["csv", "mlflow", "tensorboard", "wandb"]
    assert plain["logger"]["mlflow"]["tracking_uri"].startswith("sqlite:///") and \
        plain["logger"]["mlflow"]["experiment"] == "sva_tiny_reliability"
    assert sorted(trackers.check(plain["logger"])) == ["mlflow", "tensorboard", "wandb"]
    prepare(plain)
    default = _compose("+experiment=sva_tiny_reliability")
    assert default["logger"] == {"csv": {}} and trackers.check(default["logger"]) == {}
    assert config_id(plain) == config_id(default)
    from cprobe.job import config_hash

    strip = lambda c: {k: v for k, v in c.items() if k not in ("force", "progress", "logger")}  # noqa: E731
    assert config_hash(strip(plain)) == config_hash(strip(default))


def test_unknown_logger_lists_the_valid_ones():
    with pytest.raises(Exception) as e:
        _compose("+experiment=sva_tiny", "logger=nope")
    assert explain_error(e.value) == ("unknown logger 'nope'; choose from ['csv', 'mlflow', 'tensorboard', 'wandb'] "
                                      "(logger=NAME; `cprobe list logger` describes them)")
    with pytest.raises(ConfigError, match=r"^unknown logger 'nope'; choose from \['csv', 'mlflow'"):
        trackers.check({"nope": {}})


def test_missing_package_is_refused_with_its_install_command(monkeypatch):
    import cprobe.trackers.lifecycle as T

    real = T.find_spec
    monkeypatch.setattr(T, "find_spec", lambda name: None if name == "wandb" else real(name))
    plain = _compose("+experiment=sva_tiny", "logger=[csv,wandb]")
    with pytest.raises(ConfigError) as e:
        prepare(plain)
    assert str(e.value) == ("logger 'wandb' needs the wandb package, which is not installed: "
                            "pip install 'cprobe[wandb]'")


def test_bad_logger_options_are_one_line():
    plain = _compose("+experiment=sva_tiny", "logger=mlflow", "+logger.mlflow.tracking_url=x")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['tracking_url'\] under logger.mlflow; known keys"):
        prepare(plain)
    with pytest.raises(ConfigError, match="logger.wandb.mode='sometimes' is not one of"):
        trackers.check({"wandb": {"mode": "sometimes"}})


def test_a_failing_tracker_warns_once_and_returns_nothing(caplog):
    import cprobe.trackers.base as B

    class Boom(B.Tracker):
        name = "boom"

        def destination(self):
            return "http://127.0.0.1:9"

        def log_job(self, job, parent):
            raise ConnectionError("connection refused")

    lifecycle._OFF.clear()  # which trackers failed in this process, forgotten
    t = Boom(None)
    with caplog.at_level("WARNING", logger="cprobe"):
        assert lifecycle._guard(t, "logging a job", t.log_job, None, None) is None
        assert lifecycle._guard(t, "logging a job", t.log_job, None, None) is None
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "logger boom failed while logging a job (ConnectionError: connection refused)" \
        in warnings[0].getMessage() and "local files are complete" in warnings[0].getMessage()
    lifecycle._OFF.clear()  # which trackers failed in this process, forgotten


def test_wandb_mode_auto_needs_a_key_and_never_the_network(monkeypatch, tmp_path):
    from cprobe.trackers.wandb import Options, WandbTracker

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    t = WandbTracker(Options(dir=str(tmp_path)))
    assert t.mode() == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password k\n")
    (tmp_path / "netrc").chmod(0o600)
    assert t.mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert t.mode() == "offline"
    assert WandbTracker(Options(mode="online")).mode() == "online"


def test_search_summary_parent_points_are_the_finished_trials(tmp_path):
    from cprobe.trackers.base import SweepLog

    s = SweepLog(tmp_path, "x/y", "x", [], [], search={"metric": "reliability", "trials": [
        {"number": 0, "value": 0.5, "state": "COMPLETE"}, {"number": 1, "value": None, "state": "FAIL"},
        {"number": 2, "value": 0.7, "state": "COMPLETE"}, {"number": 3, "value": math.nan, "state": "COMPLETE"}]})
    assert list(s.search_points()) == [(0, 0.5), (2, 0.7)]
    json.dumps(s.search)


def test_logger_overrides_stay_out_of_directory_names():
    from cprobe.pipeline import dir_suffix

    assert dir_suffix("intervention.rank=1,logger.mlflow.tracking_uri=http://127.0.0.1:9,+logger.wandb.mode=x") == \
        "intervention.rank=1"
    assert dir_suffix("logger.mlflow.http_retries=0") == "" and dir_suffix("seed=1") == "seed=1"
