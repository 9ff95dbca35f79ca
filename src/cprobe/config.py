"""Typed configuration: config nodes parsed once into dataclasses, unknown keys rejected with the known ones.

Every task declares a ``Config`` dataclass for its node (``probing:``, ``reliability:``, ``causalgym:`` ...);
:func:`parse` builds it from the composed (plain) config, checking each field against its annotation
(``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``list[...]``, ``dict``, ``X | None``), so a typo
or a wrong type is a one-line :class:`~cprobe.errors.ConfigError` naming the key, before any heavy work.
Defaults live in the dataclass, once.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from cprobe.errors import ConfigError

T = TypeVar("T")


def parse(cls: type[T], node: Mapping[str, Any] | None, where: str) -> T:
    """``cls(**node)`` with unknown keys and ill-typed values rejected; ``where`` names the node in errors."""
    if node is None:
        node = {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"{where or 'the config'} must be a mapping of keys to values, got {node!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(node) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} under {where or 'the config'}; known keys: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {k: check(v, hints[k], f"{where}.{k}" if where else k) for k, v in node.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where + ': ' if where else ''}{e}") from None


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null",
          list: "a list", dict: "a mapping"}


def _name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return f"one of {list(get_args(tp))}"
    return _NAMES.get(origin or tp) or getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def check(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked (and lightly coerced: int -> float, list -> tuple) against the annotation ``tp``."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return check(value, option, where)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{where}={value!r} must be {' or '.join(_name(a) for a in args)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where} must be null, got {value!r}")
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(f"{where}={value!r} is not one of {list(args)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if origin in (list, tuple, collections.abc.Sequence):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        item = args[0] if args else Any
        out = [check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin in (dict, collections.abc.Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        if len(args) == 2:
            return {check(k, args[0], f"{where} key"): check(v, args[1], f"{where}.{k}") for k, v in value.items()}
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return parse(tp, value, where)
    return value


OPTIONAL_KEYS = ("plugins", "metrics")
"""Top-level job keys whose empty default names the same configuration as their absence (configs written before
they existed): left out of config hashes and ids while empty, so adding them changed no finished job's identity."""


COMPUTE_DEFAULTS = {"resume": True, "kv_resume": True, "threads": "auto", "wait_policy": "auto",
                    "follow_load": True}
"""``compute`` keys added after jobs had been run, at their defaults: left out of config hashes and ids."""


def identity(cfg: Any) -> Any:
    """``cfg`` without the :data:`OPTIONAL_KEYS` that are empty (what config hashes and ids are computed over), and
    without the ``compute`` keys added later at their defaults (:data:`COMPUTE_DEFAULTS`: the configuration from
    before the keys existed)."""
    if not isinstance(cfg, Mapping):
        return cfg
    out = {k: v for k, v in cfg.items() if not (k in OPTIONAL_KEYS and not v)}
    compute = out.get("compute")
    if isinstance(compute, Mapping):
        kept = {k: v for k, v in compute.items()
                if not (k in COMPUTE_DEFAULTS and type(v) is type(COMPUTE_DEFAULTS[k]) and v == COMPUTE_DEFAULTS[k])}
        if len(kept) < len(compute):
            out["compute"] = kept
    return out
