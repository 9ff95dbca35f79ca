"""``report.html``: one self-contained page per run and per collected directory (``cprobe report DIR`` rebuilds it).

The page holds the leaderboard, every table and figure the run wrote (figures embedded as ``data:`` URIs), the
config, the environment, timings and warnings — inline CSS, no script, nothing fetched: it opens from disk and can
be sent as one file. It is built from the files in the directory only (see :mod:`cprobe.report.html`).
"""

from __future__ import annotations

from cprobe.report.environment import ENVIRONMENT, environment, write_environment
from cprobe.report.html import REPORT, build_report, render

__all__ = ["ENVIRONMENT", "REPORT", "build_report", "environment", "render", "write_environment"]
