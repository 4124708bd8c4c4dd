"""The peers of `specframe bench`: registered through `register_peers` (transformers' by the core's
default plugin, a third party's like any plugin's), chosen by `--peers`, and what the transformers peers'
runs print."""

import logging

import pytest
from transformers.utils import logging as hf_logging

import specframe
from specframe.bench.peers import ASSISTANT_WARNING, AssistedPeer, dropped_log, parse_peers, peer_runner
from specframe.bench.runner import build_runners
from specframe.plugging.registry import PluginRegistry, get_registry
from specframe.terms.errors import (ConfigurationError, DuplicateComponentError, SpecframeWarning,
                                    UnknownComponentError)
from specframe.terms.metrics import DecodeMetrics
from specframe.terms.sampling import SamplingParams
from specframe.testing.targets import tiny_target


class EchoPeer(specframe.Peer):
    """A third party's peer: repeats the prompt's last token, measured against plain decoding through kv."""

    name = "echo"
    options = {"times": 1}
    lossless = False
    baseline_backend = "kv"

    def decode(self, prompt_ids, max_new_tokens, seed):
        tokens = [prompt_ids[-1]] * min(max_new_tokens, self.spec.options["times"])
        return tokens, DecodeMetrics(prompt_tokens=len(prompt_ids), new_tokens=len(tokens), steps=len(tokens),
                                     accepted_per_step=[0] * len(tokens), prefill_s=0.5, wall_s=1.5)


class EchoPlugin:
    @staticmethod
    @specframe.hookimpl
    def register_peers(register):
        register(EchoPeer)


class ClashingPeer(EchoPeer):
    name = "hf-generate"


class ClashPlugin:
    @staticmethod
    @specframe.hookimpl
    def register_peers(register):
        register(ClashingPeer)


def test_a_third_party_peer_is_chosen_by_name_and_run_as_the_bench_runs_peers():
    registry = PluginRegistry()
    registry.register_plugin(EchoPlugin, name="echo-plugin")
    assert [p.name for p in parse_peers("all", registry)] == ["hf-generate", "hf-pld", "hf-assisted"]
    (spec,) = parse_peers("echo(times=3)", registry)
    assert (spec.label, spec.options, spec.optional) == ("echo(times=3)", {"times": 3}, False)
    runner = peer_runner(tiny_target(), spec, SamplingParams(), "baseline", registry)
    tokens, record = runner.generate([4, 5, 6], max_new_tokens=8)
    assert tokens == [6, 6, 6] and record["new_tokens"] == 3 and record["decode_tokens_per_s"] == 2.0
    assert record["alpha"] is None and record["draft_tokens"] is None  # not observable from outside
    runners = build_runners(tiny_target(), [], [spec], SamplingParams(), registry)
    assert (runners[-1].label, runners[-1].baseline) == ("echo(times=3)", "baseline")
    entry = next(p for p in registry.describe()["plugins"] if p["name"] == "echo-plugin")
    assert entry["peers"] == ["echo"]  # what `specframe plugins` prints
    assert "echo" in registry.describe()["peers"]


def test_an_unknown_peer_lists_the_known_ones_and_wrong_options_name_the_right_ones():
    with pytest.raises(UnknownComponentError, match="unknown peer 'nope'.*hf-assisted, hf-generate, hf-pld"):
        parse_peers("nope")
    with pytest.raises(ConfigurationError, match=r"'hf-pld' takes options \['num_tokens'\], got \['n'\]"):
        parse_peers("hf-pld(n=3)")
    assert parse_peers("none") == [] and parse_peers(" ") == []


def test_a_peer_name_taken_twice_is_refused_naming_both_classes():
    registry = PluginRegistry()
    registry.load()
    with pytest.raises(DuplicateComponentError, match="PeerRunner.*ClashingPeer"):
        registry.register_plugin(ClashPlugin, name="clash")
    assert get_registry().peers.get("hf-generate").__name__ == "PeerRunner"


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_hf_assisted_prints_no_transformers_deprecation_warning():
    """transformers' assisted generation passes its assistant a generation config and arguments both, and
    warns (once per process) that this is deprecated: the peer drops exactly that message."""
    logger, start = ASSISTANT_WARNING
    collect = Collect()
    logging.getLogger(logger).addHandler(collect)
    hf_logging.warning_once.cache_clear()  # a test that ran before may have spent transformers' once
    try:
        spec = parse_peers("hf-assisted(layers=1)")[0]
        runner = AssistedPeer(tiny_target(layers=3), spec, SamplingParams())
        tokens, _ = runner.generate(list(range(5, 25)), max_new_tokens=8)
    finally:
        logging.getLogger(logger).removeHandler(collect)
    assert len(tokens) == 8
    assert not [m for m in collect.messages if m.startswith(start)]
    assert logging.getLogger(logger).filters == []  # dropped only during the call


def test_dropped_log_drops_only_that_message_only_inside():
    collect = Collect()
    logger = logging.getLogger("specframe.test.dropped")
    logger.addHandler(collect)
    logger.propagate = False
    try:
        with dropped_log("specframe.test.dropped", "noise"):
            logger.warning("noise about generation")
            logger.warning("a real problem")
        logger.warning("noise after the block")
    finally:
        logger.removeHandler(collect)
    assert collect.messages == ["a real problem", "noise after the block"]


def test_assisted_peers_are_skipped_from_all_and_refused_by_name_on_a_stateful_model():
    """transformers refuses assisted generation (and so prompt lookup) on models with a recurrent state,
    mid-run: `--peers all` (the default) leaves those peers out with a warning, and naming one is refused
    before any work, pointing at `hf-generate`."""
    target = tiny_target()
    target.model._is_stateful = True  # as Mamba and hybrid models declare it
    registry = get_registry()
    with pytest.warns(SpecframeWarning, match="recurrent state") as caught:
        runners = build_runners(target, [], parse_peers("all"), SamplingParams(), registry)
    assert [r.label for r in runners[1:]] == ["hf-generate"]
    assert sorted(str(w.message).split("'")[1] for w in caught) == ["hf-assisted", "hf-pld"]
    with pytest.raises(ConfigurationError, match="hf-assisted.*--peers hf-generate"):
        build_runners(target, [], parse_peers("hf-assisted"), SamplingParams(), registry)
    target.model._is_stateful = False
    runners = build_runners(target, [], parse_peers("all"), SamplingParams(), registry)
    assert [r.label for r in runners[1:]] == ["hf-generate", "hf-pld", "hf-assisted"]
