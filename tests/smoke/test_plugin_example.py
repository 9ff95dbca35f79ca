"""The worked example, as a researcher uses it: ``examples/cprobe-plugin-example`` installed with ``pip install -e``
(offline, into a scratch target, so the suite's environment is left as it was), listed by ``cprobe plugins``,
checked by ``cprobe check`` (in process), then run from the CLI — one sweep, in process — on the reliability study
(one site with the package's metric; two sites read at every later layer), CausalGym, CEBaB and LIBERTy at smoke
size, with no line of cprobe changed; the sweep's leaderboard lists the package's methods beside the built-ins, with
its name and version."""

from __future__ import annotations

import os
import subprocess
import sys
import pandas as pd
import pytest

from tests.cli import run
from tests.conftest import REPO, SHARED_DATA

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "cprobe-plugin-example"
SOURCE = "cprobe-plugin-example 0.1.0"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example installed editable into a scratch target (its metadata: the entry points; its code: ``src``)."""
    target = tmp_path_factory.mktemp("plugin_site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), "-e", str(EXAMPLE)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (target / "cprobe_plugin_example-0.1.0.dist-info" / "entry_points.txt").is_file()
    return [str(target), str(EXAMPLE / "src")]


@pytest.fixture
def in_process(installed, monkeypatch):
    from cprobe.registry import refresh_plugins

    for p in reversed(installed):
        monkeypatch.syspath_prepend(p)
    refresh_plugins()
    yield
    monkeypatch.undo()
    sys.path[:] = [p for p in sys.path if p not in installed]
    refresh_plugins()


def test_cprobe_plugins_lists_the_package_and_cprobe_check_passes_on_it(in_process):
    from typer.testing import CliRunner

    from cprobe.cli import app

    out = CliRunner().invoke(app, ["plugins"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()[2:]
    for name in ("spectral", "trimmed_mean", "mean_shift", "edit_norm"):
        row = next(line for line in lines if f" {name} " in line)
        assert SOURCE in row and row.rstrip().endswith("ok"), out.output
    out = CliRunner().invoke(app, ["check", "--package", "cprobe-plugin-example"])
    assert out.exit_code == 0, out.output
    assert " failed" not in out.output and "passed" in out.output.splitlines()[-1]
    for check in ("spectral      intervention", "check_nullifying_erases", "check_edit_direction",
                  "trimmed_mean", "check_finds_planted_direction", "mean_shift", "edit_norm"):
        assert check in out.output


EXPERIMENTS = {
    "plug_reliability": """
        defaults:
          - /debug/smoke
          - override /model: tiny_bert_sva
          - override /dataset: synthetic_sva
          - override /split: reliability
          - override /probe: all
          - override /intervention: custom
          - _self_
        name: plug_reliability
        task: reliability
        layers: last
        intervention: {{name: spectral}}
        metrics: [edit_norm]
        reliability: {{target: z_c, others: [z_e]}}
    """,
    "plug_sites": """
        defaults:
          - /debug/smoke
          - override /model: tiny_bert_sva
          - override /dataset: synthetic_sva
          - override /split: reliability
          - override /probe: all
          - override /intervention: custom
          - _self_
        name: plug_sites
        task: reliability
        layers: last
        intervention: {{name: cprobe_plugin_example.eraser:SpectralEraser}}
        reliability: {{target: z_c, others: [z_e], sites: [3, 4], read_layers: all}}
    """,
    "plug_causalgym": """
        defaults:
          - /debug/smoke
          - override /model: tiny_neox_causalgym
          - _self_
        name: plug_causalgym
        task: causalgym
        layers: [1, 2]
        model: {{tiny: {{train: {{steps: 30, layers: 2}}, grammar: {{n_sentences: 300}},
                         causalgym_corpus: {{templates: {templates}, n_per_task: 50, tasks: [agr_sv_num_pp]}}}}}}
        causalgym: {{templates: {templates}, tasks: [agr_sv_num_pp], n_train: 8, n_eval: 4,
                    methods: [mean, trimmed_mean, spectral], random_draws: 2,
                    oracle_probe: {{name: mlp, widths: [32], lrs: [0.01], epochs: 4, n_layers: [1]}}}}
    """,
    "plug_cebab": """
        defaults:
          - /debug/smoke
          - override /model: bert_base_uncased
          - override /dataset: cebab
          - override /probe: null
          - override /split: null
          - _self_
        name: plug_cebab
        task: cebab
        model: {{path: {cebab_encoder}, finetune: {{lr: 0.003, max_length: 64}}}}
        cebab: {{explainers: [random, mean_shift, via_spectral, via_trimmed_mean_direction]}}
    """,
    "plug_liberty": """
        defaults:
          - /debug/smoke
          - base/liberty
          - override /dataset: liberty_cv
          - override /model: bert_base_uncased
          - _self_
        name: plug_liberty
        dataset: {{scm: {scm}, n_explained: 150, n_explainer: 60}}
        model: {{path: {liberty_encoder}, finetune: {{lr: 0.003}}}}
        liberty: {{explainers: [random, mean_shift, via_spectral], mc_samples: 2000, finetune: {{max_length: 64}},
                  concept_model: {{max_length: 64}}}}
    """,
}


@pytest.fixture(scope="module")
def sweep(installed, tmp_path_factory):
    """One `cprobe run -m` over the five jobs (in process: ``tests.cli.run``), the example on the path as installed; each experiment
    takes the smoke sizes (``/debug/smoke``) before its own settings."""
    if not (SHARED_DATA / "causalgym" / "templates" / "syntaxgym.json").is_file():
        pytest.skip(f"needs {SHARED_DATA}/causalgym/templates (the shared data dir; set CPROBE_DATA_DIR)")
    from tests.cebab_fixtures import tiny_encoder_dir as cebab_encoder
    from tests.cebab_fixtures import write_cebab
    from tests.liberty_fixtures import tiny_encoder_dir as liberty_encoder
    from tests.liberty_fixtures import write_scm

    root = tmp_path_factory.mktemp("plugin_sweep")
    write_cebab(root / "cebab_data", n_train=40, n_eval=8)
    paths = {"templates": SHARED_DATA / "causalgym" / "templates" / "syntaxgym.json",
             "cebab_encoder": cebab_encoder(root / "cebab_encoder"), "scm": write_scm(root / "tiny.yaml"),
             "liberty_encoder": liberty_encoder(root / "liberty_encoder")}
    conf = root / "conf" / "experiment"
    conf.mkdir(parents=True)
    import textwrap

    for name, body in EXPERIMENTS.items():
        (conf / f"{name}.yaml").write_text("# @package _global_\n" + textwrap.dedent(body).format(**paths))
    env = {"PYTHONPATH": os.pathsep.join([*installed, os.environ.get("PYTHONPATH", "")]),
           "CPROBE_DATA_DIR": str(root / "cebab_data")}
    out = root / "sweep"
    from cprobe.registry import refresh_plugins

    sys.path[:0] = installed  # as PYTHONPATH puts them for a new interpreter
    refresh_plugins()
    try:
        r = run("run", "-m", f"+experiment={','.join(EXPERIMENTS)}", "device=cpu",
                f"hydra.searchpath=[file://{root / 'conf'}]", f"hydra.sweep.dir={out}",
                # the experiment is left out of job dir names (every other sweep fixes it): name them by it
                "hydra.sweep.subdir=${name}", cwd=root, env=env)
    finally:
        sys.path[:] = [p for p in sys.path if p not in installed]
        refresh_plugins()
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Traceback" not in r.stderr
    return out


def test_the_example_runs_on_every_yardstick_and_sits_on_the_leaderboard_with_its_provenance(sweep):
    board = pd.read_parquet(sweep / "leaderboard.parquet")
    mine = board[board["source"] == SOURCE]
    got = set(zip(mine["study"], mine["method"]))
    assert {("reliability", "spectral"), ("reliability", "cprobe_plugin_example.eraser:SpectralEraser"),
            ("causalgym", "trimmed_mean"), ("causalgym", "spectral"), ("causalgym", "spectral_dir"),
            ("cebab", "mean_shift"), ("cebab", "via_spectral"), ("cebab", "via_trimmed_mean_direction"),
            ("liberty", "mean_shift"), ("liberty", "via_spectral")} <= got, sorted(got)
    builtin = board[board["source"] == "built-in"]
    assert {("causalgym", "mean"), ("cebab", "random"), ("liberty", "random")} <= set(zip(builtin["study"],
                                                                                         builtin["method"]))
    # the package's metric, on the leaderboard as a headline (lower is better), one site and none other
    norm = board[board["metric"] == "edit_norm"]
    assert list(norm["method"]) == ["spectral"] and (norm["direction"] == "lower").all()
    assert ((norm["mean"] > 0) & (norm["mean"] < 2)).all()
    # downstream read layers and two sites: C/S/R at every read layer from the deepest edit on
    sites = board[(board["method"] == "cprobe_plugin_example.eraser:SpectralEraser")
                  & (board["metric"] == "reliability")]
    assert sorted(sites["read_layer"].astype(int)) == [4] and "sites" in str(sites["setting"].iloc[0])
    recs = pd.read_parquet(sweep / "records.parquet")
    plug = recs[recs["source"] == SOURCE]
    assert (plug["plugin_api"] == 1).all() and {"reliability", "causalgym", "cebab", "liberty"} <= set(plug["study"])
    assert "cprobe-plugin-example" in (sweep / "leaderboard.md").read_text()
    assert "cprobe-plugin-example 0.1.0" in (sweep / "report.html").read_text()
