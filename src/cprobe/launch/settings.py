"""The SLURM launcher's own settings (``hydra.launcher.*``), checked before anything is asked of the cluster: each
value's kind and range, and the pairs that cannot work together.

- ``timeout_min`` against ``signal_delay_s``: SLURM warns a task (SIGUSR2) ``signal_delay_s`` before its time limit,
  and up to :data:`SIGNAL_SLACK_S` earlier still (its event resolution, sbatch(1) ``--signal``); the task then
  requeues itself. The warning may take at most half of a task's time — ``signal_delay_s + 60 <= timeout_min * 30``
  — else a task would be warned, and requeued, before most of its points could finish, round after round.
- ``additional_parameters`` (any other sbatch flag) must not set what a launcher key sets (``time``, ``mem``,
  ``cpus-per-task``, ``signal``, ...): submitit would pass both, the scheduler keep one, and cprobe's checks and
  packing would go by the other. Each array task is one process running its points, so ``ntasks``/``nodes`` are
  refused too, and ``no-requeue`` while ``max_requeues`` asks for requeues.
- ``max_requeues >= 0``; ``array_parallelism``, ``signal_delay_s`` (at most SLURM's 65535), ``timeout_min`` and
  ``points_per_task`` ``>= 1``; ``poll_s >= 1`` second; ``setup`` a list of shell lines; ``detach`` a boolean.

What depends on the partition (CPUs, memory, GPUs, its time limit) is :mod:`cprobe.launch.resources`. Every refusal
is one line naming the key(s) and what to set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cprobe.errors import ConfigError

DEFAULTS: dict[str, Any] = {
    "partition": None, "account": None, "qos": None, "constraint": None, "timeout_min": 120,
    "gpus_per_node": "auto", "cpus_per_task": "auto", "mem_gb": "auto", "points_per_task": "auto",
    "max_requeues": 3, "signal_delay_s": 120, "array_parallelism": 16, "poll_s": 10, "detach": False,
    "setup": [], "additional_parameters": {}, "name": "cprobe", "exclude": None,
}

SIGNAL_SLACK_S = 60
"""How much earlier than ``--signal=USR2@<delay>`` asks SLURM may send the signal (sbatch(1))."""
MAX_SIGNAL_DELAY_S = 65535  # sbatch(1): --signal's sig_time is at most 65535 s

RESERVED_FLAGS: dict[str, str] = {
    "time": "timeout_min", "partition": "partition", "account": "account", "qos": "qos",
    "constraint": "constraint", "exclude": "exclude", "job-name": "name", "cpus-per-task": "cpus_per_task",
    "cpus-per-gpu": "cpus_per_task", "mem": "mem_gb", "mem-per-cpu": "mem_gb", "mem-per-gpu": "mem_gb",
    "gpus": "gpus_per_node", "gpus-per-node": "gpus_per_node", "gpus-per-task": "gpus_per_node",
    "signal": "signal_delay_s", "array": "array_parallelism",
}
"""sbatch flags a launcher key sets: ``additional_parameters`` naming one is refused, pointing at the key."""
ONE_PROCESS_FLAGS = ("nodes", "ntasks", "ntasks-per-node")
OWN_FLAGS = ("output", "error", "open-mode")  # the tasks' logs (.slurm/<job>/)


def _integer(params: Mapping[str, Any], key: str, minimum: int, auto: bool = False) -> None:
    v = params[key]
    if auto and str(v).strip().lower() == "auto":
        return
    alt = " or auto" if auto else ""
    if isinstance(v, bool) or not isinstance(v, int | str) or not str(v).strip().lstrip("-").isdigit():
        raise ConfigError(f"hydra.launcher.{key}={v!r} must be an integer{alt}")
    if int(v) < minimum:
        raise ConfigError(f"hydra.launcher.{key}={v!r} must be >= {minimum}{alt}")


def _text(params: Mapping[str, Any], key: str) -> None:
    v = params[key]
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise ConfigError(f"hydra.launcher.{key}={v!r} must be a non-empty string (or null)")


def check_additional(extra: Any, max_requeues: int) -> dict[str, Any]:
    """``additional_parameters`` as ``{sbatch flag: value}``; ConfigError for a flag cprobe sets itself."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"hydra.launcher.additional_parameters={extra!r} must be a mapping of sbatch flags to "
                          "values, e.g. {mail-type: END}")
    out = {str(k).strip().lstrip("-").replace("_", "-").lower(): v for k, v in extra.items()}
    for flag, value in out.items():
        where = f"hydra.launcher.additional_parameters.{flag}"
        if flag in RESERVED_FLAGS:
            raise ConfigError(f"{where} sets what hydra.launcher.{RESERVED_FLAGS[flag]} sets (sbatch would get "
                              f"both); use hydra.launcher.{RESERVED_FLAGS[flag]} instead")
        if flag == "gres" and "gpu" in str(value).lower():
            raise ConfigError(f"{where}={value!r} asks for GPUs, which hydra.launcher.gpus_per_node sets; use that")
        if flag in ONE_PROCESS_FLAGS:
            raise ConfigError(f"{where}={value!r}: each array task is one process that runs its points one after "
                              "another (several would run the same points at once); drop it, and use "
                              "hydra.launcher.cpus_per_task for more cores")
        if flag in OWN_FLAGS:
            raise ConfigError(f"{where}: cprobe writes the tasks' logs itself (<sweep dir>/.slurm/<job id>/); "
                              "drop it")
        if flag == "no-requeue" and value not in (False, None) and max_requeues > 0:
            raise ConfigError(f"{where} forbids the requeues hydra.launcher.max_requeues={max_requeues} asks for; "
                              "set hydra.launcher.max_requeues=0 instead (a task near its time limit is then "
                              "stopped, its points marked interrupted)")
    return out


def check_signal_delay(timeout_min: int, signal_delay_s: int) -> None:
    """The time-limit warning may take at most half of a task's time (module doc)."""
    if signal_delay_s + SIGNAL_SLACK_S <= timeout_min * 30:
        return
    need = math.ceil((signal_delay_s + SIGNAL_SLACK_S) / 30)
    most = timeout_min * 30 - SIGNAL_SLACK_S
    lower = f", or lower hydra.launcher.signal_delay_s to {most} or less" if most >= 1 else ""
    raise ConfigError(
        f"hydra.launcher.timeout_min={timeout_min} with signal_delay_s={signal_delay_s}: SLURM warns a task "
        f"(SIGUSR2) {signal_delay_s} s before its time limit, and up to {SIGNAL_SLACK_S} s earlier still, so a task "
        f"would be stopped and requeued after at most {max(0, timeout_min * 60 - signal_delay_s - SIGNAL_SLACK_S)} "
        f"s of its {timeout_min * 60} s, round after round; the warning may take at most half a task's time: "
        f"raise timeout_min to {need} or more{lower}")


def check(params: Mapping[str, Any]) -> dict[str, Any]:
    """The launcher's settings (defaults filled in, OmegaConf nodes made plain), every value and pair checked;
    ConfigError, in one line, for the first that cannot work."""
    from omegaconf import OmegaConf

    out = {**DEFAULTS, **{k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                          for k, v in params.items()}}
    unknown = sorted(set(out) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown hydra.launcher key(s) {unknown} for the SLURM launcher; known: {sorted(DEFAULTS)}")
    for key in ("partition", "account", "qos", "constraint", "exclude", "name"):
        _text(out, key)
    for key, minimum in (("timeout_min", 1), ("signal_delay_s", 1), ("max_requeues", 0), ("array_parallelism", 1)):
        _integer(out, key, minimum)
        out[key] = int(out[key])
    _integer(out, "points_per_task", 1, auto=True)
    if out["signal_delay_s"] > MAX_SIGNAL_DELAY_S:
        raise ConfigError(f"hydra.launcher.signal_delay_s={out['signal_delay_s']} exceeds SLURM's "
                          f"{MAX_SIGNAL_DELAY_S} s")
    check_signal_delay(out["timeout_min"], out["signal_delay_s"])
    poll = out["poll_s"]
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not poll >= 1:
        raise ConfigError(f"hydra.launcher.poll_s={poll!r} must be a number of seconds >= 1 (how often the driver "
                          "asks the scheduler)")
    if not isinstance(out["detach"], bool):
        raise ConfigError(f"hydra.launcher.detach={out['detach']!r} must be true or false")
    setup = out["setup"]
    if setup is None:
        out["setup"] = []
    elif not isinstance(setup, list) or not all(isinstance(line, str) for line in setup):
        raise ConfigError(f"hydra.launcher.setup={setup!r} must be a list of shell lines, e.g. "
                          "['module load cuda']")
    out["additional_parameters"] = check_additional(out["additional_parameters"], out["max_requeues"])
    return out
