"""Test helpers for plugin authors: tiny targets, references, conformance checks and suites, and the
exact-law harness (`check_verifier_law`, `check_tree_builder_law`, `check_decoder_law`).

Installing specframe registers a pytest plugin (`specframe.testing.plugin`) with the fixtures
`tiny_target`, `tiny_prompt`, `specframe_registry` and `make_decoder`. To check a component of your
own, subclass the matching suite in a test module::

    from specframe.testing import DrafterConformance

    class TestMyDrafter(DrafterConformance):
        component = MyDrafter

Importing this package imports pytest only through `specframe.testing.suites`.
"""

from specframe.testing.checks import (
    check_backend_scores, check_batch_rows, check_class, check_fresh_state_per_copy, check_lossless,
    check_proposal, check_tree, check_tree_builder, check_verifier_greedy, make_decoder,
)
from specframe.testing.exact import LawTest, LogitTable, TableBackend, exact_law, law_test
from specframe.testing.law import check_decoder_law, check_tree_builder_law, check_verifier_law
from specframe.testing.synthetic import (
    FirstNodesTreeBuilder, MarkovProblem, NoisyTargetDrafter, random_proposal, random_tree,
)
from specframe.testing.targets import (
    reference_greedy, reference_hidden, reference_logits, repetitive_prompt, tiny_target,
)


def __getattr__(name: str):
    """The suites need pytest: import them only when asked for."""
    if name in {"DrafterConformance", "TreeBuilderConformance", "VerifierConformance", "BackendConformance"}:
        from specframe.testing import suites

        return getattr(suites, name)
    raise AttributeError(f"module 'specframe.testing' has no attribute {name!r}")


__all__ = [
    "BackendConformance", "DrafterConformance", "FirstNodesTreeBuilder", "LawTest", "LogitTable",
    "MarkovProblem", "NoisyTargetDrafter", "TableBackend", "TreeBuilderConformance", "VerifierConformance",
    "check_backend_scores", "check_batch_rows", "check_class", "check_decoder_law",
    "check_fresh_state_per_copy", "check_lossless",
    "check_proposal", "check_tree", "check_tree_builder", "check_tree_builder_law", "check_verifier_greedy",
    "check_verifier_law", "exact_law", "law_test", "make_decoder", "random_proposal", "random_tree",
    "reference_greedy", "reference_hidden", "reference_logits", "repetitive_prompt", "tiny_target",
]
