"""The library path without Hydra (issue 25): configs by name, the shipped YAMLs, the built-in dataset's defaults."""

from __future__ import annotations

import pytest
import yaml

import cprobe
from cprobe.errors import ConfigError
from cprobe.paths import config_dir


def test_the_library_names_are_exported():
    for name in ("load_model", "load_dataset", "model_config", "dataset_config", "read_sites", "intervene",
                 "task_accuracy", "run", "LEACE", "LinearProbe", "Site"):
        assert name in cprobe.__all__ and callable(getattr(cprobe, name)) or name == "Site"


def test_no_export_is_shadowed_by_a_submodule():
    """Importing ``cprobe.<x>`` sets the package attribute ``x`` to the submodule: an export of that name would
    turn into a module after first use (``cprobe.extract`` did)."""
    import importlib.util

    shadowed = [n for n in cprobe.__all__ if n != "__version__" and importlib.util.find_spec(f"cprobe.{n}")]
    assert not shadowed


def test_model_configs_load_by_name_and_every_shipped_yaml_parses_without_hydra():
    from cprobe.models.load import parse_model_config

    cfg = cprobe.model_config("tiny_bert_sva", batch_size=16)
    assert cfg["dtype"] == "float32" and cfg["batch_size"] == 16 and cfg["source"] == "tiny"
    for path in sorted((config_dir() / "model").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())  # `${oc.select:compute.dtype,float32}` as written
        if raw["source"] == "local":  # model=local: the checkpoint's path is the one required key, and names it
            with pytest.raises(ConfigError, match="model=local needs model.path=DIR"):
                parse_model_config(raw)
            raw["path"] = "/models/m.gguf"
            assert parse_model_config(raw).name == "m"
        assert parse_model_config(raw).dtype == "float32", path.name
    with pytest.raises(ConfigError, match=r"unknown model 'nope'; choose from \["):
        cprobe.model_config("nope")
    with pytest.raises(ConfigError, match="must be a plain name"):
        cprobe.model_config("../model/gpt2")


def test_datasets_load_by_name_and_the_built_in_one_works_with_the_defaults(tmp_path):
    from cprobe.data.registry import load_dataset

    data = cprobe.load_dataset("synthetic_sva", max_examples=300)
    assert len(data) == 300 and data.values("z_c") == ["pl", "sg"]
    labels = data.labels("z_c")
    assert labels.shape == (300,) and set(labels) == {0, 1}
    # the library's defaults: no `duplicates: drop` in the config (the generator repeats 7 of 3000 by chance)
    ds = load_dataset({"name": "mine", "type": "synthetic", "grammar": {"n_sentences": 3000, "seed": 0}}, tmp_path)
    assert len(ds) == 2993 and "dropped 7 duplicated" in ds.notes[0]
    with pytest.raises(Exception, match="duplicated sentence"):  # an explicit `error` still refuses them
        load_dataset({"name": "mine", "type": "synthetic", "grammar": {"n_sentences": 3000, "seed": 0},
                      "duplicates": "error"}, tmp_path)
