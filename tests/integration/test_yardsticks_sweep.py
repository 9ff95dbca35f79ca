"""The yardsticks' one sweep line (docs/methods.md, "One sweep line, four yardsticks") at smoke size: every study scores
the same methods, each job in a folder of its own, and the sweep's ``yardsticks.csv`` puts the four studies' headline
metrics of one method side by side."""

from __future__ import annotations

import pandas as pd
import pytest

from tests import cli
from tests.cli import REPO
from tests.conftest import needs_shared

STUDY_COLUMNS = {"reliability": "reliability: reliability ↑", "causalgym": "causalgym: overall odds-ratio ↑",
                 "axbench": "axbench: detection AUROC ↑ [concept=z_c=pl]", "ravel": "ravel: disentanglement ↑",
                 "mib": "mib: MIB mean over layers ↑ [variable=answer_pointer]"}


@pytest.mark.slow
@needs_shared("causalgym", "templates", "syntaxgym.json")  # the grammar studies' tiny model is trained on it
def test_one_sweep_line_scores_the_same_method_on_all_four_yardsticks(tmp_path):
    # DAS: the method that trains through the model in every study (the unit tests compose all five methods)
    r = cli.run("run", "-m", "+experiment=glob(yardsticks_*)", "method=das", "--smoke", "progress=false",
                f"hydra.sweep.dir={tmp_path}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p.parent.name for p in tmp_path.glob("*/status.json"))
    assert jobs == sorted(f"experiment=yardsticks_{s},method=das" for s in STUDY_COLUMNS)  # a folder each
    y = pd.read_csv(tmp_path / "yardsticks.csv", dtype=str)
    das = y[y["method"] == "das"]
    grammar = das[(das["model"] == "tiny_neox_causalgym") & (das["layer"] == "4")]
    assert len(grammar) == 1, das[["model", "layer"]]  # one row: the three grammar studies on one model and layer
    for study in ("reliability", "causalgym", "axbench"):
        assert grammar[STUDY_COLUMNS[study]].notna().all(), study
    assert grammar["causalgym: max IIA ↑"].notna().all()  # IIA: a headline column of its own
    ravel = das[das["model"] == "fact_neox_ravel"]  # RAVEL reads the fact world's model
    assert len(ravel) and ravel[STUDY_COLUMNS["ravel"]].notna().all()
    assert (y["method"] == "mdas").any()  # RAVEL's DAS job also trains multi-task DAS, a row of its own
    mib = das[das["model"] == "mib_neox_smoke"]  # MIB reads the tiny model trained on its tasks
    assert len(mib) and mib[STUDY_COLUMNS["mib"]].notna().all()
    assert mib["mib: MIB best layer ↑ [variable=answer_pointer]"].notna().all()
