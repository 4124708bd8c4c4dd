"""Conformance suites: subclass one in your plugin's tests and pytest runs every check against your class.

    from specframe.testing import DrafterConformance
    from my_plugin import MyDrafter

    class TestMyDrafter(DrafterConformance):
        component = MyDrafter            # or a registered name, e.g. "my-drafter"
        options = {"width": 2}           # constructor options, if any

Override the `target` fixture to run on another model (an SSM backend would return a tiny hybrid).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from specframe.contract.interfaces import Drafter, StateBackend, TreeBuilder, Verifier
from specframe.terms.kinds import DEFAULT_COMPONENTS, ComponentKind
from specframe.terms.proposal import DrawMethod
from specframe.testing import checks
from specframe.testing.law import check_verifier_law
from specframe.testing.targets import repetitive_prompt, tiny_target


class _Conformance:
    kind: ClassVar[ComponentKind]
    base: ClassVar[type]
    component: ClassVar[str | type]
    options: ClassVar[dict] = {}
    budget: ClassVar[int] = 8
    max_new_tokens: ClassVar[int] = 40

    @pytest.fixture
    def target(self):
        """The model every check runs on; override for components that need another kind of model."""
        return tiny_target(seed=0)

    @pytest.fixture
    def prompts(self, target):
        return [repetitive_prompt(target.vocab_size, 40, seed=s) for s in (0, 1)]

    @pytest.fixture
    def rng(self):
        return np.random.default_rng(1234)

    @property
    def cls(self) -> type:
        cls, _ = checks.resolve(self.kind, self.component)
        return cls

    @property
    def all_options(self) -> dict:
        _, opts = checks.resolve(self.kind, self.component)
        return {**opts, **self.options}

    def decoder(self, target, **components):
        """A greedy decoder with the component under test in its slot and `components` in the others."""
        slot = {ComponentKind.DRAFTER: "drafter", ComponentKind.TREE_BUILDER: "tree",
                ComponentKind.VERIFIER: "verifier", ComponentKind.BACKEND: "backend"}
        slots = {**{slot[kind]: name for kind, name in DEFAULT_COMPONENTS.items()}, **components}
        slots[slot[self.kind]] = self.cls
        return checks.make_decoder(target, slots["drafter"], slots["tree"], slots["verifier"],
                                   slots["backend"], budget=self.budget,
                                   options={self.kind: self.all_options})

    def test_class_is_registrable(self):
        checks.check_class(self.cls, self.base)


class DrafterConformance(_Conformance):
    """Checks for a `Drafter`: well-formed proposals during real decoding, lossless with chains and trees,
    and at least one non-empty proposal on the fixture's repetitive prompts.

    A drafter that proposes nothing is lossless by construction, so the losslessness checks alone would
    pass it. Set `proposes = False` for a drafter that legitimately proposes nothing in this setting (the
    plain drafter `none`, or one that needs trained weights or a datastore the fixtures do not give it).
    """

    kind, base = ComponentKind.DRAFTER, Drafter
    proposes: ClassVar[bool] = True

    def _checked(self, decoder, target):
        """Wrap `propose` so every proposal made while decoding is checked."""
        drafter = decoder.pipeline.drafter
        propose = drafter.propose
        seen = []

        def checked_propose(context):
            proposal = propose(context)
            caps = self.cls.capabilities
            checks.check_proposal(proposal, target.vocab_size, self.cls.name,
                                  provides_draft_probs=caps.provides_draft_probs, score_kind=caps.score_kind)
            seen.append(len(proposal))
            return proposal

        drafter.propose = checked_propose
        return seen

    def test_proposals_are_well_formed_and_lossless_with_chain(self, target, prompts):
        decoder = self.decoder(target, tree="chain")
        seen = self._checked(decoder, target)
        checks.check_lossless(decoder, prompts, self.max_new_tokens, f"drafter '{self.cls.name}' + chain")
        assert seen, f"drafter '{self.cls.name}' was never asked for a proposal"

    def test_lossless_with_branching_tree(self, target, prompts):
        decoder = self.decoder(target, tree="first-n")
        self._checked(decoder, target)
        checks.check_lossless(decoder, prompts, self.max_new_tokens, f"drafter '{self.cls.name}' + first-n")

    def test_rows_of_a_batch_draft_as_requests_alone(self, target, prompts):
        prompts = [*prompts, list(prompts[0][:25]), list(prompts[1][5:])]  # four rows, four lengths
        checks.check_batch_rows(lambda: self.decoder(target, tree="first-n"), prompts, self.max_new_tokens,
                                f"drafter '{self.cls.name}' + first-n")

    def test_proposes_drafts(self, target, prompts):
        if not self.proposes:
            pytest.skip(f"drafter '{self.cls.name}' is declared to propose nothing here (proposes = False)")
        decoder = self.decoder(target, tree="chain")
        seen = self._checked(decoder, target)
        decoder.generate(list(prompts[0]), max_new_tokens=self.max_new_tokens)
        assert any(seen), (
            f"drafter '{self.cls.name}' proposed nothing in {len(seen)} steps on a prompt in which a phrase "
            "recurs: it can never speed decoding up. Fix `propose`, or set `proposes = False` in the suite "
            "if proposing nothing on a tiny random model is intended")


class TreeBuilderConformance(_Conformance):
    """Checks for a `TreeBuilder`: trees within budget, closed under parents, that follow the proposal;
    any budget from 1 up without raising; lossless decoding."""

    kind, base = ComponentKind.TREE_BUILDER, TreeBuilder
    may_return_empty: ClassVar[bool] = False  # True for builders that prune by a threshold
    draws: ClassVar[tuple[DrawMethod, ...]] = (DrawMethod.SAMPLED, DrawMethod.TOPK)

    def test_trees_follow_the_proposal(self, rng):
        checks.check_tree_builder(self.cls(**self.all_options), rng, draws=self.draws,
                                  may_return_empty=self.may_return_empty)

    def test_lossless(self, target, prompts):
        if self.cls.capabilities.needs_draft_probs:
            decoder = self.decoder(target, drafter="noisy-target")
        else:
            decoder = self.decoder(target, drafter="pld(matches=4)")
        checks.check_lossless(decoder, prompts, self.max_new_tokens, f"tree builder '{self.cls.name}'")


class VerifierConformance(_Conformance):
    """Checks for a `Verifier`: valid paths, greedy losslessness, and the sampled law when lossless.

    Lossless means every token a verifier emits is one the target would produce there; it may accept
    fewer draft tokens than the target agrees with (that costs speed, not correctness). Set
    `maximal = True` to also check that at temperature 0 it accepts the longest path the target agrees
    with. The law check runs every scenario of `specframe.testing.law` with `law_runs` seeded decodes
    each (20,000 by default: enough to catch a 1 % bias; see `docs/explanation/lossless-sampling.md`).
    """

    kind, base = ComponentKind.VERIFIER, Verifier
    law_runs: ClassVar[int] = 20_000
    maximal: ClassVar[bool] = False

    def test_greedy_paths(self, rng):
        verifier = self.cls(**self.all_options)
        checks.check_verifier_greedy(verifier, rng, need_probs=self.cls.capabilities.needs_draft_probs)

    def test_greedy_paths_are_longest(self, rng):
        if not self.maximal:
            pytest.skip(f"verifier '{self.cls.name}' is not declared maximal (maximal = True)")
        verifier = self.cls(**self.all_options)
        checks.check_verifier_greedy(verifier, rng, need_probs=self.cls.capabilities.needs_draft_probs,
                                     maximal=True)

    def test_sampling_follows_the_target_distribution(self):
        caps = self.cls.capabilities
        if not (caps.supports_sampling and caps.lossless):
            pytest.skip(f"verifier '{self.cls.name}' does not declare lossless sampling")
        check_verifier_law(self.cls(**self.all_options), runs=self.law_runs)

    def test_lossless_greedy_decoding(self, target, prompts):
        if not self.cls.capabilities.lossless:
            pytest.skip(f"verifier '{self.cls.name}' is not declared lossless")
        decoder = self.decoder(target, drafter="noisy-target", tree="first-n")
        checks.check_lossless(decoder, prompts, self.max_new_tokens, f"verifier '{self.cls.name}'")


class BackendConformance(_Conformance):
    """Checks for a `StateBackend`: tree logits equal plain forward logits, scores carry their tree, only
    the latest scores commit, commits match plain decoding, lossless decoding, copies independent when
    the backend declares `fresh_state_per_copy`, and the rows of a batch decode as alone."""

    kind, base = ComponentKind.BACKEND, StateBackend

    def test_scores_match_plain_forward(self, target, prompts, rng):
        checks.check_backend_scores(self.cls, target, prompts[0], rng)

    def test_lossless(self, target, prompts):
        tree = "first-n" if self.cls.capabilities.supports_trees else "chain"
        decoder = self.decoder(target, drafter="pld(matches=3)", tree=tree)
        checks.check_lossless(decoder, prompts, self.max_new_tokens, f"backend '{self.cls.name}' + {tree}")

    def test_prefilled_copies_are_independent_sequences(self, target, prompts, rng):
        """`BackendCapabilities.fresh_state_per_copy`, where declared: copies of one backend prefilled with
        different prompts and stepped in turns each decode their own sequence (`RowByRow` relies on it)."""
        if not self.cls.capabilities.fresh_state_per_copy:
            pytest.skip(f"backend '{self.cls.name}' does not declare fresh_state_per_copy")
        checks.check_fresh_state_per_copy(self.cls, target, prompts, rng, options=self.all_options)

    def test_rows_of_a_batch_decode_as_plain_greedy_alone(self, target, prompts):
        """`StateBackend.batch` (the backend's own, or the row-by-row default): each row of a batch of
        prompts of different lengths, rows leaving and joining, equals plain greedy decoding alone."""
        if self.cls.batch is StateBackend.batch and not self.cls.capabilities.fresh_state_per_copy:
            pytest.skip(f"backend '{self.cls.name}' refuses batches: no batch() of its own, and the default "
                        "needs fresh_state_per_copy")
        tree = "first-n" if self.cls.capabilities.supports_trees else "chain"
        prompts = [*prompts, list(prompts[0][:25]), list(prompts[1][5:])]
        for size in (len(prompts), 2):
            decoder = self.decoder(target, drafter="pld(matches=3)", tree=tree)
            rows = decoder.generate_batch([list(p) for p in prompts], self.max_new_tokens, batch_size=size)
            for i, (prompt, row) in enumerate(zip(prompts, rows)):
                expected = checks.reference_greedy(target, prompt, self.max_new_tokens)
                assert row.tokens == expected, (
                    f"backend '{self.cls.name}' batch ({type(decoder.pipeline.backend.batch()).__name__}, "
                    f"{size} rows at a time): row {i} differs from plain greedy decoding of its prompt alone")

