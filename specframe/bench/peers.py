"""The bench's peers (decoding by other systems, timed in the same process on the same prompts): how
`--peers` picks them from the registry (`parse_peers`, `peer_runner`), and Hugging Face transformers' own
decoding, the core's default peer plugin (`register_peers` below; pyproject.toml registers this module
through the `specframe` entry-point group as `hf-peers`, as every first-party plugin is registered). Other
peers come from plugins, such as llama.cpp's in `specframe_llamacpp`.

- `hf-generate`: `model.generate`, greedy (Spec-Bench's baseline). With `split_prompt` (what
  `specframe generate --compare` runs) it reads the prompt as specframe does (`prompt_cache`).
- `hf-pld(num_tokens=10)`: transformers prompt lookup (`prompt_lookup_num_tokens`).
- `hf-assisted(layers=8, num_tokens=4)`: transformers assisted generation with a draft model. No separate
  small model sharing the tokenizer is available offline, so the assistant is the target's own first
  `layers` decoder layers with its final norm and LM head (weights shared, nothing copied).

Timing comes from a streamer: transformers calls `put` with the prompt, then once per target forward with
the tokens that forward produced, so the first call after the prompt ends the prefill and every call is
one verification step. Draft counts are not visible from outside, so a peer's alpha is None. Importing
this module loads neither torch nor transformers: a peer imports them when it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from specframe.contract.hookspecs import hookimpl
from specframe.contract.peers import Peer, PeerSpec
from specframe.terms.errors import ConfigurationError
from specframe.runtime.devices import synchronize
from specframe.terms.metrics import DecodeMetrics, now, peak_memory_bytes
from specframe.terms.target import Target
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.sampling import SamplingParams

from specframe.bench.methods import split_parts

if TYPE_CHECKING:
    import torch

DEFAULT_ASSISTANT_LAYERS = 8
# transformers' assisted generation calls its assistant's `generate` with a `generation_config` and generation
# arguments both, which transformers itself then warns is deprecated: nothing a user of bench can change.
ASSISTANT_WARNING = ("transformers.generation.utils", "Passing `generation_config` together with generation-")


def parse_peers(text: str, registry: PluginRegistry | None = None) -> list[PeerSpec]:
    """`--peers`: a comma list of peer specs, `all` (the registered peers that say `in_all`: transformers')
    or `none`. An unknown name lists the registered peers."""
    peers = (registry or get_registry()).peers
    text = text.strip()
    if text in ("", "none"):
        return []
    parts = ([name for name in peers.registered() if peers.get(name).in_all] if text == "all"
             else [p for p in split_parts(text, ",") if p])
    chosen = []
    for part in parts:
        spec = ComponentSpec.parse(part)
        defaults = peers.get(spec.name).options
        unknown = set(spec.options) - set(defaults)
        if unknown:
            raise ConfigurationError(f"peer '{spec.name}' takes options "
                                     f"{sorted(defaults) or 'none'}, got {sorted(unknown)}")
        chosen.append(PeerSpec(part.strip(), spec.name, {**defaults, **spec.options}, text == "all"))
    return chosen


def peer_class(spec: PeerSpec, registry: PluginRegistry | None = None) -> type[Peer]:
    """The registered class of peer `spec`."""
    return (registry or get_registry()).peers.get(spec.name)


def peer_runner(target: Target, spec: PeerSpec, sampling: SamplingParams, baseline: str,
                registry: PluginRegistry | None = None) -> Peer:
    """The runner of peer `spec`, measured against `baseline`."""
    return peer_class(spec, registry)(target, spec, sampling, baseline=baseline)


@hookimpl
def register_peers(register):
    register(PeerRunner)
    register(PromptLookupPeer)
    register(AssistedPeer)


class StepClock:
    """A transformers streamer that timestamps every forward's output instead of printing it."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []  # (time, tokens produced by that call)

    def put(self, value: torch.Tensor) -> None:
        self.events.append((now(), int(value.numel())))

    def end(self) -> None:
        pass


@contextmanager
def dropped_log(logger: str, start: str) -> Iterator[None]:
    """Within the block, `logger` drops the records whose message starts with `start`; nothing else."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(start)

    target = logging.getLogger(logger)
    target.addFilter(keep)
    try:
        yield
    finally:
        target.removeFilter(keep)


def without_log(function, logger: str, start: str):
    """`function` with the records of `dropped_log(logger, start)` dropped while it runs."""
    def run(*args, **kwargs):
        with dropped_log(logger, start):
            return function(*args, **kwargs)

    return run


def truncated_assistant(target: Target, layers: int | None) -> torch.nn.Module:
    """The target's first `layers` decoder layers + final norm + LM head, sharing the target's weights
    (`specframe.runtime.truncation.truncated_model`).

    `layers=None` takes `DEFAULT_ASSISTANT_LAYERS`, or all layers but one on smaller models."""
    from specframe.runtime.truncation import truncated_model

    total = int(getattr(target.config, "num_hidden_layers", 0) or 0)
    layers = min(DEFAULT_ASSISTANT_LAYERS, total - 1) if layers is None else int(layers)
    return truncated_model(target, layers, "peer 'hf-assisted' (leave it out of --peers)").eval()


class PeerRunner(Peer):
    """transformers' own `model.generate` (peer `hf-generate`); the other transformers peers are it with a
    candidate generator (`assistance`)."""

    name = "hf-generate"
    in_all = True
    lossless = True  # greedy transformers decoding, with or without assistance, is plain greedy decoding

    def __init__(self, target: Target, spec: PeerSpec, sampling: SamplingParams, baseline: str = "baseline",
                 split_prompt: bool = False):
        super().__init__(target, spec, sampling, baseline)
        self.split_prompt = split_prompt  # read the prompt as specframe does, where possible: `prompt_cache`
        self.kwargs: dict = {"do_sample": False} if sampling.greedy else {
            "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k or None}
        self.kwargs.update(self.assistance())

    def assistance(self) -> dict:
        """The arguments of `generate` that make it speculate (none: plain decoding)."""
        return {}

    def decode(self, prompt_ids: list[int], max_new_tokens: int,
               seed: int | None) -> tuple[list[int], DecodeMetrics]:
        import torch

        with torch.inference_mode():
            input_ids = torch.tensor([prompt_ids], device=self.target.device)  # (1, P)
            clock = StepClock()
            if seed is not None:
                torch.manual_seed(seed)
            eos = sorted(self.target.eos_token_ids)
            device = self.target.device
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)  # the peak of this request, not of the process
            synchronize(device)
            start = now()
            kwargs = dict(self.kwargs)
            if self.split_prompt and splits_prompt(self.target.model):
                kwargs["past_key_values"] = prompt_cache(self.target.model, input_ids)
            out = self.target.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                streamer=clock, pad_token_id=eos[0] if eos else None, **kwargs)  # (1, P + new)
            synchronize(device)  # generate syncs every step to test for a stop; this charges the last one
            wall = now() - start
        tokens = out[0, len(prompt_ids):].tolist()
        steps = clock.events[1:]  # the first call is the prompt itself
        return tokens, DecodeMetrics(prompt_tokens=len(prompt_ids), new_tokens=len(tokens), steps=len(steps),
                                     accepted_per_step=[n - 1 for _, n in steps],
                                     prefill_s=steps[0][0] - start if steps else wall, wall_s=wall,
                                     peak_memory_bytes=peak_memory_bytes(self.target.device))


class StatelessPeer(PeerRunner):
    """A transformers peer that runs assisted generation, which transformers refuses for a model that keeps a
    recurrent state (`_is_stateful`: Mamba, hybrids); prompt lookup is assisted generation with another
    candidate generator."""

    @classmethod
    def unsupported_reason(cls, target: Target) -> str | None:
        if getattr(target.model, "_is_stateful", False):
            model = type(target.model).__name__
            return (f"peer '{cls.name}' runs transformers' assisted generation, which transformers refuses "
                    f"for models that keep a recurrent state ({model}); use --peers hf-generate")
        return None


class PromptLookupPeer(StatelessPeer):
    """transformers' prompt lookup (peer `hf-pld`)."""

    name = "hf-pld"
    options = {"num_tokens": 10}

    def assistance(self) -> dict:
        return {"prompt_lookup_num_tokens": int(self.spec.options["num_tokens"])}


class AssistedPeer(StatelessPeer):
    """transformers' assisted generation with the target's first layers as the assistant (peer
    `hf-assisted`): by default the first 8 layers (fewer on smaller models), 4 draft tokens per step."""

    name = "hf-assisted"
    options = {"layers": None, "num_tokens": 4}

    def assistance(self) -> dict:
        assistant = truncated_assistant(self.target, self.spec.options["layers"])
        assistant.generation_config.num_assistant_tokens = int(self.spec.options["num_tokens"])
        assistant.generate = without_log(assistant.generate, *ASSISTANT_WARNING)  # transformers calls it
        return {"assistant_model": assistant}


def splits_prompt(model: torch.nn.Module) -> bool:
    """Whether `prompt_cache` can serve `model`: its layers are attention only, so their state is plain keys
    and values that a cache made apart from `generate` can hold."""
    from transformers import DynamicCache

    types = getattr(model.config, "layer_types", None) or ()
    if set(types) - {"full_attention", "sliding_attention"}:
        return False
    return all(hasattr(layer, "keys") for layer in getattr(DynamicCache(config=model.config), "layers", ()))


def prompt_cache(model: torch.nn.Module, input_ids: torch.Tensor):
    """transformers' cache of all but the last token of `input_ids` (1, P), read in one forward as
    specframe's backends read a prompt, so that `generate` reads the last token in a one-row step, as
    specframe's first step does (for a model that `splits_prompt`; None for a one-token prompt).

    Read with the rest of the prompt, the last token gets other bits in bfloat16: a prompt of more than
    64 tokens goes to torch's attention kernel, and a row of a larger product may round differently
    (`specframe.runtime.attention`), so greedy outputs can part from the first new token."""
    from transformers import DynamicCache

    if input_ids.shape[1] < 2:
        return None
    cache = DynamicCache(config=model.config)
    model(input_ids=input_ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache
