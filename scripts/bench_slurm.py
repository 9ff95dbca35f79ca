"""Packed vs unpacked SLURM sweeps: the same grid as one point per array task and as a few tasks of many points, on
the cluster ``$SLURM_CONF`` points at (scripts/slurm_up.sh starts the single-node test cluster).

    SLURM_CONF=/tmp/cprobe-slurm/slurm.conf python scripts/bench_slurm.py            # the 41-point INLP grid
    python scripts/bench_slurm.py --smoke --overrides intervention.rank=0,1,2,3       # a quick look

Both runs get the same resources per task (``--cpus``, ``--mem-gb``), so the partition runs the same number of tasks
at once; caches are warmed by one point first, so both measure the same work. Printed per variant: the sweep's wall
time, each task's start-up (process start to its first point: Python, imports, unpickling), the first point's extra
cost over the task's later points (the imports and model load a point pays once per process), and what share of the
task-seconds went to start-up; then the ratio packed / unpacked. Numbers come from the tasks' own records
(``.slurm/tasks/*.json``), written by the tasks as they run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cprobe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("cprobe"))
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)


def run_variant(name: str, base: list[str], k: str, root: Path) -> dict:
    d = root / name
    t0 = time.time()
    r = cprobe(*base, f"hydra.launcher.points_per_task={k}", f"hydra.sweep.dir={d}", cwd=root)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"{name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    tasks = [json.loads(p.read_text()) for p in sorted((d / ".slurm" / "tasks").glob("*.json"))]
    starts, first_extra, task_walls, points, cpu_start, point_cpu, firsts = [], [], [], [], [], [], []
    for t in tasks:
        run_ = t["runs"][-1]
        ps = sorted(t["points"].values(), key=lambda p: p["started"])
        starts.append(t["startup_s"])
        cpu_start.append(t.get("startup_cpu_s", 0.0))
        task_walls.append(run_.get("ended", time.time()) - run_["started"])
        points += [p["duration_s"] for p in ps]
        firsts.append(ps[0]["duration_s"])
        point_cpu += [p.get("cpu_s", 0.0) for p in ps]
        if len(ps) > 1:
            first_extra.append(ps[0]["duration_s"] - statistics.median(p["duration_s"] for p in ps[1:]))
    n = len(points)
    later = [p for t in tasks for p in sorted(t["points"].values(), key=lambda p: p["started"])[1:]]
    work = statistics.median(p["duration_s"] for p in later) if later else None
    return {"variant": name, "points": n, "tasks": len(tasks), "wall_s": wall, "task_s": sum(task_walls),
            "startup_s": statistics.median(starts), "startup_cpu_s": statistics.median(cpu_start),
            "first_point_s": statistics.median(firsts), "first_point_extra_s":
            statistics.median(first_extra) if first_extra else None, "point_work_s": work,
            "task_s_per_point": sum(task_walls) / n, "cpu_s_per_point": (sum(point_cpu) + sum(cpu_start)) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="sva_tiny_reliability")
    ap.add_argument("--sweep", default="reliability_inlp", help="a conf/sweep preset (default: the 41-point INLP grid)")
    ap.add_argument("--overrides", nargs="*", default=[], help="instead of --sweep: sweep overrides, e.g. x=1,2")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--mem-gb", type=float, default=4)
    ap.add_argument("--packed", default="auto", help="points_per_task of the packed run (default auto)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--keep", action="store_true", help="keep the sweep dirs (printed)")
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF") and not Path("/etc/slurm/slurm.conf").exists():
        sys.exit("no SLURM cluster: set SLURM_CONF (scripts/slurm_up.sh prints it)")
    grid = [f"+sweep={args.sweep}"] if not args.overrides else ["-m", *args.overrides]
    base = ["run", f"+experiment={args.experiment}", *grid, "hydra/launcher=slurm", "progress=false",
            f"hydra.launcher.cpus_per_task={args.cpus}", f"hydra.launcher.mem_gb={args.mem_gb}",
            "hydra.launcher.poll_s=2", *(["--smoke"] if args.smoke else [])]
    root = Path(tempfile.mkdtemp(prefix="bench_slurm_"))
    try:
        warm = cprobe("run", f"+experiment={args.experiment}", *(["--smoke"] if args.smoke else []),
                      f"hydra.run.dir={root / 'warm'}", "progress=false", cwd=root)
        if warm.returncode != 0:
            sys.exit(f"warm-up run failed:\n{warm.stderr[-3000:]}")
        rows = [run_variant("unpacked", base, "1", root), run_variant("packed", base, args.packed, root)]
        work = rows[1]["point_work_s"]  # a point's own work: the median of the points after a task's first
        for r in rows:  # start-up per task: before the first point, plus what its first point costs beyond the work
            r["startup_total_s"] = r["startup_s"] + (r["first_point_s"] - work if work is not None else 0.0)
            r["startup_share"] = r["tasks"] * r["startup_total_s"] / r["task_s"]
        print(f"point work (median of the points after a task's first): {work:.1f} s" if work is not None else "")
        print(f"{'variant':<9} {'points':>6} {'tasks':>5} {'sweep wall s':>12} {'task-s/point':>12} "
              f"{'CPU s/point':>11} {'to 1st point s':>14} {'start-up CPU s':>14} {'start-up/task s':>15} "
              f"{'start-up share':>14}")
        for r in rows:
            print(f"{r['variant']:<9} {r['points']:>6} {r['tasks']:>5} {r['wall_s']:>12.0f} "
                  f"{r['task_s_per_point']:>12.1f} {r['cpu_s_per_point']:>11.1f} {r['startup_s']:>14.1f} "
                  f"{r['startup_cpu_s']:>14.1f} {r['startup_total_s']:>15.1f} {r['startup_share']:>13.1%}")
        u, p = rows
        print(f"packed / unpacked: sweep wall {p['wall_s'] / u['wall_s']:.2f}x, task-seconds per point "
              f"{p['task_s_per_point'] / u['task_s_per_point']:.2f}x, CPU per point "
              f"{p['cpu_s_per_point'] / u['cpu_s_per_point']:.2f}x; load average now {os.getloadavg()[0]:.1f}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    finally:
        if args.keep:
            print(f"sweep dirs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
