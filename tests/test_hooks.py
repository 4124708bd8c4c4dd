"""Observer hooks see every step and the finished request."""

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
