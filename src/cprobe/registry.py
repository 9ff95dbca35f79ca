"""Name -> class registries, so configs select code by short names (never free ``_target_``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

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

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
