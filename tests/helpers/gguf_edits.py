"""Every small edit of a GGUF file's header, for fuzzing what reads it: each key's type code and value
(counts set to 0, 1, one more or less, twice, the type's largest value; floats to 0, -1, NaN, infinity;
strings and arrays to an empty, a shorter, a longer or a huge length; an array's item type), the name
length, dimension count, dimensions, type and data offset of four tensor entries (the first two, one
in the middle, the last), the header's version and counts, and truncations. `header_edits(raw, path)`
yields (label, edited bytes); positions come from `specframe.runtime.gguf_header.read_header`'s offsets.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from specframe.runtime.gguf_header import ARRAY, FLOATS, INTEGERS, SCALARS, STRING, read_header

HUGE = 2 ** 62
TYPE_CODES = (0, 4, 6, 7, 8, 9, 10, 13, 2 ** 31)  # a few of each kind, and two GGUF does not define


def put(raw: bytes, at: int, fmt: str, value) -> bytes:
    packed = struct.pack(fmt, value)
    return raw[:at] + packed + raw[at + len(packed):]


def _int_values(value: int, fmt: str) -> list[int]:
    bits = struct.calcsize(fmt) * 8
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt[1].islower() else (0, 2 ** bits - 1)
    wanted = {0, 1, 3, high, value + 1, value - 1, value * 2, value // 2, low}
    return sorted(v for v in wanted if low <= v <= high and v != value)


def header_edits(raw: bytes, path: Path) -> Iterator[tuple[str, bytes]]:
    """(label, bytes) for every edit described in the module docstring of the GGUF `raw` (read at `path`)."""
    header = read_header(path)
    yield "only the magic", raw[:4]
    yield "empty", b""
    yield "cut in the header", raw[:header.data_start // 2]
    yield "cut at the data", raw[:header.data_start]
    yield "cut one byte short", raw[:-1]
    for version in (1, 4):
        yield f"version {version}", put(raw, 4, "<I", version)
    for count in (0, len(header.tensors) + 1, HUGE):
        yield f"tensor count {count}", put(raw, 8, "<Q", count)
    for count in (0, len(header.fields) - 1, len(header.fields) + 1, HUGE):
        yield f"key count {count}", put(raw, 16, "<Q", count)
    for key, field in header.fields.items():
        yield from _field_edits(raw, key, field)
    tokens = header.fields["tokenizer.ggml.tokens"]
    yield from _duplicate_token(raw, tokens)
    tensors = list(header.tensors.values())
    for tensor in {t.name: t for t in (*tensors[:2], tensors[len(tensors) // 2], tensors[-1])}.values():
        yield from _tensor_edits(raw, tensor)


def _field_edits(raw: bytes, key: str, field) -> Iterator[tuple[str, bytes]]:
    at = field.offset
    for code in TYPE_CODES:
        if code != field.type:
            yield f"{key}: type code {code}", put(raw, at, "<I", code)
    if field.type in INTEGERS:
        fmt = SCALARS[field.type]
        for value in _int_values(field.value, fmt):
            yield f"{key} = {value}", put(raw, at + 4, fmt, value)
    elif field.type in FLOATS:
        for value in (0.0, -1.0, float("nan"), float("inf")):
            yield f"{key} = {value}", put(raw, at + 4, SCALARS[field.type], value)
    elif field.type == STRING:
        length = len(field.value)
        for value in {0, max(length - 1, 0), length + 1, HUGE} - {length}:
            yield f"{key}: string length {value}", put(raw, at + 4, "<Q", value)
    elif field.type == ARRAY:
        for code in TYPE_CODES:
            if code != field.item_type:
                yield f"{key}: item type {code}", put(raw, at + 4, "<I", code)
        for count in {0, 1, field.count - 1, field.count + 1, HUGE} - {field.count}:
            yield f"{key}: item count {count}", put(raw, at + 8, "<Q", count)
        if field.item_type in INTEGERS and field.count:
            fmt = SCALARS[field.item_type]
            for value in _int_values(field.value[0], fmt):
                yield f"{key}[0] = {value}", put(raw, at + 16, fmt, value)
        if field.item_type == STRING and field.count:
            yield f"{key}[0]: string length {HUGE}", put(raw, at + 16, "<Q", HUGE)


def _duplicate_token(raw: bytes, tokens) -> Iterator[tuple[str, bytes]]:
    """The second token made equal to an earlier one of the same length."""
    at = tokens.offset + 16
    starts = []
    for token in tokens.value:
        starts.append(at)
        at += 8 + len(token)
    for i in range(1, len(tokens.value)):
        twin = next((j for j in range(i) if len(tokens.value[j]) == len(tokens.value[i])), None)
        if twin is not None:
            copy = tokens.value[twin]
            yield f"token {i} = token {twin}", raw[:starts[i] + 8] + copy + raw[starts[i] + 8 + len(copy):]
            return


def _tensor_edits(raw: bytes, tensor) -> Iterator[tuple[str, bytes]]:
    name, at = tensor.name, tensor.at
    for length in (0, len(name) + 1, HUGE):
        yield f"tensor {name}: name length {length}", put(raw, at, "<Q", length)
    dims_at = at + 8 + len(name.encode())
    for n_dims in {0, 1, 3, 5, 2 ** 31} - {len(tensor.shape)}:
        yield f"tensor {name}: {n_dims} dimensions", put(raw, dims_at, "<I", n_dims)
    for d, dim in enumerate(tensor.shape):
        for value in (0, dim + 1, dim * 2, HUGE):
            yield f"tensor {name}: dimension {d} = {value}", put(raw, dims_at + 4 + 8 * d, "<Q", value)
    type_at = dims_at + 4 + 8 * len(tensor.shape)
    for code in {0, 1, 2, 3, 99, 2 ** 31} - {tensor.type}:
        yield f"tensor {name}: type {code}", put(raw, type_at, "<I", code)
    for offset in (tensor.offset + 1, tensor.offset + 32, HUGE):
        yield f"tensor {name}: offset {offset}", put(raw, type_at + 4, "<Q", offset)
