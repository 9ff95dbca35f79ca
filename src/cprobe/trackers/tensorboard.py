"""TensorBoard (``logger=tensorboard``; ``pip install 'cprobe[tensorboard]'``): event files under one log dir.

Each job writes to ``<log_dir>/<its run dir relative to the output root>`` (``outputs/tensorboard/sweeps/NAME/TIME/
intervention.rank=4``), so ``tensorboard --logdir outputs/tensorboard`` shows every run and sweep, and a sweep's jobs
are the sub-runs of its directory (the parent). A job: every record as a scalar (key from the record's fields, step =
layer), its figures as images, its resolved config, status and the path of its ``report.html`` as text, and its
overrides with its headline metrics in the HParams dashboard. A sweep's own run: its overrides, its report's path,
and for an hparams search the objective per trial (step = trial number) and the winner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cprobe.trackers.base import JobLog, SweepLog, Tracker, clean_key


@dataclass(frozen=True)
class Options:
    log_dir: str = "outputs/tensorboard"
    output_root: str | None = None  # run dirs below it are mirrored under log_dir; null: the run dir's name alone
    images: bool = True  # the figures as images


def _writer(path: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

    path.mkdir(parents=True, exist_ok=True)
    return SummaryWriter(log_dir=str(path))


def _table(rows: Mapping[str, str]) -> str:
    """A two-column markdown table (TensorBoard renders text summaries as markdown)."""
    return "\n".join(["| key | value |", "|---|---|",
                      *(f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows.items())])


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    Options = Options

    def destination(self) -> str:
        return str(Path(self.options.log_dir).resolve())

    def run_dir(self, directory: Path) -> Path:
        directory = Path(directory).resolve()
        root = Path(self.options.output_root).resolve() if self.options.output_root else None
        rel = directory.relative_to(root) if root is not None and directory.is_relative_to(root) \
            else Path(directory.name)
        return Path(self.destination()) / rel

    def start_sweep(self, sweep_dir: Path, run_name: str, experiment: str, overrides: Sequence[str]) -> dict:
        path = self.run_dir(sweep_dir)
        w = _writer(path)
        try:
            w.add_text("sweep", _table({"sweep dir": str(sweep_dir), "overrides": " ".join(overrides) or "(none)"}))
        finally:
            w.close()
        return {"log_dir": str(path)}

    def log_job(self, job: JobLog, parent: Mapping[str, Any] | None) -> dict:
        from cprobe.metrics.registry import METRICS

        path = self.run_dir(job.out_dir)
        w = _writer(path)
        try:
            for p in job.points:
                w.add_scalar(p.key, p.value, global_step=p.step)
            w.add_text("status", _table({"state": job.state, **({"error": job.status["error"]}
                                                                  if job.status.get("error") else {}),
                                         "run dir": str(job.out_dir), "report": str(job.out_dir / "report.html"),
                                         **job.tags}))
            w.add_text("config", _table(job.params))
            if self.options.images:
                self._images(w, job.out_dir, job.artifacts)
            hp = job.hparams()
            if hp:
                heads = {f"hparams/{p.key}": p.value for p in job.points if p.fields.get("metric") in METRICS
                         and METRICS[p.fields["metric"]].headline}
                w.add_hparams(hp, heads or {"hparams/state_done": float(job.ok)}, run_name=".")
        finally:
            w.close()
        return {"log_dir": str(path)}

    def _images(self, w: Any, root: Path, files: Sequence[Path]) -> None:
        import matplotlib.image as mpimg

        for f in files:
            if f.suffix == ".png":
                img = mpimg.imread(str(f))
                w.add_image(clean_key(f"figures/{f.relative_to(root).with_suffix('')}"), img[..., :3],
                            dataformats="HWC")

    def end_sweep(self, sweep: SweepLog, parent: Mapping[str, Any]) -> None:
        w = _writer(Path(parent["log_dir"]))
        try:
            rows = {"state": "done" if sweep.ok else "failed", "report": str(sweep.sweep_dir / "report.html")}
            if sweep.failed:
                rows["failed"] = "; ".join(sweep.failed)
            s = sweep.search
            if s:
                for n, v in sweep.search_points():
                    w.add_scalar(clean_key(f"search/{s['metric']}"), v, global_step=n)
                best = s.get("best") or {}
                if best:
                    rows.update({"best trial": str(best["number"]), "best params": str(best["params"]),
                                 "best value": str(best["value"]), "why": str(s.get("why", ""))})
            w.add_text("sweep_result", _table(rows))
            if self.options.images:
                self._images(w, sweep.sweep_dir, sweep.artifacts)
        finally:
            w.close()

    def discard_sweep(self, parent: Mapping[str, Any]) -> None:
        import shutil

        path = Path(parent["log_dir"])
        if path.is_dir() and all(f.name.startswith("events.out.tfevents") for f in path.iterdir()):
            shutil.rmtree(path)
