"""`cprobe._hydra.parse_configs_once`: Hydra's config sources parse a config file's YAML once per process; what they
compose is what they composed before, an edited file is read again, and a YAML error still names its file.
`cprobe._hydra.compose_defaults_once`: a composition whose config files and config-choosing overrides were composed
before starts from a copy of that merge; what it composes is Hydra's, and an edit, a new file or a registered
structured config composes afresh."""

from __future__ import annotations

import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal import config_loader_impl
from hydra._internal.core_plugins import file_config_source, importlib_resources_config_source
from omegaconf import OmegaConf

from cprobe import _hydra
from tests.conftest import REPO

COMPOSE_JOBS_ONCE = _hydra.compose_jobs_once
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def _composed(conf, *overrides: str) -> str:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return OmegaConf.to_yaml(compose("config", overrides=list(overrides), return_hydra_config=True))


def _genuine(f):
    return getattr(f, "__wrapped__", f)


@pytest.fixture()
def plain(monkeypatch):
    """Hydra's own sources and composition as shipped (no memo), then both memos installed on a clean slate."""
    for module in (file_config_source, importlib_resources_config_source):
        monkeypatch.setattr(module, "OmegaConf", OmegaConf)
    monkeypatch.setattr(_hydra, "_PARSED", {})
    monkeypatch.setattr(_hydra, "_DEFAULTS", {})
    monkeypatch.setattr(config_loader_impl, "create_defaults_list", _genuine(config_loader_impl.create_defaults_list))
    loader = config_loader_impl.ConfigLoaderImpl
    monkeypatch.setattr(loader, "_compose_config_from_defaults_list",
                        _genuine(loader._compose_config_from_defaults_list))

    def install(compose: bool = True):
        _hydra.parse_configs_once()
        if compose:
            _hydra.compose_defaults_once()
    return install


def _counting(monkeypatch) -> list:
    """Each genuine defaults-list build (one per composition without the memo), counted."""
    calls, real = [], config_loader_impl.create_defaults_list
    monkeypatch.setattr(config_loader_impl, "create_defaults_list", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def test_what_is_composed_is_what_hydra_composes_and_yaml_runs_once_per_file(plain, monkeypatch):
    overrides = [[f"+experiment={e}"] for e in EXPERIMENTS] + [
        ["+experiment=sva_tiny_reliability", "+sweep=reliability_inlp"], ["hydra/launcher=local_parallel"]]
    before = [_composed(REPO / "conf", *o) for o in overrides]
    plain()
    parses = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda stream, Loader: parses.append(stream.name) or real(stream, Loader))
    assert [_composed(REPO / "conf", *o) for o in overrides] == before
    assert parses and len(parses) == len(set(parses))  # every file parsed once
    assert any(n.endswith("conf/config.yaml") for n in parses) and any("hydra/conf" in n for n in parses)  # file, pkg
    n = len(parses)
    assert [_composed(REPO / "conf", *o) for o in overrides] == before and len(parses) == n  # nothing parsed again


def test_a_composition_with_the_same_choices_is_hydras_from_one_merge(plain, monkeypatch):
    """Value overrides (a sweep's ranks, a seed, a dict) and the hydra node's apply to a copy of the kept merge; each
    config is Hydra's own, and the kept merge is never edited by what was applied to a copy."""
    overrides = [["+experiment=sva_tiny_reliability", "intervention=inlp", f"intervention.rank={r}"] for r in (0, 7)]
    overrides += [["+experiment=sva_tiny", "seed=3", "probe=mlp", "+probe.mlp.extra={a: 1}"],
                  ["+experiment=sva_tiny", "seed=4", "probe=mlp", "hydra.job.name=x"],
                  ["+experiment=cebab", "+debug=smoke", "cebab.max_pairs=9"], ["+experiment=cebab", "+debug=smoke"]]
    before = [_composed(REPO / "conf", *o) for o in overrides]
    plain(compose=False)
    calls = _counting(monkeypatch)
    _hydra.compose_defaults_once()
    assert [_composed(REPO / "conf", *o) for o in overrides] == before
    assert len(calls) == 3  # one merge per set of choices
    assert [_composed(REPO / "conf", *o) for o in reversed(overrides)] == before[::-1] and len(calls) == 3
    assert len(_hydra._DEFAULTS) == 3


def _memo_on_a_copy(plain, tmp_path, monkeypatch) -> tuple:
    """(a copy of conf/, the genuine defaults-list builds counted, its first composition with the memo installed)."""
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    plain(compose=False)
    calls = _counting(monkeypatch)
    _hydra.compose_defaults_once()
    return conf, calls, _composed(conf, "+experiment=sva_tiny")


@pytest.mark.parametrize("change", ["edit", "same-size edit, mtime kept", "new option", "structured config"])
def test_an_edit_a_new_file_or_a_registered_config_composes_afresh(change, plain, tmp_path, monkeypatch):
    conf, calls, first = _memo_on_a_copy(plain, tmp_path, monkeypatch)
    assert _composed(conf, "+experiment=sva_tiny") == first and len(calls) == 1
    if change.startswith("edit"):
        cfg = conf / "config.yaml"
        cfg.write_text(cfg.read_text().replace("\nseed: 0", "\nseed: 7"))
        assert _composed(conf, "+experiment=sva_tiny") == first.replace("seed: 0", "seed: 7", 1)
    elif change.startswith("same-size"):  # a copy that keeps the mtime (cp -p, rsync -t): the inode tells
        import os

        cfg = conf / "config.yaml"
        stat = cfg.stat()
        new = tmp_path / "config.yaml"
        new.write_text(cfg.read_text().replace("\nseed: 0", "\nseed: 7"))
        os.utime(new, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.replace(new, cfg)
        assert _composed(conf, "+experiment=sva_tiny") == first.replace("seed: 0", "seed: 7", 1)
    elif change == "new option":
        (conf / "probe" / "wide.yaml").write_text("defaults:\n  - mlp\nmlp:\n  widths: [4096]\n")
        assert "- 4096" in _composed(conf, "+experiment=sva_tiny", "probe=wide")
    else:
        from hydra.core.config_store import ConfigStore

        repo = ConfigStore.instance().repo
        ConfigStore.instance().store(group="probe", name="stored", node={"mlp": {"widths": [8192]}})
        try:
            assert "- 8192" in _composed(conf, "+experiment=sva_tiny", "probe=stored")
        finally:
            repo["probe"].pop("stored.yaml", None)
            if not repo["probe"]:
                repo.pop("probe")
    assert len(calls) == 2


def test_a_dangling_link_or_a_non_config_file_in_a_config_folder_is_no_error(plain, tmp_path, monkeypatch):
    """An editor's lock (``.#config.yaml``, a link to nowhere) and files Hydra never reads: composed as by Hydra."""
    conf, calls, first = _memo_on_a_copy(plain, tmp_path, monkeypatch)
    (conf / ".#config.yaml").symlink_to(tmp_path / "nowhere")
    (conf / "notes.txt").write_text("mine")
    assert _composed(conf, "+experiment=sva_tiny") == first and len(calls) == 2  # a new name: composed afresh
    (conf / "notes.txt").write_text("mine, edited")
    assert _composed(conf, "+experiment=sva_tiny") == first and len(calls) == 2  # a .txt changes nothing kept


def test_the_memo_outlives_hydras_plugin_scan(plain, monkeypatch):
    """`cprobe run` installs the memo before Hydra's first composition, whose plugin scan executes the config-source
    modules again: the memo must still be in place after it (it was not: every file was parsed at every composition)."""
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    monkeypatch.delitem(Singleton._instances, Plugins, raising=False)  # as in a fresh process: no scan yet
    plain()
    parses = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda stream, Loader: parses.append(stream.name) or real(stream, Loader))
    _composed(REPO / "conf", "+experiment=sva_tiny")
    n = len(parses)
    assert n and len(parses) == len(set(parses))
    _composed(REPO / "conf", "+experiment=sva_tiny")
    assert len(parses) == n
    assert file_config_source.OmegaConf.load is importlib_resources_config_source.OmegaConf.load is _hydra._load_parsed


def test_an_edited_config_file_is_read_again(plain, tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    plain()
    first = _composed(conf, "+experiment=sva_tiny")
    assert "seed: 0" in first
    cfg = conf / "config.yaml"
    cfg.write_text(cfg.read_text().replace("\nseed: 0", "\nseed: 7"))
    again = _composed(conf, "+experiment=sva_tiny")
    assert "seed: 7" in again and again.replace("seed: 7", "seed: 0") == first


def test_a_yaml_error_still_names_its_file(plain, tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "experiment" / "broken.yaml").write_text("a: [1, 2\n")
    plain()
    with pytest.raises(Exception) as e:
        _composed(conf, "+experiment=broken")
    assert "broken.yaml" in str(e.value) + str(e.value.__cause__) + str(e.value.__context__)


def _sweep(conf, tmp_path, monkeypatch, once: bool) -> tuple[list[str], int]:
    """(each job's config as YAML, how many compositions) of a 4-job in-process multirun over ``conf``."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    genuine = getattr(ConfigLoaderImpl.load_sweep_config, "__wrapped__", ConfigLoaderImpl.load_sweep_config)
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", genuine)  # Hydra's, whatever ran before
    monkeypatch.setattr(_hydra, "compose_jobs_once", COMPOSE_JOBS_ONCE if once else lambda: None)
    calls = []
    real = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    seen = []
    monkeypatch.chdir(tmp_path)
    _hydra.run(["-m", "opt=x,y", "a=1,2", f"hydra.sweep.dir={tmp_path / ('once' if once else 'plain')}"],
               lambda cfg: seen.append(OmegaConf.to_yaml(cfg, resolve=True)), str(conf))
    return seen, len(calls)


def test_a_sweep_composes_each_job_once_and_runs_the_same_configs(tmp_path, monkeypatch):
    """The sweeper's check and the launcher compose the same job config: the check's copy goes to the launcher."""
    conf = tmp_path / "conf"
    (conf / "opt").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - opt: x\n  - _self_\na: 0\nb: ${a}\n")
    (conf / "opt" / "x.yaml").write_text("name: x\nscale: 1.5\n")
    (conf / "opt" / "y.yaml").write_text("name: y\nscale: 2.5\nlist: [1, 2]\n")
    plain, n_plain = _sweep(conf, tmp_path, monkeypatch, once=False)
    once, n_once = _sweep(conf, tmp_path, monkeypatch, once=True)
    assert len(plain) == 4 and once == plain and "scale: 2.5" in once[-1] and "b: 2" in once[-1]
    assert n_plain == 2 + 2 * 4 and n_once == 2 + 4  # the run config (its mode, then itself), each job twice / once
    assert _hydra._COMPOSED == {}
