"""`suffix-heads`: SuffixDecoding's sources plus S4C draft heads for what no text has said before.

A copying drafter can only propose what was written before: in the prompt, an earlier response or a
corpus. Open-ended answers are mostly new text, so there it proposes little or nothing and a step emits
one token. SAM-Decoding answers this with an auxiliary model drafter next to its suffix automaton; here
the auxiliary source is the `s4c` drafter's heads (declared in `requires` and obtained through
`specframe.kit.components.required`, so this plugin imports no other), which predict the next tokens
from the target's own last feature. Their forest joins the suffix drafter's sources in the same merge:
each node's score is its probability of being reached (the product of the heads' q along its path, as
the suffix trees' counts give), labelled `HEADS`, so adaptive speculation learns how far the heads can
be trusted and keeps their nodes only where they pay.

`suffix-eagle` is the same merge with an EAGLE head (the `eagle` plugin's drafter) in place of the S4C
heads: its level-by-level forest joins the copied ones, and the head, which keeps a cache of the
request's context, hears every step's features whether or not it drafted.

The heads always draft their top-k tokens (never samples), so the merged forest is deterministic and
is verified like any copied draft (greedy, or sample-and-match when the request samples). On
SmolLM2-135M on a CPU one head costs 6-7 % of a plain step; the `s4c` plugin's `suffix-s4c` preset runs
it only on steps whose copied drafts are weak (`docs/explanation/suffix-decoding.md`).
"""

from __future__ import annotations

import numpy as np

from specframe import ComponentKind, ConfigurationError, DraftContext, DrafterCapabilities, ScoreKind
from specframe.kit.components import required
from specframe_suffix.drafter import SuffixDrafter
from specframe_suffix.drafts import HEADS, SourceDraft


class _SuffixWithHeads(SuffixDrafter):
    """`suffix` plus a network drafter's forest as one more source, skipped on steps where a copied child
    of the root is more than `heads_below` likely. Subclasses build `self.heads` and say how it drafts."""

    capabilities = DrafterCapabilities(needs_hidden_states=True, proposes_trees=True,
                                       score_kind=ScoreKind.FREQUENCY,
                                       remembers_requests=True)

    def __init__(self, target, *, heads_below: float = 1.0, **options):
        super().__init__(target, **options)
        if (isinstance(heads_below, bool) or not isinstance(heads_below, (int, float))
                or not 0 <= heads_below <= 1):
            raise ConfigurationError(
                f"drafter '{self.name}': heads_below must be a number in [0, 1], got {heads_below!r}")
        self.heads_below = float(heads_below)
        self.head_steps = 0  # steps on which the heads drafted

    @property
    def extra_parameters(self) -> int:
        """Parameters the heads add to the target."""
        return self.heads.extra_parameters

    def _drafts(self, context: DraftContext) -> list[SourceDraft]:
        drafts = super()._drafts(context)
        copied = max((p for d in drafts for p, parent in zip(d.probs, d.parents) if parent < 0), default=0.0)
        if copied > self.heads_below or context.hidden is None:  # no feature yet on a request's first step
            return drafts
        self.head_steps += 1
        tokens, parents, scores = self._forest(context)  # top-k drafts; their q is not needed
        if len(tokens):
            reach = np.exp(np.minimum(scores, 0.0))  # cumulative log q -> P(reaching the node) under q
            drafts.append(SourceDraft(HEADS, list(tokens), list(parents), reach.tolist(), match_len=0))
        return drafts

    def _forest(self, context: DraftContext) -> tuple:
        """(tokens, parents, cumulative log q) of the heads' top-k forest after `context`."""
        raise NotImplementedError


class SuffixHeadsDrafter(_SuffixWithHeads):
    """`suffix` with one more source: S4C heads (`heads`: a heads file, default the ones that ship for
    the target; `depth` of them used, each expanding `topk` children of the node it reads, `widths` as
    in `s4c`). The heads cost more than the copying sources, so they skip steps where a copied child of
    the root is more than `heads_below` likely (1.0, the default: they never skip). Every other option
    is `suffix`'s."""

    name = "suffix-heads"
    requires = ((ComponentKind.DRAFTER, "s4c"),)  # the heads are the s4c plugin's drafter

    def __init__(self, target, *, heads: str | None = None, topk: int = 2, widths: int | tuple = 1,
                 depth: int | None = 1, heads_below: float = 1.0, **options):
        super().__init__(target, heads_below=heads_below, **options)
        self.heads = s4c_drafter()(target, heads=heads, topk=topk, widths=widths, draw="top-k", depth=depth)

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        """Untrained heads for any target (see `s4c`): poor drafts, but every step still verifies."""
        return s4c_drafter().example_options(target, workdir)

    def _forest(self, context: DraftContext) -> tuple:
        tokens, parents, scores, _, _ = self.heads.expand(context)
        return tokens, parents, np.asarray(scores, dtype=np.float64)


class SuffixEagleDrafter(_SuffixWithHeads):
    """`suffix` with an EAGLE head as one more source (`heads`: as `eagle` takes it, default the head
    that ships for the target; `topk`, `width`, `depth` as in `eagle`), skipped on steps where a copied
    child of the root is more than `heads_below` likely. Every other option is `suffix`'s. The head reads
    the features the backend hands out: an EAGLE-3 head of several layers needs
    `kv(hidden_layers=...)`, which the error names."""

    name = "suffix-eagle"
    requires = ((ComponentKind.DRAFTER, "eagle"),)  # the head is the eagle plugin's drafter

    def __init__(self, target, *, heads: str | None = None, topk: int = 4, width: int = 2, depth: int = 4,
                 heads_below: float = 1.0, **options):
        super().__init__(target, heads_below=heads_below, **options)
        self.heads = eagle_drafter()(target, heads=heads, topk=topk, width=width, depth=depth, draw="top-k")

    @classmethod
    def example_options(cls, target, workdir: str) -> dict:
        """An untrained EAGLE head for any target (see `eagle`)."""
        return eagle_drafter().example_options(target, workdir)

    def _forest(self, context: DraftContext) -> tuple:
        return self.heads.forest(context)

    def observe(self, outcome) -> None:
        super().observe(outcome)
        self.heads.observe(outcome)  # the head reads every step's features, drafted or not

    def reset(self) -> None:
        super().reset()
        self.heads.reset()

    def spawn(self) -> SuffixEagleDrafter:
        other = super().spawn()
        other.heads = self.heads.spawn()
        return other


def s4c_drafter() -> type:
    """The `s4c` drafter's class, which `suffix-heads` declares it needs: plugins import no other plugin,
    so a missing or broken s4c plugin is a `ConfigurationError` that says what to install (assembly
    checks it before building any drafter)."""
    return required(SuffixHeadsDrafter, ComponentKind.DRAFTER, "s4c")


def eagle_drafter() -> type:
    """The `eagle` drafter's class, which `suffix-eagle` declares it needs (as `s4c_drafter`)."""
    return required(SuffixEagleDrafter, ComponentKind.DRAFTER, "eagle")
