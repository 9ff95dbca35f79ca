"""Hyperparameter search: the ``hparams_search=`` config group, run by cprobe's Optuna sweeper (TPE by default).

``cprobe run -m +experiment=sva_tiny_reliability intervention=inlp hparams_search=reliability`` asks Optuna for the
intervention's hyperparameter ``n_trials`` times, runs each trial as an ordinary job of the sweep (its own directory
named by its overrides, records, report, resume), reads the trial's objective back from the job's
``records.parquet`` — a registered metric (:mod:`cprobe.metrics.registry`), optimised in the direction the registry
gives — and writes at the sweep root ``search.json`` and ``search.md``: every trial, the winner and why.

Why not hydra-optuna-sweeper: its newest release (1.3.0) still requires ``optuna<3``; optuna 2.10 imports on Python
3.11, but its RDB storage fails on SQLAlchemy 2 (so a search cannot be persisted or resumed), it takes the objective
from the task function's return value (a skipped, resumed job returns none) and one failed trial ends the whole
search. This sweeper is small and uses optuna's own ask/tell API (optuna >= 4): the objective comes from the records,
a failed job is a failed trial and the search goes on, and a rerun into the same sweep directory
(``hydra.sweep.dir=DIR``) rebuilds the study from the finished trials (unfinished ones are run again first) and
asks only for the trials still missing.

The search space: ``hydra.sweeper.params`` ({key: Hydra sweep syntax}: ``range(0,41)``, ``interval(0.01,1)``,
``tag(log,interval(1e-4,1))``, ``choice(a,b)``, ``a,b``), plus any sweep override on the command line
(``intervention.rank=range(0,10)``), plus — when neither names it — the selected intervention's own hyperparameter
(``intervention.hparam``) over its range in ``hydra.sweeper.hparam_ranges``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cprobe.errors import ConfigError

log = logging.getLogger("cprobe")

SEARCH_JSON = "search.json"
SEARCH_MD = "search.md"


@dataclass(frozen=True)
class Sampler:
    name: Literal["tpe", "random"] = "tpe"
    seed: int = 0
    n_startup_trials: int = 4  # TPE: random trials before it models the objective


@dataclass(frozen=True)
class SearchOptions:
    """``hydra.sweeper`` of ``hydra/sweeper=cprobe_optuna`` (set by an ``hparams_search`` preset)."""

    metric: str = "reliability"  # a registered metric (`cprobe list metrics`) the trials' study records
    direction: Literal["maximize", "minimize"] | None = None  # null: from the metrics registry
    where: dict = field(default_factory=dict)  # record fields the objective's records must have ({method: das})
    reduce: Literal["mean", "max", "min"] = "mean"  # over the matching records (layers, slices, ...)
    n_trials: int = 20
    n_jobs: int = 1  # trials launched together (with hydra/launcher=local_parallel, its n_jobs)
    sampler: Sampler = field(default_factory=Sampler)
    params: dict = field(default_factory=dict)  # {config key: Hydra sweep syntax}
    hparam_ranges: dict = field(default_factory=dict)  # {intervention name: range of its own hyperparameter}

    def __post_init__(self) -> None:
        if self.n_trials < 1 or self.n_jobs < 1:
            raise ValueError(f"n_trials and n_jobs must be >= 1, got {self.n_trials}, {self.n_jobs}")


def options(raw: Mapping[str, Any]) -> SearchOptions:
    from cprobe.config import parse

    return parse(SearchOptions, {k: v for k, v in raw.items() if k != "_target_"}, "hydra.sweeper")


# ----------------------------------------------------------------------------------------------- objective
def direction_of(opts: SearchOptions) -> tuple[str, str]:
    """(``maximize``|``minimize``, where it came from); refuses an unknown metric or one with no better side."""
    from cprobe.metrics.registry import HIGHER, LOWER, METRICS

    if opts.metric not in METRICS:
        raise ConfigError(f"unknown metric {opts.metric!r} for hydra.sweeper.metric; choose from {sorted(METRICS)} "
                          "(`cprobe list metrics` defines them)")
    m = METRICS[opts.metric]
    if opts.direction is not None:
        return opts.direction, "hydra.sweeper.direction"
    if m.direction == HIGHER:
        return "maximize", "the metrics registry: higher is better"
    if m.direction == LOWER:
        return "minimize", "the metrics registry: lower is better"
    raise ConfigError(f"metric {opts.metric!r} has no better direction in the metrics registry; set "
                      "hydra.sweeper.direction=maximize or minimize")


def _matches(series: Any, want: Any, column: str) -> Any:
    from cprobe.records import canonical

    if column in ("setting", "slice") and isinstance(want, Mapping):
        return series == canonical(want)
    return series.astype(str) == str(want)


def objective(job_dir: Path, opts: SearchOptions) -> tuple[float | None, int, str]:
    """(value, records used, why not) of a finished trial: the mean (or max/min) of its records of the metric that
    match ``where``; the whole-data records (slice ``{}``) when ``where`` names no slice and there are any."""
    import pandas as pd

    from cprobe.records import RECORDS_FILE

    f = Path(job_dir) / RECORDS_FILE
    if not f.is_file():
        return None, 0, f"no {RECORDS_FILE}"
    r = pd.read_parquet(f)
    r = r[r["metric"] == opts.metric]
    for k, v in opts.where.items():
        if k not in r.columns:
            return None, 0, f"records have no field {k!r}"
        r = r[_matches(r[k], v, k)]
    if "slice" not in opts.where and (r["slice"] == "{}").any():
        r = r[r["slice"] == "{}"]
    v = r["value"].astype(float).dropna()
    if v.empty:
        return None, 0, f"no {opts.metric} record" + (f" with {opts.where}" if opts.where else "")
    value = float(getattr(v, opts.reduce)())
    return (value if math.isfinite(value) else None), len(v), ""


# ----------------------------------------------------------------------------------------------- space
def distribution(key: str, override: Any) -> Any:
    """An optuna distribution from a parsed Hydra sweep override (choice / range / interval, ``tag(log, ...)``)."""
    import optuna.distributions as D
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    v = override.value()
    if isinstance(v, ChoiceSweep):
        return D.CategoricalDistribution([tuple(c) if isinstance(c, list) else c for c in v.list])
    if isinstance(v, RangeSweep):
        values = list(v.range())
        if not values:
            raise ConfigError(f"search space {key}: {override.input_line} is empty")
        if all(isinstance(x, int) for x in (v.start, v.stop, v.step)):
            return D.IntDistribution(int(values[0]), int(values[-1]), step=int(v.step))
        return D.FloatDistribution(float(values[0]), float(values[-1]), step=float(v.step))
    if isinstance(v, IntervalSweep):
        log_ = "log" in (v.tags or set())
        lo, hi = v.start, v.end
        if lo is None or hi is None or lo >= hi:
            raise ConfigError(f"search space {key}: {override.input_line} needs low < high")
        if isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool):
            return D.IntDistribution(lo, hi, log=log_)
        if log_ and lo <= 0:
            raise ConfigError(f"search space {key}: a log interval needs low > 0, got {lo}")
        return D.FloatDistribution(float(lo), float(hi), log=log_)
    raise ConfigError(f"search space {key}: {override.input_line!r} is not a sweep (use range(a,b), interval(a,b), "
                      "tag(log,interval(a,b)), choice(a,b) or a,b)")


def value_text(v: Any) -> str:
    """A parameter value as a Hydra override value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, tuple):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    return str(v)


# ----------------------------------------------------------------------------------------------- the search
@dataclass
class Search:
    """One search, set up and validated by :func:`prepare`, run by :func:`run` (:class:`CprobeOptunaSweeper`)."""

    opts: SearchOptions
    direction: str
    direction_from: str
    fixed: list[str]  # the command line's non-sweep overrides, every trial's
    space: dict[str, Any]  # key -> optuna distribution
    study_name: str  # the job's study (task)
    sweep_dir: Path
    trials: list[dict] = field(default_factory=list)


def _parser(config_loader: Any) -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create(config_loader=config_loader)


def _compose(sweeper: Any, overrides: Sequence[str]) -> Any:
    return sweeper.hydra_context.config_loader.load_sweep_config(sweeper.config, list(overrides))


def _plain_job(cfg: Any) -> dict[str, Any]:
    import copy

    from omegaconf import OmegaConf, open_dict, read_write

    cfg = copy.deepcopy(cfg)
    with read_write(cfg), open_dict(cfg):
        cfg.pop("hydra", None)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _missing_key(cfg: Any, key: str) -> str | None:
    """Why ``key`` cannot be searched in the composed job config ``cfg`` (None: it can)."""
    from omegaconf import OmegaConf

    group = key.split(".")[0]
    if "." not in key:  # a config group (intervention=inlp,rlace) or a top-level key
        if group in cfg or group in (cfg.hydra.runtime.choices if "hydra" in cfg else {}):
            return None
        return f"the config has no key or group {key!r} to search"
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None)
    if node is not None and hasattr(node, "keys") and leaf in node:
        return None
    if group == "intervention" and node is not None and parent == "intervention":
        have = sorted(k for k in node.keys() if k not in ("name", "hparam"))
        return (f"intervention {node.get('name')!r} has no hyperparameter {leaf!r}; it has {have} "
                f"(search one of them, e.g. hydra.sweeper.params={{intervention.{have[0] if have else 'x'}: ...}})")
    has = f"{parent!r} has {sorted(node.keys())}" if node is not None and hasattr(node, "keys") else \
        f"there is no {parent!r}"
    return f"the config has no key {key!r} to search ({has})"


def prepare(sweeper: Any, arguments: Sequence[str]) -> Search:
    """Validate the whole search before anything runs: the sweeper's options, the metric (registered, recorded by
    the job's study, with a direction), every searched key (present in the job's config), and the job config itself
    at the low end of the space (:func:`cprobe.pipeline.prepare`). Raises :class:`ConfigError` in one line."""
    from importlib.util import find_spec

    from omegaconf import OmegaConf

    from cprobe.metrics.registry import METRICS

    if find_spec("optuna") is None:
        raise ConfigError("hparams_search needs the optuna package, which is not installed: pip install "
                          "'cprobe[optuna]'")
    opts = options(OmegaConf.to_container(sweeper.config.hydra.sweeper, resolve=True))  # type: ignore[arg-type]
    direction, why = direction_of(opts)
    parser = _parser(sweeper.hydra_context.config_loader)
    fixed, space = [], {}
    for o in parser.parse_overrides(list(arguments)):
        if o.is_sweep_override():
            space[o.get_key_element()] = distribution(o.get_key_element(), o)
        else:
            fixed.append(o.input_line)
    for key, text in _leaves(opts.params).items():
        (o,) = parser.parse_overrides([f"{key}={value_text(text) if not isinstance(text, str) else text}"])
        if not o.is_sweep_override():
            raise ConfigError(f"hydra.sweeper.params.{key}={text!r} is one value, not a search space (use "
                              "range(a,b), interval(a,b), tag(log,interval(a,b)) or choice(a,b))")
        space.setdefault(key, distribution(key, o))
    base = _compose(sweeper, fixed)
    task = str(base.get("task"))
    m = METRICS[opts.metric]
    if task not in m.studies:
        theirs = sorted(n for n, x in METRICS.items() if task in x.studies)
        raise ConfigError(f"metric {opts.metric!r} is not recorded by the {task} study (the {' and '.join(m.studies)} "
                          f"{'study records' if len(m.studies) == 1 else 'studies record'} it); "
                          f"{task} records {theirs}")
    icfg = base.get("intervention")
    hparam = icfg.get("hparam") if icfg is not None else None
    key = f"intervention.{hparam}" if hparam else None
    if key is not None and opts.hparam_ranges and "intervention" not in space and key not in space:
        if icfg.get("name") not in opts.hparam_ranges:
            raise ConfigError(f"no range for intervention {icfg.get('name')!r}'s hyperparameter {hparam!r} in "
                              f"hydra.sweeper.hparam_ranges (it has {sorted(opts.hparam_ranges)}); set "
                              f"hydra.sweeper.params={{{key}: ...}} or sweep {key}=... on the command line")
        (o,) = parser.parse_overrides([f"{key}={opts.hparam_ranges[icfg.get('name')]}"])
        space[key] = distribution(key, o)
    if not space:
        what = (f"intervention {icfg.get('name')!r} has no hyperparameter (hparam: null)" if icfg is not None
                and not hparam else "nothing to search")
        searchable = sorted(opts.hparam_ranges)
        raise ConfigError(f"{what}: name a search space with hydra.sweeper.params={{key: range(a,b)}} or a sweep "
                          "override" + (f", or pick an intervention with a range: {searchable}" if searchable else ""))
    for key in space:
        if why_not := _missing_key(base, key):
            raise ConfigError(why_not)
    import optuna.distributions as D

    from cprobe.paths import roots
    from cprobe.pipeline import prepare as prepare_job

    sample = [f"{k}={value_text(d.choices[0] if isinstance(d, D.CategoricalDistribution) else d.low)}"
              for k, d in space.items()]
    cfg = _compose(sweeper, fixed + sample)
    plain = _plain_job(cfg)
    prepare_job(plain, *roots(plain), overrides=fixed + sample)
    return Search(opts, direction, why, fixed, space, task, Path(sweeper.config.hydra.sweep.dir))


def _leaves(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``params`` as {dotted key: value}: YAML writes ``intervention.rank: ...``, a command-line override
    ``+hydra.sweeper.params.intervention.rank='range(0,9)'`` nests it."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, Mapping):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _trial_params(job: Path, space: Mapping[str, Any], parser: Any) -> dict[str, Any] | None:
    """A finished or unfinished job of this sweep as trial params (None: not a trial of this space)."""
    import yaml

    f = job / ".hydra" / "overrides.yaml"
    try:
        lines = yaml.safe_load(f.read_text()) or []
    except (OSError, yaml.YAMLError):
        return None
    got = {}
    for o in parser.parse_overrides([str(x) for x in lines]):
        key = o.get_key_element()
        if key in space and not o.is_sweep_override():
            v = o.value()
            got[key] = tuple(v) if isinstance(v, list) else v
    if set(got) != set(space):
        return None
    try:
        return got if all(space[k]._contains(space[k].to_internal_repr(v)) for k, v in got.items()) else None
    except (ValueError, TypeError):
        return None


def run(sweeper: Any, arguments: Sequence[str]) -> list[Any]:
    """Validate, then ask/launch/tell until ``n_trials``; write ``search.json``/``search.md``. A config error
    removes the (still empty) sweep directory and ends the command with one line before any job runs."""
    import optuna
    from omegaconf import OmegaConf

    from cprobe.errors import CprobeError, JobAborted

    try:
        s = prepare(sweeper, arguments)
    except CprobeError as e:
        _discard(sweeper.config)
        raise JobAborted(e) from None
    except Exception as e:  # a composition error (a typo in an override): the CLI words Hydra's errors
        _discard(sweeper.config)
        raise e
    s.sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(sweeper.config, s.sweep_dir / "multirun.yaml")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    o = s.opts
    sampler = (optuna.samplers.TPESampler(seed=o.sampler.seed, n_startup_trials=o.sampler.n_startup_trials)
               if o.sampler.name == "tpe" else optuna.samplers.RandomSampler(seed=o.sampler.seed))
    study = optuna.create_study(direction=s.direction, sampler=sampler)
    parser = _parser(sweeper.hydra_context.config_loader)
    resumed = _resume(s, study, parser)
    log.info("search: %s %s (%s) over %s with %s, %d trials%s", s.direction, o.metric, s.direction_from,
             {k: _dist_text(d) for k, d in s.space.items()}, o.sampler.name.upper(), o.n_trials,
             f"; {resumed} finished trial(s) found in {s.sweep_dir}" if resumed else "")
    returns, job_idx = [], 0
    size = _space_size(s.space)
    patience = 10 * o.n_trials  # proposals of points already run before a search of a small space gives up
    while _distinct(study) < o.n_trials and patience > 0:
        if size is not None and _distinct(study) >= size:
            log.info("search: all %d points of the space have been run", size)
            break
        batch: list[Any] = []
        twins: list[tuple[Any, Any]] = []  # (trial, the trial of this batch with the same params)
        for _ in range(min(o.n_jobs, o.n_trials - _distinct(study))):
            t = study.ask(s.space)
            done = next((d for d in study.trials if d.number != t.number and d.state.name == "COMPLETE"
                         and dict(d.params) == dict(t.params)), None)
            if done is not None:  # TPE may propose a point already run (its job would be skipped): same value
                t.set_user_attr("duplicate_of", done.number)
                study.tell(t, done.value)
                patience -= 1
                log.info("search: trial %d (%s) = trial %d: %s = %.6g (not counted)", t.number,
                         _params_text(t.params), done.number, o.metric, done.value)
                continue
            twin = next((b for b in batch if dict(b.params) == dict(t.params)), None)
            if twin is not None:
                twins.append((t, twin))
                continue
            batch.append(t)
        if not batch:
            continue
        lines = [s.fixed + [f"{k}={value_text(v)}" for k, v in t.params.items()] for t in batch]
        sweeper.validate_batch_is_legal(lines)  # each job composes, and its folder is new, empty or cprobe's
        results = sweeper.launcher.launch(lines, initial_job_idx=job_idx)
        job_idx += len(batch)
        returns.append(results)
        values = {}
        for t, r in zip(batch, results):
            job = Path(r.hydra_cfg.hydra.runtime.output_dir)
            value, n, why = objective(job, o) if _state(job) == "done" else (None, 0, f"the job is {_state(job)}")
            t.set_user_attr("job", _rel(job, s.sweep_dir))
            values[t.number] = value
            if value is None:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
                log.warning("search: trial %d (%s) has no objective: %s", t.number, _params_text(t.params), why)
            else:
                study.tell(t, value)
                log.info("search: trial %d (%s): %s = %.6g", t.number, _params_text(t.params), o.metric, value)
        for t, twin in twins:
            t.set_user_attr("duplicate_of", twin.number)
            if values.get(twin.number) is None:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(t, values[twin.number])
    write_summary(s, study)
    return returns


def _distinct(study: Any) -> int:
    """Trials that ran a job of their own (or failed): repeats of a point already run do not count."""
    return sum(1 for t in study.trials if t.state.is_finished() and "duplicate_of" not in t.user_attrs)


def _space_size(space: Mapping[str, Any]) -> int | None:
    """How many points a discrete space has (None: a continuous dimension)."""
    import optuna.distributions as D

    n = 1
    for d in space.values():
        if isinstance(d, D.CategoricalDistribution):
            n *= len(d.choices)
        elif isinstance(d, D.IntDistribution) and not d.log:
            n *= (d.high - d.low) // d.step + 1
        elif isinstance(d, D.FloatDistribution) and d.step is not None:
            n *= int(round((d.high - d.low) / d.step)) + 1
        else:
            return None
    return n


def _state(job: Path) -> str:
    from cprobe.job import read_status

    return str((read_status(job) or {}).get("state", "missing"))


def _rel(job: Path, root: Path) -> str:
    try:
        return str(job.relative_to(root))
    except ValueError:
        return str(job)


def _params_text(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={value_text(v)}" for k, v in params.items())


def _dist_text(d: Any) -> str:
    import optuna.distributions as D

    if isinstance(d, D.CategoricalDistribution):
        return f"choice{tuple(d.choices)}"
    kind = "int" if isinstance(d, D.IntDistribution) else "float"
    return f"{kind}[{d.low}, {d.high}]" + (" log" if d.log else "") + (f" step {d.step}" if d.step not in (None, 1)
                                                                         else "")


def _resume(s: Search, study: Any, parser: Any) -> int:
    """Add the sweep dir's finished trials to the study (and queue its unfinished ones to run first)."""
    import optuna

    n = 0  # (a sweep dir not made yet globs to nothing)
    for status in sorted(s.sweep_dir.glob("*/status.json")):
        job = status.parent
        params = _trial_params(job, s.space, parser)
        if params is None:
            continue
        if _state(job) == "done":
            value, _, why = objective(job, s.opts)
            if value is not None:
                study.add_trial(optuna.trial.create_trial(params=params, distributions=s.space, value=value,
                                                          user_attrs={"job": _rel(job, s.sweep_dir),
                                                                      "resumed": True}))
                n += 1
                continue
        study.enqueue_trial(params, skip_if_exists=True)
    return n


def write_summary(s: Search, study: Any) -> dict[str, Any]:
    """``search.json`` and ``search.md`` at the sweep root: the space, every trial, the winner and why."""
    from cprobe.io import atomic_write_bytes, write_json

    trials = [{"number": t.number, "params": {k: list(v) if isinstance(v, tuple) else v for k, v in t.params.items()},
               "value": t.value if t.state.name == "COMPLETE" else None, "state": t.state.name,
               "job": t.user_attrs.get("job"), "duplicate_of": t.user_attrs.get("duplicate_of"),
               "resumed": bool(t.user_attrs.get("resumed"))} for t in study.trials]
    done = [t for t in trials if t["state"] == "COMPLETE"]
    sign = 1 if s.direction == "maximize" else -1
    ranked = sorted(done, key=lambda t: (-sign * t["value"], t["number"]))
    best = ranked[0] if ranked else None
    if best is not None and best.get("job") is None and best.get("duplicate_of") is not None:
        best = dict(best, job=next((t["job"] for t in trials if t["number"] == best["duplicate_of"]), None))
    o = s.opts
    runner = next((t for t in ranked[1:] if best is None or t["params"] != best["params"]), None)
    if best is None:
        why = f"no trial finished with a {o.metric} value"
    else:
        why = (f"trial {best['number']} ({_params_text(best['params'])}) has the "
               f"{'highest' if sign > 0 else 'lowest'} {o.metric}, {best['value']:.6g} ({s.direction}: "
               f"{s.direction_from}; {o.reduce} over its {o.metric} records"
               + (f" with {o.where}" if o.where else "") + ")"
               + (f"; next best {runner['value']:.6g} (trial {runner['number']}, {_params_text(runner['params'])})"
                  if runner else "; no other setting finished"))
    summary = {"metric": o.metric, "direction": s.direction, "direction_from": s.direction_from,
               "study": s.study_name, "where": o.where, "reduce": o.reduce, "sampler": asdict(o.sampler),
               "n_trials": o.n_trials, "space": {k: _dist_text(d) for k, d in s.space.items()},
               "fixed": s.fixed, "trials": trials, "best": best, "why": why,
               "failed": [t["number"] for t in trials if t["state"] == "FAIL"]}
    write_json(s.sweep_dir / SEARCH_JSON, summary)
    atomic_write_bytes(s.sweep_dir / SEARCH_MD, _markdown(summary).encode())
    log.info("search: %s", why)
    return summary


def _markdown(s: Mapping[str, Any]) -> str:
    repeats = sum(1 for t in s["trials"] if t["duplicate_of"] is not None)
    lines = [f"# Search: {s['direction']} {s['metric']}", "", f"**Winner.** {s['why']}.", "",
             f"Space: {', '.join(f'`{k}` {v}' for k, v in s['space'].items())}; sampler {s['sampler']['name']} "
             f"(seed {s['sampler']['seed']}); {len(s['trials']) - repeats} trials run (n_trials {s['n_trials']}), "
             f"{repeats} repeated point(s) not run again; fixed overrides: {' '.join(s['fixed']) or '(none)'}.", "",
             "| trial | params | value | state | job |", "|---|---|---|---|---|"]
    for t in s["trials"]:
        v = "" if t["value"] is None else f"{t['value']:.6g}"
        job = t["job"] or (f"= trial {t['duplicate_of']}" if t["duplicate_of"] is not None else "")
        lines.append(f"| {t['number']} | {_params_text(t['params'])} | {v} | {t['state']} | {job} |")
    return "\n".join(lines) + "\n"


def _discard(config: Any) -> None:
    """Undo the sweep's start before any job ran: the trackers' parent runs, then what this process made of the sweep
    directory (:mod:`cprobe.ownership`: never what was there before), ``latest`` pointed back."""
    from cprobe import ownership, trackers

    trackers.sweep_discarded(config)
    made = ownership.MADE.pop(ownership.key(config.hydra.sweep.dir), None)
    if made is not None:
        ownership.undo(made)
