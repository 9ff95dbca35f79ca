"""The estimator base shared by the four method families (probes, interventions, directions, explainers).

scikit-learn's contract, once: ``fit`` returns ``self`` and sets the trailing-underscore flag ``fitted_``; a method
that needs a fitted estimator raises :class:`~cprobe.errors.NotFittedError` (one line: what to call first) before it
runs; a fitted attribute read before ``fit`` raises the same error instead of an AttributeError; capabilities are
class attributes the callers dispatch on, listed once per family and readable with :meth:`Estimator.capabilities`.

A family declares, as class attributes of its base class:

- ``_marks_fitted``: methods after which the estimator is fitted (``fit``; interventions also ``use_probe``);
- ``_needs_fitted``: methods that refuse to run unfitted (``transform``, ``explain``, ``logits``, ...);
- ``_fitted_attrs``: attributes that exist only once fitted (a probe's ``module``, a direction's ``a``);
- ``_fit_hint``: what the error tells the user to call (``"fit(X, y)"``);
- ``CAPABILITIES``: the names of the family's capability attributes.

Wrapping happens once per class that *defines* one of those methods (``__init_subclass__``), so a subclass's own
``fit`` is covered without calling anything from it. A family may also override :meth:`_before` / :meth:`_after`
(explainers check their inputs and the shape of their output there).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from cprobe.errors import NotFittedError


class Estimator:
    """Base of every fitted method (module doc)."""

    fitted_: bool = False
    """True once ``fit`` (or another ``_marks_fitted`` method) has run; loading a saved estimator sets it too."""
    CAPABILITIES: ClassVar[tuple[str, ...]] = ()
    _marks_fitted: ClassVar[tuple[str, ...]] = ("fit",)
    _needs_fitted: ClassVar[tuple[str, ...]] = ()
    _fitted_attrs: ClassVar[tuple[str, ...]] = ()
    _fit_hint: ClassVar[str] = "fit"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for name in cls._marks_fitted:
            if name in own and not getattr(own[name], "__isabstractmethod__", False):
                setattr(cls, name, _marking(own[name], name))
        for name in cls._needs_fitted:
            if name in own and not getattr(own[name], "__isabstractmethod__", False):
                setattr(cls, name, _checking(own[name], name))

    def __getattr__(self, name: str) -> Any:  # only reached when the attribute is unset
        if hasattr(type(self), name):  # a property that raised AttributeError (e.g. NotFittedError): re-raise it
            return object.__getattribute__(self, name)
        if name in type(self)._fitted_attrs:
            raise NotFittedError(self, type(self)._fit_hint)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def check_fitted(self) -> None:
        """Raise :class:`NotFittedError` unless fitted."""
        if not self.fitted_:
            raise NotFittedError(self, type(self)._fit_hint)

    @classmethod
    def capabilities(cls) -> dict[str, Any]:
        """The family's declared capabilities and this class's values of them."""
        return {c: getattr(cls, c) for c in cls.CAPABILITIES}

    def _before(self, method: str, args: tuple, kwargs: dict) -> None:
        """Hook run before a wrapped method (after the fitted check); families override it."""

    def _after(self, method: str, result: Any, args: tuple, kwargs: dict) -> Any:
        """Hook run after a wrapped method, returning its (possibly converted) result; families override it."""
        return result


def _marking(fn: Any, name: str) -> Any:
    @functools.wraps(fn)
    def wrapper(self: Estimator, *args: Any, **kwargs: Any) -> Any:
        self._before(name, args, kwargs)
        out = fn(self, *args, **kwargs)
        self.fitted_ = True
        return self._after(name, out, args, kwargs)
    return wrapper


def _checking(fn: Any, name: str) -> Any:
    @functools.wraps(fn)
    def wrapper(self: Estimator, *args: Any, **kwargs: Any) -> Any:
        self.check_fitted()
        self._before(name, args, kwargs)
        return self._after(name, fn(self, *args, **kwargs), args, kwargs)
    return wrapper


def adapt(obj: Any, base: type, required: tuple[str, ...], kind: str) -> type | None:
    """A class that does not subclass ``base`` but has every ``required`` method (duck typing): a subclass of both,
    so the family's contract (fitted state, not-fitted errors, capability defaults) applies to it; None when ``obj``
    is not such a class. Logged once per class: subclassing ``base`` says the same without the adapter."""
    import logging

    if not inspect.isclass(obj) or issubclass(obj, base):
        return None
    if not all(callable(getattr(obj, m, None)) for m in required):
        return None
    cached = _ADAPTED.get((obj, base))
    if cached is not None:
        return cached
    logging.getLogger("cprobe").warning(
        "%s.%s does not subclass cprobe.plugin.%s; used as one (subclass it to silence this)", obj.__module__,
        obj.__qualname__, base.__name__)
    ns: dict[str, Any] = {"__module__": obj.__module__, "__qualname__": obj.__qualname__, "__doc__": obj.__doc__,
                          "__cprobe_adapted__": obj}
    for name in (*base._marks_fitted, *base._needs_fitted, *required):
        if callable(getattr(obj, name, None)):
            ns[name] = getattr(obj, name)
    try:
        cls = type(obj.__name__, (obj, base), ns)
    except TypeError as e:  # incompatible layouts / metaclasses
        from cprobe.errors import ConfigError

        raise ConfigError(f"{obj.__module__}.{obj.__qualname__} cannot be used as a{'n' if kind[0] in 'aeiou' else ''} "
                          f"{kind} ({e}); subclass cprobe.plugin.{base.__name__}") from None
    _ADAPTED[(obj, base)] = cls
    return cls


_ADAPTED: dict[tuple[type, type], type] = {}


def accept_class(obj: Any, ref: str, base: type, required: tuple[str, ...], kind: str,
                 problems: Callable[[type], list[str]] | None = None, unless: tuple[str, ...] = ()) -> type:
    """A family registry's ``accept``: ``obj`` as a ``base`` class — a subclass, or a class with every ``required``
    method and none of ``unless`` (another family's methods), adapted (:func:`adapt`) — not abstract, and with no
    contradictions in its declared capabilities (``problems``); a one-line ConfigError otherwise, a
    :class:`~cprobe.registry.WrongFamily` when it is no ``kind`` at all."""
    from cprobe.errors import ConfigError
    from cprobe.registry import WrongFamily, wrong_family

    if not (inspect.isclass(obj) and issubclass(obj, base)):
        other = inspect.isclass(obj) and any(callable(getattr(obj, m, None)) for m in unless)
        got = None if other else adapt(obj, base, required, kind)
        if got is None:
            raise wrong_family(obj, ref, kind, base.__name__)
        obj = got
    if inspect.isabstract(obj):
        raise WrongFamily(f"{ref!r} is abstract (implement {sorted(obj.__abstractmethods__)})")
    found = problems(obj) if problems else []
    if found:
        raise ConfigError(f"{kind} {ref!r} declares contradictory capabilities: {'; '.join(found)}")
    return obj
