"""``examples/quickstart.ipynb`` runs end to end with nbclient on a real ipykernel, offline, from an empty working
directory, at the size it ships with (``SMOKE = True``); then the test checks what the notebook produced, by its own
means: the LEACE-erased states it computed hide ``z_c`` from a fresh scikit-learn probe (and the clean ones do not),
the accuracies it printed are those, the records its two reliability runs wrote hold every headline metric with
finite values and the plugin's provenance, its table is those records, and its figure was drawn. The stored notebook
carries no outputs. Cost: one kernel, ~20-35 s on 2 busy cores with the suite's trained tiny BERT (copied from
the suite's cache, as the README test does; activations and probe fits start cold)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
SHARED_CACHE = Path(os.environ.get("CPROBE_CACHE_DIR", REPO / ".cache" / "cprobe-test"))
HEADLINE = ("oracle_completeness", "oracle_selectivity", "reliability", "delta_task_accuracy")
# appended to the executed copy only: what the notebook computed, for the test to check independently
DUMP = """
import json as _json, numpy as _np
_np.savez("quickstart_state.npz", X=X.numpy(), X_leace=X_leace.numpy(), z=z.numpy(), train=train.numpy(),
          test=test.numpy())
_json.dump({"runs": {"leace": str(run_leace), "lda_projection": str(run_mine)},
            "table": {m: dict(row) for m, row in table.iterrows()}}, open("quickstart_state.json", "w"))
"""


def test_the_notebook_is_stored_small_and_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert NOTEBOOK.stat().st_size < 20_000
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == "python3"
    assert any("SMOKE = True" in c.source for c in code), "the notebook ships at smoke size"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook executed in an empty directory with a cache of its own (the suite's trained models linked in);
    (the executed notebook, its working directory)."""
    cwd = tmp_path_factory.mktemp("notebook_cwd")
    cache = tmp_path_factory.mktemp("notebook_cache")
    (SHARED_CACHE / "models").mkdir(parents=True, exist_ok=True)  # the suite's tiny models, shared (not copied)
    (cache / "models").symlink_to(SHARED_CACHE / "models", target_is_directory=True)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1", "CPROBE_CACHE_DIR": str(cache)}
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(DUMP))
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)  # the kernel is a child process: it inherits this environment
    mp.delenv("CPROBE_SMOKE", raising=False)  # the notebook sets its own size
    try:
        nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        mp.undo()
    return nb, cwd


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _cell(nb, needle: str):
    return next(c for c in nb.cells if c.cell_type == "code" and needle in c.source)


def test_leace_in_the_notebook_hides_z_c_from_an_independent_probe(executed):
    from sklearn.linear_model import LogisticRegression

    nb, cwd = executed
    s = np.load(cwd / "quickstart_state.npz")
    z, train, test = s["z"], s["train"], s["test"]
    assert len(s["X"]) == 400 and set(np.unique(z)) == {0, 1}
    assert not set(train) & set(test) and len(train) + len(test) == len(z)

    def acc(X):
        return LogisticRegression(max_iter=2000).fit(X[train], z[train]).score(X[test], z[test])

    majority = max(z[test].mean(), 1 - z[test].mean())
    before, after = acc(s["X"]), acc(s["X_leace"])
    assert before >= 0.95  # z_c is linearly decodable from the clean states: the erasure has something to remove
    assert abs(after - majority) <= 0.1, (after, majority)
    # the notebook printed these very numbers
    printed = re.search(r"z_c probe: ([\d.]+) -> ([\d.]+) after LEACE \(majority ([\d.]+)\)",
                        _text(_cell(nb, "X_leace = leace.transform(X)")))
    assert printed, _text(_cell(nb, "X_leace = leace.transform(X)"))
    assert [float(x) for x in printed.groups()] == [round(before, 3), round(after, 3), round(majority, 3)]
    agreement = re.search(r"agreement accuracy: ([\d.]+) -> ([\d.]+)", _text(_cell(nb, "X_leace = leace.transform(X)")))
    assert float(agreement.group(1)) >= 0.95 and float(agreement.group(2)) < float(agreement.group(1)) - 0.1
    checks = _text(_cell(nb, "run_checks(LDAProjection)"))
    assert "'passed'" in checks and "failed" not in checks and "error" not in checks, checks


def test_the_runs_wrote_records_with_every_headline_metric_and_the_table_is_them(executed):
    from cprobe.plugin import PLUGIN_API_VERSION

    nb, cwd = executed
    state = json.loads((cwd / "quickstart_state.json").read_text())
    runs = {m: Path(d) for m, d in state["runs"].items()}
    on_disk = sorted(p for p in (cwd / "outputs" / "runs" / "sva_tiny_reliability").iterdir() if p.name != "latest")
    assert sorted(runs.values()) == on_disk  # the directories cprobe.run returned, in the notebook's working dir
    for method, d in runs.items():
        assert json.loads((d / "status.json").read_text())["state"] == "done"
        rec = pd.read_parquet(d / "records.parquet")
        assert set(rec.method) == {method} and set(rec.study) == {"reliability"}
        overall = rec[rec.slice == "{}"].set_index("metric")["value"]
        assert set(HEADLINE) <= set(overall.index), sorted(overall.index)
        assert all(math.isfinite(v) for v in rec.value), rec[["metric", "value"]]
        assert all(0 <= overall[m] <= 1 for m in ("oracle_completeness", "oracle_selectivity", "reliability"))
        c, s_, r = overall["oracle_completeness"], overall["oracle_selectivity"], overall["reliability"]
        assert r == pytest.approx(2 * c * s_ / (c + s_))  # reliability: the harmonic mean of the two
        assert set(rec.plugin_api) == {PLUGIN_API_VERSION}
        for m in HEADLINE:  # the notebook's table is exactly these records
            assert state["table"][method][m] == pytest.approx(overall[m], abs=1e-12)
    leace = pd.read_parquet(runs["leace"] / "records.parquet")
    mine = pd.read_parquet(runs["lda_projection"] / "records.parquet")
    assert set(leace.source) == {"built-in"} and set(mine.source) == {"__main__:LDAProjection"}
    lc = leace[(leace.slice == "{}") & (leace.metric == "oracle_completeness")].value.item()
    assert lc >= 0.8  # LEACE removes z_c for the oracle too


def test_the_notebook_draws_its_figure(executed):
    import base64

    nb, _ = executed
    cell = _cell(nb, "plt.subplots(")
    pngs = [o.data["image/png"] for o in cell.outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG")
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
