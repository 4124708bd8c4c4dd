"""Timing of the decode loop: `phase_timing` changes when the device is waited for, never the tokens.

On the CPU there is nothing to wait for, so the device synchronisation is replaced by a counter here;
tests/core/runtime/test_gpu.py runs the same decodes on CUDA.
"""

from __future__ import annotations

import pytest
from conftest import tiny_llama

import specframe.decode.loop
import specframe.decode.session
from specframe import SpeculativeDecoder
from specframe.testing.targets import reference_greedy, repetitive_prompt

PHASES_SYNCED = 5  # draft, tree, forward, verify, commit ("other" is what is left of the step)


@pytest.fixture(scope="module")
def tiny(one_thread):
    return tiny_llama(seed=3)


@pytest.fixture
def prompt():
    return repetitive_prompt(96, 48, seed=2)


def test_phase_timing_off_gives_the_same_tokens_and_says_so(tiny, prompt):
    results = {}
    for on in (True, False):
        decoder = SpeculativeDecoder.from_names(tiny, "pld", budget=4, phase_timing=on)
        assert decoder.phase_timing is on
        results[on] = decoder.generate(prompt, max_new_tokens=24)
        assert results[on].metrics.phase_timing is on
        assert results[on].metrics.to_dict()["phase_timing"] is on
        assert results[on].metrics.wall_s >= results[on].metrics.prefill_s > 0
    assert results[False].tokens == results[True].tokens == reference_greedy(tiny, prompt, 24)
    assert results[False].metrics.steps == results[True].metrics.steps


@pytest.mark.parametrize("on", [True, False])
def test_the_device_is_waited_for_per_phase_only_with_phase_timing(tiny, prompt, monkeypatch, on):
    waits, resets = [], []
    monkeypatch.setattr(specframe.decode.session, "synchronizer", lambda device: lambda: waits.append(device))
    monkeypatch.setattr(specframe.decode.loop, "reset_peak_memory", resets.append)
    decoder = SpeculativeDecoder.from_names(tiny, "pld", budget=4, phase_timing=on)
    result = decoder.generate(prompt, max_new_tokens=12)
    per_request = 2  # after the prefill, and before reading the end time
    assert len(waits) == per_request + (PHASES_SYNCED * result.metrics.steps if on else 0)
    assert resets == [tiny.device]  # the peak memory is this request's


def test_from_names_defaults_to_phase_timing(tiny):
    assert SpeculativeDecoder.from_names(tiny, "pld", budget=2).phase_timing is True
