"""The suite's checked-in tiny models (tests/data/models): intact cache entries, each the very entry its model config
asks for today (a config, grammar or training change makes a new key, and the seed would silently stop being used),
and the seeding itself (tests/conftest.py::seed_models)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, SEEDED_MODELS, SHARED_DATA, TRAIN_ENV, needs_shared, seed_models, \
    trained_this_session

GRAMMAR_MODELS = ("tiny_bert_sva", "tiny_neox_sva", "tiny_neox_causalgym", "mib_neox_smoke")
"""The agreement-grammar models the suite trains for longer than a few seconds (conf/model/<name>.yaml)."""
FACT_MODELS = {"fact_neox_ravel": "fact_world_ravel"}
"""The fact-world models among them: {model config: the dataset config whose world it is trained on}."""


def _seeds() -> list[Path]:
    return sorted(p for p in SEEDED_MODELS.iterdir() if p.is_dir())


def _found(monkeypatch) -> list[str]:
    """Make the cache lookup of the tiny models answer from the seeds without building: the names it asked for."""
    from cprobe.models import tiny

    asked: list[str] = []

    def lookup(cache_dir, name, key, build):
        asked.append(name)
        return SEEDED_MODELS / name

    monkeypatch.setattr(tiny, "cached_build", lookup)
    return asked


@pytest.mark.parametrize("seed", _seeds(), ids=lambda p: p.name)
def test_every_seed_is_an_intact_entry_of_its_own_key(seed):
    from cprobe.cache import entry_problem
    from cprobe.models.tiny import _key_problem

    key = json.loads((seed / "training.json").read_text())["key"]
    assert seed.name.endswith(key)
    assert entry_problem(seed, lambda p: _key_problem(p, key)) is None


@needs_shared("causalgym", "templates", "syntaxgym.json")
@pytest.mark.parametrize("name", GRAMMAR_MODELS)
def test_each_grammar_model_config_asks_for_its_seed(name, monkeypatch, tmp_path):
    from cprobe.models.tiny import tiny_model_dir

    asked = _found(monkeypatch)
    node = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml").tiny)
    try:
        tiny_model_dir(name, node, tmp_path, progress=False, data_root=SHARED_DATA)
    except FileNotFoundError:
        pytest.fail(f"conf/model/{name}.yaml asks for {asked[-1]}, which tests/data/models lacks: refresh the seeds "
                    "(tests/data/models/README.md)")
    assert len(asked) == 1


@pytest.mark.parametrize("name", sorted(FACT_MODELS))
def test_each_fact_model_config_asks_for_its_seed(name, monkeypatch):
    from cprobe.data.fact_world import generate_world
    from cprobe.data.registry import load_dataset
    from cprobe.models.zoo import fact_model_dir

    asked = _found(monkeypatch)
    node = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "dataset" / f"{FACT_MODELS[name]}.yaml"))
    data = load_dataset(node, SHARED_DATA)
    model = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml"), resolve=False)
    path = fact_model_dir(model, generate_world(data.world.keys, data.name), Path("unused"), progress=False)
    assert path.is_dir(), (f"conf/model/{name}.yaml asks for {asked[-1]}, which tests/data/models lacks: refresh the "
                           "seeds (tests/data/models/README.md)")


def test_seeding_fills_only_missing_entries_and_stays_off_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(TRAIN_ENV, raising=False)
    seeds = tmp_path / "seeds"
    for name in ("tiny-bert-aaaa", "tiny-neox-bbbb"):
        (seeds / name).mkdir(parents=True)
        (seeds / name / "training.json").write_text("{}")
    cache = tmp_path / "cache"
    (cache / "models" / "tiny-neox-bbbb").mkdir(parents=True)  # the cache's own: kept as it is
    assert seed_models(cache, seeds) == ["tiny-bert-aaaa"]
    assert (cache / "models" / "tiny-bert-aaaa" / "training.json").is_file()
    assert not (cache / "models" / "tiny-neox-bbbb" / "training.json").exists()
    assert sorted(p.name for p in (cache / "models").iterdir()) == ["tiny-bert-aaaa", "tiny-neox-bbbb"]  # no temp left
    assert seed_models(cache, seeds) == []
    monkeypatch.setenv(TRAIN_ENV, "1")
    assert seed_models(tmp_path / "other", seeds) == [] and not (tmp_path / "other").exists()


def test_the_summary_names_only_slow_models_trained_in_the_session(tmp_path):
    start = time.time()
    for name, seconds, age in (("tiny-bert-new", 132.4, 0), ("corpus-neox-quick", 4.2, 0), ("tiny-neox-old", 60.0, 3600)):
        d = tmp_path / "models" / name
        d.mkdir(parents=True)
        (d / "training.json").write_text(json.dumps({"train_seconds": seconds}))
        os.utime(d / "training.json", (start - age, start - age))
    assert trained_this_session(tmp_path, since=start - 60) == [("tiny-bert-new", 132.4)]
