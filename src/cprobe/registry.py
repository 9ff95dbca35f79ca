"""Name -> class registries, so configs select code by short names (never free ``_target_``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from cprobe.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from config names to factories with a helpful unknown-name error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; choose from {sorted(self._items)}"
            ) from None

    def build(self, cfg: Mapping[str, Any], **context: Any) -> Any:
        """The one factory: ``cfg["name"]`` with the other keys as constructor arguments.

        ``context`` (e.g. ``seed=``, ``device=``) reaches only constructors that declare the parameter, and
        never overrides a key the config sets. Unknown keys are a one-line error listing the valid ones;
        YAML lists become tuples; a constructor's ``TypeError``/``ValueError`` becomes a ``ConfigError``
        naming the component.
        """
        if "name" not in cfg:
            raise ConfigError(f"{self.kind} config needs a 'name'; choose from {self.names()}")
        name = str(cfg["name"])
        cls = self.get(name)
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k != "name"}
        valid = accepted_params(cls)
        unknown = sorted(set(kwargs) - valid)
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} for {self.kind} {name!r}; valid: {sorted(valid)}")
        for key, value in context.items():
            if key in valid and key not in kwargs:
                kwargs[key] = value
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{self.kind} {name!r}: {e}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


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
