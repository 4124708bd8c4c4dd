"""Bench peers that run llama.cpp itself (llama-cpp-python's `Llama`) in the same process, on the GGUF file
the target was loaded from, greedy (registered through `register_peers` in this package's `__init__`):

- `llamacpp-generate`: `Llama.generate`, llama.cpp's own plain decoding;
- `llamacpp-pld(num_tokens=10)`: the same with llama-cpp-python's prompt lookup draft model
  (`LlamaPromptLookupDecoding`), its own speculative decoding;
- `llamacpp-grammar`: llama.cpp's own grammar decoding, a peer of the structured-output run
  (`specframe.bench.structured`, `specframe bench --suite structured`): each request decodes under its
  JSON schema, converted to GBNF by llama.cpp's own converter (`LlamaGrammar.from_json_schema`) and
  applied by llama.cpp's grammar sampler before its greedy one (`decode_schema`). That converter lets
  JSON carry whitespace where specframe's constraints lay it out as `json.dumps` does, so an output may
  differ from constrained plain decoding in its layout as well as through llama.cpp's logits.

All take `context` (4096 positions by default, as the `llamacpp` backend, at most the model's; the
prompt lookup peer keeps logits for every position of it, 800 MB for SmolLM2's vocabulary at 4096; a
request that does not fit is refused naming the option). The model loads without llama.cpp's
extra weight buffers, as the `llamacpp` backend loads it (see `plugins/specframe_llamacpp/engine.py`:
the AMX repacking crashes on a CPU that reports AMX without letting a process use it), with torch's
thread count (`--threads`), and llama-cpp-python's other defaults (flash attention off, for one). Their
logits are not the baseline's bit for bit, so their outputs are not compared with it; a step is one
`Llama.eval`, so their tau is measured, their alpha is not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from specframe import ConfigurationError, DecodeMetrics, Peer, PeerSpec, SamplingParams, Target
from specframe.kit.progress import now, peak_memory_bytes

GREEDY = {"top_k": 1, "top_p": 1.0, "min_p": 0.0, "temp": 0.0, "repeat_penalty": 1.0}


@contextmanager
def without_extra_buffers() -> Iterator[None]:
    """Within the block, `Llama` loads models without llama.cpp's extra (repacked) weight buffers: it
    offers no option for that, and reads its model parameters from `llama_model_default_params`."""
    from llama_cpp import llama_cpp as lib

    default = lib.llama_model_default_params

    def params():
        chosen = default()
        chosen.use_extra_bufts = False
        return chosen

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


class LlamaCppGenerate(Peer):
    """llama.cpp's own plain decoding (peer `llamacpp-generate`); `llamacpp-pld` is it with a draft model."""

    name = "llamacpp-generate"
    options = {"context": 4096}
    lossless = False  # llama.cpp's kernels are not the baseline's: outputs are not compared with it
    baseline_backend = "llamacpp"

    def __init__(self, target: Target, spec: PeerSpec, sampling: SamplingParams, baseline: str = "baseline"):
        super().__init__(target, spec, sampling, baseline)  # greedy: no draw uses the seed
        if not sampling.greedy:
            raise ConfigurationError(f"peer '{spec.name}' decodes greedily only: leave it out of --peers "
                                     "when sampling")
        try:
            from llama_cpp import Llama
        except ImportError:
            raise ConfigurationError(f"peer '{spec.name}' needs llama-cpp-python: pip install "
                                     "'specframe[llamacpp]', or leave it out of --peers") from None
        import torch

        from specframe.kit.backend import gguf_file

        path = gguf_file(target.name)
        if path is None:
            raise ConfigurationError(f"peer '{spec.name}' runs the GGUF file the model was loaded from, and "
                                     f"model '{target.name}' is none: pass --model path/to/model.gguf")
        draft = self.draft_model()
        threads = torch.get_num_threads()
        with without_extra_buffers():
            context = min(int(spec.options["context"]), target.max_context)
            # A draft model makes llama-cpp-python keep logits for every position, but it sizes that
            # buffer by `logits_all` as passed, so without it a prompt longer than one batch (512) fails
            self.llm = Llama(str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                             verbose=False, draft_model=draft, logits_all=draft is not None)
        self.evals = 0
        evaluate = self.llm.eval

        def counted(tokens):
            self.evals += 1
            return evaluate(tokens)

        self.llm.eval = counted  # one call per forward: the prompt, then one per step

    def draft_model(self):
        """llama-cpp-python's draft model for this peer (none: plain decoding)."""
        return None

    def decode(self, prompt_ids: list[int], max_new_tokens: int,
               seed: int | None) -> tuple[list[int], DecodeMetrics]:
        return self.decode_greedy(prompt_ids, max_new_tokens)

    def decode_greedy(self, prompt_ids: list[int], max_new_tokens: int,
                      grammar=None) -> tuple[list[int], DecodeMetrics]:
        """`Llama.generate`, greedy, under llama.cpp's `grammar` (a `LlamaGrammar`) where one is given."""
        room = self.llm.n_ctx()
        if len(prompt_ids) + max_new_tokens > room:  # llama-cpp-python would fail on a numpy shape
            raise ConfigurationError(
                f"peer '{self.label}': the prompt ({len(prompt_ids)} tokens) and {max_new_tokens} new tokens "
                f"exceed its llama.cpp context of {room} positions: pass --peers "
                f"'{self.spec.name}(context=N)' with a larger N (at most the model's), or fewer new tokens")
        eos = self.target.eos_token_ids
        self.llm.reset()  # no prompt reused from the previous request
        self.evals = 0
        tokens: list[int] = []
        forwards: list[int] = []  # for each token, the forward that produced it (1: the prompt's)
        start = now()
        first = None
        for token in self.llm.generate(prompt_ids, grammar=grammar, **GREEDY):
            first = first or now()  # the prompt's forward produced the first token
            tokens.append(int(token))
            forwards.append(self.evals)
            if token in eos or len(tokens) >= max_new_tokens:
                break
        wall = now() - start
        prefill = (first or wall + start) - start
        # Tokens of each forward; the prompt's counts as a step, as in the other peers and specframe's
        # decoding, where the first step reads the prompt's last token
        per_step = [forwards.count(k) for k in sorted(set(forwards))]
        return tokens, DecodeMetrics(prompt_tokens=len(prompt_ids), new_tokens=len(tokens),
                                     steps=len(per_step), accepted_per_step=[n - 1 for n in per_step],
                                     prefill_s=prefill, wall_s=wall,
                                     peak_memory_bytes=peak_memory_bytes("cpu"))


class LlamaCppPromptLookup(LlamaCppGenerate):
    """llama.cpp's plain decoding with llama-cpp-python's prompt lookup draft model (peer `llamacpp-pld`)."""

    name = "llamacpp-pld"
    options = {"num_tokens": 10, "context": 4096}

    def draft_model(self):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        return LlamaPromptLookupDecoding(num_pred_tokens=int(self.spec.options["num_tokens"]))


class LlamaCppGrammar(LlamaCppGenerate):
    """llama.cpp's own grammar decoding under a JSON schema (peer `llamacpp-grammar`), for the
    structured-output run, which calls `decode_schema` with each prompt's schema."""

    name = "llamacpp-grammar"

    def __init__(self, target: Target, spec: PeerSpec, sampling: SamplingParams, baseline: str = "baseline"):
        super().__init__(target, spec, sampling, baseline)
        from llama_cpp import llama_cpp as lib

        vocab = lib.llama_model_get_vocab(self.llm.model)
        if not any(lib.llama_vocab_is_eog(vocab, token) for token in target.eos_token_ids):
            # llama.cpp's grammar sampler then has no token left once a grammar is complete, and aborts
            raise ConfigurationError(f"peer '{spec.name}' needs a model whose end-of-sequence token "
                                     f"llama.cpp reads as the end of generation, and {target.name} has none: "
                                     "leave the peer out of --peers for this model")
        self.grammars: dict[str, object] = {}  # schema as JSON text -> its LlamaGrammar

    def decode(self, prompt_ids: list[int], max_new_tokens: int,
               seed: int | None) -> tuple[list[int], DecodeMetrics]:
        raise ConfigurationError(f"peer '{self.label}' decodes under a JSON schema only: run it on a "
                                 "structured suite (specframe bench --suite structured), or use "
                                 "llamacpp-generate")

    def decode_schema(self, prompt_ids: list[int], max_new_tokens: int,
                      schema: dict) -> tuple[list[int], DecodeMetrics]:
        """One request decoded greedily under `schema` by llama.cpp's grammar sampler."""
        return self.decode_greedy(prompt_ids, max_new_tokens, self.grammar(schema))

    def grammar(self, schema: dict):
        """llama.cpp's grammar for `schema` (converted once per schema)."""
        from llama_cpp import LlamaGrammar

        text = json.dumps(schema, sort_keys=True)
        if text not in self.grammars:
            try:
                self.grammars[text] = LlamaGrammar.from_json_schema(text, verbose=False)
            except (ValueError, KeyError, TypeError, RecursionError) as err:
                raise ConfigurationError(f"peer '{self.label}': llama.cpp's converter refused the schema "
                                         f"{text[:80]}... ({err}); leave the peer out of --peers for this "
                                         "suite") from None
        return self.grammars[text]
