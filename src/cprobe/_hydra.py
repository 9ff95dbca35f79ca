"""The only module that touches Hydra internals: run a task function with a pass-through argv.

Hydra 1.3 has no public embedding API; ``@hydra.main`` itself calls ``_run_hydra`` with the parsed
argv, and so do NeMo and others. We do the same with ``parse_intermixed_args`` so overrides may sit
on both sides of ``-m`` (Hydra 1.3's ``parse_args`` rejects that). Pinned to ``hydra-core<1.4``;
``tests/smoke/test_cli_contract.py`` guards the behaviour.
"""

from __future__ import annotations

import argparse
import copy
import io
import re
from collections.abc import Callable, Sequence
from typing import Any

NOTICE_EXPERIMENT = "note: treating 'experiment={0}' as '+experiment={0}' (experiment is an addition to the defaults)"
CUSTOM_GROUPS = ("intervention", "dataset")
"""Groups with a ``custom`` option (an empty node for outside code): its keys are the class's, so ``group.key=v``
adds them (``++group.key=v``) instead of failing as keys the node does not have."""


def normalise(argv: Sequence[str], resolve: bool = True) -> tuple[list[str], list[str]]:
    """Rewrite a bare ``experiment=x`` to ``+experiment=x``; with ``intervention=custom`` (``dataset=custom``), a
    ``intervention.key=v`` to ``++intervention.key=v`` (the outside class's keys are not in the empty node); quote
    list items Hydra's grammar cannot read bare (``[<eos>]`` -> ``['<eos>']``); and (``resolve``) add ``--resolve``
    to ``--cfg job`` and ``--cfg all`` so the config is printed as it will run, not with ``${...}`` interpolations
    (``--cfg hydra`` stays raw: the hydra node alone refers to job keys it cannot resolve); returns (argv,
    notices)."""
    out, notes = [], []
    custom = {g for g in CUSTOM_GROUPS if f"{g}=custom" in argv}
    for a in argv:
        if a.startswith("experiment="):
            notes.append(NOTICE_EXPERIMENT.format(a.split("=", 1)[1]))
            a = "+" + a
        key = a.split("=", 1)[0]
        if "=" in a and key.split(".")[0] in custom and "." in key and not key.startswith(("+", "~")):
            a = "++" + a
        out.append(quote_list_items(a))
    if resolve and _cfg_kind(out) in ("job", "all") and "--resolve" not in out:
        out.append("--resolve")
    if swept("experiment", out) and not any(a.startswith("hydra.sweep.subdir=") for a in out):
        out.append(EXPERIMENT_SUBDIR)
    return out, notes


EXPERIMENT_SUBDIR = "hydra.sweep.subdir='${cprobe_expdir:${hydra.overrides.task},${hydra.job.override_dirname}}'"
"""A sweep over experiments names each job's folder after its experiment too (folder names leave out the experiment,
which a run's own directory already names: without it, two experiments' jobs with the same other overrides would
share one folder)."""


def swept(group: str, argv: Sequence[str]) -> bool:
    """Does an override of ``argv`` sweep ``group`` (``+experiment=a,b``, ``glob(...)``, ``choice(...)``)?"""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for a in argv:
        if "=" not in a or a.startswith("-") or a.lstrip("+~").split("=", 1)[0] != group:
            continue
        try:
            if parser.parse_override(a).is_sweep_override():
                return True
        except OverrideParseException:  # Hydra reports a malformed override itself
            continue
    return False


_BARE = re.compile(r"^[\w./\-+\\$%*@?|: ]+$")


def quote_list_items(arg: str) -> str:
    """``key=[a,<eos>]`` -> ``key=[a,'<eos>']``: a bracketed list's items that Hydra's override grammar cannot read
    unquoted (``<``, ``>``, ...) quoted; anything else (and every already-valid override) unchanged."""
    key, eq, value = arg.partition("=")
    if not eq or not (value.startswith("[") and value.endswith("]")) or any(q in value for q in "'\"{}()") \
            or parses(arg):
        return arg
    items = value[1:-1].split(",")
    quoted = [i if not i.strip() or _BARE.match(i.strip()) else f"'{i.strip()}'" for i in items]
    return arg if quoted == items else f"{key}=[" + ",".join(quoted) + "]"


def parses(override: str) -> bool:
    """Does Hydra's override grammar read ``override`` (``key=value``, with ``+``/``++``/``~`` prefixes)?"""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_override(override)
    except Exception:
        return False
    return True


def _cfg_kind(argv: Sequence[str]) -> str | None:
    """The value of ``--cfg``/``-c`` (``job``, ``hydra``, ``all``), or None."""
    for i, a in enumerate(argv):
        if a.startswith("--cfg="):
            return a.split("=", 1)[1]
        if a in ("--cfg", "-c") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def parse_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """Hydra's own parser, but intermixed: flags may sit anywhere between overrides."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    return parser.parse_intermixed_args(list(argv)), parser


_PARSED: dict[str, Any] = {}
"""Config files' text -> the config OmegaConf made of it, never handed out itself (:func:`parse_configs_once`)."""


def _load_parsed(file_: Any) -> Any:
    """``OmegaConf.load`` of a config file, its YAML parsed and made a config once per process and per text; each call
    gets a deep copy (Hydra edits what it loads), which costs less than half of making it again."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    text = file_.read()
    text = text.decode("utf-8") if isinstance(text, bytes) else text
    if text not in _PARSED:
        stream = io.StringIO(text)
        stream.name = getattr(file_, "name", "<file>")  # YAML errors name the file, as before
        obj = yaml.load(stream, Loader=get_yaml_loader())
        if obj is not None and not isinstance(obj, list | dict | str):
            raise OSError(f"Invalid loaded object type: {type(obj).__name__}")
        if len(_PARSED) >= 4096:
            _PARSED.clear()
        _PARSED[text] = OmegaConf.create() if obj is None else OmegaConf.create(obj)
    return copy.deepcopy(_PARSED[text])


def parse_configs_once() -> None:
    """Hydra reads and parses every YAML file of the defaults tree again at each composition — twice per run (the
    mode, then the run) and twice more per sweep job (the sweeper's check, the launcher) — and parsing is the
    largest part of composing. Its two file sources (``file://``, ``pkg://``) get an ``OmegaConf`` whose ``load``
    parses a given text once per process; the configs composed are the same (tested). Hydra's plugin scan runs
    first: it executes its plugin modules again (``exec_module`` on each, even one already imported), which would
    rebind their ``OmegaConf`` and undo this."""
    from hydra._internal.core_plugins import file_config_source, importlib_resources_config_source
    from hydra.core.plugins import Plugins
    from omegaconf import OmegaConf

    Plugins.instance()  # the scan, once per process

    class _OmegaConf(OmegaConf):  # type: ignore[misc]
        load = staticmethod(_load_parsed)

    for module in (file_config_source, importlib_resources_config_source):
        module.OmegaConf = _OmegaConf  # type: ignore[attr-defined]


_COMPOSED: dict[tuple[int, int, tuple[str, ...]], tuple[Any, Any, Any]] = {}
"""(config loader, master config, a job's overrides) -> the job's config composed for the sweeper's check, kept for
the launcher (:func:`compose_jobs_once`)."""
_COMPOSED_MAX = 4096


def compose_jobs_once() -> None:
    """A sweep composes every job's config twice: the sweeper first checks that each job of a batch composes
    (``Sweeper.validate_batch_is_legal``: "this repeats work the launcher will do"), then the launcher composes it
    again to run it (~90 ms each). The config composed for the check is kept (a copy) and handed to the launcher's
    call with the same loader, master config and overrides, once; any other call composes as before."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    original = ConfigLoaderImpl.load_sweep_config
    if getattr(original, "_cprobe_once", False):
        return

    def load_sweep_config(self: Any, master_config: Any, sweep_overrides: list[str]) -> Any:
        key = (id(self), id(master_config), tuple(sweep_overrides))
        kept = _COMPOSED.pop(key, None)
        if kept is not None and kept[0] is self and kept[1] is master_config:  # the same objects, not a reused id
            return kept[2]
        cfg = original(self, master_config, sweep_overrides)
        while len(_COMPOSED) >= _COMPOSED_MAX:
            _COMPOSED.pop(next(iter(_COMPOSED)))
        _COMPOSED[key] = (self, master_config, copy.deepcopy(cfg))
        return cfg

    load_sweep_config._cprobe_once = True  # type: ignore[attr-defined]
    load_sweep_config.__wrapped__ = original  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_sweep_config = load_sweep_config  # type: ignore[method-assign]


_DEFAULTS: dict[tuple, Any] = {}
"""(config files' fingerprint, config name, the overrides that choose configs, ...) -> Hydra's defaults list and the
config it composes (:func:`compose_defaults_once`), the last :data:`_DEFAULTS_MAX` used."""
_DEFAULTS_MAX = 32


def _files_key(repo: Any) -> tuple[tuple, list]:
    """Every config file the repository can read, as (folder, file, inode, mtime, ctime, size), and the structured
    configs registered (by identity: the nodes are returned, for the entry to hold, so that no id is reused while it
    lives): any edit, new file or registration changes it (~2 ms for cprobe's and Hydra's ~200 files)."""
    import importlib.resources
    import os

    from hydra.core.config_store import ConfigStore

    out: list[Any] = []
    for source in repo.get_sources():
        out.append((source.scheme(), source.path))
        root = source.path if source.scheme() == "file" else None
        if source.scheme() == "pkg":
            try:
                root = os.fspath(importlib.resources.files(source.path))
            except (ImportError, TypeError, ValueError):  # a module gone, or not on a file system: its name only
                root = None
        for top, _, files in os.walk(root or "", followlinks=True):
            for f in sorted(f for f in files if f.endswith((".yaml", ".yml"))):
                try:
                    s = os.stat(os.path.join(top, f))
                    out.append((top, f, s.st_ino, s.st_mtime_ns, s.st_ctime_ns, s.st_size))
                except OSError:  # a dangling link (an editor's lock), a file gone meanwhile
                    out.append((top, f))
    nodes: list[Any] = []

    def walk(d: dict, path: str) -> None:
        for k, v in d.items():
            walk(v, f"{path}/{k}") if isinstance(v, dict) else (out.append((f"{path}/{k}", id(v))), nodes.append(v))

    walk(ConfigStore.instance().repo, "")
    return tuple(out), nodes


def compose_defaults_once() -> None:
    """Every composition builds Hydra's defaults list (loading every config of the tree to read its ``defaults:``) and
    merges those configs, ~230 ms for cprobe's tree, 90 % of a composition, though a sweep's jobs, or a process's
    runs, mostly differ only in values. Both are kept, keyed by the config files' state (:func:`_files_key`), the
    config name and the overrides that choose configs (``group=option``, ``+group=``, ``~group``); a composition
    with the same key starts from a copy of the merged config and applies its own value overrides, as Hydra does.
    The configs composed are the same (tests/unit/test_hydra_parse.py). Not kept: a choice given by interpolation on
    the command line; a choice interpolated inside a config's ``defaults:`` is read at its key's first composition,
    and so are Hydra's composition warnings (Python shows each once anyway)."""
    import os

    from hydra import version
    from hydra._internal import config_loader_impl as loader
    from hydra._internal.defaults_list import DefaultsList

    create, merge = loader.create_defaults_list, loader.ConfigLoaderImpl._compose_config_from_defaults_list
    if getattr(create, "_cprobe_once", False):
        return

    def create_defaults_list(repo: Any, config_name: Any, overrides_list: list, prepend_hydra: bool,
                             skip_missing: bool) -> Any:
        values, chooses = [], []  # split as hydra's Overrides does (sweeps: neither)
        for o in overrides_list:
            if not o.is_sweep_override():
                is_value = isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group)
                (values if is_value else chooses).append(o)
        if any("${" in o.input_line for o in chooses):  # a choice interpolated (an environment variable): Hydra's
            return create(repo, config_name, overrides_list, prepend_hydra, skip_missing)
        files, nodes = _files_key(repo)
        key = (files, config_name, prepend_hydra, skip_missing, tuple(o.input_line for o in chooses),
               version.getbase(), *(os.environ.get(v) for v in ("SELF_WARNING_AS_ERROR",
                                                                 "HYDRA_DEPRECATION_WARNINGS_AS_ERRORS")))
        if (kept := _DEFAULTS.pop(key, None)) is None:
            kept = [create(repo, config_name, overrides_list, prepend_hydra, skip_missing), None, nodes]
        _DEFAULTS[key] = kept
        while len(_DEFAULTS) > _DEFAULTS_MAX:
            _DEFAULTS.pop(next(iter(_DEFAULTS)))
        got = kept[0]
        ours = copy.copy(got.overrides)
        ours.config_overrides = values
        return DefaultsList(defaults=got.defaults, config_overrides=values, defaults_tree=got.defaults_tree,
                            overrides=ours)

    def compose(self: Any, defaults: list, repo: Any) -> Any:
        kept = next((k for k in _DEFAULTS.values() if k[0].defaults is defaults), None)
        if kept is None:  # not a list kept above
            return merge(self, defaults, repo)
        if kept[1] is None:
            kept[1] = merge(self, defaults, repo)
        return copy.deepcopy(kept[1])

    create_defaults_list._cprobe_once = True  # type: ignore[attr-defined]
    create_defaults_list.__wrapped__, compose.__wrapped__ = create, merge  # type: ignore[attr-defined]
    loader.create_defaults_list = create_defaults_list
    loader.ConfigLoaderImpl._compose_config_from_defaults_list = compose  # type: ignore[method-assign]


def check_job_dirs_first() -> None:
    """Hydra makes a sweep job's folder (``hydra.sweep.dir``/``hydra.sweep.subdir``) and writes ``.hydra/`` and the
    log there before any of the job's code runs; a sweeper composes every job of a batch before launching it
    (``Sweeper.validate_batch_is_legal``; cprobe's search too). There each job's folder gets a run dir's check
    (:func:`cprobe.ownership.check_target`): the sweep is refused in one line before the batch starts, whatever the
    launcher. (A folder named from ``hydra.job.num``, which only the launcher sets, is not named yet.)"""
    from pathlib import Path

    from hydra.plugins.sweeper import Sweeper
    from omegaconf import OmegaConf

    from cprobe.ownership import check_target

    def validate_batch_is_legal(self: Any, batch: Sequence[Sequence[str]]) -> None:
        for overrides in batch:  # composed as Hydra's check does (and kept for the launcher: compose_jobs_once)
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            try:
                job = Path(cfg.hydra.sweep.dir) / str(OmegaConf.select(cfg, "hydra.sweep.subdir") or "")
            except Exception:  # noqa: BLE001  (it interpolates what the launcher sets)
                continue
            check_target(job, "hydra.sweep.dir (or move the files away)", f"the sweep's job folder {job}")

    Sweeper.validate_batch_is_legal = validate_batch_is_legal  # type: ignore[method-assign]


def run(argv: Sequence[str], task_function: Callable[[Any], Any], config_dir: str) -> None:
    """Run Hydra over ``argv`` exactly as ``@hydra.main`` would."""
    from hydra import version
    from hydra._internal.utils import _run_hydra

    version.setbase("1.3")
    parse_configs_once()
    compose_defaults_once()
    compose_jobs_once()
    check_job_dirs_first()
    args, parser = parse_argv(argv)
    try:
        _run_hydra(args=args, args_parser=parser, task_function=task_function, config_path=config_dir,
                   config_name="config")
    finally:
        _COMPOSED.clear()  # what a failed or unusual sweep left


def explain_error(e: BaseException) -> str | None:
    """One actionable line for a Hydra composition error (None when ``e`` is not one): an unknown option names
    the valid ones, without Hydra's listing and config search path; an unknown key says how to add one."""
    mod = type(e).__module__
    if not mod.startswith(("hydra", "omegaconf")):
        return None
    text = str(e)
    if missing := re.search(r"Could not find '([^']*)'", text):
        path = missing.group(1)
        group, _, option = path.rpartition("/")
        options = getattr(e, "options", None)
        if options is None:
            options = [l.strip() for l in text.split("Available options in", 1)[-1].split("Config search path")[0]
                       .splitlines()[1:] if l.strip()]
        if group:
            plus = "+" if group in ("experiment", "sweep", "debug") else ""
            return f"unknown {group} {option!r}; choose from {list(options)} ({plus}{group}=NAME; `cprobe list " \
                   f"{group}` describes them)"
        return f"no config named {path!r}; choose from {list(options)}"
    if override := re.match(r"Could not override '([^']*)'", text):
        key = override.group(1)
        if key.startswith("hydra.launcher."):  # a key of another launcher than the chosen one
            from cprobe.launchers import who_reads

            name = key.split(".")[2]
            return f"unknown config key {key!r}: the launcher chosen has no `{name}`; {who_reads(name)}"
        return (f"unknown config key {key!r}: `{key}=...` changes an existing key, `+{key}=...` adds one, "
                f"`++{key}=...` sets it either way (in a sweep over a group, each job's own option: `-m "
                f"intervention=fgsm,pgd ++intervention.eps=1`); `cprobe run +experiment=NAME --cfg job` lists the keys")
    lines = [l.strip() for l in text.split("Config search path:")[0].splitlines() if l.strip()]
    return "; ".join(lines)
