"""The persisted response cache of the `suffix` drafter: one versioned JSON file per cache.

arctic-inference keeps its suffix trees in memory only. To let a long session or a benchmark warm up
across processes, specframe keeps the responses of finished requests (oldest first, at most
`max_cached`) and writes them as::

    {"format": 1, "tokenizer": {"name": ..., "fingerprint": ..., "vocab_size": ...},
     "responses": [[id, id, ...], ...]}

A drafter opening the file replays the responses into the library's cache. A file written for another
tokenizer, by a newer specframe, or damaged is refused with a message saying how to clear it, and is
never overwritten: the user decides. Writes are atomic (a temporary file in the same directory, then
`os.replace`), so a crash or a concurrent reader never sees half a file. A writer holds the cache's lock,
re-reads the file and appends its new responses to what it finds, so two processes sharing a cache keep
the responses of both; it also removes the temporary files of writes that were killed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from specframe import ConfigurationError
from specframe.kit.drafting import TokenizerIdentity
from specframe.kit.files import (
    FILE_LOCK_WAIT, check_writable_dir, file_lock, locked_update, read_json, specframe_home, write_atomically,
)

FORMAT = 1
SUFFIX = ".json"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class SuffixCacheError(ConfigurationError):
    """A suffix-decoding response cache is corrupt, from a newer format, or built for another tokenizer."""


def cache_home() -> Path:
    """Where named caches live: `$SPECFRAME_HOME/suffix-caches` (default ~/.cache/specframe/suffix-caches)."""
    return specframe_home() / "suffix-caches"


def resolve_cache(value: str | os.PathLike) -> Path:
    """A cache file from a name (`NAME` means `cache_home() / "NAME.json"`) or a path (anything with a
    directory part or ending in `.json`; a path must end in `.json`, so clearing a cache can only ever
    delete such files)."""
    text = os.fspath(value)
    if not text.strip():
        raise ConfigurationError("suffix: the cache name is empty; give a name (cache='chat') or a path")
    if "/" in text or os.sep in text or text.endswith(SUFFIX) or text.startswith(("~", ".")):
        if not text.endswith(SUFFIX):
            raise ConfigurationError(f"suffix: cache file {text!r} must end in {SUFFIX} (or give a name)")
        return Path(text).expanduser()
    if not NAME.fullmatch(text):
        raise ConfigurationError(f"suffix: cache name {text!r} must be letters, digits, '_', '.' or '-' "
                                 "(or give a path ending in .json)")
    return cache_home() / f"{text}{SUFFIX}"


def clear_hint(label: str) -> str:
    return f"`specframe cache clear {label}`"


# The whole header `append_responses` writes, byte for byte (compact JSON, ASCII, keys in this order), up
# to the responses: `{"format":1,"tokenizer":{"name":"...","fingerprint":"...","vocab_size":N},"responses":[`
_JSON_STRING = rb'"(?:[^"\\\x00-\x1f]|\\.)*"'
_CACHE_START = re.compile(rb'\{"format":[1-9]\d{0,8},"tokenizer":\{"name":' + _JSON_STRING
                          + rb',"fingerprint":' + _JSON_STRING
                          + rb',"vocab_size":[1-9]\d{0,11}\},"responses":\[')
HEADER_BYTES = 4096  # read of a file's start when telling whether it is a cache (a long tokenizer name)


def is_cache_file(path: Path) -> bool:
    """Whether `path` is a suffix cache, maybe damaged past its header: a `.json` file starting with the
    exact header `append_responses` writes. This is the proof `specframe cache clear` asks for before
    deleting a file, so that a damaged cache can go but no other file the user points at, even a JSON
    file starting with the same keys."""
    if path.suffix != SUFFIX:
        return False
    try:
        with open(path, "rb") as f:
            return _CACHE_START.match(f.read(HEADER_BYTES)) is not None
    except OSError:
        return False


def remedy(path: Path, label: str | None = None) -> str:
    """What to do about a cache file that cannot be used: clear it, when it is one."""
    if is_cache_file(path):
        return f"delete it with {clear_hint(label or str(path))}"
    return ("give another cache name or path (this file does not start like a suffix cache, so "
            "`specframe cache clear` will not delete it)")


def missing_cache(label: str, path: Path) -> SuffixCacheError:
    """The error for a cache that does not exist, listing the named ones."""
    known = ", ".join(sorted(p.stem for p in cache_home().glob(f"*{SUFFIX}"))) or "(none)"
    return SuffixCacheError(f"no suffix cache '{label}' ({path} does not exist); named caches in "
                            f"{cache_home()}: {known}")


@dataclass
class CacheFile:
    """The parsed content of a cache file (checked for structure, not yet for the tokenizer)."""

    path: Path
    identity: TokenizerIdentity
    responses: list[list[int]]

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self.responses)


def read_cache(path: Path, label: str | None = None) -> CacheFile:
    """Parse and check the cache file at `path`; `label` (the name the user gave) goes into the hints."""
    hint = remedy(path, label)
    where = f"suffix cache '{path}'"
    try:
        data = read_json(path, f"the file is damaged: {hint}", SuffixCacheError, where=where)
    except OSError as err:
        raise SuffixCacheError(f"{where} cannot be read ({err.strerror or err}): give a readable cache "
                               "file, or another cache name") from None
    if not isinstance(data, dict) or "format" not in data:
        raise SuffixCacheError(f"{where} is not a specframe suffix cache (no \"format\" field): {hint}")
    version = data["format"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SuffixCacheError(f"{where} has an invalid format {version!r}: the file is damaged; {hint}")
    if version > FORMAT:
        raise SuffixCacheError(f"{where} has format {version}, newer than the format {FORMAT} this specframe "
                               f"reads: upgrade specframe, or {hint}")
    identity = _identity(data.get("tokenizer"), where, hint)
    responses = data.get("responses")
    if not isinstance(responses, list) or not all(_is_ids(r, identity.vocab_size) for r in responses):
        raise SuffixCacheError(f"{where}: \"responses\" must be lists of token ids in [0, "
                               f"{identity.vocab_size}): the file is damaged; {hint}")
    return CacheFile(path, identity, responses)


def _identity(value, where: str, hint: str) -> TokenizerIdentity:
    fields = {"name": str, "fingerprint": str, "vocab_size": int}
    if not (isinstance(value, dict) and all(isinstance(value.get(k), t) for k, t in fields.items())
            and not isinstance(value["vocab_size"], bool) and value["vocab_size"] > 0):
        raise SuffixCacheError(f"{where}: \"tokenizer\" must hold name, fingerprint and vocab_size: the file "
                               f"is damaged; {hint}")
    return TokenizerIdentity(**{k: value[k] for k in fields})


def _is_ids(row, vocab_size: int) -> bool:
    return isinstance(row, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in row)


def load_responses(path: Path, identity: TokenizerIdentity, label: str) -> list[list[int]]:
    """The responses stored at `path` for a target with tokenizer `identity` (none if no file yet)."""
    if not path.exists():
        return []
    if not path.is_file():
        raise SuffixCacheError(f"suffix cache '{path}' is not a file; give a file path or a cache name")
    stored = read_cache(path, label)
    if not stored.identity.matches(identity):
        raise SuffixCacheError(
            f"suffix cache '{path}' was built with tokenizer {stored.identity.describe()} but the target "
            f"uses tokenizer {identity.describe()}; use another cache name for this model, or delete the "
            f"cache with {clear_hint(label)}")
    return stored.responses


def check_writable(path: Path) -> None:
    """Refuse, before any work, a cache whose directory cannot hold it (read-only, or a file in the way):
    the file, its lock and its temporary files are all written there."""
    check_writable_dir(path.parent, "the suffix cache directory",
                       f"give cache= a name with SPECFRAME_HOME set to a writable directory, or a path "
                       f"in one (the cache {path.name}, its lock and its temporary files go there)")


def append_responses(path: Path, identity: TokenizerIdentity, new: list[list[int]], keep: int,
                     label: str) -> None:
    """Add the responses `new` to the cache at `path`, keeping the newest `keep` of all it then holds.

    Under the cache's lock the file is read again, so responses another process saved since this one
    loaded the cache stay in it; a file that became damaged or another tokenizer's is refused
    (`SuffixCacheError`) and left as it is. The new file replaces the old one atomically."""
    def busy() -> SuffixCacheError:
        return SuffixCacheError(f"suffix cache '{path}' stayed locked by another process for "
                                f"{FILE_LOCK_WAIT:g} s ({file_lock(path)}): wait for it to finish, or give "
                                "this request another cache name")

    with locked_update(path, busy, f"suffix cache '{path}'"):
        responses = (load_responses(path, identity, label) + new)[-keep:] if keep else []
        payload = {"format": FORMAT, "tokenizer": identity.to_json(), "responses": responses}
        write_atomically(path, json.dumps(payload, separators=(",", ":")))
