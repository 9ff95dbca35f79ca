"""The Hydra task function: config -> task -> metric table, with resume and failure records."""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cprobe.errors import CprobeError, JobAborted
from cprobe.job import JobContext, config_hash, quiet_workers, read_status, seed_everything, write_status
from cprobe.paths import cache_dir, data_dir

log = logging.getLogger("cprobe")

# "_k=v,..." for run dir names, or "" without overrides (registered wherever run_job is unpickled).
OmegaConf.register_new_resolver("hydra_dirsuffix", lambda s: f"_{s}" if s else "", replace=True)


def run_job(cfg: DictConfig) -> None:
    """Run one job (one point of a sweep). Top-level so joblib/submitit can pickle it by reference."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from cprobe import tasks, results

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    h = config_hash({k: v for k, v in plain.items() if k not in ("force", "progress")})
    prev = read_status(out_dir)
    if prev and prev.get("state") == "done" and prev.get("config_hash") == h and not cfg.get("force", False):
        log.info("job already done with the same config (%s); skipping — pass force=true to redo it", out_dir)
        return
    ctx = JobContext(
        cfg=plain, out_dir=out_dir,
        data_root=Path(plain["paths"]["data_dir"]) if plain["paths"].get("data_dir") else data_dir(),
        cache_root=Path(plain["paths"]["cache_dir"]) if plain["paths"].get("cache_dir") else cache_dir(),
        progress=bool(cfg.get("progress", True)) and not quiet_workers(),
    )
    seed_everything(int(cfg.seed))
    t0 = time.time()
    write_status(out_dir, state="running", config_hash=h, started=t0, task=str(cfg.task))
    try:
        table = tasks.run_task(str(cfg.task))(ctx)
        table["task"] = str(cfg.task)
        table["seed"] = int(cfg.seed)
        results.write_table(table, out_dir / "metrics")
        results.report(table, out_dir)
        write_status(out_dir, state="done", config_hash=h, started=t0, duration_s=time.time() - t0,
                     task=str(cfg.task), rows=len(table), timings=ctx.timings)
        log.info("wrote %s (%d rows) in %.1fs", out_dir / "metrics.csv", len(table), time.time() - t0)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        write_status(out_dir, state="failed", config_hash=h, started=t0, duration_s=time.time() - t0,
                     task=str(cfg.task), error=msg,
                     traceback=None if isinstance(e, CprobeError) else traceback.format_exc())
        if multirun:
            log.error("job failed: %s", msg)  # keep the sweep going; the CLI exits non-zero at the end
            return
        if isinstance(e, CprobeError):
            raise JobAborted(e) from None
        raise
