"""What transformers and llama.cpp rely on in a GGUF header (`specframe.runtime.gguf_header` reads it): the
model's dimensions, its vocabulary, and every tensor's type, shape and place in the file. Each check
raises `ModelLoadError` naming the key or tensor, its value, what it must be and what to do.

The dimensions are the keys llama.cpp reads for every architecture (`<arch>.block_count`, ...), with the
limits its loader asserts (an assertion aborts the process); the shapes of a decoder block's tensors are
checked for the Llama-style architectures (`LLAMA_LIKE`), whose layout is known here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from specframe.runtime.gguf_header import (
    ARRAY, FIX, FLOATS, INTEGERS, STRING, GGUFHeader, finite, read_header,
)
from specframe.terms.errors import ModelLoadError

MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS
ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")  # what llama.cpp's loader accepts
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")


@functools.lru_cache(maxsize=8)
def _checked(path: str, size: int, mtime_ns: int) -> None:
    header = read_header(Path(path))
    check_dimensions(header, path)
    check_vocabulary(header, path)
    check_tensors(header, path)


def check_gguf(path: Path) -> None:
    """Refuse (`ModelLoadError`) a GGUF file whose header transformers or llama.cpp would fail on, or
    crash on. Checked once per process for each version of the file (its size and modification time)."""
    try:
        stat = Path(path).stat()
    except OSError as err:
        raise ModelLoadError(f"cannot read GGUF file {path}: {err}") from None
    _checked(str(path), stat.st_size, stat.st_mtime_ns)


def _bad(path: str, what: str) -> ModelLoadError:
    return ModelLoadError(f"GGUF file {path}: {what}; {FIX}")


def _shown(value) -> str:
    if isinstance(value, bytes):
        return repr(value.decode(errors="replace")[:60])
    if isinstance(value, tuple) and len(value) > 8:
        return f"[{', '.join(map(str, value[:8]))}, ...] ({len(value)} items)"
    return repr(list(value) if isinstance(value, tuple) else value)


def _text(header: GGUFHeader, path: str, key: str, *, required: bool) -> str | None:
    field = header.fields.get(key)
    if field is None:
        if required:
            raise _bad(path, f"it has no {key}, which transformers and llama.cpp need")
        return None
    if field.type != STRING:
        raise _bad(path, f"{key} is {_shown(field.value)} and must be a string")
    try:
        return field.value.decode()
    except UnicodeDecodeError:
        raise _bad(path, f"{key} is {_shown(field.value)} and must be UTF-8 text") from None


def _counts(header: GGUFHeader, path: str, key: str, *, low: int, layers: int | None = None,
            required: bool = False, rule: str = "") -> list[int] | None:
    """The integer `key` (at least `low`; `rule` says it in words) as a list: of one item, or with `layers`,
    of one per block (llama.cpp takes either form for per-block sizes, 0 for a block without the part)."""
    field = header.fields.get(key)
    if field is None:
        if required:
            raise _bad(path, f"it has no {key}, which llama.cpp needs")
        return None
    rule = rule or f"an integer of at least {low}"
    if field.type in INTEGERS:
        if field.value < low:
            raise _bad(path, f"{key} is {field.value}, and it must be {rule}")
        return [field.value]
    if layers is not None and field.type == ARRAY and field.item_type in INTEGERS and field.value is not None:
        if len(field.value) != layers or min(field.value) < 0 or max(field.value) < low:
            raise _bad(path, f"{key} is {_shown(field.value)}, and it must be {rule}, or a list of {layers} "
                             "such counts (one per block, 0 for a block without it)")
        return list(field.value)
    raise _bad(path, f"{key} is {_shown(field.value)}, and it must be {rule}")


def _number(header: GGUFHeader, path: str, key: str, *, positive: bool) -> None:
    field = header.fields.get(key)
    if field is None:
        return
    ok = field.type in FLOATS and finite(field.value) and (field.value > 0 if positive else field.value >= 0)
    if not ok:
        raise _bad(path, f"{key} is {_shown(field.value)}, and it must be a finite float "
                         f"{'above' if positive else 'of at least'} 0")


def check_dimensions(header: GGUFHeader, path: str) -> None:
    """The model's sizes: blocks, context, embedding, heads, feed-forward, rotary dimensions, experts."""
    arch = _text(header, path, "general.architecture", required=True)
    blocks = _counts(header, path, f"{arch}.block_count", low=1, required=True,
                     rule=f"from 1 to {MAX_LAYERS} (llama.cpp's limit)")[0]
    if blocks > MAX_LAYERS:
        raise _bad(path, f"{arch}.block_count is {blocks}, and llama.cpp takes at most {MAX_LAYERS} blocks")
    _counts(header, path, f"{arch}.context_length", low=1, required=True)
    embedding = _counts(header, path, f"{arch}.embedding_length", low=1, required=True)[0]
    _counts(header, path, f"{arch}.feed_forward_length", low=1, layers=blocks)
    heads = _counts(header, path, f"{arch}.attention.head_count", low=1, layers=blocks)
    kv_key = f"{arch}.attention.head_count_kv"
    kv_heads = _counts(header, path, kv_key, low=1, layers=blocks) or heads
    if heads and kv_heads:
        per_layer = zip(heads * blocks if len(heads) == 1 else heads,
                        kv_heads * blocks if len(kv_heads) == 1 else kv_heads)
        if any((kv and not h) or (kv and h % kv) for h, kv in per_layer):
            raise _bad(path, f"{kv_key} is {_shown(tuple(kv_heads))} and the head count "
                             f"{_shown(tuple(heads))}: each key-value head count must divide its head count")
    key_length = _counts(header, path, f"{arch}.attention.key_length", low=1)
    _counts(header, path, f"{arch}.attention.value_length", low=1)
    head_dim = key_length[0] if key_length else None
    if heads and heads[0] and head_dim is None:
        if embedding % heads[0]:
            raise _bad(path, f"{arch}.embedding_length is {embedding} and {arch}.attention.head_count "
                             f"{heads[0]}: the embedding must split evenly into the heads")
        head_dim = embedding // heads[0]
    rope = _counts(header, path, f"{arch}.rope.dimension_count", low=2)
    if rope and head_dim is not None and (rope[0] > head_dim or rope[0] % 2):
        raise _bad(path, f"{arch}.rope.dimension_count is {rope[0]}, and it must be even and at most the "
                         f"head size, {head_dim}")
    _number(header, path, f"{arch}.rope.freq_base", positive=True)
    _number(header, path, f"{arch}.attention.layer_norm_rms_epsilon", positive=False)
    _number(header, path, f"{arch}.attention.layer_norm_epsilon", positive=False)
    scaling = _text(header, path, f"{arch}.rope.scaling.type", required=False)
    if scaling is not None and scaling not in ROPE_SCALINGS:
        raise _bad(path, f"{arch}.rope.scaling.type is {scaling!r}, and llama.cpp knows "
                         f"{', '.join(ROPE_SCALINGS)}")
    next_layers = _counts(header, path, f"{arch}.nextn_predict_layers", low=0)
    if next_layers and next_layers[0] > blocks:
        raise _bad(path, f"{arch}.nextn_predict_layers is {next_layers[0]}, more than the {blocks} blocks")
    _check_experts(header, path, arch, blocks)


def _check_experts(header: GGUFHeader, path: str, arch: str, blocks: int) -> None:
    """A mixture of experts' counts, as llama.cpp's loader asserts them."""
    experts = (_counts(header, path, f"{arch}.expert_count", low=0) or [0])[0]
    used = max(_counts(header, path, f"{arch}.expert_used_count", low=0, layers=blocks) or [0])
    groups = (_counts(header, path, f"{arch}.expert_group_count", low=0) or [0])[0]
    group_used = (_counts(header, path, f"{arch}.expert_group_used_count", low=0) or [0])[0]
    grouped = groups <= 1 or (experts % groups == 0 and 0 < group_used < groups)
    consistent = experts <= MAX_EXPERTS and used <= experts and (
        (used > 0 and groups < experts and grouped) if experts else groups == 0)
    if not consistent:
        raise _bad(path, f"its experts do not add up: {arch}.expert_count {experts} (at most {MAX_EXPERTS}), "
                         f"expert_used_count {used} (1 to the expert count, 0 without experts), "
                         f"expert_group_count {groups} (fewer than the experts, dividing them), "
                         f"expert_group_used_count {group_used} (fewer than the groups)")


def check_vocabulary(header: GGUFHeader, path: str) -> None:
    """The token list (distinct strings), and the per-token scores and types beside it."""
    arch = _text(header, path, "general.architecture", required=True)
    _text(header, path, "tokenizer.ggml.model", required=True)
    tokens = _array(header, path, "tokenizer.ggml.tokens", (STRING,), required=True)
    if tokens.count == 0:
        raise _bad(path, "tokenizer.ggml.tokens is empty")
    if tokens.value is not None and len(set(tokens.value)) != tokens.count:
        seen: set[bytes] = set()
        twice = next(t for t in tokens.value if t in seen or seen.add(t))
        raise _bad(path, f"tokenizer.ggml.tokens holds the token {_shown(twice)} twice, and a vocabulary's "
                         "tokens must be distinct (llama.cpp aborts on it)")
    for key, types in (("tokenizer.ggml.scores", (6, 5)), ("tokenizer.ggml.token_type", (5,))):
        field = _array(header, path, key, types, required=False)
        if field is not None and field.count != tokens.count:
            raise _bad(path, f"{key} has {field.count} items and tokenizer.ggml.tokens {tokens.count}: one "
                             "per token")
    _array(header, path, "tokenizer.ggml.merges", (STRING,), required=False)
    declared = _counts(header, path, f"{arch}.vocab_size", low=1)
    if declared and declared[0] != tokens.count:
        raise _bad(path, f"{arch}.vocab_size is {declared[0]}, and tokenizer.ggml.tokens holds "
                         f"{tokens.count} tokens")


def _array(header: GGUFHeader, path: str, key: str, item_types: Sequence[int], *, required: bool):
    field = header.fields.get(key)
    if field is None:
        if required:
            raise _bad(path, f"it has no {key}, which transformers and llama.cpp need")
        return None
    if field.type != ARRAY or field.item_type not in item_types:
        names = {STRING: "strings", 5: "int32", 6: "float32"}
        raise _bad(path, f"{key} is not an array of {' or '.join(names[t] for t in item_types)}")
    return field


def check_tensors(header: GGUFHeader, path: str) -> None:
    """Every tensor's type, shape and data within the file; the embedding's shape; the blocks' tensors."""
    from gguf.constants import GGML_QUANT_SIZES

    arch = _text(header, path, "general.architecture", required=True)
    sizes = {int(kind): size for kind, size in GGML_QUANT_SIZES.items()}
    room = header.size - header.data_start
    for tensor in header.tensors.values():
        if tensor.type not in sizes:
            raise _bad(path, f"tensor {tensor.name!r} has type {tensor.type}, which is no ggml type")
        block, block_bytes = sizes[tensor.type]
        if min(tensor.shape) < 1 or tensor.shape[0] % block:
            raise _bad(path, f"tensor {tensor.name!r} has the shape {list(tensor.shape)}: every dimension "
                             f"must be at least 1, and its rows a multiple of {block} values for its type")
        elements = 1
        for dim in tensor.shape:
            elements *= dim
        end = tensor.offset + elements // block * block_bytes
        if end > room:
            raise _bad(path, f"tensor {tensor.name!r} ends {end} bytes into the tensor data, and the file "
                             f"holds {room} bytes of it (truncated, or its offset or shape wrong)")
    fields = header.fields
    n_vocab = fields["tokenizer.ggml.tokens"].count if "tokenizer.ggml.tokens" in fields else None
    embedding = fields[f"{arch}.embedding_length"].value
    expected = {"token_embd.weight": (embedding, n_vocab)}
    blocks = fields[f"{arch}.block_count"].value
    used = set()
    for name in header.tensors:
        if name.startswith("blk."):
            index = name.split(".")[1]
            if not index.isdigit() or int(index) >= blocks:
                raise _bad(path, f"tensor {name!r} belongs to no block: {arch}.block_count is {blocks}")
            used.add(int(index))
    if len(used) < blocks:
        raise _bad(path, f"{arch}.block_count is {blocks}, and block {min(set(range(blocks)) - used)} has no "
                         "tensors")
    if arch in LLAMA_LIKE:
        expected.update(_llama_shapes(header, arch, embedding, n_vocab, blocks))
    for name, shape in expected.items():
        tensor = header.tensors.get(name)
        if tensor is None and name != "output.weight":  # without it, the output reuses the embedding
            raise _bad(path, f"it has no tensor {name!r}, which a {arch} model of this header needs")
        if tensor is not None and tensor.shape != shape:
            raise _bad(path, f"tensor {name!r} has the shape {list(tensor.shape)}, and the header's sizes "
                             f"({arch}.embedding_length, head counts, vocabulary) make it {list(shape)}")


def _llama_shapes(header: GGUFHeader, arch: str, embedding: int, n_vocab: int | None,
                  blocks: int) -> dict[str, tuple[int, ...]]:
    """The shapes of a Llama-style model's tensors, as GGUF stores them (row length first)."""
    fields = header.fields

    def value(key: str, default):
        field = fields.get(f"{arch}.{key}")
        return default if field is None or field.type == ARRAY else field.value

    heads = value("attention.head_count", None)
    if heads is None:
        return {}
    kv_heads = value("attention.head_count_kv", heads)
    k_dim = value("attention.key_length", embedding // heads)
    v_dim = value("attention.value_length", embedding // heads)
    ff = value("feed_forward_length", None)
    shapes = {"output_norm.weight": (embedding,), "output.weight": (embedding, n_vocab)}
    for i in range(blocks):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (embedding,), f"blk.{i}.ffn_norm.weight": (embedding,),
            f"blk.{i}.attn_q.weight": (embedding, heads * k_dim),
            f"blk.{i}.attn_k.weight": (embedding, kv_heads * k_dim),
            f"blk.{i}.attn_v.weight": (embedding, kv_heads * v_dim),
            f"blk.{i}.attn_output.weight": (heads * v_dim, embedding)})
        if ff is not None:
            shapes.update({
                f"blk.{i}.ffn_gate.weight": (embedding, ff), f"blk.{i}.ffn_up.weight": (embedding, ff),
                f"blk.{i}.ffn_down.weight": (ff, embedding)})
    return shapes
