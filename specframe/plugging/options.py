"""Component options checked against the constructor's signature before a component is built, so a wrong
name or type fails at assembly with the list of accepted options, never mid-decode.

Integers are checked against bounds too: a component declares the range of each integer option it takes
in `option_limits` (`{"max_depth": (1, 4096)}`), and an integer option it declares no range for must fit
the C `int` (32 bits) that native libraries and kernels read it into, so a value beyond it is refused
at assembly instead of failing inside such a library."""

from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from typing import Any

from specframe.terms.errors import ConfigurationError

INJECTED = {"self", "target", "want_hidden", "calibration"}  # passed by the pipeline, not by the user
C_INT = (-(2**31), 2**31 - 1)  # the range of an integer option whose component declares none


def check_bounds(what: str, settings: object, at_least: dict[str, float] | None = None,
                 positive: tuple[str, ...] = ()) -> None:
    """Refuse a settings object (a training config, say) whose fields fall below their bounds: each field
    named in `at_least` must be >= its bound, each in `positive` > 0. The error names `what` and the field,
    so a run with zero steps or a zero learning rate fails at once instead of after loading a model."""
    for name, low in (at_least or {}).items():
        value = getattr(settings, name)
        if value < low:
            raise ConfigurationError(f"{what}: {name} must be >= {low}, got {value}")
    for name in positive:
        value = getattr(settings, name)
        if not value > 0:
            raise ConfigurationError(f"{what}: {name} must be > 0, got {value}")


def accepted_options(cls: type) -> dict[str, Any]:
    """Option name -> type hint (or `inspect.Parameter.empty`) of a component class's constructor."""
    params = inspect.signature(cls.__init__).parameters
    hints = _type_hints(cls.__init__)
    return {name: hints.get(name, inspect.Parameter.empty) for name, p in params.items()
            if name not in INJECTED and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def check_options(kind: str, cls: type, options: dict[str, Any]) -> None:
    """Raise `ConfigurationError` for an option the constructor does not take or a value of the wrong type."""
    accepted = accepted_options(cls)
    listing = ", ".join(f"{name}: {describe(hint)}" for name, hint in accepted.items()) or "none"
    for key, value in options.items():
        if key not in accepted:
            if _forwards_any_option(cls):
                continue
            raise ConfigurationError(f"{kind} '{cls.name}' has no option '{key}'; its options are: {listing}")
        hint = accepted[key]
        if hint is not inspect.Parameter.empty and not matches(value, hint):
            raise ConfigurationError(f"{kind} '{cls.name}': option {key}={value!r} must be {describe(hint)} "
                                     f"(options: {listing})")
        low, high = getattr(cls, "option_limits", {}).get(key, C_INT)
        if any(not low <= number <= high for number in integers(value)):
            raise ConfigurationError(f"{kind} '{cls.name}': option {key}={value!r} is out of range: "
                                     f"{'each ' if isinstance(value, (list, tuple)) else ''}integer must be "
                                     f"from {low} to {high}")


def integers(value: Any) -> list[int]:
    """The integers of an option value: itself, or the items of a list or tuple (bools are not integers)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def matches(value: Any, hint: Any) -> bool:
    """Whether `value` fits the type hint; hints this function does not understand accept anything."""
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return any(value == choice and type(value) is type(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        item = args[0] if args and (origin is not tuple or len(args) == 2 and args[1] is Ellipsis) else None
        return item is None or all(matches(v, item) for v in value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def describe(hint: Any) -> str:
    if hint is inspect.Parameter.empty:
        return "any"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    return str(hint).replace("typing.", "")


def _forwards_any_option(cls: type) -> bool:
    """True when the class's own constructor takes **options (the interfaces' catch-alls refuse them)."""
    from specframe.contract.interfaces import Drafter, StateBackend, TreeBuilder, Verifier

    init = cls.__init__
    if init in {Drafter.__init__, TreeBuilder.__init__, Verifier.__init__, StateBackend.__init__}:
        return False
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values())


def _type_hints(function) -> dict[str, Any]:
    """Evaluated annotations; ones that cannot be evaluated (names imported only for type checking) are
    left out, which makes them accept anything."""
    try:
        return typing.get_type_hints(function)
    except Exception:
        pass
    module = sys.modules.get(function.__module__)
    namespace = vars(module) if module else {}
    hints = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except Exception:
            continue
    return hints
