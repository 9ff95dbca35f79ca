"""scripts/real_models.sh's commands compose as Hydra composes them (no weights are loaded): each multirun's master
config, then every job of its sweep — what refused `intervention.eps=1` beside `intervention=fgsm,pgd,autoattack`
(the master config has the default intervention, which has no eps) and `dataset.max_examples` on the grammar."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "real_models.sh"


def _commands(tmp_path, model: str, settings: dict[str, str]) -> list[list[str]]:
    """The cprobe argument lists the script runs for ``model`` (a shim in place of cprobe records them)."""
    log = tmp_path / "argv.jsonl"
    shim = tmp_path / "cprobe"
    shim.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    shim.chmod(0o755)
    env = {**os.environ, **settings, "CPROBE": str(shim), "OUT": str(tmp_path / "out")}
    subprocess.run(["bash", str(SCRIPT), model], env=env, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("model,settings", [("gemma3_270m", {}), ("gemma3_270m", {"REL_EPS": "1"}),
                                            ("smollm2_135m", {"REL_EPS": "1", "REL_LAYER": "15"})])
def test_every_command_of_the_script_composes_every_job(tmp_path, model, settings):
    """As the script's defaults and as docs/real_models.md ran it (one budget: a key set, not swept)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    import cprobe.pipeline  # noqa: F401  (the config resolvers)

    commands = _commands(tmp_path, model, settings)
    assert [c[0] for c in commands] == ["run"] * len(commands) and len(commands) == 9, commands
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(REPO / "conf")))
    for argv in commands:
        multirun = "-m" in argv
        args = [a for a in argv[1:] if a != "-m"]
        mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        master = loader.load_configuration("config", overrides=args, run_mode=mode)  # raises as Hydra would
        assert master.model.name == model, shlex.join(argv)
        if not multirun:
            continue
        task = [a for a in args if not a.startswith("hydra.")]
        (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(task), None)
        assert len(jobs) > 1, shlex.join(argv)
        for job in jobs:
            cfg = loader.load_sweep_config(master, job)
            eps = [o.split("=", 1)[1] for o in job if o.lstrip("+").startswith("intervention.eps=")]
            if eps:  # each attack's own budget, set in the job whose intervention has it
                assert cfg.intervention.name in ("fgsm", "pgd", "autoattack") and cfg.intervention.eps == float(eps[0])
