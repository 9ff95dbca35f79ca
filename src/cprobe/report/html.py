"""Render ``report.html`` from the files of a run or a collected directory (nothing else is read).

Sections: overview (status, studies, records), leaderboard (``leaderboard.parquet``, per study), yardsticks (a
collected directory's ``yardsticks.csv``: the studies side by side per model, layer and method), tables (every table
the study wrote, ``<name>.parquet``; long ones cut to :data:`MAX_ROWS` rows with a note), figures (every ``*.png``,
embedded as base64 ``data:`` URIs), jobs (collected directories: state, time, overrides, a link to each job's own
page), config (``.hydra/config.yaml``, overrides; a sweep's ``multirun.yaml``), environment, timings, warnings.
Text is HTML-escaped; the page has inline CSS and no script, and refers to nothing outside itself except the jobs'
own pages beside it.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cprobe.io import atomic_write_bytes, read_json

REPORT = "report.html"
MAX_ROWS = 200
SKIP = {"records", "record_items", "leaderboard", "metrics", "results"}
"""Tables shown in their own section (or not at all: the records are data for analysis, not reading)."""
BULKY = ("_pair_effects", "_predictions", "_items")
"""Per-item files (pairs, cloze predictions): linked, not rendered."""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1c1e21;background:#fafafa}
header{background:#24292f;color:#fff;padding:14px 28px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9d1d9}main{padding:8px 28px 40px;max-width:1400px}
nav{margin:12px 0;padding:8px 12px;background:#fff;border:1px solid #ddd;border-radius:6px}
nav a{margin-right:14px;color:#0969da;text-decoration:none}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 18px 14px;margin:14px 0}
h2{font-size:17px;border-bottom:1px solid #eee;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.scroll{overflow-x:auto;max-height:640px;overflow-y:auto}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0 10px}
caption{text-align:left;font-weight:600;padding:4px 0;color:#444}
th,td{border:1px solid #e1e4e8;padding:3px 8px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#f3f4f6;position:sticky;top:0}td.num{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafbfc}
figure{margin:10px 0 22px}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:12.5px}pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:12px}
.note{color:#666;font-size:12.5px}.state-done{color:#1a7f37;font-weight:600}
.state-failed,.state-interrupted{color:#cf222e;font-weight:600}.state-running{color:#9a6700;font-weight:600}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px}dt{font-weight:600;color:#444}dd{margin:0}
"""


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _cell(v: Any) -> tuple[str, bool]:
    """(text, is a number) of a table cell."""
    from cprobe.leaderboard import number

    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "", False
    if isinstance(v, bool):
        return str(v), False
    if isinstance(v, int) or (hasattr(v, "dtype") and str(getattr(v, "dtype", "")).startswith("int")):
        return str(v), True
    if isinstance(v, float) or (hasattr(v, "dtype") and str(getattr(v, "dtype", "")).startswith("float")):
        f = float(v)
        return (str(int(f)) if f.is_integer() and abs(f) < 1e6 else number(f)), True
    return str(v), False


def table_html(df: pd.DataFrame, caption: str = "", note: str = "", max_rows: int = MAX_ROWS) -> str:
    """A table (never an empty one: no rows gives a note instead)."""
    if df is None or len(df) == 0 or df.shape[1] == 0:
        return f'<p class="note">{esc(caption)}: no rows.</p>' if caption else ""
    shown = df.head(max_rows)
    head = "".join(f"<th>{esc(c)}</th>" for c in shown.columns)
    body = []
    for row in shown.itertuples(index=False, name=None):
        cells = (f'<td class="num">{esc(text)}</td>' if num else f"<td>{esc(text)}</td>"
                 for text, num in map(_cell, row))
        body.append("<tr>" + "".join(cells) + "</tr>")
    cut = f" Showing {max_rows} of {len(df)} rows." if len(df) > max_rows else ""
    notes = f'<p class="note">{esc(note)}{esc(cut)}</p>' if note or cut else ""
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            f"</div>{notes}")


def _read_table(path: Path) -> pd.DataFrame | None:
    try:
        return pd.read_parquet(path)
    except Exception:  # noqa: BLE001 - a file the page cannot show is named instead
        return None


def _figure(path: Path, root: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    rel = path.relative_to(root)
    return (f'<figure><img alt="{esc(path.stem)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(rel)}</figcaption></figure>")


def _tables(d: Path, root: Path) -> list[str]:
    out = []
    for f in sorted(d.glob("*.parquet")):
        if f.stem in SKIP:
            continue
        rel = f.relative_to(root)
        if f.stem.endswith(BULKY):
            out.append(f'<p class="note">{esc(rel)}: per-item data, not shown (read it with pandas).</p>')
            continue
        df = _read_table(f)
        if df is None:
            out.append(f'<p class="note">{esc(rel)}: could not be read.</p>')
            continue
        out.append(f"<h3>{esc(f.stem)}</h3>" + table_html(df, note=f"{rel.with_suffix('.csv')}"))
    return out


def _dl(items: Iterable[tuple[str, Any]]) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items if v not in (None, "", [], {}))
    return f"<dl>{rows}</dl>" if rows else ""


def _state(s: str) -> str:
    return f'<span class="state-{esc(s)}">{esc(s)}</span>'


def _is_job(d: Path) -> bool:
    return (d / "status.json").is_file() or (d / "metrics.parquet").is_file()


def _jobs(d: Path) -> list[Path]:
    return sorted({p.parent for p in d.rglob("status.json") if p.parent != d})


def _leaderboard(d: Path) -> str:
    from cprobe.leaderboard import wide

    board = _read_table(d / "leaderboard.parquet")
    if board is None or board.empty:
        return '<p class="note">No headline metric recorded (see the tables below).</p>'
    kinds = sorted(set(board["ci"]))
    parts = ['<p class="note">Mean over seeds [95% bootstrap interval]; ↑ higher is better, ↓ lower. Intervals: '
             + esc("; ".join(kinds)) + ". Metric definitions: <code>cprobe list metrics</code>.</p>"]
    for name, t in wide(board).items():
        parts.append(table_html(t, caption=name))
    return "".join(parts)


def _yardsticks(d: Path) -> str:
    """``yardsticks.csv`` of a collected directory (:mod:`cprobe.yardsticks`), or ``""`` where there is none."""
    try:
        t = pd.read_csv(d / "yardsticks.csv", dtype=str, keep_default_na=False)
    except (OSError, ValueError):  # none written (a job), or not a table
        return ""
    return ('<p class="note">Each study\'s headline metrics per model, layer and method (a direction used as an '
            "intervention or an explainer on its direction's row); mean over seeds [95% interval]. A study summarised "
            "over layers stands on every layer row of its method; where a method ran at several settings, the one best "
            "on the study's deciding metric, named in <code>&lt;study&gt;: which</code>. yardsticks.csv</p>"
            + table_html(t, caption="yardsticks"))


def _records_overview(d: Path) -> str:
    from cprobe.metrics.registry import METRICS

    recs = _read_table(d / "records.parquet")
    if recs is None or recs.empty:
        return ""
    g = recs.groupby(["study", "metric"], sort=True).agg(records=("value", "size"),
                                                          defined=("value", "count")).reset_index()
    g["direction"] = [METRICS[m].direction if m in METRICS else "?" for m in g["metric"]]
    g["definition"] = [METRICS[m].title if m in METRICS else "(unregistered)" for m in g["metric"]]
    return ("<h3>Records</h3>" + table_html(g, note=f"{len(recs)} records in records.parquet (one schema for every "
                                            "study: docs/records.md)", max_rows=500))


def _methods_overview(d: Path) -> str:
    """Where each method came from (records' ``source``: built-in, a plugin package and version, an import path)
    and the plugin API version the jobs ran under."""
    recs = _read_table(d / "records.parquet")
    if recs is None or recs.empty or "source" not in recs:
        return ""
    r = recs[(recs["method"] != "") & (recs["source"] != "")]
    if r.empty:
        return ""
    g = r.groupby(["study", "method", "family", "source"], sort=True).agg(
        plugin_api=("plugin_api", lambda v: ", ".join(sorted({str(x) for x in v.dropna()}))),
        records=("value", "size")).reset_index()
    outside = int((g["source"] != "built-in").sum())
    return ("<h3>Methods</h3>" + table_html(g, note=f"where each method came from: built-in, an installed plugin "
                                            f"(package version) or an import path; {outside} from outside cprobe "
                                            "(docs/extending.md)", max_rows=500))


def _config(d: Path, job: bool) -> str:
    parts = []
    hydra = d / ".hydra"
    if (hydra / "overrides.yaml").is_file():
        parts.append("<h3>Overrides</h3><pre>" + esc((hydra / "overrides.yaml").read_text()) + "</pre>")
    if (hydra / "config.yaml").is_file():
        parts.append("<h3>Composed config</h3><pre>" + esc((hydra / "config.yaml").read_text()) + "</pre>")
    if (d / "multirun.yaml").is_file():
        import yaml

        try:
            mr = yaml.safe_load((d / "multirun.yaml").read_text()) or {}
            task = (mr.get("hydra") or {}).get("overrides", {}).get("task")
            params = (mr.get("hydra") or {}).get("sweeper", {}).get("params")
            body = {k: v for k, v in mr.items() if k != "hydra"}
            text = yaml.safe_dump({"overrides": task, "sweeper params": params}, sort_keys=False)
            parts.append("<h3>Sweep</h3><pre>" + esc(text) + "</pre>")
            parts.append("<h3>Composed config (first job)</h3><pre>" + esc(yaml.safe_dump(body, sort_keys=False))
                         + "</pre>")
        except Exception:  # noqa: BLE001
            parts.append('<p class="note">multirun.yaml could not be read.</p>')
    if not parts:
        parts.append('<p class="note">No config beside this directory' + ("" if job else
                     " (each job's page shows its own)") + ".</p>")
    return "".join(parts)


def _environment(d: Path, jobs: Sequence[Path]) -> str:
    envs = [e for e in ([read_json(d / "environment.json")] + [read_json(j / "environment.json") for j in jobs])
            if e]
    if not envs:
        return '<p class="note">No environment.json (written by cprobe ≥ this version).</p>'
    env = envs[0]
    packages = env.get("packages") or {}
    items = [(k, v) for k, v in env.items() if k not in ("packages", "env")]
    items += [(k, v) for k, v in (env.get("env") or {}).items()]
    distinct = {json.dumps(e, sort_keys=True) for e in envs}
    note = "" if len(distinct) <= 1 else (f'<p class="note">{len(distinct)} distinct environments among the jobs; '
                                          "the first is shown (each job's page shows its own).</p>")
    return note + _dl(items) + "<h3>Packages</h3>" + _dl(packages.items())


def _timings(d: Path, status: dict[str, Any] | None) -> str:
    parts = []
    if status:
        t = status.get("timings") or {}
        items = [("total", f"{float(status['duration_s']):.1f} s")] if status.get("duration_s") is not None else []
        items += [(k, f"{float(v):.2f} s" if isinstance(v, (int, float)) else v) for k, v in t.items()]
        parts.append(_dl(items))
    f = d / "timings.csv"
    if f.is_file():
        try:
            tt = pd.read_csv(f)
            cols = [c for c in tt.columns if c != "row" and pd.api.types.is_numeric_dtype(tt[c])]
            if cols:
                summary = pd.DataFrame({"column": cols, "sum_s": [tt[c].sum() for c in cols],
                                        "max_s": [tt[c].max() for c in cols], "rows": len(tt)})
                parts.append(table_html(summary, caption="timings.csv (per row of the metric table)"))
        except (OSError, ValueError):
            pass
    return "".join(parts) or '<p class="note">No timings recorded.</p>'


def _jobs_section(d: Path, jobs: Sequence[Path]) -> str:
    from cprobe.results import job_overrides

    rows = []
    for j in jobs:
        st = read_json(j / "status.json") or {}
        rel = j.relative_to(d)
        over = " ".join(f"{k.removeprefix('override.')}={v}" for k, v in job_overrides(j).items())
        link = f'<a href="{esc(rel.as_posix())}/{REPORT}">page</a>' if (j / REPORT).is_file() else ""
        dur = st.get("duration_s")
        rows.append(f"<tr><td>{esc(rel)}</td><td>{_state(st.get('state', 'unknown'))}</td><td>{esc(st.get('task'))}"
                    f"</td><td class=\"num\">{'' if dur is None else f'{float(dur):.1f}'}</td><td>{esc(over)}</td>"
                    f"<td>{esc(st.get('error') or '')}</td><td>{link}</td></tr>")
    if not rows:
        return ""
    total = sum(float((read_json(j / "status.json") or {}).get("duration_s") or 0) for j in jobs)
    return ('<div class="scroll"><table><thead><tr><th>job</th><th>state</th><th>study</th><th>seconds</th>'
            "<th>overrides</th><th>error</th><th>report</th></tr></thead><tbody>" + "".join(rows)
            + f'</tbody></table></div><p class="note">{len(jobs)} job(s), {total:.1f} s in all.</p>')


def _search(s: dict[str, Any]) -> str:
    """An hparams search's winner and why, and every trial (``search.json`` at a sweep root: cprobe.search)."""
    trials = pd.DataFrame([{"trial": t["number"], **{k: v for k, v in (t.get("params") or {}).items()},
                            s.get("metric", "value"): t.get("value"), "state": t.get("state"),
                            "job": t.get("job") or (f"= trial {t['duplicate_of']}" if t.get("duplicate_of") is not None
                                                    else "")} for t in s.get("trials", [])])
    head = (f"<p><b>Winner.</b> {esc(s.get('why', ''))}.</p><p class=\"note\">{esc(s.get('direction', ''))} "
            f"{esc(s.get('metric', ''))} over {esc(', '.join(f'{k} {v}' for k, v in (s.get('space') or {}).items()))}"
            f"; search.json / search.md hold the same.</p>")
    return head + (table_html(trials, note="every trial; a repeat of a point already run is not run again")
                   if len(trials) else "")


def render(directory: Path) -> str:
    """The page's HTML."""
    from cprobe.report.environment import cprobe_version

    __version__ = cprobe_version()
    d = Path(directory)
    job = _is_job(d)
    jobs = [] if job else _jobs(d)
    status = read_json(d / "status.json") if job else None
    statuses = [status] if status else [s for s in (read_json(j / "status.json") for j in jobs) if s]
    studies = sorted({s.get("task") for s in statuses if s.get("task")})
    title = f"{d.name} — cprobe report"
    if job:
        sub = f"run of {', '.join(studies) or 'a study'} · state {(status or {}).get('state', 'unknown')}"
    else:
        states = pd.Series([s.get("state", "unknown") for s in statuses]).value_counts().to_dict()
        sub = (f"{len(jobs)} job(s) of {', '.join(studies) or '?'} · "
               + ", ".join(f"{n} {k}" for k, n in states.items()))
    overview = _dl([("directory", str(d)), ("studies", ", ".join(studies)),
                    ("state", (status or {}).get("state")), ("rows", (status or {}).get("rows")),
                    ("error", (status or {}).get("error"))]) + _records_overview(d) + _methods_overview(d)
    sections = [("overview", "Overview", overview), ("leaderboard", "Leaderboard", _leaderboard(d))]
    yard = _yardsticks(d)
    if yard:
        sections.append(("yardsticks", "Yardsticks side by side", yard))
    search = None if job else read_json(d / "search.json")
    if search:
        sections.append(("search", "Search", _search(search)))
    holders = {p for j in jobs for p in j.parents}  # sweeps (and run folders) below: their own pages show them
    dirs = [d] + sorted(p for p in d.iterdir() if p.is_dir() and not _is_job(p) and not p.name.startswith(".")
                        and p not in holders and any(p.glob("*.parquet")))
    tables, figures = [], []
    for sub_dir in dirs:
        heading = "" if sub_dir == d else f"<h3>{esc(sub_dir.name)}</h3>"
        t = _tables(sub_dir, d)
        if t:
            tables.append(heading + "".join(t))
        figs = [_figure(p, d) for p in sorted(sub_dir.glob("*.png"))]
        if figs:
            figures.append(heading + "".join(figs))
    own, what = (("metrics", "the study's own table") if job and (d / "metrics.parquet").is_file()
                 else ("results", "every job's table"))
    m = _read_table(d / f"{own}.parquet")  # None where there is none
    if m is not None and len(m):
        tables.append(f"<h3>{own}</h3>" + table_html(m, note=f"{own}.csv: {what}"))
    sections.append(("tables", "Tables", "".join(tables) or '<p class="note">No tables.</p>'))
    sections.append(("figures", "Figures", "".join(figures) or '<p class="note">No figures.</p>'))
    if jobs:
        sections.append(("jobs", "Jobs", _jobs_section(d, jobs)))
    sections.append(("config", "Config", _config(d, job)))
    sections.append(("environment", "Environment", _environment(d, jobs[:50])))
    sections.append(("timings", "Timings", _timings(d, status)))
    warned = list(dict.fromkeys(w for s in statuses for w in (s.get("warnings") or [])))
    if warned:
        sections.append(("warnings", "Warnings", "<ul>" + "".join(f"<li>{esc(w)}</li>" for w in warned) + "</ul>"))
    nav = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t, _ in sections)
    body = "".join(f'<section id="{a}"><h2>{esc(t)}</h2>{content}</section>' for a, t, content in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"generator\" content=\"cprobe {esc(__version__)}\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><p>{esc(sub)}</p></header><main><nav>{nav}</nav>{body}"
            f'<p class="note">Written by cprobe {esc(__version__)}; rebuild with <code>cprobe report {esc(d)}</code>.'
            "</p></main></body></html>\n")


def build_report(directory: Path) -> Path:
    """Write ``DIR/report.html`` (atomically) and return its path."""
    from cprobe.errors import CprobeError

    d = Path(directory)
    if not d.is_dir():
        raise CprobeError(f"{d} is not a directory; pass a run or sweep output dir (e.g. outputs/runs/NAME/latest)")
    if not _is_job(d) and not _jobs(d) and not (d / "leaderboard.parquet").is_file():
        raise CprobeError(f"{d} holds no cprobe run (no status.json or metrics.parquet in it or below)")
    from cprobe import ownership

    ownership.check_overwrite(d, [REPORT], "cprobe report")
    path = d / REPORT
    atomic_write_bytes(path, render(d).encode("utf-8"))
    ownership.note_outputs(d, [REPORT])
    return path
