"""`kv`: the transformer KV-cache state backend, for any Hugging Face causal LM with a `DynamicCache`.

The backend is written once, in its rows form (`specframe_kv.rows.KVRows`, returned by `batch()`): several
sequences in one cache, every step's trees scored in one forward with an explicit 4D ancestor mask and
explicit position ids (no patching of model code), each accepted branch compacted with one gather per
layer. A single request is a batch of one row (`StateBackend.prefill`, `score`, `commit`). This module
holds what every row shares: which models `kv` serves, the rows a forward is padded to, the rows a forward
may take while staying exact.

On some CPUs a forward over 1 or 2 tokens costs more than over 4: with torch's own linear kernel
(`SPECFRAME_CPU_LINEAR=torch`) the BLAS switches from one streaming pass over each weight matrix to a per-row
one; with the default oneDNN-packed weights (`specframe.kit.models.PackedLinear`) its 1- and 2-row kernels
stream the weights more slowly than its 4-row one (on SmolLM2 a 1-node tree or a plain step padded to 4 rows
costs less than unpadded on an Intel Xeon and on an AMD EPYC). So every forward, a plain step (the root
alone) included, may be padded with throwaway rows up to `min_rows` (docs/explanation/metrics-and-costs.md).
Nothing attends to the padding and its logits and cache rows are dropped, so results are unchanged. On other
CPUs padding loses (an Intel Xeon with AMX, where a plain step padded to 4 rows is slower than one row), so
whether a CPU pads is measured for the model by its calibration (`specframe.kit.backend.forward_min_rows`),
handed to the backend when it is built (`specframe.kit.backend.Calibration`). Without one `kv` does not pad,
so that plain decoding runs the one-row forward transformers' `generate` runs; a calibration measured later
(the first `budget="auto"` request) reaches the backends built after it, never one already built.

A CPU target in bfloat16 computes each row of a forward exactly as a plain step would
(`specframe.runtime.attention`) only up to `exact_rows(model)` rows (measured on the CPU, and more rows with
packed linears than with torch's own: docs/explanation/metrics-and-costs.md): a larger tree is scored by
several forwards of at most that many rows each, in order, each reading the rows before it from the
cache. The limit is measured again when torch's thread count changes, as kernels depend on it.

With `want_hidden` (a drafter that reads the target's features) every score carries the final hidden state
of its root and nodes (`TargetScores.hidden`), and a row's first scores the prompt's too
(`TargetScores.prompt_hidden`, from the forward that read the prompt, at no extra cost), so a drafter with
a context of its own (EAGLE's head) starts from the whole prompt. `hidden_layers=(i, j, ...)` hands out
those hidden states instead, concatenated (an EAGLE-3 head reads a low, a middle and a high layer).

The backend serves only the model families it has been shown to serve exactly (`VERIFIED_MODEL_TYPES`):
a layer that keeps state outside its keys/values (RWKV's time mixing, xLSTM's matrix memory) is not
rolled back by cropping, and a model without typed layers cannot say it has one. A refusal says only why
`kv` cannot serve the model; the registry adds which installed backend does, if any.
"""

from __future__ import annotations

import specframe
from specframe import BackendCapabilities, StateBackend

# Layer types whose only state is the KV cache (attention) or that have no state at all (NemotronH blocks).
CACHELESS_TYPES = {"full_attention", "sliding_attention", "mlp", "moe"}
# Attention-only families (`config.model_type`) whose tree scores equal plain forwards and whose commits
# leave the state of the plain run: tests/plugins/kv/test_kv_admission.py proves each on a tiny random model.
VERIFIED_MODEL_TYPES = ("cohere", "gemma", "gpt2", "granite", "llama", "mistral", "olmo2", "phi", "phi3",
                        "qwen2", "qwen3", "smollm3", "stablelm", "starcoder2")


def _recurrent_reason(recurrent: list[str]) -> str:
    """Why cropping a KV cache cannot serve a model with `recurrent` layer types. Which backend serves it
    instead, if any, the registry adds to the refusal, having asked every backend
    (`specframe.plugging.pipeline.backend_refusal`)."""
    return f"it has recurrent layers ({recurrent}) whose state cannot be rolled back by cropping a KV cache"


def _unverified_reason(model_type: str) -> str:
    """Why `kv` refuses a family it has no evidence for."""
    return (f"its model type '{model_type}' is not one of the attention-only families the 'kv' backend is "
            f"verified to serve exactly ({', '.join(VERIFIED_MODEL_TYPES)}): its layers may keep state that "
            "cropping a KV cache does not roll back")


class KVCacheBackend(StateBackend):
    name = "kv"
    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True,
                                       fresh_state_per_copy=True)  # prefill makes a new cache

    def __init__(self, target, *, want_hidden: bool = False, calibration=None, min_rows: int | None = None,
                 hidden_layers: tuple[int, ...] | None = None):
        from specframe.kit.backend import forward_min_rows, pads_by_measurement
        from specframe.kit.models import linear_kernel

        super().__init__(target, want_hidden=want_hidden, calibration=calibration)
        self.model = target.model
        self.hidden_layers = check_hidden_layers(target, hidden_layers)
        # Rows (root + nodes) a tree forward is padded to: see the module docstring. 1 turns padding off.
        linear = linear_kernel(target.model)
        self._measured_padding = pads_by_measurement(min_rows, target.device, linear)
        self.min_rows = forward_min_rows(min_rows, target.device, self.name, linear,
                                         calibrated=self.calibration.min_rows)
        self._max_rows: dict[int, int | None] = {}  # `exact_rows(model)` by torch's thread count
        self._fixed_rows: tuple[int | None] | None = None

    @classmethod
    def unsupported_reason(cls, target) -> str | None:
        from transformers import DynamicCache

        layer_types = getattr(target.config, "layer_types", None) or []
        recurrent = sorted(set(layer_types) - CACHELESS_TYPES)
        if recurrent:
            return _recurrent_reason(recurrent)
        model_type = getattr(target.config, "model_type", "")
        if model_type not in VERIFIED_MODEL_TYPES:
            return _unverified_reason(model_type)
        window = getattr(target.config, "sliding_window", None)
        if window and (not layer_types or "sliding_attention" in layer_types):
            return (f"its attention looks back over a sliding window of {window} tokens, which the tree mask "
                    "does not apply; no backend serves sliding-window attention yet")
        cache = DynamicCache(config=target.config)
        if any(not hasattr(layer, "keys") for layer in getattr(cache, "layers", [])):
            return "its cache layers do not hold plain keys/values"
        return None

    @property
    def max_rows(self) -> int | None:
        """Rows one forward may take with the target's rows computed exactly (see the module docstring);
        None: any number. Measured once per torch thread count, since the kernels, and so the rows they
        keep exact, depend on it, and a program may change the count after building the backend."""
        import torch

        from specframe.kit.backend import exact_rows

        if self._fixed_rows is not None:
            return self._fixed_rows[0]
        threads = torch.get_num_threads()
        if threads not in self._max_rows:
            self._max_rows[threads] = exact_rows(self.model)
        return self._max_rows[threads]

    @max_rows.setter
    def max_rows(self, rows: int | None) -> None:
        """Fix the limit whatever the thread count (for experiments that compare limits)."""
        self._fixed_rows = (rows,)

    def cost_options(self) -> dict:
        return {"min_rows": "auto" if self._measured_padding else self.min_rows}

    def pads_by_measurement(self) -> bool:
        """Whether `min_rows` was left to calibration: not given, on a CPU, with linears that are not
        `stream` (`specframe.kit.backend.pads_by_measurement`)."""
        return self._measured_padding

    def batch(self):
        """Rows sharing one cache, every step's trees scored in one forward, each row's logits the same
        whatever else shares its forward (`specframe_kv.rows`, which says how). A single request is this
        with one row (`StateBackend.prefill`)."""
        from specframe_kv.rows import KVRows  # imports torch: not at registration

        return KVRows(self)


def check_hidden_layers(target, layers: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The `hidden_layers` option: which of the target's hidden states (transformers' numbering: 0 the
    embeddings, i the input of layer i, the layer count the final normed output) a backend built with
    `want_hidden` hands out, concatenated in that order (EAGLE-3 heads read three). None (the default):
    the final output alone, the `TargetScores.hidden` every drafter expects."""
    if layers is None:
        return None
    count = int(getattr(target.config, "num_hidden_layers", 0) or 0)
    layers = tuple(layers) if isinstance(layers, (list, tuple)) else (layers,)
    numbers = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= count for i in layers)
    if not layers or not numbers:
        raise specframe.ConfigurationError(
            f"backend 'kv': hidden_layers={layers!r} must name hidden states of model '{target.name}' by "
            f"number, 0 (its embeddings) to {count} (its final output), e.g. kv(hidden_layers=(2, "
            f"{count // 2}, {max(count - 3, 0)}))")
    return layers


@specframe.hookimpl
def register_state_backends(register):
    register(KVCacheBackend)
