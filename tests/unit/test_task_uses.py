"""Tasks declare what they read (config groups, capabilities); validation refuses what a task would ignore.

Composed in-process as the CLI composes a job (Hydra's ``hydra.overrides.task`` are the command line's overrides).
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cprobe.errors import ConfigError
from tests.conftest import REPO


def _compose(*overrides: str) -> tuple[dict, list[str]]:
    """(the resolved job config without paths/hydra, the command-line overrides Hydra records for the job)."""
    import cprobe.pipeline  # noqa: F401  (registers the config's resolvers)

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    task = list(cfg.hydra.overrides.task)
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra")
    plain = OmegaConf.to_container(OmegaConf.create(plain), resolve=True)
    plain.pop("paths", None)
    return plain, task


def prepare(*overrides: str):
    from cprobe.pipeline import prepare

    cfg, task = _compose(*overrides)
    return prepare(cfg, overrides=task)


def test_every_task_declares_what_it_uses():
    from cprobe.tasks import SHARED_GROUPS, TASK_MODULES, task_uses

    for name in TASK_MODULES.names():
        uses = task_uses(name)
        assert "model" in uses.groups and uses.groups <= set(SHARED_GROUPS), name
    assert task_uses("causalgym").groups == {"model", "layers"}
    assert "intervention" in task_uses("reliability").groups and "intervention" not in task_uses("cebab").groups
    from cprobe.tasks import tasks_with

    assert tasks_with("model_sets") == ["prompt_bias", "ravel"]


@pytest.mark.parametrize(("overrides", "needle"), [
    (["+experiment=causalgym", "intervention=leace"], "task 'causalgym' does not use `intervention`"),
    (["+experiment=cebab", "intervention=leace"], "task 'cebab' does not use `intervention`"),
    (["+experiment=causalgym", "+dataset.max_examples=5"], "does not use `dataset`"),
    (["+experiment=causalgym", "probe=linear"], "does not use `probe`"),
    (["+experiment=causalgym", "position=first"], "does not use `position`"),
    (["+experiment=cebab", "layers=2"], "task 'cebab' does not use `layers`"),
    (["+experiment=liberty_cv", "split=probing"], "task 'liberty' does not use `split`"),
    (["+experiment=causalgym", "+cebab.max_pairs=3"], "sets the 'cebab' task's settings but this job runs task "
                                                      "'causalgym'"),
])
def test_a_group_the_task_does_not_use_set_on_the_command_line_is_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        prepare(*overrides)
    assert "\n" not in str(err.value) and overrides[-1] in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["+experiment=causalgym", "+debug=smoke"],  # the preset sizes every task (probe=smoke, dataset.max_examples)
    ["+experiment=causalgym", "~intervention"],  # unsetting is fine
    ["+experiment=causalgym", "causalgym.methods=[das]", "seed=1", "compute=cpu"],  # a sweep job's overrides
    ["+experiment=sva_tiny_reliability", "intervention=leace", "layers=last", "position=target"],
    ["+experiment=cebab", "+debug=smoke", "cebab.max_pairs=10", "dataset.max_examples=50"],
    ["+experiment=lama_bias", "+debug=smoke"],
])
def test_presets_sweeps_and_used_groups_pass(overrides):
    prepare(*overrides)


def test_unknown_causalgym_method_lists_the_valid_names():
    """A name that is neither a direction method nor an intervention: the message lists both (no crash); an
    intervention is a method (issue 22)."""
    with pytest.raises(ConfigError) as err:
        prepare("+experiment=causalgym", "causalgym.methods=[nope]")
    from cprobe.methods import method_names

    msg = str(err.value)
    assert f"unknown method 'nope' in causalgym.methods; choose from {method_names()}" in msg and "Registry" not in msg
    assert {"das", "vanilla", "leace", "autoattack"} <= set(method_names())
    prepare("+experiment=causalgym", "causalgym.methods=[leace,pgd]")


def test_a_model_set_needs_a_task_that_declares_it_reads_one():
    with pytest.raises(ConfigError, match=r"model 'fact_zoo' is a model zoo \(a set of models\); only task\(s\) "
                                          r"\['prompt_bias', 'ravel'\] read one; pick a single model for task "
                                          r"'causalgym'"):
        prepare("+experiment=causalgym", "model=fact_zoo")
    prepare("+experiment=lama_bias", "+debug=smoke")


def test_per_model_task_defaults_live_under_the_tasks_name():
    from cprobe.tasks.causalgym import Config

    job = prepare("+experiment=causalgym")
    assert job.keys.model["task_defaults"] == {"causalgym": {"probe_lam": 10.0}}
    assert Config().resolve(job.keys.model).probe_lam == (10.0,)
    with pytest.raises(ConfigError, match=r"unknown task\(s\) \['causalgymm'\] under model.task_defaults"):
        prepare("+experiment=causalgym", "+model.task_defaults.causalgymm.probe_lam=3")
    with pytest.raises(ConfigError, match="no probe λ for model 'gpt2'"):
        prepare("+experiment=causalgym", "model=gpt2")
    job = prepare("+experiment=causalgym", "model=gpt2", "+model.task_defaults.causalgym.probe_lam=3")
    assert Config().resolve(job.keys.model).probe_lam == (3.0,)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['lam'\] under model.task_defaults.causalgym"):
        Config().resolve({"name": "x", "task_defaults": {"causalgym": {"lam": 3}}})


def test_prompt_bias_disparity_is_a_typed_node_parse_checks():
    """The nested ``prompt_bias.disparity`` node is a dataclass: ``parse`` reports unknown keys and wrong types, as
    for every other node (no hand-parsing)."""
    from cprobe.config import parse
    from cprobe.tasks.prompt_bias import Config, Disparity

    cfg = parse(Config, {"disparity": {"base": ["bert_small"], "gammas": [0, 0.5], "train": {"steps": 3}}}, "prompt_bias")
    assert cfg.disparity == Disparity(base=("bert_small",), gammas=(0.0, 0.5), train={"steps": 3})
    assert parse(Config, {"disparity": {"base": None}}, "prompt_bias").disparity.base == ()
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['gamma'\] under prompt_bias.disparity"):
        parse(Config, {"disparity": {"gamma": [0.5]}}, "prompt_bias")
    with pytest.raises(ConfigError, match="prompt_bias.disparity.sentences must be an integer"):
        parse(Config, {"disparity": {"sentences": "many"}}, "prompt_bias")
    with pytest.raises(ConfigError, match=r"gammas must be a non-empty list in \[0, 1\]"):
        parse(Config, {"disparity": {"gammas": [0.5, 2]}}, "prompt_bias")


def test_the_liberty_experiments_share_one_base_and_differ_only_in_their_data():
    """Every LIBERTy setting lives once, in conf/experiment/base/liberty.yaml; an experiment adds its dataset and name
    (and at most its own choice of concepts or explainers)."""
    import yaml

    nodes = {}
    for scm in ("cv", "disease", "violence"):
        own = yaml.safe_load((REPO / "conf" / "experiment" / f"liberty_{scm}.yaml").read_text())
        assert "base/liberty" in own["defaults"], scm
        assert set(own) <= {"defaults", "name", "liberty"} and set(own.get("liberty") or {}) <= {"concepts",
                                                                                                  "explainers"}, scm
        cfg, _ = _compose(f"+experiment=liberty_{scm}")
        assert cfg["name"] == f"liberty_{scm}" and cfg["dataset"]["scm"] == scm
        cfg["liberty"] = {k: v for k, v in cfg["liberty"].items() if k not in ("concepts", "explainers")}
        nodes[scm] = {k: v for k, v in cfg.items() if k not in ("name", "dataset")}
    assert nodes["cv"] == nodes["disease"] == nodes["violence"]
