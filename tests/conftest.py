"""Shared fixtures: tiny random Llama targets and the real SmolLM2 target (loaded once per session)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network (set before hub imports)

import pytest
import torch

import specframe
from specframe.support.paths import specframe_home

# What tests may share with the user's SPECFRAME_HOME: converted models and built datastores, which take
# minutes to make and are the same for everyone. Step costs, acceptance counts and suffix caches that
# tests write for their temporary models stay in a per-session home.
SHARED_HOME_DIRS = ("models", "datastores")


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory, request):
    """A fresh SPECFRAME_HOME for the session (and the notebooks it runs), linked to the user's model and
    datastore caches, so tests leave no calibrations of throwaway models behind.

    The pytest-xdist workers of one run share it, in the run's temporary directory above theirs, as the
    tests of a run without workers do: a calibration of SmolLM2 (about 20 s per backend) is then measured
    once per run, not once per worker. Its writers take a lock and replace files atomically
    (`specframe.support.atomic_dirs`), so workers may calibrate at the same time. A worker is known by its
    config (`workerinput`), not by the environment: a pytest that a test starts in a subprocess inherits
    the worker's environment, yet its temporary directory's parent is the user's, shared by every run."""
    user_home, previous = specframe_home(), os.environ.get("SPECFRAME_HOME")
    if hasattr(request.config, "workerinput"):
        home = tmp_path_factory.getbasetemp().parent / "specframe-home"
        home.mkdir(exist_ok=True)
    else:
        home = tmp_path_factory.mktemp("specframe-home")
    for name in SHARED_HOME_DIRS:
        (user_home / name).mkdir(parents=True, exist_ok=True)
        link = home / name
        try:
            link.symlink_to(user_home / name, target_is_directory=True)
        except FileExistsError:  # made by another worker
            assert link.resolve() == (user_home / name).resolve(), f"{link} is not the user's {name}"
    os.environ["SPECFRAME_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("SPECFRAME_HOME", None)
    else:
        os.environ["SPECFRAME_HOME"] = previous


def tiny_llama(seed: int = 0, vocab: int = 96, kv_heads: int = 2, layers: int = 2) -> specframe.Target:
    """A random Llama-family target; `kv_heads < 4` gives grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    # Sharpen the output so greedy decoding repeats itself and drafts get accepted sometimes.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return specframe.Target(model=model, tokenizer=None, name=f"tiny-llama-{seed}")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for modules of tiny tensors: on a busy 2-core machine more threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2() -> specframe.Target:
    return specframe.load_target("smollm2-135m")


def plain_greedy(target: specframe.Target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference: transformers' own greedy `generate`, no speculation."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=0)
    new = out[0, len(prompt):].tolist()
    eos = target.eos_token_ids
    for i, tok in enumerate(new):  # generate pads after EOS; our decoder stops there
        if tok in eos:
            return new[: i + 1]
    return new


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked `gpu` (tests/core/runtime/test_gpu.py) on a machine where torch sees no CUDA
    device, and those marked `exhaustive` unless SPECFRAME_EXHAUSTIVE=1 asks for the whole cross product."""
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA device")
    if os.environ.get("SPECFRAME_EXHAUSTIVE") != "1":
        skips["exhaustive"] = pytest.mark.skip(
            reason="one of the whole cross product; SPECFRAME_EXHAUSTIVE=1 runs it (make test-exhaustive)")
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
