"""What `specframe train eagle` reads: the sources `specframe datastore build --source` takes (a directory,
a `.jsonl` of texts or chats, a text file, `python-stdlib`, the target's own answers `model:PROMPTS.jsonl`
or `model:self`) and `answers:NAME`, the target's own chats or code of an earlier `specframe datastore
build --source model:self` (or `model-continue:python-stubs`) named NAME; `SOURCE:N` keeps the first N
documents. Tokenized by the target and cut into blocks of equal length."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specframe import ConfigurationError


def token_blocks(target, specs: list[str], block: int, out: Path, max_tokens: int | None = None,
                 log=print) -> np.ndarray:
    """(B, block) int64 token blocks of the documents of `specs`, joined by EOS (when the target has one),
    at most `max_tokens` tokens. Sources that generate (the target's own answers) keep their cache in
    `out`."""
    from specframe_corpus.datastore import DatastoreError

    eos = min(target.eos_token_ids) if target.eos_token_ids else None
    ids: list[int] = []
    for spec in specs:
        try:
            for doc in documents(spec, target, out):
                ids.extend(int(t) for t in doc)
                if eos is not None:
                    ids.append(eos)
                if max_tokens is not None and len(ids) >= max_tokens:
                    break
        except DatastoreError as err:
            raise ConfigurationError(f"eagle training: --data {spec}: {err}") from None
        log(f"eagle: {len(ids):,} tokens after --data {spec}")
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    ids = ids[:max_tokens] if max_tokens is not None else ids
    rows = len(ids) // block
    if rows == 0:
        raise ConfigurationError(
            f"eagle training: the data holds {len(ids)} tokens, fewer than one block ({block})")
    return np.asarray(ids[: rows * block], dtype=np.int64).reshape(rows, block)  # (B, T)


def documents(spec: str, target, out: Path):
    """The token ids of each document of one `--data` source; `SOURCE:N` keeps its first N documents (so
    the rest can be held out)."""
    from itertools import islice

    name, _, count = spec.rpartition(":")
    if name and count.isdigit():
        yield from islice(documents(name, target, out), int(count))
        return
    from specframe_corpus.answers import built_answers
    from specframe_corpus.build import tokenize
    from specframe_corpus.source_specs import parse_source

    if spec.startswith("answers:"):
        yield from built_answers(spec.removeprefix("answers:"), target.tokenizer)
        return
    source = parse_source(spec)
    source.prepare(target, out / "data")  # the target's own answers are cached in OUT
    for batch, _ in source.batches():
        yield from tokenize(target.tokenizer, batch, spec)
