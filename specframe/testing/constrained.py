"""Constraints for tests of structured output on tiny targets, and their exact law.

`TokenAutomaton` is a constraint given by tables (a finite automaton over token ids), so a test can build a
small grammar over a vocabulary of 8 without a tokenizer; `byte_constraint` compiles a regular expression
or a Lark grammar with llguidance for a vocabulary of single bytes (token i is one byte), so the library's
own masks are tested on a tiny target too. `constrained_law` is the exact law of the first tokens under a
constraint (the target's logits masked, then `Sampler.probs`), for `specframe.testing.exact.law_test`.
"""

from __future__ import annotations

import itertools

import numpy as np

from specframe.terms.constraint import Constraint, ConstraintError, ConstraintState, mask_logits
from specframe.terms.sampling import Sampler, SamplingParams


class AutomatonState(ConstraintState):
    def __init__(self, automaton: TokenAutomaton, state: int):
        self.automaton, self.state = automaton, state

    def allowed(self) -> np.ndarray:
        return self.automaton.allowed[self.state]

    def follow(self, token: int) -> AutomatonState:
        """The next state by the transition table, allowed or not (what a mutant that does not check uses)."""
        return AutomatonState(self.automaton, int(self.automaton.next[self.state, token]))

    def advance(self, token: int) -> AutomatonState:
        if not self.allowed()[token]:
            raise ConstraintError(f"automaton: token {token} is not allowed in state {self.state}")
        return self.follow(token)


class TokenAutomaton(Constraint):
    """A constraint as tables: `allowed[s]` (V,) bool and `next[s]` (V,) the state after each token, from
    state 0. Every state must allow some token."""

    def __init__(self, allowed: np.ndarray, next_state: np.ndarray):
        self.allowed = np.asarray(allowed, bool)  # (S, V)
        self.next = np.asarray(next_state, np.int64)  # (S, V)
        self.vocab_size = self.allowed.shape[1]
        if not self.allowed.any(axis=1).all():
            raise ConstraintError("automaton: every state must allow at least one token")

    @classmethod
    def modular(cls, vocab: int = 8, states: int = 3) -> TokenAutomaton:
        """State = sum of the tokens so far mod `states`; in state s a token t is allowed when t mod
        `states` != s, and token `vocab - 1` only in state 0 (so after each token what may follow
        changes, and a wrong state shows in the law)."""
        tokens = np.arange(vocab)
        allowed = np.stack([tokens % states != s for s in range(states)])  # (S, V)
        allowed[1:, vocab - 1] = False
        next_state = (np.arange(states)[:, None] + tokens[None, :]) % states  # (S, V)
        return cls(allowed, next_state)

    def start(self) -> AutomatonState:
        return AutomatonState(self, 0)

    def describe(self) -> str:
        return f"automaton of {len(self.allowed)} states"


class _ByteTokenizer:
    """What llguidance's `TokenizerWrapper` reads: token i is the byte `alphabet[i]`, the last is EOS."""

    def __init__(self, alphabet: bytes):
        self.tokens = [bytes([b]) for b in alphabet]
        self.eos_token_id, self.bos_token_id, self.special_token_ids = len(alphabet) - 1, None, []

    def __call__(self, text) -> list[int]:
        data = text if isinstance(text, bytes) else text.encode()
        return [self.tokens.index(bytes([b])) for b in data if bytes([b]) in self.tokens]


def byte_constraint(*, regex: str | None = None, grammar: str | None = None, alphabet: bytes = b"abcdefg\0"
                    ) -> Constraint:
    """An llguidance constraint over a vocabulary of single bytes (default 8: `a` to `g`, then an EOS)."""
    import llguidance

    from specframe.runtime.structured import GuidanceConstraint

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer(alphabet)))
    if regex is not None:
        text = llguidance.LLMatcher.grammar_from_regex(regex)
        return GuidanceConstraint(text, tokenizer, f"regex {regex!r}")
    return GuidanceConstraint(llguidance.LLMatcher.grammar_from_lark(grammar), tokenizer, "grammar")


def constrained_law(table, params: SamplingParams, constraint: Constraint) -> dict[tuple[int, ...], float]:
    """P(first `table.depth` tokens = seq) under the target's logits masked by `constraint`, then
    processed by `Sampler.probs`: the law a constrained request must follow."""
    sampler = Sampler(params)
    start = constraint.start()
    law = {}
    for seq in itertools.product(range(table.vocab), repeat=table.depth):
        mass, state = 1.0, start
        for i in range(table.depth):
            allowed = np.zeros(table.vocab, bool)
            allowed[: constraint.vocab_size] = state.allowed()[: table.vocab]
            row = mask_logits(table(seq[:i])[None], allowed[None])[0]  # (V,)
            mass *= float(sampler.probs(row).double()[seq[i]])
            if mass == 0:
                break
            state = state.advance(seq[i])
        if mass > 0:
            law[seq] = mass
    return law
