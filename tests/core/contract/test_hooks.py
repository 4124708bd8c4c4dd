"""Observer hooks see every step and the finished request; the drafter's `finish` sees each request end."""

import pytest
from conftest import tiny_llama

import specframe
from specframe.plugging.registry import PluginRegistry


class Recorder:
    def __init__(self):
        self.events, self.starts, self.ends, self.results = [], [], [], []

    @specframe.hookimpl
    def on_decode_start(self, prompt_ids):
        self.starts.append(list(prompt_ids))

    @specframe.hookimpl
    def on_step(self, event):
        self.events.append(event)

    @specframe.hookimpl
    def on_decode_end(self, prompt_ids, result):
        self.ends.append(list(prompt_ids))
        self.results.append(result)


def test_observers_see_every_step():
    registry = PluginRegistry()
    recorder = Recorder()
    registry.register_plugin(recorder, name="recorder")
    decoder = specframe.SpeculativeDecoder.from_names(tiny_llama(), "pld", registry=registry)
    result = decoder.generate([4, 5, 6, 4, 5, 6, 4, 5], max_new_tokens=20)
    assert recorder.starts == recorder.ends == [[4, 5, 6, 4, 5, 6, 4, 5]]
    assert recorder.results == [result]
    assert len(recorder.events) == result.metrics.steps
    assert [t for e in recorder.events for t in e.emitted] == result.tokens
    phases = {"draft", "tree", "forward", "verify", "commit", "other"}
    assert all(set(e.times) >= phases for e in recorder.events)


class Remembering(specframe.Drafter):
    """Proposes nothing; counts what `finish` is told."""

    name = "remembering"
    fail_at: int | None = None  # the step whose drafting raises

    def __init__(self, target):
        super().__init__(target)
        self.finished, self.steps = [], 0

    def propose(self, context):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("drafting failed")
        return specframe.DraftProposal.empty()

    def finish(self, prompt, response):
        self.finished.append((list(prompt), list(response)))


def test_the_drafter_finishes_each_request_with_its_exact_tokens_whatever_ended_it():
    target = tiny_llama()
    prompt = [4, 5, 6, 4, 5, 6, 4, 5]
    decoder = specframe.SpeculativeDecoder.from_names(target, Remembering, registry=PluginRegistry())
    full = decoder.generate(prompt, max_new_tokens=12)  # ends at the length limit
    target.model.generation_config.eos_token_id = full.tokens[4]
    early = decoder.generate(prompt, max_new_tokens=12)  # ends at EOS
    assert early.finish_reason == "eos" and len(early.tokens) < len(full.tokens)
    assert decoder.pipeline.drafter.finished == [(prompt, full.tokens), (prompt, early.tokens)]
    failing = specframe.SpeculativeDecoder.from_names(target, type("Failing", (Remembering,), {"fail_at": 2}),
                                                      registry=PluginRegistry())
    with pytest.raises(specframe.DrafterError, match="RuntimeError: drafting failed") as raised:
        failing.generate(prompt, max_new_tokens=12)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert failing.pipeline.drafter.finished == []  # a request that raises ends without `finish`
