"""The README is an executable spec: every `cprobe` command line in its ```bash blocks runs exactly as written,
in README order, from one empty working directory, at smoke size (CPROBE_SMOKE=1) — in process, through the Typer
app the console script calls (``tests.cli.run``), but for ``LAUNCHED`` lines (`cprobe version`, `cprobe list`),
which run as real processes. The study lines (one plain run per study, ``tests/study_runs.py``) run once per session,
first, by the fixture ``readme_study_runs``, whose runs the study tests read too (``study_runs``); their tests here
assert on that fixture's results. After every command the test process has its working directory, ``sys.path`` and
environment back.

A trailing `# needs: hub` marks a command that needs a model download: it must fail fast with the one-line
instructions. `# needs: slurm` marks a command that needs a SLURM cluster: its first sweep point must compose
with the SLURM launcher (`--cfg hydra`, which Hydra accepts only without `-m`). `# needs: example` marks a command
that uses the example plugin's code (`examples/cprobe-plugin-example`): it runs with that code on the path.
`# needs: real` marks a command on a real model of the extra ``cprobe[real-models]``: without the extra it must fail
fast with the one-line instruction naming it; with it the command composes (its run is `make test-real`'s).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.study_runs import (COMMANDS, LAUNCHED, STUDY_LINES, changed, environment_snapshot, real_models_installed,
                              run_readme_line)

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("CPROBE_DATA_DIR", REPO.parent / "shared" / "data"))
pytestmark = pytest.mark.slow


def readme_python_blocks(text: str) -> list[str]:
    """The source of every ```python block."""
    out, block = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is not None:
                out.append("\n".join(block) + "\n")
                block = None
            elif line.strip() == "```python":
                block = []
            continue
        if block is not None:
            block.append(line)
    return out


PYTHON_BLOCKS = readme_python_blocks((REPO / "README.md").read_text())


def test_the_readme_has_commands_of_every_kind():
    kinds = {c.split()[1] for c, _ in COMMANDS}
    assert {"run", "list", "data", "collect", "cache", "version"} <= kinds
    assert any(" -m " in c for c, _ in COMMANDS) and {n for _, n in COMMANDS} >= {None, "hub", "slurm", "real"}
    assert set(LAUNCHED) <= {c for c, _ in COMMANDS}  # the console script itself runs some README lines


def test_every_study_has_its_readme_line():
    """The study runs the suite reads are the README's own lines: one plain run per study's experiment."""
    assert STUDY_LINES == {
        "probing": "cprobe run --smoke +experiment=sva_tiny",
        "reliability": "cprobe run +experiment=sva_tiny_reliability intervention=pgd intervention.eps=0.5",
        "causalgym": "cprobe run +experiment=causalgym 'causalgym.tasks=[agr_sv_num_pp]'",
        "cebab": "cprobe run +experiment=cebab", "liberty": "cprobe run +experiment=liberty_cv",
        "prompt_bias": "cprobe run +experiment=lama_bias", "axbench": "cprobe run +experiment=axbench_detect",
        "ravel": "cprobe run +experiment=ravel_tiny", "mib": "cprobe run +experiment=mib_tiny"}


@pytest.mark.parametrize("command,needs", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command(command, needs, readme_dirs, request):
    if not SHARED_DATA.is_dir() and any(k in command for k in ("lgd", "causalgym", "marvin", "dataset=ravel")):
        pytest.skip(f"needs the shared data dir {SHARED_DATA} (set CPROBE_DATA_DIR); CI has it")
    studies = {line: study for study, line in STUDY_LINES.items()}
    before = environment_snapshot()
    if command in studies:  # run once per session, by the fixture the study tests read too
        run = request.getfixturevalue("readme_study_runs")[studies[command]]
        r = run.result
        assert r.returncode != 0 or run.run_dir.is_dir(), run
    else:
        r = run_readme_line(command, needs, readme_dirs)
    assert not changed(before, environment_snapshot()), "a README command left the test process changed"
    if needs == "hub":
        assert r.returncode == 1, r.stderr[-3000:]
        assert "huggingface-cli download" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        return
    if needs == "real" and not real_models_installed():
        assert r.returncode == 1, r.stderr[-3000:]
        assert "cprobe[real-models]" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        return
    assert r.returncode == 0, f"`{command}` failed:\n{r.stderr[-4000:]}"
    assert "Traceback" not in r.stderr
    assert "\r" not in r.stderr, "progress bars in a non-terminal log"
    if needs == "slurm":
        assert "SlurmLauncher" in r.stdout
    if needs == "example":  # its code is gone from the process again, as from a shell without the plugin
        assert not any(m.split(".")[0] == "cprobe_plugin_example" for m in sys.modules)
    if "model=minilm_l6 dataset=lgd" in command:
        _check_minilm_on_lgd(r, readme_dirs)
    if "hydra/launcher=local_parallel" in command:  # joblib's worker processes ran the jobs; this one aggregated
        import pandas as pd

        sweep = (readme_dirs.workdir / "outputs" / "sweeps" / "sva_tiny" / "latest").resolve()
        assert sorted(p.parent.name for p in sweep.glob("*/status.json")) == ["layers=last,probe=linear", "layers=last,probe=mlp"]
        assert set(pd.read_csv(sweep / "results.csv")["probe"]) == {"linear", "mlp"}


def _check_minilm_on_lgd(r, dirs) -> None:
    """The real MiniLM (an encoder: no LM head) on LGD (no attractor numbers), offline: z_c probed at every layer on
    the smoke size's 400 sentences (240 train), z_e skipped with a note in the log and in the table, task accuracy
    n/a, and the majority baseline LGD's share of singular subjects (63.5 %)."""
    import pandas as pd

    assert "skipping property z_e" in r.stdout + r.stderr
    (run,) = (dirs.workdir / "outputs" / "runs" / "sva_tiny").glob("*_dataset=lgd,model=minilm_l6")
    t = pd.read_parquet(run / "metrics.parquet")
    assert t["task_accuracy"].isna().all()
    assert set(t["property"]) == {"z_c"} and sorted(t["layer"].unique()) == list(range(7))
    assert t["n_dropped"].eq(0).all() and t["n_train"].eq(240).all()
    assert t["dataset_source"].eq("lgd_agreement/lgd_subset.tsv").all()
    assert t["warnings"].str.contains("skipping property z_e").all()
    assert t["majority"].between(0.6, 0.67).all(), t["majority"]


def test_the_readme_has_a_python_section():
    assert len(PYTHON_BLOCKS) == 1 and "cprobe.load_model(" in PYTHON_BLOCKS[0]
    assert 10 <= len(PYTHON_BLOCKS[0].splitlines()) <= 25


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"python-{i}" for i in range(len(PYTHON_BLOCKS))])
def test_readme_python_block_runs_as_written(block, readme_dirs):
    """The library path: the block runs exactly as written (full size, not smoke) and prints what it says."""
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "CPROBE_CACHE_DIR": str(readme_dirs.cache)}
    env.pop("CPROBE_SMOKE", None)
    workdir = readme_dirs.workdir
    script = workdir / "readme_block.py"
    script.write_text(block)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=workdir, env=env,
                       timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    out = r.stdout.splitlines()
    assert out[0] == "['pl', 'sg'] (600, 128) 1.0", out
    after_leace = float(out[1].rsplit(" ", 1)[1])
    assert 0.35 <= after_leace <= 0.65, out[1]  # z_c erased: the probe is at chance
    before, after = (float(x) for x in out[2].split(": ")[1].split(" -> "))
    assert before >= 0.95 and after < before, out[2]  # the model used z_c for agreement


def readme_notebook_lines(text: str) -> list[str]:
    """Every line starting with `jupyter ` inside ```bash blocks."""
    out, in_bash = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if in_bash and line.startswith("jupyter "):
            out.append(line)
    return out


def test_readme_notebook_lines_run_the_notebook_the_suite_executes():
    """A `jupyter execute NOTEBOOK` line names a notebook in the repo that tests/smoke/test_notebook.py executes end to
    end and checks (so it is not run a second time here)."""
    from tests.smoke.test_notebook import NOTEBOOK

    lines = readme_notebook_lines((REPO / "README.md").read_text())
    assert lines, "the README's Usage shows how to run the quickstart notebook"
    for line in lines:
        argv = shlex.split(line, comments=True)
        assert argv[:2] == ["jupyter", "execute"] and len(argv) == 3, line
        assert (REPO / argv[2]).resolve() == NOTEBOOK.resolve() and NOTEBOOK.is_file(), line
