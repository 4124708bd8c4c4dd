"""Where models come from (a directory, a .gguf file, an alias, a Hugging Face id) and where they run
(`--device`, `--dtype`). Everything stays offline: a tiny model is written into a temporary Hugging Face
cache laid out as `huggingface_hub` lays it out, and loaded by its id."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specframe
from specframe.runtime import load
from specframe.runtime.devices import resolve_device, resolve_dtype
from specframe.terms.errors import ConfigurationError, ModelLoadError
from specframe.testing import tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

REPO_ID = "tiny-org/tiny-smollm2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A Hugging Face hub cache holding REPO_ID: a random 2-layer Llama over SmolLM2's vocabulary, with
    SmolLM2's tokenizer, in `models--ORG--NAME/snapshots/COMMIT` with `refs/main` naming the commit."""
    from transformers import AutoTokenizer

    cache = tmp_path_factory.mktemp("hf-hub")
    repo = cache / f"models--{REPO_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    tiny_target(seed=5, vocab_size=49152, hidden_size=32).model.save_pretrained(snapshot)
    AutoTokenizer.from_pretrained(load.resolve_model_dir("smollm2-135m")).save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


@pytest.fixture
def offline_hub(hub_cache, monkeypatch) -> Path:
    """Point huggingface_hub at `hub_cache` in offline mode, as HF_HUB_CACHE / HF_HUB_OFFLINE would."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def test_a_hub_id_loads_from_the_users_cache(offline_hub):
    target = specframe.load_target(REPO_ID, device="cpu")
    assert target.name == REPO_ID and target.config.num_hidden_layers == 2
    assert target.tokenizer("def f():")["input_ids"]  # SmolLM2's tokenizer came with it
    result = specframe.SpeculativeDecoder.from_names(target, "pld").generate([1, 2, 3, 1, 2], 4)
    assert len(result.tokens) == 4


def test_a_hub_id_missing_offline_says_how_to_fetch_it(offline_hub):
    with pytest.raises(ModelLoadError, match=r"not in the Hugging Face cache.*hf download tiny-org/absent"):
        specframe.load_target("tiny-org/absent")


def test_a_name_that_is_nothing_loadable_lists_the_forms():
    with pytest.raises(ModelLoadError, match=r"local Hugging Face model directory, a \.gguf file, a known "
                                             r"alias \(smollm2-135m, smollm2-135m-hybrid, "
                                             r"smollm2-135m-hybrid-1in2\) or a Hugging Face model id"):
        specframe.load_target("no such model")
    with pytest.raises(ModelLoadError, match="GGUF file .*missing.gguf does not exist"):
        specframe.load_target("/tmp/missing.gguf")


def test_loading_never_changes_the_users_hub_settings(monkeypatch, offline_hub):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    specframe.load_target(REPO_ID, device="cpu")
    assert "HF_HUB_OFFLINE" not in os.environ


def test_the_cli_resolves_a_hub_id_through_the_environment(hub_cache, tmp_path):
    """The user's own HF_HUB_CACHE and HF_HUB_OFFLINE, read by huggingface_hub in a fresh process."""
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "specframe.cli", "generate", "def f():", "--model", REPO_ID,
                          "--max-new-tokens", "3", "--device", "cpu", "--dtype", "float32", "--budget", "4",
                          "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert '"new_tokens": 3' in run.stdout


def test_a_gguf_file_is_converted_once_and_again_when_it_changes(tmp_path, monkeypatch):
    """Any .gguf path goes through the alias's conversion (lock, temporary directory, marker); the cache
    name carries the file's size and mtime, so a replaced file is converted again."""
    monkeypatch.setenv("SPECFRAME_HOME", str(tmp_path / "home"))
    converted = []

    def dequantize(source, tmp, out):
        converted.append(source)
        tiny_target(seed=1, vocab_size=64, hidden_size=16).model.save_pretrained(tmp)

    monkeypatch.setattr(load, "_dequantize", dequantize)
    gguf = tmp_path / "My-Model.Q4.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    first = load.resolve_model_dir(str(gguf))
    assert first.name.startswith("My-Model.Q4-") and converted == [str(gguf.resolve())]
    assert load.resolve_model_dir(str(gguf)) == first and len(converted) == 1  # cached
    gguf.write_bytes(b"GGUF stand-in, replaced")
    os.utime(gguf, ns=(1, 1))
    assert load.resolve_model_dir(str(gguf)) != first and len(converted) == 2


def test_devices_resolve_or_say_what_this_machine_has():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(ConfigurationError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="no CUDA GPU.*use --device cpu"):
            resolve_device("cuda:1")


def test_dtypes_auto_is_float32_on_cpu_and_the_checkpoints_elsewhere():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", cpu, torch.bfloat16) == torch.float32
    assert resolve_dtype("auto", cuda, torch.bfloat16) == torch.bfloat16
    assert resolve_dtype("auto", cuda, None) == torch.float32
    assert resolve_dtype("bf16", cpu) == resolve_dtype("bfloat16", cpu) == torch.bfloat16
    with pytest.raises(ConfigurationError, match="unknown dtype 'int8'"):
        resolve_dtype("int8", cpu)


# The toy model's output layer (32 inputs, 49152 outputs) keeps rows exact in bfloat16 only for small
# products on our CPUs, and the kv backend says so (specframe.runtime.attention.exact_rows).
@pytest.mark.filterwarnings("ignore:this model's bfloat16 linear layers")
def test_a_model_loads_in_the_dtype_asked_for(offline_hub):
    target = specframe.load_target(REPO_ID, device="cpu", dtype="bfloat16")
    assert next(target.model.parameters()).dtype == torch.bfloat16
    result = specframe.SpeculativeDecoder.from_names(target, "pld").generate([1, 2, 3, 1, 2], 3)
    assert len(result.tokens) == 3


def test_a_bad_device_is_refused_before_the_model_loads(tmp_path):
    env = {**os.environ, "SPECFRAME_HOME": str(tmp_path / "empty-home"), "OMP_NUM_THREADS": "1"}
    device = "cuda:7" if not torch.cuda.is_available() else "tpu"
    run = subprocess.run([sys.executable, "-m", "specframe.cli", "generate", "hi", "--device", device],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0 and "device" in run.stderr
    assert not (tmp_path / "empty-home" / "models").exists()  # nothing was converted first
