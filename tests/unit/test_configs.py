"""In-process Hydra composition: every intervention and probe option composes and builds, with the
papers' defaults (Canby et al. App. C–D, the reference codes)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import REPO

INTERVENTIONS = sorted(p.stem for p in (REPO / "conf" / "intervention").glob("*.yaml") if p.stem != "custom")
PROBES = sorted(p.stem for p in (REPO / "conf" / "probe").glob("*.yaml"))


def _compose(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=sva_tiny_reliability", *overrides])
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize("name", INTERVENTIONS)
def test_every_intervention_config_builds(name):
    from cprobe.interventions import INTERVENTIONS as REG

    node = _compose(f"intervention={name}")["intervention"]
    node.pop("hparam", None)
    method = REG.build(node)
    assert type(method) is REG.get(name)


def test_the_custom_intervention_is_an_empty_node_for_outside_classes():
    from cprobe.errors import ConfigError
    from cprobe.interventions import INTERVENTIONS as REG

    node = _compose("intervention=custom")["intervention"]
    assert node == {"name": None, "hparam": None}
    with pytest.raises(ConfigError, match="needs a 'name'"):
        REG.build({"name": node["name"]})
    node = _compose("intervention=custom", "intervention.name=cprobe.interventions.leace:LEACE",
                    "++intervention.shrinkage=false")["intervention"]
    node.pop("hparam")
    assert REG.build(node).shrinkage is False


@pytest.mark.parametrize("name", PROBES)
def test_every_probe_config_composes(name):
    from cprobe.probes import PROBES as REG

    probes = _compose(f"probe={name}")["probe"]
    assert probes
    for cfg in probes.values():
        REG.build(cfg)


def test_paper_defaults():
    cfg = _compose()
    assert _compose("probe=linear")["probe"]["linear"]["lrs"] == [1e-4, 1e-3, 1e-2, 1e-1]  # App. D.3
    inlp = _compose("intervention=inlp")["intervention"]
    assert inlp["C"] == 1.0 and inlp["l2"] is None  # scikit-learn's LogisticRegression defaults
    rl = _compose("intervention=rlace")["intervention"]
    assert (rl["lr"], rl["batch_size"], rl["epsilon"]) == (0.005, 128, 0.0015)
    assert _compose("intervention=pgd")["intervention"]["select"] == "last"
    le = _compose("intervention=leace")["intervention"]
    assert le["shrinkage"] and le["constrain_cov_trace"]
    assert cfg["intervention"]["name"] == "inlp"


EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name, tmp_path):
    """Each experiment resolves and passes the whole pre-flight validation (no model or data loaded)."""
    from cprobe.pipeline import prepare

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={name}", "paths.data_dir=/nonexistent",
                                           f"paths.cache_dir={tmp_path}"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    job = prepare(plain)
    assert job.keys.task == plain["task"]


def test_offline_canby_setting_trains_on_attractor_agreement():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=sva_marked_reliability"]))
    assert cfg["model"]["tiny"]["grammar"]["attractor_agreement"] is True
    assert cfg["dataset"]["grammar"]["attractor_agreement"] is True
    assert cfg["reliability"]["target"] == "z_c" and cfg["reliability"]["others"] == ["z_e"]


GROUP_OPTIONS = [(g, p.stem) for g in ("model", "dataset", "split", "debug")
                 for p in sorted((REPO / "conf" / g).glob("*.yaml"))]


@pytest.mark.parametrize(("group", "name"), GROUP_OPTIONS)
def test_every_option_of_every_group_composes_and_validates(group, name, tmp_path):
    """model / dataset / split / debug options: composed in-process and through the whole pre-flight check."""
    from cprobe.pipeline import prepare

    override = f"+{group}={name}" if group == "debug" else f"{group}={name}"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        base = "sva_tiny" if (group, name) == ("split", "probing") else "sva_tiny_reliability"  # the task it serves
        text = (REPO / "conf" / "model" / f"{name}.yaml").read_text() if group == "model" else ""
        if "source: zoo" in text:
            base = "lama_bias"  # model sets are read by the prompt-bias study only
        elif "\nsource: fact_world" in text:
            base = "ravel"  # a fact-world member alone: the RAVEL study trains and reads it
        extra = ["prompt_bias.disparity.base=[]"] if base == "lama_bias" and "fact" not in name else []
        if (group, name) == ("dataset", "generic"):  # the reliability study needs z_e too: name its column
            extra.append("+dataset.properties.z_e=attractor_number")
        if (group, name) == ("dataset", "custom"):  # an outside dataset class, named by its import path
            extra.append("dataset.type=cprobe.testing:PlantedAgreement")
        if (group, name) == ("model", "local"):  # any local checkpoint: its path is the one required key
            extra.append(f"model.path={tmp_path}/m.gguf")
        cfg = compose("config", overrides=[f"+experiment={base}", override, f"paths.cache_dir={tmp_path}", *extra])
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("paths", None)
    prepare(plain)


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf" / "sweep").glob("*.yaml")))
def test_every_sweep_composes(name):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=sva_tiny_reliability", f"+sweep={name}"],
                      return_hydra_config=True)
    assert cfg.hydra.sweeper.params or cfg.hydra.mode is not None


@pytest.mark.parametrize(("compute", "device", "dtype"), [("auto", "auto", "float32"), ("cpu", "cpu", "float32"),
                                                          ("gpu", "cuda", "float32"), ("gpu_bf16", "cuda", "bfloat16")])
def test_compute_group_sets_the_one_device_and_the_model_dtype(compute, device, dtype):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=causalgym", f"compute={compute}"]),
                                     resolve=True)
    assert cfg["device"] == device and cfg["model"]["dtype"] == dtype
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["compute=gpu_bf16", "device=cpu", "model.dtype=float32"]),
                                     resolve=True)
    assert cfg["device"] == "cpu" and cfg["model"]["dtype"] == "float32"  # either can still be set alone


def test_compute_resume_is_validated_defaults_on_and_keeps_config_hashes():
    """``compute.resume`` (every compute group: true) reaches the model; anything but a boolean is refused before
    heavy work; its default leaves a config's hash as it was before the key existed, ``false`` makes another job."""
    from cprobe.errors import ConfigError
    from cprobe.job import config_hash
    from cprobe.pipeline import prepare

    for group in sorted(p.stem for p in (REPO / "conf" / "compute").glob("*.yaml")):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=sva_tiny", f"compute={group}"]),
                                         resolve=True)
        assert cfg["compute"]["resume"] is True, group
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=sva_tiny", "compute=cpu"]),
                                     resolve=True)
    prepare(cfg)
    before = {**cfg, "compute": {k: v for k, v in cfg["compute"].items() if k != "resume"}}
    assert config_hash(cfg) == config_hash(before)
    off = {**cfg, "compute": {**cfg["compute"], "resume": False}}
    prepare(off)
    assert config_hash(off) != config_hash(cfg)
    with pytest.raises(ConfigError, match="compute.resume must be true or false, got 'no'"):
        prepare({**cfg, "compute": {**cfg["compute"], "resume": "no"}})


def test_compute_kv_resume_is_validated_defaults_on_and_keeps_config_hashes():
    """``compute.kv_resume`` (every compute group: true) is checked before heavy work; its default leaves a config's
    hash as it was before the key existed, ``false`` makes another job."""
    from cprobe.errors import ConfigError
    from cprobe.job import config_hash
    from cprobe.pipeline import prepare

    for group in sorted(p.stem for p in (REPO / "conf" / "compute").glob("*.yaml")):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=sva_tiny", f"compute={group}"]),
                                         resolve=True)
        assert cfg["compute"]["kv_resume"] is True, group
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["+experiment=sva_tiny", "compute=cpu"]),
                                     resolve=True)
    before = {**cfg, "compute": {k: v for k, v in cfg["compute"].items() if k not in ("resume", "kv_resume")}}
    assert config_hash(cfg) == config_hash(before)
    off = {**cfg, "compute": {**cfg["compute"], "kv_resume": False}}
    prepare(off)
    assert config_hash(off) != config_hash(cfg)
    with pytest.raises(ConfigError, match="compute.kv_resume must be true or false, got 1"):
        prepare({**cfg, "compute": {**cfg["compute"], "kv_resume": 1}})


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf" / "hydra" / "launcher").glob("*.yaml")))
def test_every_launcher_composes(name):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=sva_tiny", f"hydra/launcher={name}"], return_hydra_config=True)
    assert "_target_" in cfg.hydra.launcher


def test_model_configs_load_outside_hydra():
    """A model file read on its own (a notebook, load_adapter) resolves its dtype without the compute group."""
    from cprobe.models.load import parse_model_config

    for path in sorted((REPO / "conf" / "model").glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        if node["source"] == "local":  # model=local: the checkpoint's path is the one required key
            node["path"] = "/models/m.gguf"
        assert parse_model_config(node).dtype == "float32", path.name


def test_a_direction_trained_through_the_model_is_refused_where_the_data_cannot_emit_minimal_pairs(tmp_path):
    """DAS needs minimal pairs flipping the target: the grammar emits them for z_c; a file dataset cannot, and a
    target the grammar cannot flip is refused too — at validation, before any model or data loads."""
    from cprobe.errors import ConfigError
    from cprobe.pipeline import prepare

    def plain(*overrides: str) -> dict:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["+experiment=sva_tiny_reliability", "intervention=das",
                                               f"paths.cache_dir={tmp_path}", *overrides])
        out = OmegaConf.to_container(cfg, resolve=True)
        out.pop("paths", None)
        return out

    prepare(plain())
    with pytest.raises(ConfigError, match="cannot emit minimal pairs"):
        prepare(plain("dataset=marvin_linzen"))
    with pytest.raises(ConfigError, match="not 'z_e'"):
        prepare(plain("reliability.target=z_e", "reliability.others=[z_c]"))
