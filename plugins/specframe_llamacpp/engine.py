"""llama.cpp through llama-cpp-python's low-level API: one model per GGUF file, the contexts of a backend's
batches (`ContextPool`), and the batch, sequence and state calls its rows make (`specframe_llamacpp.rows`).

How the context is set up, and why (each choice is what keeps a tree row's logits identical, bit for bit,
to a plain step's; `tests/plugins/llamacpp/test_llamacpp_backend.py` and `test_llamacpp_smollm2.py` check
them):

- The model loads without llama.cpp's extra weight buffers (`use_extra_bufts=False`): those repack the
  weights for AMX or other matrix units, whose kernels may take one code path for one row and another
  for many, so that a tree row would not reproduce a plain step; on a CPU that reports AMX but whose
  kernel does not let a process use it, that path crashes.
- Flash attention is on: it skips masked cells, so a row's sum over the cells it sees does not depend on
  what else the cache holds. Without it, rows from the fourteenth of a batch on were seen to round
  differently.
- A step's rows go to llama.cpp in calls of at most `ubatch` rows (the backend's option): with flash
  attention, every row of a 63-row micro-batch equals a plain step on the CPU it was checked on, and from
  64 rows on every row differs. The default, 32, stays below that edge; a tree of up to 31 nodes is one
  `llama_decode`. A prompt is read in micro-batches of up to `PREFILL_ROWS`, as llama.cpp reads one:
  plain and speculative decoding through the backend read it alike, so it needs no row-exactness.
- One unified KV cache for all sequences (`kv_unified`): copying the prefix to a sequence is then a
  change of cell metadata, not of data.
- One thread (`one_thread`).

Making a context allocates its whole cache and plans its compute graphs, which would cost a single request
more than many of its steps: a backend's contexts are kept in a `ContextPool`, from which each batch takes
one and to which it gives it back when it is dropped, so requests decoded one after another (each a batch
of one row) reuse them.
"""

from __future__ import annotations

import ctypes
import logging
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specframe import ConfigurationError, ModelLoadError, SpecframeWarning

LOGGER = "llama-cpp-python"  # the logger llama-cpp-python prints llama.cpp's own log through
CELL_BLOCK = 256  # llama.cpp sizes the KV cache in multiples of this many cells
PREFILL_ROWS = 512  # rows one `llama_decode` call takes at most (llama.cpp's n_batch), context permitting
INSTALL = "pip install 'specframe[llamacpp]' (llama-cpp-python builds llama.cpp from source: minutes of CPU)"

_models: dict[str, int] = {}  # GGUF path -> llama_model pointer, loaded once per process


def llama():
    """The `llama_cpp` module; `ModuleNotFoundError` when llama-cpp-python is not installed."""
    import llama_cpp

    return llama_cpp


def missing_reason() -> str | None:
    """Why llama.cpp cannot be used here, or None when llama-cpp-python imports."""
    try:
        llama()
    except ImportError as err:
        return f"it needs llama-cpp-python, which does not import ({err}): {INSTALL}"
    return None


def quiet() -> None:
    """Keep llama.cpp's loading chatter (hundreds of lines per model) off stderr, errors excepted, unless
    the program configured llama-cpp-python's logger itself."""
    logger = logging.getLogger(LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.ERROR)


def load_model(path: Path) -> int:
    """The llama.cpp model of the GGUF file `path`, loaded on first use (memory-mapped, on the CPU)."""
    key = str(path)
    if key not in _models:
        lib = llama()
        quiet()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = False  # see the module docstring
        model = lib.llama_model_load_from_file(key.encode(), params)
        if not model:
            raise ModelLoadError(f"llama.cpp cannot load {path}: it is not a GGUF model llama.cpp reads (set "
                                 f"logging.getLogger('{LOGGER}').setLevel('INFO') to see why)")
        _models[key] = model
    return _models[key]


@dataclass(frozen=True)
class ModelFacts:
    """What the backend checks of a llama.cpp model before serving it."""

    vocab: int  # rows of its logits
    trained_context: int
    recurrent: bool  # Mamba, RWKV, hybrids: state outside the KV cache
    window: int  # sliding-window attention span, 0 for none
    encoder: bool
    diffusion: bool


def model_facts(model: int) -> ModelFacts:
    lib = llama()
    return ModelFacts(
        vocab=int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))),
        trained_context=int(lib.llama_model_n_ctx_train(model)),
        recurrent=bool(lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model)),
        window=int(lib.llama_model_n_swa(model)),
        encoder=bool(lib.llama_model_has_encoder(model)),
        diffusion=bool(lib.llama_model_is_diffusion(model)))


class Batch:
    """A `llama_batch` over numpy buffers, made once per context and refilled for every call."""

    def __init__(self, rows: int, ids: int):
        lib = llama()
        self.token = np.zeros(rows, np.int32)
        self.pos = np.zeros(rows, np.int32)
        self.n_seq_id = np.zeros(rows, np.int32)
        self.seq_id = np.zeros((rows, ids), np.int32)  # row i's sequence ids in its first n_seq_id[i]
        self.logits = np.zeros(rows, np.int8)
        row = ctypes.POINTER(ctypes.c_int32)
        self._rows = (row * rows)(*[ctypes.cast(self.seq_id[i].ctypes.data, row) for i in range(rows)])
        self.struct = lib.llama_batch(
            n_tokens=0, token=self.token.ctypes.data_as(row), embd=None, pos=self.pos.ctypes.data_as(row),
            n_seq_id=self.n_seq_id.ctypes.data_as(row), seq_id=ctypes.cast(self._rows, ctypes.POINTER(row)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)))

    def fill(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: list[list[int]] | None,
             outputs: int) -> None:
        """Rows `tokens` at `positions`, in the sequences `seq_ids` (None: all in sequence 0), logits for
        the first `outputs` rows."""
        n = len(tokens)
        self.token[:n] = tokens
        self.pos[:n] = positions
        if seq_ids is None:
            self.seq_id[:n, 0] = 0
            self.n_seq_id[:n] = 1
        else:
            for i, ids in enumerate(seq_ids):
                self.seq_id[i, :len(ids)] = ids
                self.n_seq_id[i] = len(ids)
        self.logits[:n] = 0
        self.logits[:outputs] = 1
        self.struct.n_tokens = n


class LlamaEngine:
    """A llama.cpp context over one GGUF model, set up as the module docstring says, holding `paths`
    sequences (ids 0..paths-1: the rows' own and the ids a step lends for tree paths) and one spare id,
    with which the rows (`specframe_llamacpp.rows`) mark discarded cells (`settle`)."""

    def __init__(self, path: Path, *, context: int, paths: int, threads: int):
        lib = llama()
        self.model = load_model(path)
        self.vocab = model_facts(self.model).vocab
        params = lib.llama_context_default_params()
        # llama.cpp rounds the cache up to whole blocks of cells, but limits a call's rows to the context
        # asked for, and aborts where that leaves fewer rows than sequences: ask for the rounded size
        params.n_ctx = -(-context // CELL_BLOCK) * CELL_BLOCK
        params.n_batch = params.n_ubatch = max(paths + 1, min(PREFILL_ROWS, params.n_ctx))
        params.n_seq_max = paths + 1
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.kv_unified = True
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise ConfigurationError(
                f"llama.cpp could not make a context of {context} tokens and {paths + 1} sequences with "
                f"flash attention for {path} (set logging.getLogger('{LOGGER}').setLevel('INFO') to see "
                "why): lower the backend's context option")
        weakref.finalize(self, lib.llama_free, ctx)
        self.ctx, self.memory = ctx, lib.llama_get_memory(ctx)
        self.cells = int(lib.llama_n_ctx(ctx))  # cells the cache holds
        self.context = min(context, self.cells)  # what the backend lets a request use
        self.rows = int(params.n_batch)
        self.spare = paths  # the sequence id that marks discarded cells (`settle`, `retire`)
        self.sequences = paths + 1
        self.batch = Batch(self.rows, paths + 1)

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: list[list[int]] | None = None,
               outputs: int = 0, rows: int | None = None) -> np.ndarray:
        """Run the rows `tokens` at `positions` into the cache, in sequences `seq_ids` (None: sequence 0),
        in calls of at most `rows` rows (default: as many as a call takes): the (outputs, V) logits of
        the first `outputs` rows."""
        lib, rows = llama(), min(rows or self.rows, self.rows)
        out = np.empty((outputs, self.vocab), np.float32)  # (outputs, V)
        for start in range(0, len(tokens), rows):
            end = min(start + rows, len(tokens))
            wanted = min(max(outputs - start, 0), end - start)
            self.batch.fill(tokens[start:end], positions[start:end],
                            None if seq_ids is None else seq_ids[start:end], wanted)
            code = lib.llama_decode(self.ctx, self.batch.struct)
            if code != 0:
                raise RuntimeError(f"llama_decode failed with code {code} on {end - start} rows at positions "
                                   f"{int(positions[start])}..{int(positions[end - 1])}")
            if wanted:
                out[start:start + wanted] = self.logits(wanted)
        return out

    def logits(self, rows: int) -> np.ndarray:
        """The (rows, V) logits of the last `llama_decode`, as a numpy view of llama.cpp's buffer (valid
        until the next call): one copy out of it, with no ctypes conversion per element or per row."""
        address = ctypes.cast(llama().llama_get_logits(self.ctx), ctypes.c_void_p).value
        buffer = (ctypes.c_float * (rows * self.vocab)).from_address(address)
        return np.frombuffer(buffer, np.float32).reshape(rows, self.vocab)

    def clear(self) -> None:
        """Empty the cache (metadata only)."""
        llama().llama_memory_clear(self.memory, False)

    def save(self, seq: int) -> ctypes.Array:
        """A copy of sequence `seq`'s cells (positions, keys, values: llama.cpp's per-sequence state)."""
        lib = llama()
        size = lib.llama_state_seq_get_size(self.ctx, seq)
        state = (ctypes.c_uint8 * size)()
        written = lib.llama_state_seq_get_data(self.ctx, state, size, seq)
        if not written:
            raise RuntimeError(f"llama.cpp could not read the cells of sequence {seq}")
        return state if written == size else (ctypes.c_uint8 * written).from_buffer_copy(state)

    def load(self, seq: int, state: ctypes.Array, what: str = "a saved sequence") -> None:
        """Write `state` (from `save`, of this engine or another over the same model) into sequence `seq`,
        in the first free cells that hold it in one run."""
        if not llama().llama_state_seq_set_data(self.ctx, state, len(state), seq):
            raise RuntimeError(f"llama.cpp could not write {what} into sequence {seq}: its cache has no run "
                               f"of {len(state)} bytes' worth of free cells")

    def settle(self, ids: list[int], start: int, kept: int | None, end: int) -> None:
        """End a tree scored in sequences `ids` (the row's own first, then borrowed ones) from position
        `start` on: every tree cell also gets the spare id, which no query reads, so that no cell is
        freed (a free cell between a row's cells would take a later token before accepted ones); the
        row's own sequence keeps the cells of sequence `kept` before `end` (none when `kept` is None);
        the borrowed ids are emptied."""
        lib, own = llama(), ids[0]
        for seq in ids:
            lib.llama_memory_seq_cp(self.memory, seq, self.spare, start, -1)
        lib.llama_memory_seq_rm(self.memory, own, end if kept == own else start, -1)
        if kept is not None and kept != own:
            lib.llama_memory_seq_cp(self.memory, kept, own, start, end)
        for seq in ids[1:]:
            lib.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def copy(self, source: int, targets: list[int]) -> None:
        """Make each sequence of `targets` hold `source`'s cells too (metadata only)."""
        for seq in targets:
            llama().llama_memory_seq_cp(self.memory, source, seq, -1, -1)

    def retire(self, seq: int, into: int | None = None) -> None:
        """Hand sequence `seq`'s cells to sequence `into` (None: the spare id, discarded) and empty it."""
        lib = llama()
        lib.llama_memory_seq_cp(self.memory, seq, self.spare if into is None else into, -1, -1)
        lib.llama_memory_seq_rm(self.memory, seq, -1, -1)


class ContextPool:
    """The llama.cpp contexts of one backend's batches, each made for `context` positions and a number of
    sequence ids (the last one the spare): `first` ids for a batch's first context, enough for one row's
    tree of `max_leaves` paths, and up to every id llama.cpp has (`sequences`) for a batch that needs more
    (a context's compute grows with its ids, so one request does not pay for a batch's). `take` hands a
    batch an idle context, emptied, or a new one; `give` takes it back when the batch is dropped, keeping
    up to `KEEP` idle of each kind. A request is a batch of one row, whose batch the next request's drops
    before making its own (`StateBackend.prefill`), so requests one after another reuse one context."""

    KEEP = 2

    def __init__(self, path: Path, context: int, first: int):
        self.path, self.context = path, context
        self.sequences = int(llama().llama_max_parallel_sequences())
        self.first = min(first, self.sequences)
        self._idle: dict[int, list[LlamaEngine]] = {}  # by sequence ids

    def make(self, context: int, sequences: int) -> LlamaEngine:
        """A new context for `context` positions and `sequences` ids (a batch grows into a larger one), on
        one thread (`one_thread`)."""
        return LlamaEngine(self.path, context=context, paths=sequences - 1, threads=1)

    def take(self, sequences: int) -> LlamaEngine:
        idle = self._idle.get(sequences)
        if not idle:
            return self.make(self.context, sequences)
        engine = idle.pop()
        engine.clear()
        return engine

    def give(self, engine: LlamaEngine) -> None:
        """Keep `engine` for the next `take`, unless it grew past the pool's size (its micro-batches could
        then differ from a new context's) or `KEEP` are idle already."""
        idle = self._idle.setdefault(engine.sequences, [])
        if engine.context == self.context and len(idle) < self.KEEP:
            idle.append(engine)

    def read(self, ids: np.ndarray) -> ctypes.Array:
        """The cells of `ids` read into an empty context of the pool's size, as the first row of a new batch
        reads its prompt (`LlamaEngine.save`'s copy of them): a row added to a batch that holds other
        cells gets the bits it would read alone."""
        engine = self.take(self.first)
        try:
            engine.decode(ids, np.arange(len(ids), dtype=np.int32))
            return engine.save(0)
        finally:
            self.give(engine)


def one_thread(asked: int) -> None:
    """Warn when `asked` (torch's thread count) is more than one: llama.cpp runs on one. On more, its CPU
    flash attention splits a one-row step over the threads once the cache holds a few hundred cells (seen
    from about 256 at two threads), and that row's logits then differ from the same token's row in a tree,
    so greedy output would part from plain decoding within a few tokens."""
    if asked > 1:
        warnings.warn(SpecframeWarning(
            f"backend 'llamacpp' runs llama.cpp on 1 thread, not {asked}: on more threads its one-row steps "
            "and tree rows are not computed alike, which would make speculative output differ from plain "
            "decoding; run several requests in separate processes to use more cores"), stacklevel=3)
