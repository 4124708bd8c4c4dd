"""`llamacpp`: the state backend that scores trees with llama.cpp, on the GGUF file the target was loaded
from (see the package docstring for the contract and its limits)."""

from __future__ import annotations

import warnings

import numpy as np

from specframe import (
    BackendCapabilities, ConfigurationError, SpecframeError, SpecframeWarning, StateBackend, TargetScores,
    TokenTree,
)
from specframe_llamacpp import engine
from specframe_llamacpp.layout import kept_in_place, kept_sequence, tree_layout

DEFAULT_CONTEXT = 4096  # positions the cache holds (fewer where the model was trained on fewer)
DEFAULT_LEAVES = 64  # root-to-leaf paths a tree may have: sequences the context is made for
DEFAULT_UBATCH = 32  # rows of a step per llama.cpp call: see `specframe_llamacpp.engine`


class LlamaCppBackend(StateBackend):
    """Scores every node of a tree in one `llama_decode`, with the GGUF's own weights and kernels.

    Options: `context` (positions the KV cache holds), `max_leaves` (root-to-leaf paths a tree may have),
    `ubatch` (rows of a step per `llama_decode`; a tree of more rows takes several, in order),
    `min_rows` (pad every forward to this many rows, as `kv` does; by default what the calibration handed
    to it measured, else no padding)."""

    name = "llamacpp"
    # Copies of the backend would share one llama.cpp context, so the default `RowByRow` would be wrong:
    # `batch()` makes rows sequences of one context of their own instead (`specframe_llamacpp.rows`).
    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=False,
                                       fresh_state_per_copy=False, runs_target_model=False)

    def __init__(self, target, *, want_hidden: bool = False, calibration=None, context: int | None = None,
                 max_leaves: int = DEFAULT_LEAVES, ubatch: int = DEFAULT_UBATCH, min_rows: int | None = None):
        import torch

        from specframe.kit.backend import forward_min_rows, gguf_file, pads_by_measurement

        super().__init__(target, want_hidden=want_hidden, calibration=calibration)
        reason = self.unsupported_reason(target)
        if reason:
            raise ConfigurationError(f"backend 'llamacpp' cannot serve model '{target.name}': {reason}")
        self.path = gguf_file(target.name)
        facts = engine.model_facts(engine.load_model(self.path))
        self.context = check_context(context, facts.trained_context)
        most_leaves = engine.llama().llama_max_parallel_sequences() - 1  # one sequence id is the spare
        self.max_leaves = check_count("max_leaves", max_leaves, most_leaves)
        self.ubatch = check_count("ubatch", ubatch, engine.PREFILL_ROWS)
        cpu = torch.device("cpu")  # llama.cpp runs on the CPU whatever the target's device
        self._measured_padding = pads_by_measurement(min_rows, cpu, "llama.cpp")
        self.min_rows = forward_min_rows(min_rows, cpu, self.name, "llama.cpp",
                                         calibrated=self.calibration.min_rows)
        self.engine = engine.LlamaEngine(self.path, context=self.context, paths=self.max_leaves, threads=1)
        self._committed = 0
        self._pending: int | None = None
        self._scored = False  # whether the cache holds rows of a score not yet committed

    @classmethod
    def unsupported_reason(cls, target) -> str | None:
        from specframe.kit.backend import gguf_file

        missing = engine.missing_reason()
        if missing:
            return missing
        if target.device.type != "cpu":
            return (f"llama.cpp runs on the CPU here, and the model was loaded on {target.device}: pass "
                    "--device cpu")
        try:
            path = gguf_file(target.name)
        except SpecframeError as err:
            return str(err)
        if path is None:
            return ("it was not loaded from a GGUF file, which the 'llamacpp' backend runs itself: pass "
                    "--model path/to/model.gguf or a GGUF alias (smollm2-135m)")
        try:
            facts = engine.model_facts(engine.load_model(path))
        except SpecframeError as err:
            return str(err)
        return facts_reason(facts, target.vocab_size)

    def batch(self):
        """Rows as llama.cpp sequences of one context, every row's tree in one `llama_decode`
        (`specframe_llamacpp.rows.LlamaRows`)."""
        from specframe_llamacpp.rows import LlamaRows

        return LlamaRows(self)

    def cost_options(self) -> dict:
        return {"min_rows": "auto" if self._measured_padding else self.min_rows, "ubatch": self.ubatch}

    def pads_by_measurement(self) -> bool:
        """Whether `min_rows` was left to calibration: not given
        (`specframe.kit.backend.pads_by_measurement`)."""
        return self._measured_padding

    @property
    def committed_length(self) -> int:
        return self._committed

    def prefill(self, ids: list[int]) -> None:
        import torch

        self.engine.set_threads(exact_threads(torch.get_num_threads()))
        self.check_room(len(ids), "the prompt")
        self.engine.clear()
        prefix = np.asarray(ids[:-1], dtype=np.int32)
        self._scored = False
        self.engine.decode(prefix, np.arange(len(prefix), dtype=np.int32))
        self._committed, self._pending = len(prefix), int(ids[-1])

    def score(self, tree: TokenTree) -> TargetScores:
        import torch

        start, rows = self._committed, len(tree) + 1
        run = tree.padded(self.min_rows - rows, self._pending)  # throwaway rows after the tree's
        layout = tree_layout(run)
        if layout.paths > self.max_leaves:
            raise ConfigurationError(
                f"backend 'llamacpp': a tree of {layout.paths} root-to-leaf paths, and the context was made "
                f"for {self.max_leaves}: pass --backend 'llamacpp(max_leaves={layout.paths})' or a smaller "
                "budget")
        self.check_room(start + layout.rows, "this step")
        if self._scored:
            self.engine.drop_from(start)  # the rows of an earlier, uncommitted score
        self._scored = True
        self.engine.share(layout.paths)
        tokens = np.concatenate([[self._pending], run.tokens]).astype(np.int32)
        logits = self.engine.decode(tokens, start + layout.offsets, layout.seq_ids, outputs=rows,
                                    rows=self.ubatch)
        return self.issue(TargetScores(logits=torch.from_numpy(logits), tree=tree, state=layout))

    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        self.redeem(scored)  # so the cache's tail still holds the rows of `scored.tree`
        start, end = self._committed, self._committed + 1 + len(path)
        seq = kept_sequence(scored.state, path)
        if kept_in_place(path):
            self.engine.keep(seq, end)
        else:
            self.engine.compact(seq, start, end)
        self._scored = False
        self._committed, self._pending = end, int(bonus)

    def check_room(self, positions: int, what: str) -> None:
        if positions > self.engine.context:
            raise ConfigurationError(
                f"backend 'llamacpp': {what} needs {positions} positions and the llama.cpp context holds "
                f"{self.engine.context}: pass --backend 'llamacpp(context=N)' with a larger N (the model was "
                f"trained on {engine.model_facts(self.engine.model).trained_context}), or a shorter request")


def facts_reason(facts: engine.ModelFacts, vocab: int) -> str | None:
    """Why a llama.cpp model with `facts` cannot serve a target of `vocab` logits, or None."""
    if facts.recurrent:
        return ("it has recurrent layers, whose state llama.cpp cannot roll back to a tree node; the "
                "'llamacpp' backend serves attention-only models")
    if facts.window:
        return (f"its attention looks back over a sliding window of {facts.window} tokens, which the tree's "
                "sequence layout does not cover; the 'llamacpp' backend serves full attention only")
    if facts.encoder or facts.diffusion:
        return "it is not a causal (next-token) decoder-only model"
    if facts.vocab != vocab:
        return (f"the GGUF's vocabulary has {facts.vocab} tokens and the target's logits {vocab}: load the "
                "target from the same GGUF file")
    return None


def check_context(context: int | None, trained: int) -> int:
    """The `context` option: positions the cache holds, at most what the model was trained on."""
    if context is None:
        return min(DEFAULT_CONTEXT, trained)
    check_count("context", context, trained)
    return int(context)


def check_count(option: str, value: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigurationError(f"backend 'llamacpp': {option} must be an integer from 1 to {most}, "
                                 f"got {value!r}")
    return value


def exact_threads(asked: int) -> int:
    """The threads llama.cpp runs on: one. On more, its CPU flash attention splits a one-row step over
    the threads once the cache holds a few hundred cells (seen from about 256 at two threads), and that
    row's logits then differ from the same token's row in a tree, so greedy output parts from plain
    decoding within a few tokens. A request for more threads is warned about and served on one."""
    if asked > 1:
        warnings.warn(SpecframeWarning(
            f"backend 'llamacpp' runs llama.cpp on 1 thread, not {asked}: on more threads its one-row steps "
            "and tree rows are not computed alike, which would make speculative output differ from plain "
            "decoding; run several requests in separate processes to use more cores"), stacklevel=3)
    return 1
