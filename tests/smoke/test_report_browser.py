"""The HTML reports in a real browser: headless Chromium (over its DevTools protocol, tests/browser.py) opens every
study run's report.html (the README's study runs, ``study_runs``), the page collected over all of them and the pages
of the README's sva_tiny sweeps and their jobs, takes a screenshot, and fails on console errors, uncaught exceptions, requests that leave the machine,
broken images and empty tables.

Without Chromium the tests skip (locally); CI sets CPROBE_REQUIRE_CHROMIUM=1 (``.ci/run`` installs Debian's
``chromium``), so there a missing browser fails instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser import Browser, check_page, chromium
from tests.study_runs import COMMANDS, run_readme_line

BROWSER = chromium()
if BROWSER is None and os.environ.get("CPROBE_REQUIRE_CHROMIUM", "") not in ("", "0"):
    raise RuntimeError("CPROBE_REQUIRE_CHROMIUM is set but no Chromium was found (apt-get install -y chromium)")
SWEEP_LINE = "cprobe run -m +experiment=sva_tiny probe=linear,mlp layers=last"
assert (SWEEP_LINE, None) in COMMANDS, "the README's sweep of sva_tiny changed: update SWEEP_LINE"
needs_browser = pytest.mark.skipif(BROWSER is None, reason="needs Chromium: apt-get install -y chromium (.ci/run "
                                   "installs it), or CPROBE_CHROMIUM=/path/to/chrome")

BAD_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>bad</title></head><body>
<img alt="gone" src="missing.png"><table><thead><tr><th>a</th></tr></thead><tbody></tbody></table>
<script>console.error("oops"); fetch("http://example.invalid/x").catch(() => {}); throw new Error("kaput");</script>
</body></html>"""


@needs_browser
def test_the_check_fails_on_what_a_reader_would_see_wrong(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(BAD_PAGE)
    found = "\n".join(check_page(page).problems())
    for needle in ("console error: oops", "uncaught exception: Error: kaput", "network request: http://example.invalid",
                   "broken image: gone", "empty table"):
        assert needle in found, found
    ok = tmp_path / "ok.html"
    ok.write_text("<!DOCTYPE html><html><head><title>ok</title></head><body><table><thead><tr><th>a</th></tr></thead>"
                  "<tbody><tr><td>1</td></tr></tbody></table></body></html>")
    res = check_page(ok)
    assert res.problems() == [] and res.page["tables"] == 1 and res.screenshot.startswith(b"\x89PNG")


@needs_browser
@pytest.mark.slow
def test_every_report_renders_cleanly_in_chromium(study_runs, readme_dirs, tmp_path):
    from cprobe.outputs import collect

    root = next(iter(study_runs.values())).parent
    if not (root / "report.html").is_file():
        collect(root)
    pages = sorted(root.rglob("report.html"))
    assert len(pages) == 1 + len(study_runs)  # all studies, each study's README run
    # sweep pages beside their jobs' (the study runs are single jobs): the README's `-m` sweeps of sva_tiny (run by the
    # README test before this one in its group; run here if not)
    sweeps = readme_dirs.workdir / "outputs" / "sweeps" / "sva_tiny"
    if not sweeps.is_dir():
        r = run_readme_line(SWEEP_LINE, None, readme_dirs)
        assert r.returncode == 0, r.stderr[-3000:]
    sweep_dirs = [d for d in sweeps.iterdir() if d.is_dir() and not d.is_symlink()]
    jobs = {d: [j for j in d.iterdir() if (j / "status.json").is_file()] for d in sweep_dirs}
    assert sweep_dirs and max(len(js) for js in jobs.values()) >= 2, jobs
    sweep_pages = [d / "report.html" for d in sweep_dirs] + [j / "report.html" for js in jobs.values() for j in js]
    assert all(p.is_file() for p in sweep_pages), sweep_pages  # each sweep's page and each of its jobs'
    pages += sweep_pages
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with Browser() as browser:  # the checks read the whole page; the screenshot (kept for a reader) its top 3,000 px
        results = {page: browser.check(page, max_height=3000) for page in pages}
    for page, res in results.items():
        base = root if page.is_relative_to(root) else sweeps
        name = str(page.parent.relative_to(base)).replace("/", "__") or "root"
        (shots / f"{name}.png").write_bytes(res.screenshot)
        assert res.problems() == [], (page, res.problems())
        dirs = [page.parent] + ([root / s for s in study_runs] if page.parent == root else [])
        assert res.page["images"] == sum(len(list(d.glob("*.png"))) for d in dirs), page
        assert res.page["tables"] > 0 and "Leaderboard" in res.page["sections"], page
        assert len(res.screenshot) > 20_000, page  # a rendered page, not a blank one
    assert Path(root / "report.html").stat().st_size > 100_000  # the figures are inside the page
