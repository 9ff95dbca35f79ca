"""What each sweep launcher reads (``hydra/launcher=NAME``), and the refusal of a launcher setting none would read.

A launcher reads the keys of its own config node as Hydra composes the option: ``conf/hydra/launcher/<name>.yaml``
with what it extends (Hydra's joblib plugin for ``local_parallel``; ``conf/local/slurm.yaml`` for ``slurm``), or a
Hydra plugin's own node (``basic`` has none). Nothing is listed by hand. The Hydra callback :class:`RefuseUnread`
(first in ``conf/hydra/default.yaml``, before anything runs or a directory is made) refuses, in one line naming the
launchers that read the key:

- in a single run (no ``-m``), which uses no launcher: ``hydra/launcher=...`` and any ``hydra.launcher.*``;
- in a sweep, a ``hydra.launcher.<key>`` the chosen launcher's node does not have (``+hydra.launcher.timeout_min=5``
  on the basic launcher).

A key set without ``+`` that the chosen launcher lacks is Hydra's own composition error;
:func:`cprobe._hydra.explain_error` names the launchers that read it with :func:`who_reads`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hydra.experimental.callback import Callback

from cprobe.errors import ConfigError, JobAborted

CHOICE = "hydra/launcher"


def launcher_key(override: str) -> str | None:
    """The ``hydra.launcher`` key an override sets, ``""`` for the ``hydra/launcher`` choice itself, else None."""
    key = override.split("=", 1)[0].lstrip("+~")
    if key == CHOICE:
        return ""
    return key.split(".")[2] if key.startswith("hydra.launcher.") else None


@contextmanager
def _hydra() -> Iterator[Any]:
    """Hydra's global instance: the running app's, or one on cprobe's config dir for the block."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield GlobalHydra.instance()
        return
    from cprobe.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        yield GlobalHydra.instance()


def launcher_keys(name: str, searchpath: tuple[str, ...] = ()) -> frozenset[str]:
    """The keys of launcher option ``name``'s node as Hydra composes it (``_target_`` aside); ``searchpath``: the
    command line's ``hydra.searchpath`` override, where a launcher of one's own may live."""
    from hydra import compose

    with _hydra():
        node = compose(None, overrides=[f"{CHOICE}={name}", *searchpath], return_hydra_config=True).hydra.launcher
    return frozenset(node) - {"_target_"}


def readers(key: str, searchpath: tuple[str, ...] = ()) -> list[str]:
    """The launcher options whose node has ``key``, cprobe's own (``conf/hydra/launcher/``) first; an option whose
    plugin does not compose is left out."""
    from cprobe.paths import config_dir

    with _hydra() as gh:
        names = gh.config_loader().get_group_options(CHOICE)
    names.sort(key=lambda n: not (config_dir() / "hydra" / "launcher" / f"{n}.yaml").is_file())
    out = []
    for name in names:
        try:
            keys = launcher_keys(name, searchpath)
        except Exception:  # noqa: BLE001 - e.g. a Hydra launcher plugin whose package is missing
            continue
        if key in keys:
            out.append(name)
    return out


def who_reads(key: str, searchpath: tuple[str, ...] = ()) -> str:
    """Who reads ``key``, and what to do."""
    names = readers(key, searchpath)
    if not names:
        return ("no launcher reads it (`cprobe run +experiment=NAME hydra/launcher=LAUNCHER --cfg hydra` shows a "
                "launcher's keys): drop it")
    return f"it is read only by the launcher(s) {names} of a sweep (-m {CHOICE}={names[0]}): pick one, or drop it"


def unread(overrides: Sequence[str], sweep: bool, launcher: str) -> str | None:
    """The one-line refusal of the first launcher setting among ``overrides`` (Hydra's ``hydra.overrides.hydra``)
    that nothing would read — in a single run (``sweep`` false) every one, in a sweep a key the chosen ``launcher``'s
    node lacks — or None."""
    searchpath = tuple(o for o in overrides if o.split("=", 1)[0].lstrip("+") == "hydra.searchpath")
    for item in overrides:
        key = launcher_key(item)
        if key is None or item.startswith("~"):
            continue
        if not sweep:
            if key == "":
                return f"`{item}` picks a sweep's launcher, but a single run uses none: add -m to sweep, or drop it"
            return f"`{item}` would be ignored: a single run uses no launcher, and {who_reads(key, searchpath)}"
        if key and key not in launcher_keys(launcher, searchpath):
            return (f"`{item}` would be ignored: the {launcher} launcher this sweep runs on does not read "
                    f"`{key}`; {who_reads(key, searchpath)}")
    return None


class RefuseUnread(Callback):
    """Refuses a launcher setting that nothing would read, before a run or sweep starts (module doc)."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self._check(config, sweep=False)

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._check(config, sweep=True)

    @staticmethod
    def _check(config: Any, sweep: bool) -> None:
        launcher = str(config.hydra.runtime.choices.get(CHOICE, "basic"))
        msg = unread(list(config.hydra.overrides.hydra), sweep, launcher)
        if msg:  # a BaseException: Hydra turns a callback's Exception into a warning
            raise JobAborted(ConfigError(msg))
