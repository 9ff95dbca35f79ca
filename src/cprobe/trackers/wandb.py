"""Weights & Biases (``logger=wandb``; ``pip install 'cprobe[wandb]'``): one run per job, grouped per sweep.

``mode: auto`` logs online when an API key is there (``WANDB_API_KEY``, or ``wandb login`` in ``~/.netrc``) and
otherwise offline, with no network at all, into ``<dir>/wandb/offline-run-*`` (``wandb sync <that dir>`` uploads it
later; ``wandb leet <dir>/wandb`` browses it); ``WANDB_MODE`` wins over ``auto``. W&B has no parent runs: a sweep is a
W&B *group* (``<experiment>/<sweep time>``) holding one run per job (job type ``job``) and the sweep's own run (job type
``sweep``). A job's run: config = the resolved config, history = every record (key from its fields, step = layer),
a ``records`` table with every record field, summary = state/error and the fields its records share, its figures,
``report.html`` and tables as a ``cprobe-job`` artifact, exit code 0 (done) or 1 (failed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cprobe.trackers.base import JobLog, SweepLog, Tracker, clean_key


@dataclass(frozen=True)
class Options:
    project: str = "cprobe"
    entity: str | None = None
    mode: Literal["auto", "online", "offline"] = "auto"
    dir: str = "outputs"  # runs go to <dir>/wandb/
    tags: list[str] = field(default_factory=list)
    init_timeout: float = 90.0  # seconds wandb.init may take online before it gives up


def has_api_key() -> bool:
    """An API key W&B would use: ``WANDB_API_KEY``, or an ``api.wandb.ai`` (or ``WANDB_BASE_URL`` host) entry in
    ``~/.netrc`` (what ``wandb login`` writes). Checked without any network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker(Tracker):
    name = "wandb"
    Options = Options

    def mode(self) -> str:
        env = os.environ.get("WANDB_MODE")
        if self.options.mode == "auto":
            return env if env in ("online", "offline", "disabled") else ("online" if has_api_key() else "offline")
        return self.options.mode

    def destination(self) -> str:
        where = str(Path(self.options.dir).resolve()) if self.mode() == "offline" else "online"
        return f"{where}#{self.options.entity or ''}/{self.options.project}"

    def _init(self, **kw: Any) -> Any:
        import wandb

        Path(self.options.dir).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False,
                                  silent=True, init_timeout=self.options.init_timeout)
        return wandb.init(project=self.options.project, entity=self.options.entity, dir=self.options.dir,
                          mode=self.mode(), settings=settings, reinit="create_new",
                          tags=list(self.options.tags) or None, **kw)

    def start_sweep(self, sweep_dir: Path, run_name: str, experiment: str, overrides: Sequence[str]) -> dict:
        return {"group": run_name}  # the sweep's own run is written when it ends, with what it found

    def log_job(self, job: JobLog, parent: Mapping[str, Any] | None) -> dict:
        import wandb

        run = self._init(name=job.run_name, group=parent["group"] if parent else None,
                         job_type="job" if parent else "run", config=job.config or _nest(job.params))
        ok = False
        try:
            by_step: dict[int, dict[str, float]] = {}
            for p in job.points:
                by_step.setdefault(p.step, {})[p.key] = p.value
            for step in sorted(by_step):
                run.log(by_step[step], step=step)
            if job.records is not None and not job.records.empty:
                run.log({"records": wandb.Table(dataframe=job.records.astype(object).where(job.records.notna(), None)
                                                 .astype(str))})
            run.summary.update({k.removeprefix("cprobe."): v for k, v in job.tags.items()})
            self._artifact(run, f"{job.experiment}-{job.run_name}", "cprobe-job", job.out_dir, job.artifacts)
            ok = job.ok
            rid = run.id
        finally:
            run.finish(exit_code=0 if ok else 1)
        return {"run_id": rid, "run_dir": str(Path(run.dir).parent) if getattr(run, "dir", None) else None}

    def _artifact(self, run: Any, name: str, kind: str, root: Path, files: Sequence[Path]) -> None:
        import wandb

        if not files:
            return
        art = wandb.Artifact(re.sub(r"[^\w\-.]", "_", name)[:120] or "job", type=kind)
        for f in files:
            art.add_file(str(f), name=str(f.relative_to(root)))
        run.log_artifact(art)

    def end_sweep(self, sweep: SweepLog, parent: Mapping[str, Any]) -> None:
        run = self._init(name=f"{parent['group']} (sweep)", group=parent["group"], job_type="sweep",
                         config={"overrides": " ".join(sweep.overrides), "sweep_dir": str(sweep.sweep_dir)})
        try:
            summary: dict[str, Any] = {"state": "done" if sweep.ok else "failed"}
            if sweep.failed:
                summary["failed"] = "; ".join(sweep.failed)
            s = sweep.search
            if s:
                key = clean_key(f"search/{s['metric']}")
                for n, v in sweep.search_points():
                    run.log({key: v}, step=n)
                best = s.get("best") or {}
                if best:
                    summary.update({"best_trial": best["number"], "best_params": best["params"],
                                    "best_value": best["value"], "best_job": best.get("job"), "why": s.get("why")})
            run.summary.update(summary)
            self._artifact(run, sweep.run_name, "cprobe-sweep", sweep.sweep_dir, sweep.artifacts)
        finally:
            run.finish(exit_code=0 if sweep.ok else 1)


def _nest(flat: Mapping[str, str]) -> dict[str, Any]:
    """Dotted params back to a nested dict (W&B's config panel groups by the nesting)."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        node = out
        parts = k.split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                nxt = node[p] = {"_": nxt}
            node = nxt
        node[parts[-1]] = v
    return out
