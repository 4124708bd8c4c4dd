"""Component specs as users write them: a registered name with options, `rest(c=16, live=True)` or
`draft-model(model=/models/small, layers=2)`, parsed into a `ComponentSpec` without running any code (Python
literals only, through `ast.literal_eval`; a value that is no literal is kept as its text)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from specframe.terms.errors import ConfigurationError


@dataclass(frozen=True)
class ComponentSpec:
    """A component named with options, parsed from text like `rest(c=16, live=True)`."""

    name: str
    options: dict[str, Any]

    @classmethod
    def parse(cls, text: str) -> ComponentSpec:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.:-]+)\s*(?:\((.*)\))?\s*", text)
        if not match:
            raise ConfigurationError(
                f"cannot parse component spec '{text}': use NAME or NAME(key=value, ...)")
        name, args = match.group(1), match.group(2)
        if not args or not args.strip():
            return cls(name, {})
        try:
            return cls(name, _parse_options(args, text))
        except ConfigurationError:
            raise
        except ValueError:
            raise ConfigurationError(
                f"cannot parse options of '{_excerpt(text)}': use key=value pairs separated by commas, "
                f"e.g. {name}(c=16, model='/path/to/model')") from None


def _parse_options(args: str, text: str) -> dict[str, Any]:
    """The options of `text` (whose parenthesized part is `args`): as Python keyword arguments, else as
    plain `key=value` text. Raises `ValueError` when neither reads them, `ConfigurationError` when they
    read but say something ambiguous (an option given twice, a second option list)."""
    try:
        try:
            return _python_options(args, text)
        except ConfigurationError:
            raise
        except (SyntaxError, ValueError, TypeError):  # TypeError: a literal such as {[1]: 2}
            return _plain_options(args, text)
    except (MemoryError, RecursionError):  # what Python's parser raises on very deep nesting
        raise ConfigurationError(
            f"cannot parse options of '{_excerpt(text)}': they nest too deeply; option values are plain "
            "literals such as 3, 0.5, 'text', True or [1, 2]") from None


def _python_options(args: str, text: str) -> dict[str, Any]:
    """`key=value, ...` as Python keyword arguments; a bare word is a string (`static(preset=B)`)."""
    call = ast.parse(f"f({args})", mode="eval").body
    if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
        raise ValueError(args)  # positional values or **: not keyword options
    if not isinstance(call.func, ast.Name):  # the pattern's greedy `(.*)` took in `)(`: `NAME(a=1)(b=2)`
        raise _second_list(text)
    _refuse_repeats([kw.arg for kw in call.keywords], text)
    return {kw.arg: (kw.value.id if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value))
            for kw in call.keywords}


def _second_list(text: str) -> ConfigurationError:
    name = text.strip().split("(", 1)[0]
    return ConfigurationError(
        f"'{_excerpt(text)}' has more than one option list: put every option of '{name}' into one pair of "
        f"parentheses, e.g. {name}(a=1, b=2)")


def _refuse_repeats(keys: list[str], text: str) -> None:
    """Refuse an option given twice: Python would keep the last one and silently drop the first."""
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ConfigurationError(
            f"option{'s' if len(repeated) > 1 else ''} {', '.join(map(repr, repeated))} given more than once "
            f"in '{_excerpt(text)}': give each option once")


def _excerpt(text: str, limit: int = 120) -> str:
    """`text`, cut in the middle when long, for an error message."""
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]}"


def _plain_options(args: str, text: str) -> dict[str, Any]:
    """Fallback for unquoted values such as paths (`draft-model(model=/models/small, layers=2)`): split at
    commas, keep a value that is no Python literal as its text."""
    if re.search(r"\)\s*\(\s*[A-Za-z_]\w*\s*=", args):  # `NAME(a=/x)(b=2)`
        raise _second_list(text)
    options: dict[str, Any] = {}
    keys = []
    for part in args.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier() or not value:
            raise ValueError(part)
        keys.append(key)
        try:
            options[key] = ast.literal_eval(value)
        except (SyntaxError, ValueError, TypeError):
            options[key] = value
    _refuse_repeats(keys, text)
    return options
