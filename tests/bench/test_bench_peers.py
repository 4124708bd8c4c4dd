"""The transformers peers of `specframe bench`: what their runs print."""

import logging

from transformers.utils import logging as hf_logging

from specframe.bench.peers import ASSISTANT_WARNING, PeerRunner, dropped_log, parse_peers
from specframe.terms.sampling import SamplingParams
from specframe.testing.targets import tiny_target


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
        runner = PeerRunner(tiny_target(layers=3), parse_peers("hf-assisted(layers=1)")[0], SamplingParams())
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
    import pytest

    from specframe.bench.runner import build_runners
    from specframe.plugging.registry import get_registry
    from specframe.terms.errors import ConfigurationError, SpecframeWarning

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
