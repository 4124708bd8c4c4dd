"""The `llamacpp-grammar` peer (`specframe_llamacpp.peers.LlamaCppGrammar`): llama.cpp's own grammar
decoding under each prompt's JSON schema in the structured-output run. On the real SmolLM2 GGUF (slow) its
outputs are valid and it sits in the run's table beside transformers' constrained `generate`; it refuses,
with what to do, outside a structured run and on a model without an end-of-generation token. Skipped
without llama-cpp-python."""

from __future__ import annotations

import pytest
from llamacpp_tests import gguf_target, require_llama_cpp  # noqa: F401 (the target fixture)

from specframe import ConfigurationError, SamplingParams
from specframe.bench.peers import parse_peers, peer_runner
from specframe.bench.structured import run_structured, structured_peers, table
from specframe.bench.structured_suite import load_structured_suite

require_llama_cpp()

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


def test_a_structured_run_takes_it_under_all_and_by_name():
    assert [p.name for p in structured_peers("all")] == ["hf-generate", "llamacpp-grammar"]
    assert all(p.optional for p in structured_peers("all"))
    assert [p.name for p in structured_peers("llamacpp-grammar(context=512)")] == ["llamacpp-grammar"]
    with pytest.raises(ConfigurationError, match="cannot decode under a schema: a structured run takes"):
        structured_peers("llamacpp-generate")


def test_a_model_without_an_end_of_generation_token_is_refused(target):
    """llama.cpp's grammar sampler leaves no token once a grammar is complete on such a model, and
    aborts the process: the tiny GGUF has no EOS."""
    with pytest.raises(ConfigurationError, match="end of generation.*leave the peer out"):
        peer_runner(target, parse_peers("llamacpp-grammar")[0], SamplingParams(), "plain")


@pytest.mark.slow
def test_on_smollm2_its_outputs_are_valid_and_reported_beside_transformers(smollm2):
    prompts = load_structured_suite(limit=1)
    runs = run_structured(smollm2, prompts, [], structured_peers("hf-generate,llamacpp-grammar"),
                          max_new_tokens=64, progress=False)
    rows = {run.name: run.row(runs[0]) for run in runs}
    assert list(rows) == ["plain", "hf-generate", "llamacpp-grammar"]
    assert rows["hf-generate"]["identical"] == 1.0 and rows["hf-generate"]["lossless"]
    assert rows["llamacpp-grammar"]["valid"] == 1.0 and not rows["llamacpp-grammar"]["lossless"]
    assert "`llamacpp-grammar` (other kernels)" in table(runs, "header")
    peer = peer_runner(smollm2, parse_peers("llamacpp-grammar")[0], SamplingParams(), "plain")
    with pytest.raises(ConfigurationError, match="--suite structured"):
        peer.generate([1, 2, 3], max_new_tokens=4)
