"""Name -> class registries: one per family, one factory, three sources, and where each entry came from.

A config selects code by a *name* or an *import path* — one spelling everywhere a method is named
(``intervention.name``, ``probe.<key>.name``, ``causalgym.methods``, ``cebab.explainers``, ``metrics``,
``dataset.type``):

- a registered name: a built-in (``leace``), an installed plugin (a package's entry point in the family's group,
  e.g. ``cprobe.interventions``: loaded only when its name is used, so a broken plugin never breaks a run that does
  not use it), or a name registered by a module the config lists under ``plugins:``;
- ``package.module:Class``, an import path (the colon marks it; no built-in name has one): the class is imported
  from the module (also from the launch directory, as ``python -m`` would) and used as it is.

Built-ins register through the same :meth:`Registry.register` a plugin module calls (``cprobe.plugin.register``);
a registration's source is read from the registering class's module. A plugin never shadows a built-in (its entry
point is ignored and ``cprobe plugins`` says so), two plugins claiming one name is an error naming both packages when
that name is used, and import paths into the standard library (``builtins``, ``os``, ``subprocess``, ...) are refused
before anything is imported: config-controlled targets could otherwise run arbitrary code (Hydra 1.4's lesson).
Every resolved entry knows its :class:`Provenance` (built-in, package and version, or import path), which studies
write into their records. ``CPROBE_NO_PLUGINS=1`` (``cprobe --no-plugins``) turns entry-point discovery off.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, TypeVar

from cprobe.errors import ConfigError, CprobeError

T = TypeVar("T")

PLUGIN_API_VERSION = 1
"""The version of the plugin contract (``cprobe.plugin``): written into every record (column ``plugin_api``)."""

NO_PLUGINS_ENV = "CPROBE_NO_PLUGINS"
BUILTIN = "built-in"

BLOCKED_TOP_LEVEL = frozenset({"antigravity", "this", "__main__", "__future__", "setuptools", "pip", "_pytest",
                               "pytest", "IPython", "jupyter_client", "ipykernel"})
"""Top-level modules an import path from a config may never name, besides every standard-library module: they run
code on import (``antigravity`` opens a browser, ``this`` prints) or drive tools, and hold no cprobe method."""


# ----------------------------------------------------------------------------------------------- provenance
@dataclass(frozen=True)
class Provenance:
    """Where a registered entry came from. ``kind``: ``built-in``, ``entry point`` (an installed plugin),
    ``plugins module`` (a module listed under the config's ``plugins:``) or ``import path``; ``target``:
    ``module:qualname`` of the object; ``package``/``version``: the installed distribution that provides it ("" when
    the code is not packaged)."""

    kind: str
    target: str = ""
    package: str = ""
    version: str = ""

    @property
    def builtin(self) -> bool:
        return self.kind == BUILTIN

    @property
    def text(self) -> str:
        """What records and tables show: ``built-in``, ``<package> <version>``, or the import path."""
        if self.builtin:
            return BUILTIN
        return f"{self.package} {self.version}".strip() if self.package else self.target

    def __str__(self) -> str:
        return self.text


def target_of(obj: Any) -> str:
    """``module:qualname`` of a class or function (or of an instance's class)."""
    o = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    return f"{getattr(o, '__module__', '?')}:{getattr(o, '__qualname__', getattr(o, '__name__', '?'))}"


@lru_cache(maxsize=1)
def _module_dists() -> Mapping[str, list[str]]:
    from importlib.metadata import packages_distributions

    try:
        return packages_distributions()
    except Exception:  # a broken installed distribution must not break provenance
        return {}


def distribution_of(module: str) -> tuple[str, str]:
    """(distribution, version) installing the top-level package of ``module``, ("", "") when none does."""
    from importlib.metadata import PackageNotFoundError, version

    top = module.split(".")[0]
    if top == "cprobe":
        return "", ""
    for dist in _module_dists().get(top, []):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return "", ""


def provenance_of(obj: Any, kind: str | None = None) -> Provenance:
    """The provenance of ``obj`` (``kind`` None: built-in when it lives in ``cprobe``, else ``plugins module``)."""
    target = target_of(obj)
    module = target.split(":")[0]
    if kind is None:
        kind = BUILTIN if module == "cprobe" or module.startswith("cprobe.") else "plugins module"
    return Provenance(BUILTIN, target) if kind == BUILTIN else Provenance(kind, target, *distribution_of(module))


# ----------------------------------------------------------------------------------------------- import paths
def is_import_path(name: object) -> bool:
    """``package.module:Attr`` (the colon marks an import path; registered names never contain one)."""
    return isinstance(name, str) and ":" in name


def _stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


def check_module_name(module: str, what: str) -> None:
    """Refuse a module a config may not import: the standard library and the tools of :data:`BLOCKED_TOP_LEVEL`."""
    parts = module.split(".")
    if not module or any(not p.isidentifier() for p in parts):
        raise ConfigError(f"{what}: {module!r} is not a module name (dotted identifiers, e.g. my_lab.methods)")
    top = parts[0]
    if _stdlib(top) or top in BLOCKED_TOP_LEVEL:
        kind = "standard-library" if _stdlib(top) else "tool"
        raise ConfigError(f"{what}: refusing to import {module!r} from a config: a {kind} module holds no cprobe "
                          "method and could run arbitrary code; name your own module (package.module:Class)")


def split_import_path(path: str, what: str) -> tuple[str, str]:
    """(module, attribute) of ``package.module:Attr``, refused when dangerous or malformed."""
    module, _, attr = path.partition(":")
    if not attr or ":" in attr or any(not p.isidentifier() for p in attr.split(".")):
        raise ConfigError(f"{what}: {path!r} is not an import path; write package.module:ClassName")
    check_module_name(module, what)
    if any(p.startswith("__") for p in attr.split(".")):
        raise ConfigError(f"{what}: refusing the dunder attribute in {path!r}; name a class")
    return module, attr


def _close_modules(missing: str) -> list[str]:
    import pkgutil

    names = {m.name for m in pkgutil.iter_modules()} | set(_module_dists())
    return difflib.get_close_matches(missing, sorted(names), n=3, cutoff=0.75)


def import_module(module: str, what: str) -> Any:
    """Import ``module`` for a config (checked first); one-line errors naming the missing module, with "did you mean"
    candidates, or the exception the module raised while importing."""
    check_module_name(module, what)
    cwd = os.getcwd()  # modules named by a config are also looked up in the launch directory (installed ones win)
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
        close = _close_modules(missing.split(".")[0]) if "." not in missing or missing == module.split(".")[0] else []
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        where = "" if missing == module else f" while importing {module!r}"
        raise ConfigError(f"{what}: no module named {missing!r}{where}{hint}; install the package, or run from the "
                          "directory that holds it") from None
    except CprobeError as e:
        raise ConfigError(f"{what}: importing {module!r} failed: {e}") from None
    except Exception as e:  # the module itself raised while being imported
        raise ConfigError(f"{what}: importing {module!r} raised {type(e).__name__}: {_first_line(e)}; fix the "
                          "module") from None


def import_target(path: str, what: str) -> Any:
    """The object ``package.module:Attr`` names (see :func:`split_import_path`, :func:`import_module`)."""
    module, attr = split_import_path(path, what)
    obj = import_module(module, what)
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module if i == 0 else f"{module}:{'.'.join(attr.split('.')[:i])}"
            public = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, public, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise ConfigError(f"{what}: {owner!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ----------------------------------------------------------------------------------------------- entry points
def plugins_enabled() -> bool:
    return os.environ.get(NO_PLUGINS_ENV, "") in ("", "0")


@lru_cache(maxsize=None)
def _entry_points(group: str) -> tuple[Any, ...]:
    from importlib.metadata import entry_points

    try:
        return tuple(entry_points(group=group))
    except Exception:  # a broken distribution's metadata: no plugins from it
        return ()


def entry_points_of(group: str) -> dict[str, list[Any]]:
    """The entry points of ``group`` by name (several when distributions clash), none with plugins turned off."""
    if not plugins_enabled():
        return {}
    out: dict[str, list[Any]] = {}
    for ep in _entry_points(group):
        out.setdefault(ep.name, []).append(ep)
    return out


def dist_of(ep: Any) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    return ("?", "?") if dist is None else (str(dist.metadata["Name"] or dist.name), str(dist.version))


def refresh_plugins() -> None:
    """Forget discovered entry points and module distributions (after installing a plugin in this process)."""
    _entry_points.cache_clear()
    _module_dists.cache_clear()
    importlib.invalidate_caches()
    for reg in REGISTRIES.values():
        reg._resolved = {k: v for k, v in reg._resolved.items() if v[1].kind != "entry point"}


# ----------------------------------------------------------------------------------------------- the registry
Resolver = Callable[[str], Any]
Adapter = Callable[[Any, str], Any]

REGISTRIES: dict[str, Registry[Any]] = {}
"""Every family registry by its entry-point group (``cprobe.interventions`` ...): ``cprobe plugins`` walks them."""


class Registry(Generic[T]):
    """One family's names (module doc). ``group``: the family's entry-point group (None: no plugins, e.g. tasks);
    ``accept(obj, ref)``: checks an outside object belongs to the family (and adapts it, e.g. a direction method
    named where an intervention is expected), raising ConfigError; ``resolvers``: functions giving an entry for a
    derived name (``via_<intervention>``), tried after the registered names and entry points."""

    def __init__(self, kind: str, group: str | None = None, accept: Adapter | None = None) -> None:
        self.kind = kind
        self.group = group
        self.accept = accept
        self.resolvers: list[Resolver] = []
        self._items: dict[str, T] = {}
        self._sources: dict[str, Provenance] = {}
        self._resolved: dict[str, tuple[T, Provenance]] = {}
        if group is not None:
            REGISTRIES[group] = self

    # -- registering
    def register(self, name: str, obj: T | None = None, *, source: Provenance | None = None) -> Any:
        """Register ``obj`` under ``name`` (as a decorator when ``obj`` is omitted). Built-ins and plugin modules use
        the same call; the source is read from the object's module unless given."""
        def deco(o: T) -> T:
            self._add(name, o, source or provenance_of(o))
            return o

        return deco if obj is None else deco(obj)

    def _add(self, name: str, obj: T, src: Provenance) -> None:
        if not isinstance(name, str) or not name or is_import_path(name) or any(c.isspace() for c in name):
            raise ConfigError(f"{self.kind} name {name!r} must be a non-empty string without spaces or ':'")
        old = self._items.get(name)
        if old is not None:
            if old is obj:
                return
            prev = self._sources[name]
            if prev.builtin and src.builtin:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            if prev.builtin:
                raise ConfigError(f"{src.target} registers {self.kind} {name!r}, a built-in name; a plugin never "
                                  "shadows a built-in: pick another name")
            raise ConfigError(f"{self.kind} {name!r} is claimed twice: by {_who(prev)} and by {_who(src)}; rename one")
        if not src.builtin:
            if self.accept is not None:
                obj = self.accept(obj, name)
            eps = entry_points_of(self.group) if self.group else {}
            if name in eps:
                pkg, ver = dist_of(eps[name][0])
                raise ConfigError(f"{self.kind} {name!r} is claimed twice: by {_who(src)} and by the installed package "
                                  f"{pkg} {ver}; rename one")
        self._items[name] = obj
        self._sources[name] = src

    # -- looking up
    def get(self, name: str) -> T:
        return self.resolve(name)[0]

    def resolve(self, name: str) -> tuple[T, Provenance]:
        """(entry, provenance) for a name or an import path; one-line ConfigError otherwise."""
        if not isinstance(name, str):
            raise ConfigError(f"{self.kind} must be named by a string (a name or package.module:Class), got {name!r}")
        if name in self._items:  # an entry set directly (a test's monkeypatch) counts as built-in
            return self._items[name], self._sources.get(name) or Provenance(BUILTIN, target_of(self._items[name]))
        if name in self._resolved:
            return self._resolved[name]
        if is_import_path(name):  # a derived name around a path (via_pkg.mod:Cls) first, then the path itself
            got = next((g for r in self.resolvers if (g := r(name)) is not None), None) or self._from_path(name)
        else:
            eps = entry_points_of(self.group).get(name) if self.group else None
            got = self._from_entry_point(name, eps) if eps else self._derived(name)
        self._resolved[name] = got
        return got

    def _from_path(self, path: str) -> tuple[T, Provenance]:
        what = f"{self.kind} {path!r}"
        obj = import_target(path, what)
        src = provenance_of(obj, "import path")
        if src.target.split(":")[0].startswith("cprobe."):  # a built-in named by its path
            src = Provenance(BUILTIN, src.target)
        return (self.accept(obj, path) if self.accept else obj), src

    def _from_entry_point(self, name: str, eps: list[Any]) -> tuple[T, Provenance]:
        dists = sorted({f"{p} {v}" for p, v in map(dist_of, eps)})
        if len(eps) > 1:
            raise ConfigError(f"{self.kind} {name!r} is claimed by several installed plugins: {' and '.join(dists)}; "
                              "uninstall one (`cprobe plugins` lists them)")
        ep = eps[0]
        pkg, ver = dist_of(ep)
        try:
            obj = ep.load()
        except Exception as e:
            raise ConfigError(f"plugin {self.kind} {name!r} (package {pkg} {ver}, {ep.value}) does not import: "
                              f"{type(e).__name__}: {_first_line(e)}; fix or uninstall the package, or name another "
                              f"{self.kind}") from None
        src = Provenance("entry point", target_of(obj), pkg, ver)
        if self.accept is not None:
            try:
                obj = self.accept(obj, name)
            except ConfigError as e:
                raise ConfigError(f"plugin {self.kind} {name!r} (package {pkg} {ver}): {e}") from None
        return obj, src

    def _derived(self, name: str) -> tuple[T, Provenance]:
        for resolver in self.resolvers:
            if (got := resolver(name)) is not None:
                return got
        raise ConfigError(self.unknown(name))

    def unknown(self, name: str) -> str:
        """The one-line unknown-name error: did-you-mean candidates (:func:`did_you_mean`), then every name."""
        names = self.all_names()
        return (f"unknown {self.kind} {name!r}{did_you_mean(name, names)}; choose from {names}"
                + (" (or name your own class as package.module:Class)" if self.group else ""))

    def provenance(self, name: str) -> Provenance:
        return self.resolve(name)[1]

    def build(self, cfg: Mapping[str, Any], **context: Any) -> Any:
        """The one factory: ``cfg["name"]`` with the other keys as constructor arguments.

        ``context`` (e.g. ``seed=``, ``device=``) reaches only constructors that declare the parameter, and
        never overrides a key the config sets. Unknown keys are a one-line error listing the valid ones;
        YAML lists become tuples; a constructor's ``TypeError``/``ValueError`` (any exception, for outside code)
        becomes a ``ConfigError`` naming the component.
        """
        if "name" not in cfg or cfg["name"] is None:
            raise ConfigError(f"{self.kind} config needs a 'name'; choose from {self.all_names()} (or "
                              "package.module:Class)")
        name = str(cfg["name"])
        cls, src = self.resolve(name)
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k != "name"}
        valid = accepted_params(cls)
        if unknown := sorted(set(kwargs) - valid):
            raise ConfigError(f"unknown key(s) {unknown} for {self.kind} {name!r}; valid: {sorted(valid)}")
        kwargs.update({k: v for k, v in context.items() if k in valid and k not in kwargs})
        try:
            return cls(**kwargs)
        except CprobeError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{self.kind} {name!r}: {e}") from None
        except Exception as e:
            if src.builtin:
                raise
            raise ConfigError(f"{self.kind} {name!r} ({src.text}): its constructor raised {type(e).__name__}: "
                              f"{_first_line(e)}") from None

    # -- listing
    def names(self) -> list[str]:
        """The registered names (built-ins and those of loaded plugin modules), without loading any entry point."""
        return sorted(self._items)

    def plugin_names(self) -> list[str]:
        """Names installed plugins declare (not loaded; a name shadowing a built-in is left out)."""
        return sorted(n for n in entry_points_of(self.group) if n not in self._items) if self.group else []

    def all_names(self) -> list[str]:
        return sorted(set(self._items) | set(self.plugin_names()))

    def builtin_names(self) -> list[str]:
        return sorted(n for n in self._items if self._sources[n].builtin)

    def __contains__(self, name: object) -> bool:
        """A registered or installed name (not loaded), or an import path that resolves to this family (imported:
        an import failure raises, never reads as "not there")."""
        if not isinstance(name, str):
            return False
        if name in self._items or name in self._resolved:
            return True
        if is_import_path(name):
            try:
                self.resolve(name)
            except WrongFamily:
                return False
            return True
        return bool(self.group and name in entry_points_of(self.group))


class WrongFamily(ConfigError):
    """An object named where another family's member is expected (``accept`` raises it)."""


def _who(src: Provenance) -> str:
    if src.package:
        return f"{src.package} {src.version} ({src.target})"
    return src.target or src.kind


_PROBING: list[bool] = []


def wrong_family(obj: Any, ref: str, kind: str, base: str) -> WrongFamily:
    """The error for ``obj`` named as a ``kind``: what it is instead, and the base to subclass."""
    other = None
    if not _PROBING:  # which family it is, asked of the others (whose own refusal does not ask again)
        _PROBING.append(True)
        try:
            for reg in REGISTRIES.values():
                if reg.kind == kind or reg.accept is None:
                    continue
                try:
                    reg.accept(obj, ref)
                except CprobeError:
                    continue
                other = reg.kind
                break
        finally:
            _PROBING.clear()
    an = f"a{'n' if kind[0] in 'aeiou' else ''} {kind}"
    if other:
        what = f"a{'n' if other[0] in 'aeiou' else ''} {other}, not {an}"
    elif not inspect.isclass(obj) and kind not in ("metric",):
        what = f"not a class, not {an}"
    else:
        what = f"not {an}"
    return WrongFamily(f"{ref!r} ({target_of(obj)}) is {what}: subclass cprobe.plugin.{base}, or name {an}")


# ----------------------------------------------------------------------------------------------- config modules
@dataclass
class LoadedModule:
    """A module the config listed under ``plugins:``, imported, and the names it registered."""

    module: str
    package: str = ""
    version: str = ""
    names: list[tuple[str, str]] = field(default_factory=list)  # (family, name)


LOADED_MODULES: dict[str, LoadedModule] = {}


def load_plugin_modules(modules: Any, where: str = "plugins") -> list[LoadedModule]:
    """Import every module of the config's ``plugins:`` list (each registers its methods with
    ``cprobe.plugin.register``); refused targets and import failures are one-line ConfigErrors naming the module."""
    if modules is None:
        return []
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
        raise ConfigError(f"{where} must be a list of module names (e.g. [my_lab.methods]), got {modules!r}")
    out = []
    for i, module in enumerate(modules):
        if not isinstance(module, str):
            raise ConfigError(f"{where}[{i}] must be a module name, got {module!r}")
        if is_import_path(module):
            raise ConfigError(f"{where}[{i}]={module!r}: list modules here (my_lab.methods); name a class "
                              "package.module:Class where a method is expected")
        if module in LOADED_MODULES:
            out.append(LOADED_MODULES[module])
            continue
        before = {(reg.kind, n) for reg in REGISTRIES.values() for n in reg._items}
        import_module(module, f"{where}[{i}]")
        after = {(reg.kind, n) for reg in REGISTRIES.values() for n in reg._items}
        pkg, ver = distribution_of(module)
        LOADED_MODULES[module] = LoadedModule(module, pkg, ver, sorted(after - before))
        out.append(LOADED_MODULES[module])
    return out


# ----------------------------------------------------------------------------------------------- parameters
def did_you_mean(name: str, names: Sequence[str]) -> str:
    """``"; did you mean 'a', 'b'?"`` for an unknown ``name``: the names that spell it out further, shortest first
    (``sae`` → ``sae_axbench``, ``sae_decoder``: a name that was split into kinds), then the close spellings
    (difflib); at most four, ``""`` when there is none."""
    longer = sorted((n for n in names if n.startswith(f"{name}_")), key=lambda n: (len(n), n))
    close = [n for n in difflib.get_close_matches(name, names, n=3, cutoff=0.6) if n not in longer]
    hint = (longer + close)[:4]
    return f"; did you mean {', '.join(repr(c) for c in hint)}?" if hint else ""


def accepted_params(cls: Callable[..., Any]) -> set[str]:
    """Keyword parameters ``cls(...)`` accepts: its own, and where it takes ``**kwargs``, those of the base
    classes it forwards them to (``super().__init__(**kw)``) and of ``cls.forwards_kwargs_to`` (composition)."""
    out: set[str] = set()
    targets: list[Any] = [cls]
    seen: set[int] = set()
    while targets:
        t = targets.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        init = t.__init__ if isinstance(t, type) else t
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            continue
        names = [p for p, v in params.items() if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD) and p != "self"]
        out.update(names)
        if any(v.kind is v.VAR_KEYWORD for v in params.values()) and isinstance(t, type):
            targets.extend(b for b in t.__mro__[1:] if "__init__" in vars(b) and b is not object)
            targets.extend(getattr(t, "forwards_kwargs_to", ()))
    return out
