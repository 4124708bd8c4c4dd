"""A GGUF file's header, read within the file's bounds, for the checks made before transformers or
llama.cpp read the file (`specframe.runtime.gguf_checks.check_gguf`).

Both trust a GGUF's header. An array count or a dimension count larger than the file makes transformers'
GGUF support fail with `struct.error`, a head count of 0 with `ZeroDivisionError`; llama.cpp aborts the
whole process (SIGABRT) on a block count of 0 or on two equal tokens in the vocabulary. `read_header`
bounds every count and length by the bytes left in the file before anything is read or kept, and a
structure it cannot follow is a `ModelLoadError` saying where, as are the values `gguf_checks` refuses.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

from specframe.terms.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what transformers and llama.cpp read
STRING, ARRAY = 8, 9  # GGUF value types; the others are scalars:
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}
INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
FLOATS = frozenset({6, 12})
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NAME = 63  # ggml's GGML_MAX_NAME, less the terminating zero
KEPT_ITEMS = 1 << 21  # array items kept as values (the largest vocabularies hold about 256k tokens)
CHUNK = 1 << 20  # bytes read from the file at a time
DEFAULT_ALIGNMENT = 32
FIX = ("the file is damaged or its header was edited: use the original file, or convert the model to GGUF "
       "again")


@dataclass(frozen=True)
class Field:
    """One key's value: a scalar, a string (bytes), or an array's items (a tuple; None past `KEPT_ITEMS`)."""

    type: int  # GGUF value type
    value: object
    offset: int  # where its type code is in the file: the value (an array's item type, count, items) follows
    item_type: int | None = None  # an array's
    count: int = 1  # an array's items


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the row length first
    type: int  # ggml type
    offset: int  # of its data, from the start of the data section
    at: int  # where its entry starts in the file


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    fields: dict[str, Field]
    tensors: dict[str, TensorInfo]
    data_start: int  # where the tensor data begins
    size: int  # of the file


class _Malformed(Exception):
    """What is wrong with the header's structure; `check_gguf` names the file."""


class _Cursor:
    """Reads the file forward from `pos`, refusing any read that would run past its end."""

    def __init__(self, file, size: int):
        self.file, self.size = file, size
        self.base, self.buffer, self.pos = 0, bytearray(), 0  # the buffer holds the file from `base`

    def _ready(self, n: int, what: str) -> int:
        """Where the next `n` bytes start in the buffer, read into it if needed."""
        if n > self.size - self.pos:
            raise _Malformed(f"{what} needs {n} bytes at byte {self.pos}, and the file has {self.size}")
        start = self.pos - self.base
        if start + n > len(self.buffer):
            del self.buffer[:start]  # keep only what is still ahead
            self.base, start = self.pos, 0
            self.file.seek(self.pos + len(self.buffer))
            while len(self.buffer) < n:
                chunk = self.file.read(max(n - len(self.buffer), CHUNK))
                if not chunk:
                    raise _Malformed(f"the file ended at byte {self.base + len(self.buffer)} while read")
                self.buffer += chunk
        return start

    def take(self, n: int, what: str) -> bytes:
        start = self._ready(n, what)
        self.pos += n
        return bytes(self.buffer[start:start + n])

    def strings(self, count: int, what: str, keep: bool) -> list[bytes] | None:
        """`count` strings (a length, then its bytes), kept or only passed over."""
        items = [] if keep else None
        for i in range(count):
            length = struct.unpack_from("<Q", self.buffer, self._ready(8, what))[0]
            self.pos += 8
            start = self._ready(length, f"item {i} of {what}")
            self.pos += length
            if keep:
                items.append(bytes(self.buffer[start:start + length]))
        return items

    def skip(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Malformed(f"{what} needs {n} bytes at byte {self.pos}, and the file has {self.size}")
        self.pos += n

    def scalar(self, kind: int, what: str):
        fmt = SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> bytes:
        return self.take(self.scalar(10, f"the length of {what}"), what)

    def text(self, what: str) -> str:
        raw = self.string(what)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise _Malformed(f"{what} is not UTF-8 text ({raw[:40]!r})") from None


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file `path`; `ModelLoadError` when its structure is malformed."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, 2)
            return _read(_Cursor(file, size))
    except _Malformed as err:
        raise ModelLoadError(f"GGUF file {path} is malformed: {err}; {FIX}") from None
    except OSError as err:
        raise ModelLoadError(f"cannot read GGUF file {path}: {err}") from None


def _read(cursor: _Cursor) -> GGUFHeader:
    magic = cursor.take(min(4, cursor.size), "the magic number")
    if magic != MAGIC:
        raise _Malformed(f"it does not start with {MAGIC!r} (it starts with {magic!r}): not a GGUF file")
    version = cursor.scalar(4, "the version")
    if version not in VERSIONS:
        raise _Malformed(f"its version is {version}, and only versions {VERSIONS} are read")
    n_tensors = cursor.scalar(10, "the tensor count")
    n_fields = cursor.scalar(10, "the key count")
    left = cursor.size - cursor.pos
    if n_tensors > left // 24 or n_fields > left // 12:  # the smallest entries: 24 and 12 bytes
        raise _Malformed(f"it claims {n_tensors} tensors and {n_fields} keys, more than its {cursor.size} "
                         "bytes can hold")
    fields: dict[str, Field] = {}
    for i in range(n_fields):
        key = cursor.text(f"key {i}")
        if not key or key in fields:
            raise _Malformed(f"key {i} is {'empty' if not key else f'{key!r} again'}")
        fields[key] = _value(cursor, key)
    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        tensor = _tensor(cursor, i)
        if tensor.name in tensors:
            raise _Malformed(f"tensor {tensor.name!r} is listed twice")
        tensors[tensor.name] = tensor
    alignment = fields.get("general.alignment")
    align = DEFAULT_ALIGNMENT if alignment is None else alignment.value
    if alignment is not None and (alignment.type != 4 or align < 1 or align & (align - 1)):
        raise _Malformed(f"general.alignment is {align!r}, and it must be a power of two (a uint32)")
    data_start = -(-cursor.pos // align) * align
    if data_start > cursor.size:
        raise _Malformed(f"its tensor data would start at byte {data_start}, past its end ({cursor.size})")
    return GGUFHeader(version, fields, tensors, data_start, cursor.size)


def _value(cursor: _Cursor, key: str) -> Field:
    offset = cursor.pos
    kind = cursor.scalar(4, f"the type of {key}")
    if kind in SCALARS:
        return Field(kind, cursor.scalar(kind, key), offset)
    if kind == STRING:
        return Field(kind, cursor.string(key), offset)
    if kind != ARRAY:
        raise _Malformed(f"{key} has value type {kind}, which GGUF does not define")
    item_type = cursor.scalar(4, f"the item type of {key}")
    count = cursor.scalar(10, f"the item count of {key}")
    if item_type not in SCALARS and item_type != STRING:
        raise _Malformed(f"{key} is an array of value type {item_type}, which GGUF arrays do not hold")
    width = 8 if item_type == STRING else struct.calcsize(SCALARS[item_type])  # a string's: its length
    if count > (cursor.size - cursor.pos) // width:
        raise _Malformed(f"{key} claims {count} items, more than the {cursor.size - cursor.pos} bytes left "
                         "can hold")
    keep = count <= KEPT_ITEMS
    if item_type == STRING:
        items = cursor.strings(count, key, keep)
    elif keep:
        items = struct.unpack(f"<{count}{SCALARS[item_type][1]}", cursor.take(count * width, key))
    else:
        items = None
        cursor.skip(count * width, key)
    return Field(ARRAY, None if items is None else tuple(items), offset, item_type, count)


def _tensor(cursor: _Cursor, i: int) -> TensorInfo:
    at = cursor.pos
    name = cursor.text(f"the name of tensor {i}")
    if not name or len(name.encode()) > MAX_NAME:
        raise _Malformed(f"tensor {i} has the name {name!r}: empty or longer than {MAX_NAME} bytes")
    n_dims = cursor.scalar(4, f"the dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Malformed(f"tensor {name!r} has {n_dims} dimensions, and ggml tensors have 1 to {MAX_DIMS}")
    shape = tuple(cursor.scalar(10, f"dimension {d} of tensor {name!r}") for d in range(n_dims))
    kind = cursor.scalar(4, f"the type of tensor {name!r}")
    offset = cursor.scalar(10, f"the data offset of tensor {name!r}")
    return TensorInfo(name, shape, kind, offset, at)


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
