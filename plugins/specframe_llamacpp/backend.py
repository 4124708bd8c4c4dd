"""`llamacpp`: the state backend that scores trees with llama.cpp, on the GGUF file the target was loaded
from (see the package docstring for the contract and its limits). Written once, as rows
(`specframe_llamacpp.rows.LlamaRows`): a single request is a batch of one row."""

from __future__ import annotations

from specframe import BackendCapabilities, ConfigurationError, SpecframeError, StateBackend
from specframe_llamacpp import engine

DEFAULT_CONTEXT = 4096  # positions one request may use (fewer where the model was trained on fewer)
DEFAULT_LEAVES = 64  # root-to-leaf paths one row's tree may have
DEFAULT_UBATCH = 32  # rows of a step per llama.cpp call: see `specframe_llamacpp.engine`


class LlamaCppBackend(StateBackend):
    """Scores every active row's tree in one `llama_decode`, with the GGUF's own weights and kernels.

    Options: `context` (positions one request may use: a batch's cache starts this large), `max_leaves`
    (root-to-leaf paths one row's tree may have, so that a step's trees share the context's sequence ids
    among rows; a larger tree is refused before any work), `ubatch` (rows of a step per `llama_decode`; a
    step of more rows takes several, in order), `min_rows` (pad every step to this many rows, as `kv`
    does; by default what the calibration handed to it measured, else no padding)."""

    name = "llamacpp"
    # Copies of the backend would share its llama.cpp contexts, so the default `RowByRow` would be wrong:
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
        self.trained_context = engine.model_facts(engine.load_model(self.path)).trained_context
        self.context = check_context(context, self.trained_context)
        most_leaves = engine.llama().llama_max_parallel_sequences() - 1  # one sequence id is the spare
        self.max_leaves = check_count("max_leaves", max_leaves, most_leaves)
        self.ubatch = check_count("ubatch", ubatch, engine.PREFILL_ROWS)
        cpu = torch.device("cpu")  # llama.cpp runs on the CPU whatever the target's device
        self._measured_padding = pads_by_measurement(min_rows, cpu, "llama.cpp")
        self.min_rows = forward_min_rows(min_rows, cpu, self.name, "llama.cpp",
                                         calibrated=self.calibration.min_rows)
        # made as the batches need them; a batch's first holds one row's tree and the spare id
        self.contexts = engine.ContextPool(self.path, self.context, first=self.max_leaves + 1)

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
        (`specframe_llamacpp.rows.LlamaRows`). A single request is this with one row
        (`StateBackend.prefill`)."""
        from specframe_llamacpp.rows import LlamaRows

        return LlamaRows(self)

    def cost_options(self) -> dict:
        return {"min_rows": "auto" if self._measured_padding else self.min_rows, "ubatch": self.ubatch}

    def pads_by_measurement(self) -> bool:
        """Whether `min_rows` was left to calibration: not given
        (`specframe.kit.backend.pads_by_measurement`)."""
        return self._measured_padding

    def check_room(self, positions: int, what: str) -> None:
        """Refuse, before any work, `what` (a prompt, a row's step) that needs more than `context`
        positions."""
        if positions > self.context:
            raise ConfigurationError(
                f"backend 'llamacpp': {what} needs {positions} positions and the llama.cpp context holds "
                f"{self.context}: pass --backend 'llamacpp(context=N)' with a larger N (the model was "
                f"trained on {self.trained_context}), or a shorter request")


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
