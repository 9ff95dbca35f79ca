"""What a failure says in one line: the OSError (and its path) a wrapper's message hides, a CprobeError raised inside a
plugin Hydra instantiates, and the closing line of a sweep whose jobs failed."""

from __future__ import annotations

import logging.config

import pytest

from cprobe.errors import CprobeError, cprobe_cause, one_line
from cprobe.job import failure_line


def test_a_failed_log_handler_names_the_file_and_why(tmp_path):
    """Hydra configures each job's log file with logging.config: a directory where the file goes raises
    "Unable to configure handler 'file'", which names neither; the cause, with its path, is kept."""
    where = tmp_path / "run.log"
    where.mkdir()
    with pytest.raises(ValueError) as e:
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False, "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(where)}}})
    line = one_line(e.value)
    assert line.startswith("Unable to configure handler 'file': IsADirectoryError: [Errno 21] Is a directory: ")
    assert str(where) in line and "\n" not in line


def test_one_line_adds_nothing_a_message_says_already():
    try:
        try:
            raise FileNotFoundError(2, "No such file or directory", "/x/y")
        except OSError as inner:
            raise RuntimeError(f"cannot read: {inner}") from inner
    except RuntimeError as e:
        assert one_line(e) == "cannot read: [Errno 2] No such file or directory: '/x/y'"
    assert one_line(ValueError("two\n  lines ")) == "two; lines" and one_line(KeyError()) == "KeyError"


def test_the_cprobe_error_behind_hydras_instantiation_error():
    """Hydra re-raises what a plugin's constructor raises as "Error in call to target '...': CprobeError(...)"."""
    from hydra.errors import InstantiationException

    cause = CprobeError("hydra/launcher=slurm needs the slurm extra (submitit): pip install 'cprobe[slurm]'")
    try:
        try:
            raise cause
        except CprobeError as e:
            raise InstantiationException(f"Error in call to target 'x.SlurmLauncher':\n{e!r}") from e
    except InstantiationException as wrapped:
        assert cprobe_cause(wrapped) is cause
    assert cprobe_cause(ValueError("plain")) is None


def test_the_closing_line_counts_the_failed_jobs_it_does_not_name():
    failed = [f"p{i}: boom" for i in range(5)]
    assert failure_line(failed, []) == ("5 job(s) failed: p0: boom; p1: boom; p2: boom; and 2 more (`cprobe status "
                                        "DIR` lists them)")
    assert failure_line(failed[:3], []) == "3 job(s) failed: p0: boom; p1: boom; p2: boom"
    assert failure_line(failed[:1], ["the sweep's report failed: x"]) == \
        "1 job(s) failed: p0: boom; the sweep's report failed: x"
    assert failure_line([], ["the sweep's report failed: x"]) == "the sweep's report failed: x"
