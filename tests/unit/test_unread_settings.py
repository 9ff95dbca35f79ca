"""No setting silently ignored (issue 43): a ``model.*`` key the model's source does not read, and a launcher setting
no launcher would read, are refused in one line naming what does read them, before any heavy work.

What a model source reads is its declaration in ``cprobe.models.load.MODEL_SOURCES``; what a launcher reads is its
config node as Hydra composes it (``cprobe.launchers``). Jobs are composed in-process as the CLI composes them (the
command line's overrides are Hydra's ``hydra.overrides.task``); README lines are composed, not run.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cprobe.errors import ConfigError
from tests.cli import assert_refused
from tests.cli import run as cli
from tests.conftest import REPO
from tests.study_runs import COMMANDS
from tests.unit.test_task_uses import prepare


# ------------------------------------------------------------------------------------------------- model sources
@pytest.mark.parametrize(("overrides", "reader", "source"), [
    # the issue's reproduction: the self-trained model would be trained and used, model.path unread
    (["+experiment=sva_tiny", "+model.path=/data/my-checkpoint"], "model.path is read only by models with source hub",
     "model 'tiny_bert_sva' (source: tiny) is trained by cprobe"),
    (["+experiment=sva_tiny", "+model.revision=main"], "model.revision is read only by models with source hub",
     "(source: tiny)"),
    (["+experiment=sva_tiny", "model.trust_remote_code=true"],
     "model.trust_remote_code is read only by models with source hub/local/package", "(source: tiny)"),
    (["+experiment=lama_bias", "+model.path=/data/my-checkpoint"], "model.path is read only by models with source hub",
     "model 'fact_zoo' (source: zoo) is a model zoo"),
    (["+experiment=lama_bias", "+model.batch_size=8"],
     "model.batch_size is read only by models with source fact_world/hub/local/package/tiny", "(source: zoo)"),
    (["+experiment=sva_tiny_reliability", "model=minilm_l6", "+model.path=/data/my-checkpoint"],
     "model.path is read only by models with source hub", "(source: package) is loaded from the Python package"),
    (["+experiment=sva_tiny", "model=gpt2", "+model.tiny.gate=0.5"], "model.tiny is read only by models with source "
     "tiny", "(source: hub)"),
    (["+experiment=sva_tiny", "model=gpt2", "+model.members=[gpt2]"], "model.members is read only by models with "
     "source zoo", "(source: hub)"),
])
def test_a_model_key_its_source_does_not_read_is_refused_naming_the_sources_that_do(overrides, reader, source):
    with pytest.raises(ConfigError) as err:
        prepare(*overrides)
    msg = str(err.value)
    assert reader in msg and source in msg and "\n" not in msg, msg
    assert "pick a model=... whose source reads it (e.g. model=" in msg and "or drop model." in msg


@pytest.mark.parametrize("overrides", [
    ["+experiment=sva_tiny", "model.batch_size=7", "model.tiny.train.steps=5", "+model.max_length=64"],
    ["+experiment=sva_tiny", "model.device_map=null", "model.trust_remote_code=false"],  # every file has these
    ["+experiment=sva_tiny", "compute=cpu", "model.device_map=auto", "model.offload_dir=outputs/offload"],
    ["+experiment=sva_tiny", "model=gpt2", "model.path=/data/my-checkpoint", "model.revision=main"],
    ["+experiment=lama_bias", "model.dtype=bfloat16", "model.members=[gpt2]", "prompt_bias.disparity.base=[]"],
    ["+experiment=sva_tiny_reliability", "model=minilm_l6", "model.subdir=model"],
])
def test_a_model_key_its_source_reads_is_accepted(overrides):
    prepare(*overrides)


def test_a_fact_world_model_reads_its_corpus_not_a_path():
    from cprobe.models.load import parse_model_config
    from cprobe.paths import group_config

    member = {**group_config("model", "fact_zoo_smoke")["members"][0], "dtype": "float32", "device": "auto"}
    assert parse_model_config({**member, "batch_size": 8}).source == "fact_world"
    with pytest.raises(ConfigError, match=r"^model.path is read only by models with source hub/local; model 'bert_small' "
                                          r"\(source: fact_world\) is a tiny LM trained on a fact world's corpus"):
        parse_model_config({**member, "path": "/data/my-checkpoint"})


def test_the_check_reads_each_sources_declaration(monkeypatch):
    """Derived, not hand-kept: declaring that tiny models read ``path`` lets the key through and names them."""
    from cprobe.models.load import MODEL_SOURCES, readers

    tiny = MODEL_SOURCES.get("tiny")
    assert readers("path") == ["hub", "local"]
    monkeypatch.setitem(MODEL_SOURCES._items, "tiny", dataclasses.replace(tiny, reads=tiny.reads | {"path"}))
    assert readers("path") == ["hub", "local", "tiny"]
    prepare("+experiment=sva_tiny", "+model.path=/data/my-checkpoint")


def test_every_model_key_is_read_by_some_source_and_every_source_reads_its_name():
    from cprobe.models.load import LOADED, MODEL_SOURCES, ModelConfig, readers

    for f in dataclasses.fields(ModelConfig):
        assert readers(f.name), f"no model source reads model.{f.name}: a dead key"
    for name in MODEL_SOURCES.names():
        source = MODEL_SOURCES.get(name)
        assert {"name", "source"} <= source.reads, name
        assert source.locate is None or LOADED <= source.reads, name  # a loaded model: the adapter reads these
        assert source.needs is None or source.needs[0] in source.reads, name


def test_an_unknown_source_lists_the_sources():
    from cprobe.models.load import parse_model_config

    with pytest.raises(ConfigError, match=r"unknown model source 'hbu'; did you mean 'hub'\?; choose from "
                                          r"\['fact_world', 'hub', 'local', 'package', 'tiny', 'zoo'\]"):
        parse_model_config({"name": "x", "source": "hbu"})


def test_the_issues_reproduction_exits_1_in_one_line_before_any_run_dir(tmp_path):
    r = cli("run", "+experiment=sva_tiny", f"+model.path={tmp_path}", f"paths.output_root={tmp_path / 'out'}",
            cwd=tmp_path)
    assert_refused(r, "model.path is read only by models with source hub/local; model 'tiny_bert_sva' (source: tiny)",
                   tmp_path / "out")


# ----------------------------------------------------------------------------------------------------- launchers
@pytest.mark.parametrize(("overrides", "sweep", "launcher", "needle"), [
    (["hydra/launcher=slurm"], False, "basic", "`hydra/launcher=slurm` picks a sweep's launcher, but a single run "
                                               "uses none: add -m to sweep, or drop it"),
    (["+hydra.launcher.timeout_min=5"], False, "basic", "a single run uses no launcher, and it is read only by the "
                                                        "launcher(s) ['slurm', "),
    (["+hydra.launcher.timeout_min=5"], True, "basic", "the basic launcher this sweep runs on does not read "
                                                       "`timeout_min`; it is read only by the launcher(s) ['slurm', "),
    (["hydra/launcher=slurm", "+hydra.launcher.n_jobs=2"], True, "slurm",
     "the slurm launcher this sweep runs on does not read `n_jobs`; it is read only by the launcher(s) "
     "['local_parallel', 'joblib'] of a sweep (-m hydra/launcher=local_parallel)"),
    (["+hydra.launcher.timeot_min=5"], True, "basic", "no launcher reads it"),
])
def test_a_launcher_setting_nothing_would_read_is_refused(overrides, sweep, launcher, needle):
    from cprobe.launchers import unread

    msg = unread(["hydra.run.dir=x", *overrides], sweep, launcher)
    assert msg is not None and needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize(("overrides", "sweep", "launcher"), [
    (["hydra.run.dir=x", "hydra.job.chdir=false"], False, "basic"),
    (["hydra/launcher=slurm", "hydra.launcher.timeout_min=5", "hydra.launcher.partition=debug"], True, "slurm"),
    (["hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2"], True, "local_parallel"),
    (["~hydra.launcher.n_jobs"], True, "local_parallel"),
])
def test_a_launcher_setting_the_launcher_reads_is_accepted(overrides, sweep, launcher):
    from cprobe.launchers import unread

    assert unread(overrides, sweep, launcher) is None


def test_a_launchers_keys_are_its_composed_config():
    """The SLURM launcher's file declares exactly what its driver reads; the basic launcher reads nothing."""
    from cprobe.launch.settings import DEFAULTS
    from cprobe.launchers import launcher_keys

    assert launcher_keys("slurm") == set(DEFAULTS)
    assert launcher_keys("basic") == frozenset()
    assert {"n_jobs", "backend"} <= launcher_keys("local_parallel")  # from Hydra's joblib plugin, which it extends


def test_a_key_added_to_a_launchers_config_is_then_read_by_it(tmp_path, monkeypatch):
    """Derived, not hand-kept: the launchers' keys come from their config files."""
    from cprobe.launchers import readers, unread

    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf, ignore=shutil.ignore_patterns("local"))
    with (conf / "hydra" / "launcher" / "slurm.yaml").open("a") as f:
        f.write("n_jobs: 1\n")
    monkeypatch.setenv("CPROBE_CONFIG_DIR", str(conf))
    assert readers("n_jobs")[:2] == ["local_parallel", "slurm"]
    assert unread(["hydra/launcher=slurm", "+hydra.launcher.n_jobs=2"], True, "slurm") is None


def test_a_typo_in_conf_local_slurm_yaml_is_refused_by_the_slurm_launcher_alone(tmp_path, monkeypatch):
    """``conf/local/slurm.yaml`` joins the SLURM launcher's node only; a key there the driver does not read is refused
    when the launcher starts, before it submits or makes the sweep dir."""
    from cprobe.launch.settings import check as _plain_params
    from cprobe.launchers import launcher_keys

    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf, ignore=shutil.ignore_patterns("local"))
    (conf / "local").mkdir()
    (conf / "local" / "slurm.yaml").write_text("partiton: gpu\n")
    monkeypatch.setenv("CPROBE_CONFIG_DIR", str(conf))
    assert "partiton" in launcher_keys("slurm") and launcher_keys("basic") == frozenset()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        node = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
    with pytest.raises(ConfigError, match=r"^unknown hydra.launcher key\(s\) \['partiton'\] for the SLURM launcher; "
                                          r"known: \['account', "):
        _plain_params({k: v for k, v in node.items() if k != "_target_"})


@pytest.mark.parametrize(("args", "needle"), [
    (["-m", "+hydra.launcher.timeout_min=5"], "the basic launcher this sweep runs on does not read `timeout_min`"),
    (["hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2"], "picks a sweep's launcher, but a single run uses "
                                                                    "none"),
])
def test_a_launcher_refusal_is_one_line_before_any_run_or_sweep_dir(tmp_path, args, needle):
    r = cli("run", "+experiment=sva_tiny", *args, f"paths.output_root={tmp_path}", cwd=tmp_path)
    assert_refused(r, needle, tmp_path)
    assert not any(tmp_path.iterdir())  # refused before the run dir (or the sweep dir) exists


def test_a_key_the_chosen_launcher_lacks_names_the_launchers_that_have_it():
    r = cli("run", "-m", "+experiment=sva_tiny", "hydra.launcher.n_jobs=2")
    assert_refused(r, "unknown config key 'hydra.launcher.n_jobs': the launcher chosen has no `n_jobs`; it is read "
                      "only by the launcher(s) ['local_parallel', 'joblib'] of a sweep")


# ------------------------------------------------------------------------------------- no false refusal: README
RUN_LINES = [c for c, needs in COMMANDS if c.startswith("cprobe run ") and needs != "example"]


def _first_point(argv: list[str]) -> tuple[list[str], bool]:
    """(the overrides of a README line's first sweep point, whether it sweeps): parsed as ``cprobe run`` does
    (``--smoke`` is ``+debug=smoke``, ``--detach`` an environment variable)."""
    from cprobe import _hydra

    argv = ["+debug=smoke" if a == "--smoke" else a for a in argv if a != "--detach"]
    args, _ = _hydra.parse_argv(_hydra.normalise(argv)[0])
    first = [a.split(",")[0] if not any(c in a for c in "[{") else a for a in args.overrides]
    return first, args.multirun


@pytest.mark.parametrize("command", RUN_LINES)
def test_every_readme_run_line_composes_and_passes_validation(command, tmp_path):
    """Composed only (the README test runs them): the job's validation and the launcher check refuse nothing."""
    import cprobe.pipeline  # noqa: F401  (registers the config's resolvers)
    from cprobe.launchers import unread
    from cprobe.pipeline import prepare as prepare_job

    overrides, sweep = _first_point(shlex.split(command, comments=True)[2:])
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"paths.cache_dir={tmp_path}"], return_hydra_config=True)
        hydra = cfg.hydra
        assert unread(list(hydra.overrides.hydra), sweep or str(hydra.mode).endswith("MULTIRUN"),
                      hydra.runtime.choices["hydra/launcher"]) is None
    task = list(hydra.overrides.task)
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra")
    plain = OmegaConf.to_container(OmegaConf.create(plain), resolve=True)
    plain.pop("paths")
    prepare_job(plain, overrides=task)
