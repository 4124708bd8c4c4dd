"""llama.cpp is handed no GGUF whose header would make it abort (a block count of 0 did: SIGABRT, exit
134). Every small edit of a tiny GGUF's header (`gguf_edits`) goes through `gguf_file`, the one function
the `llamacpp` backend and the bench's llama.cpp peers take their file from, then, if it passes, to
llama.cpp: a model, a context and two decoded tokens, through the backend's engine and through
llama-cpp-python's `Llama` as the peers load it. That runs in a separate process, where an abort shows
as a signal naming the edit instead of killing the test session. Skipped without llama-cpp-python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_edits import header_edits, put
from llamacpp_tests import gguf_target, require_llama_cpp  # noqa: F401 (the target fixture)

from specframe.bench.peers import parse_peers, peer_runner
from specframe.runtime.gguf_header import read_header
from specframe.terms.errors import SpecframeError
from specframe.terms.sampling import SamplingParams
from specframe_llamacpp import LlamaCppBackend, engine

require_llama_cpp()

# Loads each file named on stdin (JSON lines: label, path) as the backend and the peers would, printing
# "outcome" and a JSON list per file: ["start", label], then [outcome, label], the outcome "ran" or
# "refused: " and the exception (gguf_file's, or llama.cpp's own refusal). A crash leaves the last
# "start" without its outcome.
LOADER = r"""
import json, sys
import numpy as np
from specframe.runtime.load import gguf_file
from specframe.terms.errors import SpecframeError
from specframe_llamacpp.peers import without_extra_buffers
from specframe_llamacpp import engine
from llama_cpp import Llama

engine.quiet()
for line in sys.stdin:
    label, path = json.loads(line)
    print("outcome", json.dumps(["start", label]), flush=True)
    try:
        checked = gguf_file(path)
        runner = engine.LlamaEngine(checked, context=64, paths=2, threads=1)
        runner.decode(np.array([1, 2], np.int32), np.array([0, 1], np.int32), outputs=2)
        with without_extra_buffers():
            llm = Llama(str(checked), n_ctx=64, n_threads=1, verbose=False)
        llm.eval([1, 2])
        outcome = "ran"
    except (SpecframeError, RuntimeError, ValueError) as err:
        outcome = "refused: " + type(err).__name__
    print("outcome", json.dumps([outcome, label]), flush=True)
"""


# The edits that made llama.cpp abort (SIGABRT) when nothing checked the header before it
ABORTED = ("llama.block_count = 0", "llama.block_count = 4294967295", "token 1 = token 0",
           "llama.attention.layer_norm_rms_epsilon = -1.0", "llama.attention.layer_norm_rms_epsilon = nan")


def test_no_edit_of_the_header_makes_llama_cpp_abort(target, tmp_path):
    original = Path(target.name)
    jobs = [("unedited", str(original))]
    for i, (label, raw) in enumerate(header_edits(original.read_bytes(), original)):
        path = tmp_path / f"edit-{i}.gguf"
        path.write_bytes(raw)
        jobs.append((label, str(path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", LOADER], input="".join(json.dumps(j) + "\n" for j in jobs),
                          capture_output=True, text=True, timeout=600, env=env)
    lines = [json.loads(line[8:]) for line in proc.stdout.splitlines() if line.startswith("outcome [")]
    outcomes = {label: outcome for outcome, label in lines if outcome != "start"}
    last = lines[-1][1] if lines else None
    assert proc.returncode == 0, f"exit {proc.returncode} on the edit {last!r}: {proc.stderr[-2000:]}"
    assert outcomes["unedited"] == "ran" and len(outcomes) == len(jobs)
    for label in ABORTED:
        assert outcomes[label] == "refused: ModelLoadError", label


def block_count_zero(target, tmp_path) -> Path:
    original = Path(target.name)
    field = read_header(original).fields["llama.block_count"]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(put(original.read_bytes(), field.offset + 4, "<I", 0))
    return bad


def test_the_backend_and_the_peers_refuse_an_edited_file_before_llama_cpp(target, tmp_path, monkeypatch):
    from dataclasses import replace

    import llama_cpp

    bad = replace(target, name=str(block_count_zero(target, tmp_path)))
    monkeypatch.setattr(engine, "load_model", lambda path: pytest.fail(f"{path} was handed to llama.cpp"))
    monkeypatch.setattr(llama_cpp, "Llama", lambda *a, **k: pytest.fail("a peer handed it to llama.cpp"))
    assert "llama.block_count is 0" in LlamaCppBackend.unsupported_reason(bad)
    with pytest.raises(SpecframeError, match="llama.block_count is 0"):
        LlamaCppBackend(bad)
    with pytest.raises(SpecframeError, match="llama.block_count is 0"):
        peer_runner(bad, parse_peers("llamacpp-generate")[0], SamplingParams(), baseline="baseline")
