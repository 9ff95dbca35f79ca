"""MIB's format both ways (cprobe.mib_format): submission folders MIB's loader reads, the verifier's logic, files read
only with weights_only=True, MIB's result JSON aggregated as aggregate_results.py does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cprobe import mib_format as F
from cprobe.errors import DataError
from cprobe.models.featurizers import Subspace


def _basis(d: int = 6, k: int = 2, seed: int = 0) -> torch.Tensor:
    Q, _ = torch.linalg.qr(torch.randn(d, k, generator=torch.Generator().manual_seed(seed)))
    return Q


def read_unit(base: Path) -> tuple[Subspace | None, list[int] | None]:
    """The featurizer (None: MIB's identity) and feature indices of the unit files ``{base}_*``."""
    idx = _indices(Path(f"{base}_indices"))
    path = Path(f"{base}_featurizer")
    if not path.exists():
        return None, idx
    info = F.read_checkpoint(path)["model_info"]
    F.read_checkpoint(Path(f"{base}_inverse_featurizer"))
    cls = info.get("featurizer_class")
    if cls == "IdentityFeaturizerModule":
        return None, idx
    if cls == "SubspaceFeaturizerModule":
        R = info.get("additional_config", {}).get("rotation_matrix")
        if not isinstance(R, torch.Tensor) or R.dim() != 2:
            raise DataError(f"{path}: a subspace featurizer without its rotation_matrix")
        return Subspace(R.float()), idx
    raise DataError(f"{path}: featurizer class {cls!r} is not one cprobe reads; it reads {list(F.MODULES[:2])} and "
                    f"{list(F.MODULES[4:6])}")


def _indices(path: Path) -> list[int] | None:
    if not path.is_file():
        return None
    text = path.read_text().strip()
    if text in ("", "null"):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise DataError(f"{path}: not a JSON list of feature indices") from None
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise DataError(f"{path}: not a JSON list of feature indices")
    return value


def _export(tmp_path, model_class="LlamaForCausalLM", variable="answer_pointer"):
    units = [F.Unit(0, "correct_symbol", Subspace(_basis())), F.Unit(1, "last_token", None),
             F.Unit(2, "last_token", None)]  # layer 2 = n_layers: no block_input unit
    return F.export(tmp_path / "sub", "4_answer_MCQA", model_class, variable, units, n_layers=2)


def test_export_writes_mibs_triplets_that_weights_only_reads(tmp_path):
    folder = _export(tmp_path)
    assert folder.name == "4_answer_MCQA_LlamaForCausalLM_answer_pointer"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(f"{F.unit_id(l, p)}{s}" for l, p in ((0, "correct_symbol"), (1, "last_token"))
                           for s in ("_featurizer", "_inverse_featurizer", "_indices"))
    ck = torch.load(folder / f"{F.unit_id(0, 'correct_symbol')}_featurizer", weights_only=True)
    info = ck["model_info"]
    assert info["featurizer_class"] == "SubspaceFeaturizerModule" and info["n_features"] == 2
    torch.testing.assert_close(info["additional_config"]["rotation_matrix"], _basis(), atol=1e-5, rtol=0)
    assert (folder / f"{F.unit_id(0, 'correct_symbol')}_indices").read_text() == "null"


def test_the_state_dict_loads_as_mibs_loader_rebuilds_the_layer(tmp_path):
    """CausalAbstraction's load_modules: a (d, k) rotate layer with the saved rotation matrix, torch's orthogonal
    parametrisation, then load_state_dict — the parametrised weight is the exported basis."""
    folder = _export(tmp_path)
    ck = torch.load(folder / f"{F.unit_id(0, 'correct_symbol')}_featurizer", weights_only=True)
    R = ck["model_info"]["additional_config"]["rotation_matrix"]
    holder = torch.nn.Module()
    holder.rotate = torch.nn.utils.parametrizations.orthogonal(F._Rotate(torch.linalg.qr(torch.randn(6, 2))[0]))
    holder.load_state_dict(ck["state_dict"])
    torch.testing.assert_close(holder.rotate.weight, R, atol=1e-5, rtol=0)
    fz, idx = read_unit(folder / F.unit_id(0, "correct_symbol"))
    torch.testing.assert_close(fz.basis, _basis(), atol=1e-5, rtol=0)
    assert idx is None and read_unit(folder / F.unit_id(1, "last_token")) == (None, None)


def test_verifier_finds_the_triplet_for_mibs_models_and_warns_otherwise(tmp_path):
    _export(tmp_path)
    v = F.verify(tmp_path / "sub")
    assert v.ok and v.triplets == {("4_answer_MCQA", "LlamaForCausalLM", "answer_pointer")}
    assert v.text() == "Perfect submission! No errors or warnings. Found 1 valid triplet(s)."
    other = tmp_path / "o"
    F.export(other, "4_answer_MCQA", "GPTNeoXForCausalLM", "answer", [F.Unit(0, "last_token", None)], 2)
    v = F.verify(other)
    assert not v.ok and v.warnings == ["Skipped directory `4_answer_MCQA_GPTNeoXForCausalLM_answer`: Could not "
                                       "identify valid model name"]
    assert F.verify(other, ("GPTNeoXForCausalLM",)).ok
    F.export(other, "4_answer_MCQA", "GPT2LMHeadModel", "answer", [F.Unit(0, "last_token", None)], 2)
    assert "not in valid combinations" in F.verify(other).warnings[0]  # MIB scores MCQA on three models only


def test_a_file_that_needs_unpickling_is_refused_in_one_line(tmp_path):
    folder = _export(tmp_path)
    torch.save({"model_info": {"featurizer_class": "x"}, "state_dict": {}, "evil": np.dtype("float64")},
               folder / f"{F.unit_id(0, 'correct_symbol')}_featurizer")
    with pytest.raises(DataError, match=r"^.*_featurizer: not readable with torch.load\(weights_only=True\) .*cprobe "
                                        r"never unpickles a file it did not write$"):
        F.verify(tmp_path / "sub")


def test_token_position_files_are_parsed_not_run(tmp_path):
    _export(tmp_path)
    (tmp_path / "sub" / "token_position.py").write_text(
        "raise SystemExit('never run')\ndef get_token_positions(pipeline, model):\n    return [1, 2]\n")
    assert F.verify(tmp_path / "sub").errors[0].startswith("Token position function verification failed")
    (tmp_path / "sub" / "token_position.py").write_text(
        "def get_token_positions(pipeline, model):\n    out = [TokenPosition(f, pipeline, id='last')]\n    return out\n")
    assert F.verify(tmp_path / "sub").ok


def test_results_json_aggregates_as_aggregate_results_does(tmp_path):
    def unit(layer, pos, score):
        return {"metadata": {"layer": layer, "position": pos}, "answer_pointer": {"average_score": score}}
    data = {"method_name": "DAS", "model_name": "Qwen2ForCausalLM", "task_name": "4_answer_MCQA", "dataset": {
        "answerPosition_test": {"model_unit": {"a": unit(0, "x", 0.2), "b": unit(0, "y", 0.6), "c": unit(1, "x", 1.0)}},
        "randomLetter_test": {"model_unit": {"a": unit(0, "x", 0.4), "b": unit(0, "y", 0.2), "c": unit(1, "x", 0.8)}},
        "randomLetter_testprivate": {"model_unit": {"a": unit(0, "x", 0.0)}}}}
    (tmp_path / "r.json").write_text(json.dumps(data))
    t = F.results_table(tmp_path / "r.json")
    # layer 0: max(mean(.2, .4), mean(.6, .2)) = .4; layer 1: .9 -> best .9, mean .65
    got = dict(zip(t["metric"], t["value"]))
    assert got["mib_best"] == pytest.approx(0.9) and got["mib_mean"] == pytest.approx(0.65)
    assert set(t["method"]) == {"das"} and set(t["dataset"]) == {"mcqa"} and set(t["variable"]) == {"answer_pointer"}
    agg = {"('DBM+PCA', 'LlamaForCausalLM', 'arithmetic', 'ones_carry')": {
        "average_accuracy": 0.5, "highest_accuracy": 0.75, "method_name": "DBM+PCA"}}
    (tmp_path / "aggregated_results.json").write_text(json.dumps(agg))
    t = F.results_table(tmp_path / "aggregated_results.json")
    assert list(t["method"]) == ["DBM+PCA"] * 2 and list(t["value"]) == [0.75, 0.5]
    (tmp_path / "other.json").write_text('{"state": "done"}')
    assert F.results_table(tmp_path / "other.json") is None
    assert [p.name for p, _ in F.find_results(tmp_path)] == ["aggregated_results.json", "r.json"]


def test_mibs_aggregates_by_hand():
    iia = np.array([0.2, 0.7, 0.5, 0.4, 0.9, 0.1])
    best, mean, at_layer, at_site = F.aggregates(iia, [0, 0, 1, 1, 2, 2])
    assert (best, at_layer, at_site) == (0.9, 2, 4) and mean == pytest.approx((0.7 + 0.5 + 0.9) / 3)
