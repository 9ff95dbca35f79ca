"""The Hydra task function: config -> validated job -> task -> metric table, with resume and failure records.

Order of work in :func:`run_job`: resolve and validate the whole config (:func:`prepare`: the schema, the
task's typed config, every probe/intervention constructor, the model's layer count read from its config
file) before any model is loaded; then resume or run; then write ``metrics.*`` (deterministic: the same seed
gives byte-identical tables) and ``timings.csv``, the records, the task's report built from them and the leaderboard
(:func:`cprobe.outputs.finish_job`), ``status.json`` and ``report.html``. A config error in a single run
leaves no run directory behind (only what this process made goes: :mod:`cprobe.ownership`), and an earlier run's
directory as it was (its ``status.json``, and the record and log Hydra wrote over, put back); in a sweep it is
recorded in the job's ``status.json`` and the sweep goes on.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cprobe import ownership
from cprobe.config import parse
from cprobe.errors import ConfigError, CprobeError, InputRefused, JobAborted, Terminated
from cprobe.job import (FAILED, STATUS, JobContext, config_hash, describe_state, process_gone, quiet_workers,
                        read_status, seed_everything, this_process, write_status)
from cprobe.paths import roots, safe_name

log = logging.getLogger("cprobe")

NOT_IN_DIR_NAMES = ("logger", "hparams_search")
"""Override keys (and their sub-keys) that change where results are sent, never what they are: left out of run and
job directory names (Hydra's ``exclude_keys`` matches whole keys only)."""


def dir_suffix(overrides: str, limit: int = 100) -> str:
    """``_k=v,...`` for run dir names (or ""): path-like values shortened to their file name, characters that
    would make sub-directories replaced, long names cut with a stable hash."""
    import hashlib

    if not overrides:
        return ""
    items = []
    for item in filter(None, overrides.split(",")):
        k, sep, v = item.partition("=")
        if k.lstrip("+~").split(".")[0] in NOT_IN_DIR_NAMES:  # e.g. logger.mlflow.tracking_uri=...
            continue
        if "/" in v or "\\" in v:
            v = Path(v.rstrip("/\\")).name or v
        items.append(f"{k}{sep}{v}")
    if not items:
        return ""
    name = safe_name(",".join(items).replace("/", "~").replace("\\", "~").replace(" ", ""), limit=10**6)
    if len(name) > limit:
        name = name[: limit - 9] + "~" + hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return name


def experiment_dir(task_overrides: Sequence[str], override_dirname: str) -> str:
    """A job folder's name in a sweep over experiments (``cprobe._hydra.EXPERIMENT_SUBDIR``): ``experiment=<its
    experiment>`` and the overrides that set it apart, read from the job's own overrides (Hydra's launchers and the
    SLURM driver's naming both give them)."""
    exp = next((o.split("=", 1)[1] for o in task_overrides if o.lstrip("+").startswith("experiment=")), "none")
    return dir_suffix(f"experiment={exp},{override_dirname}")


# Resolvers the configs use (registered wherever run_job is unpickled, i.e. in launcher workers too).
# paths.root_dir: the launch directory, without HydraConfig
OmegaConf.register_new_resolver("cprobe_cwd", os.getcwd, replace=True)
OmegaConf.register_new_resolver("cprobe_dirname", dir_suffix, replace=True)
OmegaConf.register_new_resolver("cprobe_expdir", lambda t, o: experiment_dir(list(t), o), replace=True)
OmegaConf.register_new_resolver("cprobe_safe", safe_name, replace=True)  # a config string as one path component
OmegaConf.register_new_resolver("hydra_dirsuffix", lambda s: f"_{d}" if s and (d := dir_suffix(s)) else "",
                                replace=True)


@dataclass(frozen=True)
class CacheKeys:
    enabled: bool = True
    dtype: str = "float32"  # how activations are stored: float32 | bfloat16 | model (the model's dtype)
    shard_mb: float = 256  # one activation shard (and the host memory extraction holds), MiB


@dataclass(frozen=True)
class JobKeys:
    """The top-level keys of a job config (each task adds its own node, named after the task)."""

    name: str = "default"
    task: str = "probing"
    seed: int = 0
    device: str = "auto"
    layers: Any = "all"
    position: str = "target"
    progress: bool = True
    force: bool = False
    cache: CacheKeys = field(default_factory=CacheKeys)
    paths: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    dataset: dict | None = None
    probe: dict | None = None
    intervention: dict | None = None
    split: dict | None = None
    logger: dict | None = field(default_factory=dict)  # experiment trackers (cprobe.trackers); never in the results
    plugins: list[str] = field(default_factory=list)  # modules imported first: they register methods by name
    metrics: list[str] = field(default_factory=list)  # outside metrics computed where the study has their inputs
    method: str | None = None  # the one method the job scores, set where its task names its methods (choose_method)


@dataclass
class Job:
    """A validated job: the plain config, the task module and its typed config."""

    cfg: dict[str, Any]
    keys: JobKeys
    task: Any  # the task module
    task_cfg: Any  # its Config dataclass instance
    uses: Any = None  # the task's Uses declaration (cprobe.tasks.Uses)
    data_root: Path | None = None  # where data files are read (None: checks that read data files are skipped)


def prepare(cfg: Mapping[str, Any], cache_root: Path | None = None, data_root: Path | None = None,
            overrides: Sequence[str] = ()) -> Job:
    """Validate a resolved job config completely, without loading a model or data; raise ConfigError.

    ``overrides`` are the job's command-line overrides (Hydra's ``hydra.overrides.task``): one that sets a config
    group or top-level key the task does not use (``intervention=leace`` for CausalGym), or another task's node, is
    refused — it would be silently ignored. Presets (``+experiment``, ``+debug``, ``+sweep``) may set any group."""
    from cprobe.tasks import TASK_MODULES, task_module, task_uses

    task_names = TASK_MODULES.names()
    known = set(JobKeys.__dataclass_fields__) | set(task_names)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown}; known keys: {sorted(known)} "
                          "(a `+key=value` override adds a new key: check its spelling)")
    keys = parse(JobKeys, {k: v for k, v in cfg.items() if k not in task_names}, "")
    from cprobe.registry import load_plugin_modules

    load_plugin_modules(keys.plugins)  # before anything reads a name (they register theirs)
    if keys.seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {keys.seed}")
    from cprobe.compute import check_threads, compute_flag

    compute_flag(keys.compute, "resume")
    compute_flag(keys.compute, "kv_resume")
    check_threads(keys.compute)
    module = task_module(keys.task)
    uses = task_uses(keys.task)
    check_overrides(keys.task, uses, overrides)
    if keys.method is not None:
        cfg = choose_method(cfg, keys.task, uses, overrides)
        keys = parse(JobKeys, {k: v for k, v in cfg.items() if k not in task_names}, "")
    for other in task_names:  # other tasks' nodes (e.g. +debug=smoke sizes them all) are checked, not used
        if other in cfg and other != keys.task:
            parse(task_module(other).Config, cfg[other], other)
    task_cfg = parse(module.Config, cfg.get(keys.task), keys.task)
    check_metrics(keys.metrics, keys.task)
    job = Job(dict(cfg), keys, module, task_cfg, uses, data_root)
    _validate_common(job)
    if hasattr(module, "validate"):
        module.validate(job)
    if cache_root is not None and "layers" in uses.groups:
        from cprobe.extract import resolve_layers
        from cprobe.models.load import peek_n_layers

        n = peek_n_layers(keys.model, cache_root, data_root)
        if n is not None:
            resolve_layers(keys.layers, n)
    return job


def check_metrics(refs: Sequence[str], task: str) -> None:
    """The config's ``metrics:``: outside metrics that resolve, each read from inputs the task computes (one line
    naming what is missing otherwise)."""
    from cprobe.metrics.registry import INPUTS, resolve_metric

    seen: dict[str, str] = {}
    for ref in refs:
        m = resolve_metric(ref)
        if m.name in seen:
            raise ConfigError(f"metrics lists {m.name!r} twice ({seen[m.name]!r} and {ref!r})")
        seen[m.name] = ref
        studies = INPUTS[str(m.inputs)][1]
        if task not in studies:
            raise ConfigError(f"metric {ref!r} reads {m.inputs!r} inputs, which task {task!r} does not compute "
                              f"(tasks that do: {list(studies)}); drop it from metrics for this task")


def choose_method(cfg: Mapping[str, Any], task: str, uses: Any, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``method=NAME``: the config with the one method this job scores written where its task names its methods
    (``Uses.methods``), so one sweep line (``-m +experiment=A,B method=das,leace``) scores the same methods in every
    study. A list key gets ``[NAME]``; the ``intervention`` group gets NAME's node (``conf/intervention/<NAME>.yaml``,
    else ``{name: NAME}``), a direction method's being the intervention that bridges it (``mean`` →
    ``mean_direction``). One line for a task that takes no method, a name no registry knows, or a command-line
    setting of the same key (it would be replaced)."""
    name = cfg.get("method")
    if name is None:
        return dict(cfg)
    where = uses.methods
    if where is None:
        from cprobe.tasks import TASK_MODULES, task_uses

        takers = [t for t in TASK_MODULES.names() if task_uses(t).methods]
        raise ConfigError(f"task {task!r} does not score a method chosen by name, so `method={name}` would be "
                          f"ignored; drop it (tasks that take it: {takers})")
    for item in overrides:
        key = item.partition("=")[0].lstrip("+~")
        if key == where or key.startswith(f"{where}."):
            raise ConfigError(f"`{item}` and `method={name}` both set {where}: method= replaces it; keep one")
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in cfg.items()}
    if where == "intervention":
        out["intervention"] = _intervention_node(str(name), out)
        return out
    node, _, key = where.partition(".")
    out[node] = {**(out.get(node) or {}), key: [name]}
    return out


def _intervention_node(name: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The intervention config of method ``name`` (its own, or that of the intervention bridging direction ``name``),
    its interpolations resolved in the job's config ``cfg`` (``model: ${oc.select:model.name,null}``)."""
    from cprobe.interventions import INTERVENTIONS
    from cprobe.methods import bridge, method_names
    from cprobe.paths import config_dir
    from cprobe.registry import did_you_mean

    if name not in INTERVENTIONS:
        if bridge(name) is None:
            raise ConfigError(f"unknown method {name!r} for method={did_you_mean(name, method_names())}; choose from "
                              f"{method_names()}")
        name = bridge(name)
    path = config_dir() / "intervention" / f"{name}.yaml"
    if not path.is_file():
        return {"name": name}
    job = OmegaConf.create({**{k: v for k, v in cfg.items() if k != "intervention"}, "intervention": OmegaConf.load(path)})
    return OmegaConf.to_container(job.intervention, resolve=True)  # type: ignore[return-value]


PRESET_GROUPS = ("experiment", "debug", "sweep", "local", "hydra", "compute", "paths")
"""Groups that set other groups for a purpose (a study, smoke sizes, a grid, a machine): never refused."""


def check_overrides(task: str, uses: Any, overrides: Sequence[str]) -> None:
    """Refuse a command-line override of a shared group or key the task does not use, or of another task's node,
    with one line naming it and what the task reads (``cprobe.tasks.SHARED_GROUPS``; ``~group`` and ``group=null``
    unset it and are fine)."""
    from cprobe.tasks import SHARED_GROUPS, TASK_MODULES

    for item in overrides:
        if item.startswith("~"):
            continue
        key, _, value = item.partition("=")
        head = key.lstrip("+").split(".")[0].split("/")[0]
        if head in PRESET_GROUPS or value.strip() in ("null", "None", "~"):
            continue
        if head in SHARED_GROUPS and head not in uses.groups:
            raise ConfigError(f"task {task!r} does not use `{head}`, so `{item}` would be ignored; drop it ({task} "
                              f"reads {sorted(uses.groups)} and its own `{task}.*` settings)")
        if head in TASK_MODULES and head != task:
            raise ConfigError(f"`{item}` sets the {head!r} task's settings but this job runs task {task!r}; drop it or "
                              f"set `{task}.*`")


def _validate_common(job: Job) -> None:
    from cprobe.extract import check_layers_spec
    from cprobe.models.formatters import check_word_position
    from cprobe.models.load import check_device, check_device_available, parse_model_config
    from cprobe.tasks import TASK_MODULES, tasks_with

    keys, uses = job.keys, job.uses
    from cprobe.trackers import check as check_loggers

    check_loggers(keys.logger)
    check_device(keys.device)
    mc = parse_model_config(keys.model)
    for device in {keys.device, mc.device} - {"auto", "cpu"}:  # cuda without a GPU: now, not after the run dir exists
        check_device_available(device)
    from cprobe.models.placement import check_placement_for

    check_placement_for(mc, mc.device if mc.device != "auto" else keys.device)  # a device map: accelerate, GPUs
    if mc.reads_as_set and "model_sets" not in uses.capabilities:
        readers = tasks_with("model_sets")
        raise ConfigError(f"model {mc.name!r} is {mc.reads_as_set}; only task(s) {readers} read one; pick a single "
                          f"model for task {keys.task!r}")
    bad = sorted(set(mc.task_defaults or {}) - set(TASK_MODULES.names()))
    if bad:
        raise ConfigError(f"model {mc.name!r}: unknown task(s) {bad} under model.task_defaults; choose from "
                          f"{TASK_MODULES.names()}")
    if "layers" in uses.groups:
        check_layers_spec(keys.layers)
    if "position" in uses.groups:
        check_word_position(keys.position)
    if keys.dataset is not None and "dataset" in uses.groups:
        from cprobe.data.registry import split_config

        split_config(keys.dataset)
    if keys.split is not None and "split" in uses.groups:
        from cprobe.data.splits import check_split_spec

        check_split_spec(keys.split)
    for name, pc in (keys.probe or {}).items() if "probe" in uses.groups else ():
        from cprobe.probes import PROBES

        if not isinstance(pc, Mapping):
            raise ConfigError(f"probe.{name} must be a probe config (a mapping with a 'name')")
        PROBES.build(pc, seed=keys.seed)


def _plain(cfg: DictConfig) -> dict[str, Any]:
    """The resolved job config; a model config without a name (``model=local``) gets its checkpoint's."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # interpolation / resolver errors
        raise ConfigError(f"cannot resolve the config: {str(e).splitlines()[0]}") from None
    assert isinstance(plain, dict)
    if isinstance(plain.get("model"), dict) and not plain["model"].get("name"):
        from cprobe.models.load import named

        plain["model"] = named(plain["model"])
    return plain


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's stop) raises :class:`Terminated`, a KeyboardInterrupt, so a job is marked
    ``interrupted`` as on Ctrl-C; the previous handler is restored afterwards. Only the main thread can take
    signals: elsewhere nothing changes."""
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(f"terminated by signal {signum} (SIGTERM)")

    def dropped(u: Any) -> None:  # an exception out of a finaliser, a weakref callback or a collected generator is
        if u.exc_type is not None and issubclass(u.exc_type, Terminated):  # dropped (seen: the job ran on): the
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGTERM)).start()  # signal comes again after it
        else:
            hook(u)

    previous, hook = signal.signal(signal.SIGTERM, handler), sys.unraisablehook
    sys.unraisablehook = dropped
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = hook


def run_job(cfg: DictConfig) -> None:
    """Run one job (one point of a sweep). Top-level so joblib/submitit can pickle it by reference."""
    with sigterm_as_interrupt():
        _run_job(cfg)


def _run_job(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    fresh = not (out_dir / STATUS).exists()  # no earlier run here: a refused input leaves nothing behind
    t0 = time.time()
    try:
        plain = _plain(cfg)
        cache_root, data_root = roots(plain)
        job = prepare(plain, cache_root, data_root, overrides=list(hc.overrides.task))
        # the job's config (method= written in); the trackers read `logger` when the job ends, results never do
        plain = {k: v for k, v in job.cfg.items() if k != "logger"}
    except CprobeError as e:
        if not multirun:  # a config error changes nothing: what this process made goes, an earlier run's record
            made = ownership.MADE.pop(ownership.key(out_dir), None)  # and status.json stay as they were
            if made is not None:  # (without cprobe's callback nothing was recorded, so nothing is removed)
                ownership.undo(made)
            raise JobAborted(e) from None
        _fail(out_dir, e, t0, str(cfg.get("task", "?")), None, multirun)
        return
    h = job_hash(plain)
    prev = read_status(out_dir)
    if prev and prev.get("state") == "running" and prev.get("pid") not in (None, os.getpid()):
        if not process_gone(prev) and prev.get("host") == this_process()["host"]:
            e = CprobeError(f"{out_dir} is in use by another cprobe process ({describe_state(prev)}); wait for it, "
                            "or pick another hydra.run.dir / hydra.sweep.dir")
            if multirun:
                log.error("job skipped: %s", e)
                FAILED.append(f"{out_dir.name}: {e}")
                return
            raise JobAborted(e)
        log.info("%s: the previous run of this job %s; running it again", out_dir,
                 f"died while running ({describe_state(prev)})" if process_gone(prev) else
                 f"is marked running on host {prev.get('host')} (cannot be checked from here)")
    if prev and prev.get("state") == "done" and prev.get("config_hash") == h and not job.keys.force:
        log.info("job already done with the same config (%s); skipping — pass force=true to redo it", out_dir)
        return
    if prev and prev.get("state") == "done" and prev.get("config_hash") != h:
        log.info("%s holds a finished job with a different config; running again", out_dir)
    _fit_to_machine(plain, hc)
    ctx = JobContext(cfg=plain, out_dir=out_dir, data_root=data_root, cache_root=cache_root,
                     progress=job.keys.progress and not quiet_workers())
    seed_everything(job.keys.seed)
    proc = this_process()
    write_status(out_dir, state="running", config_hash=h, started=t0, task=job.keys.task, **proc)
    try:
        from cprobe.tasks import task_result

        result = task_result(job.task.run(ctx, job.task_cfg))
        table = result.table
        table["task"] = job.keys.task
        table["seed"] = job.keys.seed
        if ctx.warnings:
            table["warnings"] = "; ".join(ctx.warnings)
        if ctx.weights_column():  # quantised weights name themselves in every record (its info)
            table["model_weights"] = ctx.weights_column()
        from cprobe import outputs, results

        results.write_job(table, out_dir, ctx.timings)
        outputs.finish_job(job.keys.task, results.split_volatile(table)[0], out_dir, plain,
                           sources=table["method_source"] if "method_source" in table else None, values=result.items,
                           models=ctx.models)
        write_status(out_dir, state="done", config_hash=h, started=t0, duration_s=time.time() - t0,
                     task=job.keys.task, rows=len(table), timings=ctx.timings, warnings=ctx.warnings)
        outputs.write_report(out_dir)
        log.info("wrote %s (%d rows) in %.1fs", out_dir / "metrics.csv", len(table), time.time() - t0)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM / a SLURM task's SIGUSR2 (Terminated)
        signame = e.signame if isinstance(e, Terminated) else "SIGINT"
        write_status(out_dir, state="interrupted", config_hash=h, started=t0, duration_s=time.time() - t0,
                     task=job.keys.task, signal=signame, **proc)
        raise
    except Exception as e:
        if isinstance(e, InputRefused) and not multirun and fresh:  # refused input: nothing left behind
            made = ownership.MADE.pop(ownership.key(out_dir), None)
            if made is not None:
                ownership.undo(made)
            raise JobAborted(e) from None
        _fail(out_dir, e, t0, job.keys.task, h, multirun)


def job_hash(plain: Mapping[str, Any]) -> str:
    """What ``status.json`` records to tell a finished job with the same config (``force``, ``progress`` and the
    trackers of ``logger`` aside: none of them changes a result). The job and the SLURM driver (which asks whether a
    point is done before submitting it) both hash through here."""
    return config_hash({k: v for k, v in plain.items() if k not in ("force", "progress", "logger")})


def is_done(plain: Mapping[str, Any], out_dir: Path) -> bool:
    """Whether ``out_dir`` holds this job finished with the same config (a rerun would skip it)."""
    prev = read_status(Path(out_dir))
    return bool(prev and prev.get("state") == "done" and prev.get("config_hash") == job_hash(plain)
                and not plain.get("force"))


def _fit_to_machine(plain: dict[str, Any], hc: Any) -> None:
    """The thread policy for the jobs sharing this machine (``compute.threads``, ``compute.wait_policy``; a joblib
    sweep's ``n_jobs`` run side by side), and in a parallel sweep on a multi-GPU box a GPU of this worker's own
    (``device`` becomes ``cuda:<i>``; the config hash is computed before)."""
    from cprobe.compute import configure_process, worker_device

    workers = 1
    launcher = hc.launcher if "launcher" in hc else {}
    if "joblib" in str(launcher.get("_target_", "")).lower():
        n = int(launcher.get("n_jobs", 1) or 1)
        workers = n if n > 0 else os.cpu_count() or 1
    configure_process(workers, plain.get("compute"))
    device = str(plain.get("device", "auto"))
    new = worker_device(device, workers, int(hc.job.get("num", 0) or 0))
    if new != device:
        log.info("parallel worker on %s", new)
        plain["device"] = new


def _fail(out_dir: Path, e: Exception, t0: float, task: str, h: str | None, multirun: bool) -> None:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    write_status(out_dir, state="failed", config_hash=h, started=t0, duration_s=time.time() - t0, task=task,
                 error=msg, traceback=None if isinstance(e, CprobeError) else traceback.format_exc())
    if multirun:
        log.error("job failed: %s", msg)  # keep the sweep going; the CLI exits non-zero at the end
        return
    if isinstance(e, CprobeError):
        raise JobAborted(e) from None
    raise e


def collect(directory: Path, partial: bool = False):
    """``cprobe collect``: see :func:`cprobe.outputs.collect`."""
    from cprobe.outputs import collect as collect_

    return collect_(Path(directory), partial=partial)
