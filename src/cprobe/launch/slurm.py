"""cprobe's SLURM launcher: the driver that checks, packs, submits and follows a sweep, and the array task that runs
a pack of points.

**Driver** (``cprobe run -m ... hydra/launcher=slurm``), in :class:`Driver`:

1. *Before anything exists* (:meth:`Driver.setup`, before the sweep dir is claimed): the ``slurm`` extra is
   installed, the launcher's own settings work, each and together (:mod:`cprobe.launch.settings`), the SLURM
   commands answer, the partition exists and can give the request
   (:func:`cprobe.launch.resources.resolve`: GPUs from the job's device, CPUs and memory from the partition), and
   ``sbatch --test-only`` accepts it. A refusal is one line, exit 1, no sweep dir, ``latest`` unmoved.
2. Every point is composed once: its directory, what its activations depend on, and whether it is done already
   (same config hash as its ``status.json``) or still queued/running from an earlier submission; only the rest is
   submitted, so re-running a sweep into its directory submits what is not done.
3. The points are packed (:mod:`cprobe.launch.packing`) and submitted as one array through submitit; the manifest
   ``.slurm/sweep.json`` records which task runs which points.
4. ``--detach`` returns here. Attached, the driver follows the points' ``status.json`` every second and the scheduler
   every ``poll_s`` seconds, logs progress (done / running / queued / failed), names a failed point, and a task that
   was cancelled or vanished, as soon as it sees it, and returns when nothing more can happen; the sweep callback
   then aggregates what finished. Ctrl-C or SIGTERM stops the driver only: the tasks go on.

**Array task** (:class:`PackRunner`, unpickled by submitit on the node): runs its points one after another in one
process (imports, the model and its activations shared), records each outcome in ``.slurm/tasks/<task>.json``
(a point that fails inside Hydra, before its directory exists, is recorded there), and on SIGUSR2 (the time limit
is ``signal_delay_s`` away, or a preemption notice) or SIGTERM marks the running point ``interrupted`` and requeues
itself (up to ``max_requeues`` times; never after a user's ``scancel``, nor a second time after a requeue by the
scheduler itself, ``scontrol requeue``). The requeued task skips its finished points, and the interrupted one resumes
from its last activation shard (CausalGym from its last task). Each task runs its points as one *attempt*
(:func:`cprobe.sweep.attempt_id`: the submission's token and the task's id), which every ``status.json`` it
writes records, so the sweep's readers never take an earlier submission's files for this one's.
"""

from __future__ import annotations

import copy
import logging
import os
import shlex
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cprobe import slurmctl
from cprobe import sweep as S
from cprobe.compute import AUTO_ENV, WAIT_ENV
from cprobe.errors import ConfigError, CprobeError, DriverStopped, Terminated, one_line
from cprobe.launch import packing, resources, settings

log = logging.getLogger("cprobe")

EXTRA_HINT = "pip install 'cprobe[slurm]'"
DETACH_ENV = "CPROBE_DETACH"
FILE_POLL_S = 1.0
HEARTBEAT_S = 60.0


def detach_requested(params: Mapping[str, Any] | None = None) -> bool:
    return os.environ.get(DETACH_ENV, "") not in ("", "0") or bool((params or {}).get("detach"))


@dataclass
class Point:
    num: int
    overrides: list[str]
    name: str = ""
    key: tuple[str, ...] = ()
    device: str = "auto"
    done: bool = False


# ================================================================================================ driver
class Driver:
    """The launcher's logic (the Hydra plugin class in ``hydra_plugins.cprobe_launcher`` delegates here)."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        # checked in setup(): what Hydra's instantiation raises reaches the user wrapped in its own text
        self.raw_params = dict(params)
        self.params: dict[str, Any] = {}
        self.config: Any = None
        self.hydra_context: Any = None
        self.task_function: Any = None
        self.request: resources.Request | None = None
        self.partition: slurmctl.Partition | None = None
        self.claimed: Any = None

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        """Check everything against the cluster, then claim the sweep dir (nothing is written before)."""
        from cprobe import callbacks

        try:
            import submitit
        except ImportError:
            raise CprobeError(f"hydra/launcher=slurm needs the slurm extra (submitit): {EXTRA_HINT}") from None
        del submitit
        self.params = settings.check(self.raw_params)
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        if not slurmctl.available():
            raise CprobeError("hydra/launcher=slurm needs the SLURM commands (sbatch, squeue) on PATH: run on a "
                              "cluster's login node")
        parts = slurmctl.partitions()
        device = _select(config, "device", "auto")
        self.request = resources.resolve(self.params, [device], parts)
        self.partition = parts[self.request.partition]
        self._test_submit()
        self.claimed = callbacks.claim_sweep_dir(config)
        from cprobe import trackers

        trackers.sweep_started(config)  # the trackers' parent runs, once the sweep dir is the sweep's (never raises)

    def _test_submit(self) -> None:
        assert self.request is not None
        flags = self.request.sbatch_flags()
        flags.update(self.params["additional_parameters"])
        err = slurmctl.test_submit(flags)
        if err is not None:
            raise CprobeError(f"SLURM refuses the sweep's tasks ({self.request.describe()}): {err}")

    # ------------------------------------------------------------------------------------------ launch
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
        from hydra.core.utils import JobReturn, JobStatus

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        try:
            points = self._describe(job_overrides, initial_job_idx, sweep_dir)
            todo = self._select_todo(points, sweep_dir)
            if todo:
                job_id, tasks = self._submit(todo, sweep_dir)
        except BaseException:
            self._release(sweep_dir)
            raise
        returns = [JobReturn(overrides=p.overrides, status=JobStatus.COMPLETED) for p in points]
        if not todo:
            return returns
        if detach_requested(self.params):
            print(f"detached: {len(todo)} point(s) submitted as SLURM job {job_id}\n"
                  f"sweep dir: {sweep_dir}\n"
                  f"follow it with `cprobe status {sweep_dir}`, aggregate with `cprobe collect {sweep_dir}` "
                  f"(`--partial` while some are not done), cancel with `scancel {job_id}`", flush=True)
            return returns
        self.follow(sweep_dir, job_id, tasks, [p.name for p in todo])
        return returns

    def _release(self, sweep_dir: Path) -> None:
        """Undo the claim of a sweep dir nothing was submitted to (a refusal after setup)."""
        from cprobe import callbacks

        if self.claimed is not None and S.read_manifest(sweep_dir) is None:
            callbacks.release_sweep_dir(self.claimed)
            self.claimed = None

    def _describe(self, job_overrides: Sequence[Sequence[str]], first: int, sweep_dir: Path) -> list[Point]:
        """Each point's directory name, grouping key, device and whether it is done already. Names come from the
        overrides the way Hydra makes them (no composition); a point is composed only where that can change
        something: its directory holds a ``status.json`` (done with the same config?), or it overrides what decides
        the device."""
        from hydra._internal.config_loader_impl import get_overrides_dirname
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf, open_dict

        parser = OverridesParser.create()
        naming = copy.deepcopy(self.config)
        od = self.config.hydra.job.config.override_dirname
        base_device = str(_select(self.config, "device", "auto"))
        points = []
        for i, overrides in enumerate(job_overrides):
            p = Point(first + i, list(overrides), key=packing.group_key(overrides), device=base_device)
            app = [o for o in parser.parse_overrides(list(overrides)) if not o.is_hydra_override()]
            with open_dict(naming.hydra):
                naming.hydra.job.override_dirname = get_overrides_dirname(
                    overrides=app, kv_sep=od.kv_sep, item_sep=od.item_sep, exclude_keys=list(od.exclude_keys))
                naming.hydra.job.num = p.num
                naming.hydra.overrides.task = list(overrides)  # a name may read them (an experiment sweep's)
            p.name = str(OmegaConf.select(naming, "hydra.sweep.subdir"))
            if (sweep_dir / p.name / "status.json").is_file() or any(
                    packing._head(o) in ("compute", "device", "model") for o in overrides):
                self._compose(p, sweep_dir)
            points.append(p)
        names = [p.name for p in points]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"two sweep points share the directory {dup[0]!r}; make them differ in a key that "
                              "names the directory (hydra.job.config.override_dirname.exclude_keys)")
        return points

    def _compose(self, p: Point, sweep_dir: Path) -> None:
        """Compose point ``p`` as its job will be: its device and whether its directory holds it done already."""
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf, open_dict, read_write

        from cprobe import pipeline

        before = HydraConfig.instance().cfg
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(p.overrides))
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = p.num
                cfg.hydra.job.id = f"cprobe_{p.num}"
            HydraConfig.instance().set_config(cfg)
            p.name = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))  # where the fast naming disagrees, Hydra's wins
            out_dir = sweep_dir / p.name
            with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
                cfg.hydra.runtime.output_dir = str(out_dir.absolute())
            HydraConfig.instance().set_config(cfg)
            task_cfg = copy.copy(cfg)
            with read_write(task_cfg), open_dict(task_cfg):
                del task_cfg["hydra"]
            try:
                plain = pipeline._plain(task_cfg)
            except CprobeError:  # the job itself will say so, in its status.json
                return
            p.device = str(plain.get("device", "auto"))
            p.done = (out_dir / "status.json").is_file() and pipeline.is_done(plain, out_dir)
        finally:
            if before is not None:
                HydraConfig.instance().set_config(before)

    def _select_todo(self, points: list[Point], sweep_dir: Path) -> list[Point]:
        """The points to submit: neither done nor still queued/running from an earlier submission."""
        done = [p for p in points if p.done]
        busy: set[str] = set()
        if S.read_manifest(sweep_dir) is not None:
            st = S.sweep_state(sweep_dir)
            busy = {s.name for s in st.points if s.state in ("running", "queued")}
        todo = [p for p in points if not p.done and p.name not in busy]
        if done:
            log.info("%d of %d point(s) are done already with the same config: not submitted again", len(done),
                     len(points))
        if busy:
            log.info("%d point(s) are still queued or running from an earlier submission (`cprobe status %s`): not "
                     "submitted again", len(busy), sweep_dir)
        if not todo:
            log.info("nothing to submit")
        # a device no point showed at setup (a swept compute=): check the request again
        devices = {p.device for p in todo}
        if devices - {"auto", "cpu"} and self.request is not None and self.request.gpus == 0:
            self.request = resources.resolve(self.params, devices, {self.partition.name: self.partition})
        return todo

    def _submit(self, todo: list[Point], sweep_dir: Path) -> tuple[str, dict[str, list[str]]]:
        import submitit
        from hydra.core.singleton import Singleton

        assert self.request is not None and self.partition is not None
        req = self.request
        parallel = self.params["array_parallelism"]
        k = packing.per_task(self.params["points_per_task"], len(todo),
                             resources.slots(req, self.partition, parallel))
        packs = packing.pack([p.key for p in todo], k)
        folder = sweep_dir / S.SLURM_DIR / "%j"
        ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=0)
        extra = self.params["additional_parameters"]
        ex.update_parameters(
            job_name=self.params["name"] or "cprobe", partition=req.partition, time=req.minutes,
            cpus_per_task=req.cpus, mem=f"{int(req.mem_gb * 1024)}M", gpus_per_node=req.gpus or None,
            account=req.account, qos=req.qos, constraint=req.constraint, exclude=self.params["exclude"],
            signal_delay_s=self.params["signal_delay_s"], array_parallelism=parallel,
            setup=task_setup(self.params["setup"]), additional_parameters=extra or None, stderr_to_stdout=True)
        token = uuid.uuid4().hex[:12]  # this submission's attempts (sweep.attempt_id), whatever the job ids
        runner = PackRunner(self.hydra_context, self.config, self.task_function, Singleton.get_state(),
                            str(sweep_dir.absolute()), self.params["max_requeues"], token)
        args = [[{"num": todo[i].num, "overrides": todo[i].overrides, "name": todo[i].name} for i in pk]
                for pk in packs]
        manifest = S.read_manifest(sweep_dir) or {"version": 1, "points": {}, "submissions": []}
        for p in todo:
            manifest["points"][p.name] = {"num": p.num, "overrides": p.overrides}
        try:
            jobs = ex.map_array(runner, args)
        except Exception as e:  # sbatch refused after all (a limit --test-only does not check)
            raise CprobeError(f"sbatch refused the sweep's array ({req.describe()}): "
                              f"{slurmctl.clean(one_line(e))[:400]}") from None
        tasks = {str(j.job_id): [a["name"] for a in pk] for j, pk in zip(jobs, args)}
        job_id = str(jobs[0].job_id).split("_")[0]
        manifest["submissions"].append({
            "job_id": job_id, "token": token, "submitted": time.time(), "tasks": tasks, "request": req.as_dict(),
            "points_per_task": k, "detached": detach_requested(self.params), "pid": os.getpid(),
            "host": socket.gethostname(), "max_requeues": self.params["max_requeues"],
        })
        S.write_manifest(sweep_dir, manifest)
        log.info("submitted %d point(s) as SLURM job %s: %d array task(s) of up to %d point(s) (%s); sweep dir %s",
                 len(todo), job_id, len(packs), k, req.describe(), sweep_dir)
        return job_id, tasks

    # ------------------------------------------------------------------------------------------ follow
    def follow(self, sweep_dir: Path, job_id: str, tasks: Mapping[str, Sequence[str]], names: Sequence[str]) -> None:
        """Follow the submitted points until nothing more can happen to them."""
        poll_s = float(self.params["poll_s"])
        with _stop_as_driver_stopped(sweep_dir, job_id):
            _follow(sweep_dir, [job_id], tasks, set(names), poll_s)


def _follow(sweep_dir: Path, jobs: Sequence[str], tasks: Mapping[str, Sequence[str]], names: set[str],
            poll_s: float) -> S.SweepState:
    t0 = time.time()
    task_states: dict[str, Any] | None = None
    last_query = last_log = 0.0
    last_counts: Any = None
    reported: set[tuple[str, str]] = set()
    ended_tasks: set[str] = set()
    while True:
        now = time.time()
        if task_states is None or now - last_query >= poll_s:
            try:
                task_states = slurmctl.states(jobs)
            except slurmctl.SchedulerError as e:
                slurmctl.warn_once(f"the scheduler did not answer ({e}); trying again in {poll_s:.0f} s")
                task_states = task_states or {t: slurmctl.TaskState("UNKNOWN-ALIVE") for t in tasks}
            last_query = now
        st = S.sweep_state(sweep_dir, task_states={
            k: (slurmctl.TaskState("PENDING", "scheduler not answering") if v.state == "UNKNOWN-ALIVE" else v)
            for k, v in task_states.items()})
        mine = [p for p in st.points if p.name in names]
        for p in mine:
            if p.state in ("failed", "dead", "interrupted", "not run") and (p.name, p.state) not in reported:
                reported.add((p.name, p.state))
                (log.error if p.state == "failed" else log.warning)("point %s %s%s", p.name, p.state,
                                                                    f": {p.detail}" if p.detail else "")
        for task, task_names in tasks.items():
            ts = task_states.get(task)
            if task in ended_tasks or (ts is not None and ts.alive):
                continue
            left = [p for p in mine if p.name in task_names and p.state != "done"]
            ended_tasks.add(task)
            if left:
                what = ts.describe() if ts is not None else "vanished (the scheduler no longer knows it)"
                log.warning("task %s %s with %d point(s) not finished: %s", task, what, len(left),
                            ", ".join(f"{p.name} ({p.state})" for p in left[:5]) + (" …" if len(left) > 5 else ""))
        counts = tuple(sorted(S.SweepState(sweep_dir, mine).counts().items()))
        if counts != last_counts or now - last_log >= HEARTBEAT_S:
            last_counts, last_log = counts, now
            log.info("[%s] %s", _elapsed(now - t0), _progress(mine))
        if all(p.state in S.TERMINAL for p in mine):
            done = sum(p.state == "done" for p in mine)
            log.info("sweep ended after %s: %d of %d point(s) done", _elapsed(time.time() - t0), done, len(mine))
            return st
        time.sleep(FILE_POLL_S)


def _progress(points: Sequence[S.PointState]) -> str:
    c = S.SweepState(Path("."), list(points)).counts()
    bad = sum(c.get(s, 0) for s in ("failed", "dead", "interrupted", "not run"))
    return (f"{c.get('done', 0)}/{len(points)} done, {c.get('running', 0)} running, {c.get('queued', 0)} queued, "
            f"{bad} failed/stopped")


def _elapsed(s: float) -> str:
    m, s = divmod(int(s), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


@contextmanager
def _stop_as_driver_stopped(sweep_dir: Path, job_id: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM while following: say that the tasks go on and how to follow them."""
    import threading

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated("SIGTERM", signame="SIGTERM")

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        msg = (f"the driver was stopped ({'SIGTERM' if term else 'Ctrl-C'}); SLURM job {job_id} goes on: "
               f"`cprobe status {sweep_dir}` follows it, `cprobe collect {sweep_dir}` aggregates it, "
               f"`scancel {job_id}` cancels it")
        raise DriverStopped(msg, 143 if term else 130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _select(config: Any, key: str, default: Any) -> Any:
    from omegaconf import OmegaConf

    try:
        v = OmegaConf.select(config, key, default=default)
    except Exception:  # an interpolation the driver cannot resolve: the job will say so
        return default
    return default if v is None else v


# ================================================================================================ array task
def task_setup(setup: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The array task's setup lines: the driver's OpenMP wait policy first (it must be in the environment before the
    task's Python loads torch, and a cluster may not export the submitter's environment), then the user's. Where
    ``auto`` kept OpenMP's default because the driver's machine was quiet, the tasks get passive: a node's load is
    not the driver's."""
    env = os.environ if env is None else env
    policy = env.get(WAIT_ENV, "").strip() or ("PASSIVE" if env.get(AUTO_ENV, "").startswith("default") else "")
    return ([f"export {WAIT_ENV}={shlex.quote(policy)}"] if policy else []) + list(setup)


def process_start() -> float | None:
    """This process's start (epoch seconds), from ``/proc`` (Linux); None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class PackRunner:
    """Runs one array task's points in this process (pickled by the driver, called by submitit on the node)."""

    hydra_context: Any
    config: Any
    task_function: Any
    singleton_state: Any
    sweep_dir: str
    max_requeues: int
    token: str

    def __call__(self, pack: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        from cprobe.job import ATTEMPT_ENV

        t_call = time.time()
        sweep_dir = Path(self.sweep_dir)
        array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        task = f"{array}_{index}" if array and index else os.environ.get("SLURM_JOB_ID", f"local-{os.getpid()}")
        attempt = S.attempt_id(self.token, task)
        os.environ[ATTEMPT_ENV] = attempt  # every status.json this task's jobs write says so
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        record = S.read_record(sweep_dir, task)
        if record.get("attempt") != attempt:  # another submission's task of the same id: not this one's runs
            record = {}
        started = process_start()
        record.update(task=task, attempt=attempt, state="running", restarts=restarts, host=socket.gethostname(),
                      pid=os.getpid(), started=started, startup_s=None if started is None else t_call - started,
                      startup_cpu_s=time.process_time())
        record.setdefault("points", {})
        record.setdefault("runs", []).append({"restart": restarts, "started": started, "called": t_call})
        S.write_record(sweep_dir, task, record)
        _install_task_signals()
        _task_logging()
        log.info("task %s: %d point(s)%s, started %.1f s after the process", task, len(pack),
                 f" (restart {restarts})" if restarts else "", record["startup_s"] or float("nan"))
        try:
            for i, point in enumerate(pack):
                self._run_point(sweep_dir, task, record, point, i, len(pack))
        except KeyboardInterrupt as e:
            try:
                self._interrupted(sweep_dir, task, record, e, restarts)
            except BaseException:  # never die silently on the way out: the log says why
                import traceback

                sys.stderr.write(f"error: task {task} could not handle {getattr(e, 'signame', 'the signal')}:\n"
                                 f"{traceback.format_exc()}")
                sys.stderr.flush()
                os._exit(1)
        record["state"] = "done"
        record["runs"][-1]["ended"] = time.time()
        S.write_record(sweep_dir, task, record)
        return {"task": task, "points": record["points"]}

    def _run_point(self, sweep_dir: Path, task: str, record: dict[str, Any], point: Mapping[str, Any], i: int,
                   n: int) -> None:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import JobStatus, run_job, setup_globals
        from omegaconf import open_dict

        from cprobe.job import read_status

        name = str(point["name"])
        t0, cpu0 = time.time(), time.process_time()
        entry = record["points"].setdefault(name, {})
        entry.update(state="running", started=t0)
        entry.pop("error", None)
        S.write_record(sweep_dir, task, record)
        log.info("task %s: point %d/%d %s", task, i + 1, n, name)
        try:
            Singleton.set_state(self.singleton_state)
            setup_globals()
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(point["overrides"]))
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.id = task
                cfg.hydra.job.num = int(point["num"])
            ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                          job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
            if ret.status == JobStatus.FAILED:
                entry.update(state="failed", error=one_line(ret._return_value))
            else:
                status = read_status(sweep_dir / name) or {}
                entry.update(state=str(status.get("state", "unknown")))
                if status.get("error"):
                    entry["error"] = str(status["error"])
        except KeyboardInterrupt:
            entry.update(state="interrupted", duration_s=time.time() - t0)
            raise
        except Exception as e:  # inside Hydra, before or after the job (its directory, its config)
            msg = one_line(e)
            entry.update(state="failed", error=f"{type(e).__name__}: {msg}"[:500])
            sys.stderr.write(f"error: point {name} failed outside the job (inside Hydra): {msg[:500]}\n")
        entry.update(duration_s=time.time() - t0, cpu_s=time.process_time() - cpu0)
        S.write_record(sweep_dir, task, record)

    def _interrupted(self, sweep_dir: Path, task: str, record: dict[str, Any], e: KeyboardInterrupt,
                     restarts: int) -> None:
        for s in (signal.SIGTERM, signal.SIGUSR2):  # the requeue itself signals us again
            signal.signal(s, signal.SIG_IGN)
        signame = e.signame if isinstance(e, Terminated) else "SIGINT"
        _mark_running_interrupted(sweep_dir, record, signame)
        action, why = _should_requeue(task, signame, restarts, self.max_requeues)
        record["runs"][-1].update(ended=time.time(), signal=signame)
        if action == REQUEUED:  # the scheduler requeues it itself
            record.update(state="requeued", reason=why)
            S.write_record(sweep_dir, task, record)
            log.warning("task %s: %s", task, why)
            sys.stdout.flush()
            os._exit(0)
        if action == REQUEUE:
            record["state"] = "requeued"
            S.write_record(sweep_dir, task, record)
            err = slurmctl.requeue(task)
            if err is None:
                log.warning("task %s: %s; requeued (restart %d of at most %d)", task, why, restarts + 1,
                            self.max_requeues)
                sys.stdout.flush()
                os._exit(0)  # the scheduler kills this process anyway; nothing more to do here
            why = f"{why}; the requeue failed: {err}"
        record.update(state="interrupted", reason=why)
        S.write_record(sweep_dir, task, record)
        log.warning("task %s: %s; not requeued", task, why)
        sys.stdout.flush()
        os._exit(143)


def _mark_running_interrupted(sweep_dir: Path, record: dict[str, Any], signame: str) -> None:
    """A point whose ``status.json`` still says running in this process (the signal came outside its job's own
    handler): mark it interrupted, as the job would."""
    from cprobe.job import read_status, write_status

    for name, entry in record.get("points", {}).items():
        if entry.get("state") not in ("running", "interrupted"):
            continue
        entry["state"] = "interrupted"
        status = read_status(sweep_dir / name)
        if status and status.get("state") == "running" and status.get("pid") == os.getpid():
            write_status(sweep_dir / name, **{**status, "state": "interrupted", "signal": signame})


REQUEUE, REQUEUED, STOP = "requeue", "requeued", "stop"


def _should_requeue(task: str, signame: str, restarts: int, max_requeues: int) -> tuple[str, str]:
    """(what the task does, why): SIGUSR2 (time limit near, preemption notice) and a SIGTERM while the job is not
    being cancelled (preemption, the time limit) :data:`REQUEUE` it, up to ``max_requeues`` times; a SIGTERM while
    the scheduler already counts one more restart than this run's ``SLURM_RESTART_COUNT`` (``scontrol requeue``, a
    node failure) is :data:`REQUEUED` by the scheduler itself; a user's ``scancel`` (restarts unchanged) is a
    :data:`STOP`."""
    if signame == "SIGUSR2":
        why = "SIGUSR2 (the time limit is near, or the task is preempted)"
    elif signame == "SIGTERM":
        info = slurmctl.job_info(task)
        state, reason = info.get("JobState", "?"), info.get("Reason", "None")
        job_restarts = info.get("Restarts", "")
        if job_restarts.isdigit() and int(job_restarts) > restarts:
            return REQUEUED, (f"SIGTERM with the job requeued by the scheduler (scontrol requeue, or a node "
                              f"failure: restart {job_restarts}); it runs again")
        if state == "RUNNING" or state in ("TIMEOUT", "PREEMPTED") or reason in ("TimeLimit", "Preempted"):
            why = f"SIGTERM (job state {state}, reason {reason}: preemption or the time limit)"
        else:
            return STOP, f"SIGTERM with the job {state.lower()} (cancelled with scancel)"
    else:
        return STOP, signame
    if restarts >= max_requeues:
        return STOP, f"{why}, but it was requeued {restarts} time(s) already (hydra.launcher.max_requeues=" \
                     f"{max_requeues})"
    return REQUEUE, why


def _task_logging() -> None:
    """The task's own lines in its log before Hydra configures logging for the first point; submitit's logger
    keeps its own handler (not twice through the root's)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(levelname)s] %(message)s",
                            datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stdout)
    logging.getLogger("submitit").propagate = False


def _install_task_signals() -> None:
    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        raise Terminated(f"received {name}", signame=name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGUSR2, handler)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
