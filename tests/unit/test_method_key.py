"""``method=NAME``: one method, every study (the yardsticks' one sweep line, docs/methods.md).

Each task declares where it names the methods it scores (``Uses.methods``); :func:`cprobe.pipeline.choose_method`
writes the one method there. Composed in-process as the CLI composes a job (``tests/unit/test_task_uses.py``).
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from cprobe.errors import ConfigError
from cprobe.paths import config_dir
from cprobe.pipeline import choose_method
from cprobe.tasks import task_uses
from tests.unit.test_task_uses import prepare

PRESETS = ("yardsticks_reliability", "yardsticks_causalgym", "yardsticks_ravel", "yardsticks_axbench", "yardsticks_mib")
METHODS = ("sae_decoder", "sae_axbench", "das", "leace", "probe", "mean")


def test_each_study_names_its_methods_where_it_declares():
    assert task_uses("reliability").methods == "intervention"
    for study in ("causalgym", "ravel", "axbench", "mib"):
        assert task_uses(study).methods == f"{study}.methods"
    assert task_uses("cebab").methods is None and task_uses("probing").methods is None


def test_a_list_key_gets_the_one_method_and_keeps_the_rest_of_the_node():
    cfg = {"method": "leace", "causalgym": {"methods": ["das", "probe"], "n_train": 7}}
    out = choose_method(cfg, "causalgym", task_uses("causalgym"))
    assert out["causalgym"] == {"methods": ["leace"], "n_train": 7}
    assert cfg["causalgym"]["methods"] == ["das", "probe"]  # the input is not changed


@pytest.mark.parametrize(("method", "intervention"), [
    ("mean", "mean_direction"),   # a direction: the intervention that bridges it
    ("probe", "probe_direction"),
    ("sae_decoder", "sae_decoder_direction"),
    ("sae_axbench", "sae_axbench_direction"),
    ("das", "das"),               # a name of both registries: the intervention
    ("leace", "leace"),
])
def test_the_intervention_group_gets_the_methods_own_config(method, intervention):
    job = prepare("+experiment=sva_tiny_reliability", f"method={method}")
    node = job.cfg["intervention"]
    assert node["name"] == intervention == job.keys.intervention["name"]
    raw = OmegaConf.to_container(OmegaConf.load(config_dir() / "intervention" / f"{intervention}.yaml"))
    own = {k: v for k, v in raw.items() if not str(v).startswith("${")}
    assert {k: node[k] for k in own} == own and set(node) == set(raw)  # every setting of its conf file
    if "model" in node:  # `${oc.select:model.name,null}` resolved in the job, not in the lone file
        assert node["model"] == job.cfg["model"]["name"] == "tiny_bert_sva"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", METHODS)
def test_the_one_sweep_line_is_valid_for_every_study_and_method(preset, method):
    job = prepare(f"+experiment={preset}", f"method={method}")
    where = task_uses(job.keys.task).methods
    if where == "intervention":
        assert job.keys.intervention["name"] in (method, f"{method}_direction")
    else:
        assert job.task_cfg.methods == [method]


@pytest.mark.parametrize(("overrides", "needle"), [
    (["+experiment=cebab", "method=mean"], "task 'cebab' does not score a method chosen by name"),
    (["+experiment=sva_tiny_reliability", "method=nope"], "unknown method 'nope' for method=; choose from"),
    (["+experiment=causalgym", "method=das", "causalgym.methods=[mean]"], "both set causalgym.methods"),
    (["+experiment=sva_tiny_reliability", "method=das", "intervention.rank=2"], "both set intervention"),
    (["+experiment=sva_tiny_reliability", "method=leace", "intervention=pgd"], "both set intervention"),
])
def test_method_is_refused_where_it_would_be_ignored_or_overwrite_a_setting(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        prepare(*overrides)


def test_a_sweep_over_experiments_names_each_folder_after_its_experiment():
    from cprobe._hydra import EXPERIMENT_SUBDIR, normalise, swept

    assert swept("experiment", ["+experiment=a,b"]) and swept("experiment", ["+experiment=glob(yardsticks_*)"])
    assert not swept("experiment", ["+experiment=a", "method=x,y"])
    assert EXPERIMENT_SUBDIR in normalise(["-m", "+experiment=glob(yardsticks_*)", "method=das,mean"])[0]
    assert EXPERIMENT_SUBDIR not in normalise(["-m", "+experiment=sva_tiny", "probe=linear,mlp"])[0]
    assert EXPERIMENT_SUBDIR not in normalise(["+experiment=sva_tiny"])[0]
    assert EXPERIMENT_SUBDIR in normalise(["+experiment=a,b", "+sweep=x"])[0]  # a preset's hydra.mode: MULTIRUN
    mine = "hydra.sweep.subdir=x"
    assert normalise(["-m", "+experiment=a,b", mine])[0].count(mine) == 1  # the user's own wins
    from cprobe.pipeline import dir_suffix

    assert dir_suffix("experiment=ravel,") == "experiment=ravel"  # no override beside the experiment


def test_the_real_model_preset_sizes_each_study_and_sweeps_the_five_methods():
    from hydra import compose, initialize_config_dir

    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=yardsticks_causalgym", "+sweep=yardsticks_real"],
                      return_hydra_config=True)
    assert str(cfg.hydra.sweeper.params.method) == ",".join(METHODS) and str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert (cfg.causalgym.n_train, cfg.causalgym.n_eval, cfg.dataset.max_examples) == (100, 40, 800)
    job = prepare("+experiment=yardsticks_reliability", "+sweep=yardsticks_real", "method=das")
    assert job.keys.dataset["max_examples"] == 800 and job.keys.intervention["name"] == "das"


def test_an_experiment_folder_name_is_read_from_the_jobs_own_overrides():
    from cprobe.pipeline import experiment_dir

    assert experiment_dir(["+experiment=yardsticks_ravel", "method=das"], "method=das") == \
        "experiment=yardsticks_ravel,method=das"
    assert experiment_dir(["experiment=a"], "") == "experiment=a"
    assert experiment_dir(["method=das"], "method=das") == "experiment=none,method=das"


def test_the_slurm_driver_names_an_experiment_sweeps_points_apart(tmp_path):
    """The SLURM driver names each point from its overrides without composing it: an experiment sweep's points get
    their own experiment's folder (they would share one, and be refused, if the name came from the primary config)."""
    from hydra import compose, initialize_config_dir

    from cprobe._hydra import EXPERIMENT_SUBDIR
    from cprobe.launch.slurm import Driver
    from tests.conftest import REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", EXPERIMENT_SUBDIR], return_hydra_config=True)
    driver = Driver.__new__(Driver)
    driver.config = cfg
    points = driver._describe([[f"+experiment={e}", "method=das"] for e in PRESETS], 0, tmp_path)
    assert [p.name for p in points] == [f"experiment={e},method=das" for e in PRESETS]
