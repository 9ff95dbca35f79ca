"""The one way the tests run the `cprobe` command line, in process or as a process, and the count of launches.

- :func:`run`: in process. The Typer app the console script calls (``cprobe.cli.app``), with the test's argv,
  environment and working directory: the same code as a user's `cprobe ...` (Hydra composes, the pipeline validates
  and refuses or runs the job, ``user_errors`` prints the one line and picks the exit code), without a new
  interpreter's start-up (about 4 s of imports per launch on a CI core). Config errors and the README's commands
  run this way.
- :func:`launch` / :func:`start`: the installed console script as a process, for what only a process shows: exit
  codes and stderr as a shell sees them, start-up time and imports, signals.
- :func:`assert_refused`: the bad-input contract (exit 1, one line starting ``error:``, no traceback, nothing left
  under the output root), whichever way the command ran.

Every process the suite starts is counted (:func:`count_processes`, installed by ``tests/conftest.py``, which prints
the counts in the summary): `cprobe` launches apart, the target is at most :data:`LAUNCH_TARGET` per suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("cprobe")
LAUNCH_TARGET = 30
COUNTS: Counter[str] = Counter()
"""``cprobe`` (console-script launches), ``other`` (any other subprocess: python -c, benchmark scripts, Chromium,
the portable trainer) and ``in_process`` (:func:`run` calls); ``cprobe@FILE``: the launches made by FILE's tests."""


@dataclass(frozen=True)
class Result:
    """What a command left: the fields of :class:`subprocess.CompletedProcess` that the tests read."""

    returncode: int
    stdout: str
    stderr: str


def default_env(extra: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """The suite's environment for a command: offline, no progress bars, the suite's cache unless set."""
    env: dict[str, str | None] = {"TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    if not os.environ.get("CPROBE_CACHE_DIR"):
        env["CPROBE_CACHE_DIR"] = str(REPO / ".cache" / "cprobe-test")
    env.update(extra or {})
    return env


# What a job keeps for the rest of its process (module, attribute): the loaded model (consecutive sweep jobs share it,
# keyed by the model's config only, not the cache root), the fitted probes and the thread policy it applied. A new process starts without them, so
# an in-process run does too: a "warm" run reads the model from the disk cache, not from the run before it, and
# nothing fitted under one test's cache root serves another test's.
PROCESS_MEMOS = (("cprobe.job", "_ADAPTER"), ("cprobe.tasks.sites", "_MEMO"), ("cprobe.compute", "_POLICY"))


# What a job adds to process-wide tables (module, attribute): the outside metrics it resolved by name or import path,
# and every family registry's outside objects resolved by import path (``Registry._resolved``). A new process starts
# with the built-ins only, so after an in-process run the tables are given back as they were (a plugin's module removed
# from sys.modules and imported again by a later test is then a new object, resolved anew under its own name).
PROCESS_TABLES = (("cprobe.metrics.registry", "METRICS"), ("cprobe.metrics.registry", "SOURCES"))


def _table_snapshot() -> list[Callable[[], None]]:
    """One callable per process-wide table that gives it back as it is now."""
    import importlib

    from cprobe.registry import REGISTRIES

    def table(t: dict) -> Callable[[], None]:
        before = dict(t)
        return lambda: (t.clear(), t.update(before))

    def resolved(reg: Any) -> Callable[[], None]:
        before = dict(reg._resolved)
        return lambda: setattr(reg, "_resolved", before)

    return ([table(getattr(importlib.import_module(m), a)) for m, a in PROCESS_TABLES]
            + [resolved(reg) for reg in REGISTRIES.values()])


def _clear_process_memos() -> None:
    for module, name in PROCESS_MEMOS:
        if module in sys.modules:
            getattr(sys.modules[module], name).clear()


@contextmanager
def _restored_process_state(cwd: Path | None) -> Iterator[None]:
    """What a job changes in its process and a test process must get back: the working directory, the root
    logger's handlers (Hydra's job logging points them at the run's log file and the captured stdout), torch's
    thread count, the global Hydra instance, the environment (the CLI sets ``HYDRA_FULL_ERROR`` for its process;
    libraries set theirs on first import); and the job's process-wide memos (:data:`PROCESS_MEMOS`), empty before
    and after, as in a new process, and its process-wide tables (:data:`PROCESS_TABLES`) as they were before."""
    import logging

    _clear_process_memos()
    tables = _table_snapshot()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    threads = None
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    here, environ = os.getcwd(), dict(os.environ)
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        for k in set(os.environ) - set(environ):
            del os.environ[k]
        os.environ.update(environ)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
        if threads is not None and sys.modules["torch"].get_num_threads() != threads:
            sys.modules["torch"].set_num_threads(threads)
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        _clear_process_memos()
        for give_back in tables:
            give_back()


def run(*args: str, cwd: Path | str | None = None, env: Mapping[str, str | None] | None = None) -> Result:
    """``cprobe *args`` in this process (see the module doc); ``env`` adds to (None: removes from) the environment
    for the call only."""
    from typer.testing import CliRunner

    from cprobe.cli import app

    COUNTS["in_process"] += 1
    with _restored_process_state(Path(cwd) if cwd is not None else None):
        r = CliRunner().invoke(app, list(args), env=default_env(env), catch_exceptions=True)
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):  # as a process would print it
        stderr += "".join(traceback.format_exception(r.exception))
    return Result(r.exit_code, r.stdout, stderr)


def _process_env(env: Mapping[str, str | None] | None) -> dict[str, str]:
    merged: dict[str, str | None] = {**os.environ, **default_env(env)}
    return {k: v for k, v in merged.items() if v is not None}


def launch(*args: str, cwd: Path | str = REPO, env: Mapping[str, str | None] | None = None,
           timeout: float = 1500) -> subprocess.CompletedProcess:
    """``cprobe *args`` as a process (the installed console script); ``env`` as for :func:`run`."""
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, cwd=cwd, env=_process_env(env),
                          timeout=timeout)


def start(*args: str, cwd: Path | str = REPO, env: Mapping[str, str | None] | None = None,
          **popen: object) -> subprocess.Popen:
    """``cprobe *args`` as a running process (pipes for stdout and stderr), for signal tests."""
    return subprocess.Popen([str(EXE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=_process_env(env), **popen)  # type: ignore[call-overload]


def assert_refused(r: Result | subprocess.CompletedProcess, needle: str, output_root: Path | None = None) -> str:
    """The bad-input contract: exit code 1, one line on stderr starting with ``error:`` and containing ``needle``,
    no traceback, and (``output_root``) no file under the output root — no run directory, no status.json. Returns
    the line."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    if output_root is not None and Path(output_root).exists():
        left = [p for p in Path(output_root).rglob("*") if p.is_file()]
        assert not left, left
    return lines[0]


def count_processes() -> None:
    """Count every subprocess the test process starts (``subprocess.Popen``, which ``subprocess.run`` uses):
    `cprobe` launches apart from the others. Installed once by ``tests/conftest.py``."""
    if getattr(subprocess.Popen, "_cprobe_counted", False):
        return
    real_init = subprocess.Popen.__init__

    def counting_init(self, args, *a, **kw):  # type: ignore[no-untyped-def]
        first = args if isinstance(args, str | bytes | os.PathLike) else (list(args) or [""])[0]
        name = Path(os.fsdecode(first).split()[0] if isinstance(args, str | bytes) else os.fsdecode(first)).name
        COUNTS["cprobe" if name == "cprobe" else "other"] += 1
        if name == "cprobe":
            COUNTS["cprobe@" + os.environ.get("PYTEST_CURRENT_TEST", "?").split("::", 1)[0]] += 1
        real_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = counting_init  # type: ignore[method-assign]
    subprocess.Popen._cprobe_counted = True  # type: ignore[attr-defined]


def summary() -> str:
    """The counts as one line for the pytest summary."""
    n = COUNTS["cprobe"]
    flag = "" if n <= LAUNCH_TARGET else f" — above the target of {LAUNCH_TARGET}"
    by_file = sorted(((k.split("@", 1)[1], v) for k, v in COUNTS.items() if k.startswith("cprobe@")),
                     key=lambda kv: (-kv[1], kv[0]))
    where = f" [{', '.join(f'{f}: {v}' for f, v in by_file)}]" if by_file else ""
    return (f"cprobe: {n} process launch(es) (target <= {LAUNCH_TARGET}{flag}){where}, {COUNTS['in_process']} "
            f"in-process CLI run(s); {COUNTS['other']} other subprocess(es)")
