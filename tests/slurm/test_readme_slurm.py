"""The README's SLURM lines run exactly as written, in README order, on the test cluster (at smoke size): the
attached sweep, the detached one, `cprobe status` of it and — once it has finished — `cprobe collect`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests import cli
from tests.slurm.conftest import REPO, run, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

LATEST = "outputs/sweeps/sva_tiny/latest"


def readme_lines() -> list[tuple[str, str | None]]:
    from tests.study_runs import readme_commands

    return readme_commands((REPO / "README.md").read_text())


def _state(point: Path) -> str | None:
    try:
        return json.loads((point / "status.json").read_text()).get("state")
    except (OSError, ValueError):
        return None


def test_readme_slurm_lines_run_as_written(slurm_env, tmp_path):
    lines = readme_lines()
    slurm_lines = [c for c, n in lines if n == "slurm"]
    assert len(slurm_lines) == 2 and any("--detach" in c for c in slurm_lines)
    follow = [c for c, n in lines if n is None and c.startswith(("cprobe status ", f"cprobe collect {LATEST}"))]
    assert [c.split()[1] for c in follow] == ["status", "collect"]
    env = {**slurm_env, "CPROBE_SMOKE": "1"}
    for command in slurm_lines:
        r = run(shlex.split(command, comments=True)[1:], tmp_path, env)
        assert r.returncode == 0, f"`{command}` failed:\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr
    attached = sorted(p for p in (tmp_path / "outputs" / "sweeps" / "sva_tiny").iterdir() if p.name != "latest")[0]
    assert (attached / "results.csv").is_file() and (attached / "report.html").is_file()
    log = r.stdout + r.stderr  # the detached run: sweep dir and job id, nothing aggregated yet
    assert "detached: 2 point(s) submitted as SLURM job" in log and "sweep dir:" in log
    assert not (tmp_path / LATEST / "results.csv").exists()
    status_line, collect_line = follow
    r = cli.run(*shlex.split(status_line)[1:], cwd=tmp_path, env=env)  # in process, as the collect below
    assert r.returncode == 0, r.stdout + r.stderr  # queued / running / done: nothing needs a re-run
    assert "2 point(s)" in r.stdout and "SLURM job" in r.stdout

    points = [tmp_path / LATEST / n for n in json.loads((tmp_path / LATEST / ".slurm" / "sweep.json").read_text())
              ["points"]]

    def finished():  # the points' own status files (cheaper than a `cprobe status` process per poll)
        return all(_state(p) == "done" for p in points)

    wait_for(finished, 150, "the detached sweep to finish")
    r = cli.run(*shlex.split(collect_line)[1:], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / LATEST / "results.csv").is_file()
    manifest = json.loads((tmp_path / LATEST / ".slurm" / "sweep.json").read_text())
    sub = manifest["submissions"][-1]
    assert sub["detached"] and sub["request"]["gpus"] == 0 and sub["request"]["partition"]
    assert sorted(Path(n).name for n in manifest["points"]) == ["layers=3,probe=linear", "layers=4,probe=linear"]
