"""Reading what a user or another process hands specframe: JSON and JSON Lines that may be damaged or
crafted, and text that may not be printable.

Every JSON file specframe reads from outside its own process (datastore headers and manifests, suffix
caches, prompt suites, benchmark records, corpus sources, training data) goes through `parse_json`,
`read_json` or `json_lines`. A bad file is refused with the caller's own error class, naming the file and
how to fix it, whatever Python's parser raised: a syntax error (`JSONDecodeError`), bytes that are not
UTF-8 (`UnicodeDecodeError`), an integer of more digits than Python converts (a `ValueError`), nesting
deeper than its recursion allows (`RecursionError`), or nesting deeper than `MAX_DEPTH` (which the
parser accepts but code walking the value would not survive). `json_or_none` is for caches, where a bad
line is dropped rather than refused.

Text from such files can hold lone surrogates (a JSON `"\\ud800"` escape decodes to one), which no
encoder writes: `printable` escapes them for a terminal, and `check_encodable` refuses them, naming
where, before text reaches a tokenizer.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted; specframe's own files nest a few levels."""


def parse_json(text: str | bytes, where: str, fix: str, error: Callable[[str], Exception]) -> object:
    """The value of the JSON document `text`, or `error(message)` raised: `message` says that `where` (the
    file, and its line for JSON Lines) is not valid JSON, why, and then `fix`."""
    problem = json_problem(text)
    if isinstance(problem, str):
        raise error(f"{where}: not valid JSON ({problem}); {fix}")
    return problem[0]


def read_json(path: str | os.PathLike, fix: str, error: Callable[[str], Exception],
              where: str | None = None) -> object:
    """The value of the JSON file `path` (read as UTF-8), refused as `parse_json` refuses it. A file that
    cannot be read (missing, a directory, no permission) raises its `OSError` as it is."""
    return parse_json(Path(path).read_bytes(), where or f"{path}", fix, error)


def json_lines(path: str | os.PathLike, fix: str, error: Callable[[str], Exception],
               where: str | None = None) -> Iterator[tuple[int, object]]:
    """(line number, value) for every non-blank line of the JSON Lines file `path`, read one line at a
    time; a bad line is refused as `parse_json` refuses it, naming its number."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                yield number, parse_json(raw, f"{where or path}, line {number}", fix, error)


def json_or_none(text: str | bytes) -> object | None:
    """The value of `text`, or None where it is not valid JSON for any reason `parse_json` names (for
    caches and records, where a line cut by an interrupted write is skipped)."""
    problem = json_problem(text)
    return None if isinstance(problem, str) else problem[0]


def json_problem(text: str | bytes) -> tuple[object] | str:
    """(value,) when `text` is valid JSON nested at most `MAX_DEPTH` deep, else why not, in words."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError as err:
        return f"not UTF-8 text: {err.reason} at byte {err.start}"
    except json.JSONDecodeError as err:
        return str(err)
    except RecursionError:
        return f"nested more than {MAX_DEPTH} levels deep"
    except ValueError as err:  # int("1" * 5000): "Exceeds the limit (4300 digits) for integer string ..."
        if "integer string conversion" in str(err):
            return f"a number of more than {sys.get_int_max_str_digits()} digits"
        return str(err)
    if too_deep(value, MAX_DEPTH):
        return f"nested more than {MAX_DEPTH} levels deep"
    return (value,)


def too_deep(value: object, limit: int) -> bool:
    """Whether `value` nests lists and dicts more than `limit` deep (walked without recursion)."""
    level = [value] if isinstance(value, (list, dict)) else []
    for _ in range(limit):
        level = [item for node in level for item in (node.values() if isinstance(node, dict) else node)
                 if isinstance(item, (list, dict))]
        if not level:
            return False
    return True


def printable(text: str) -> str:
    """`text` with every lone surrogate written as its escape (`\\ud800`), so that printing it to a UTF-8
    terminal cannot fail; any other text is returned as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_encodable(text: str, where: str, fix: str, error: Callable[[str], Exception]) -> str:
    """`text` when it encodes as UTF-8 (what a tokenizer needs), else `error(message)` raised: `message`
    names `where` and the first lone surrogate (a `\\ud800`-style JSON escape without its pair), then
    `fix`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise error(f"{where} holds a lone surrogate {printable(text[err.start])} at character {err.start} "
                    f"(a JSON \\u escape without its pair), which no tokenizer takes; {fix}") from None
    return text
