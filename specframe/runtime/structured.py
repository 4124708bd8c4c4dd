"""Constraints from a JSON schema, a regular expression or a grammar, compiled for a target's tokenizer with
llguidance (the `structured` extra; why this library: docs/explanation/structured-output.md).

`constraint_for(target, json_schema=... | regex=... | grammar=...)` checks the text and compiles it before
any decoding: an invalid schema, regular expression or grammar, or one that no token sequence can start,
raises `ConstraintError` naming what was wrong. JSON is laid out as `json.dumps` writes it (`JSON_LAYOUT`).
Grammars are llguidance's Lark dialect (`start: ...`,
`%json {...}` for a schema inside a grammar); any other text is read as GBNF (llama.cpp's, with
`root ::= ...`) and converted to it first.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from specframe.terms.constraint import Constraint, ConstraintError, ConstraintState
from specframe.terms.target import Target

# JSON as `json.dumps` writes it, no other whitespace: a model cannot pad its output with spaces and
# newlines forever, and the layout is forced, so `forced` drafts it (a schema's "x-guidance" overrides it).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_TOKENIZERS: dict[int, tuple[Any, Any]] = {}  # id(HF tokenizer) -> (it, its llguidance tokenizer): ~1 s


def _llguidance():
    try:
        import llguidance
    except ImportError as err:
        raise ConstraintError("structured output needs llguidance: pip install 'specframe[structured]' "
                              "(or pip install llguidance)") from err
    return llguidance


class GuidanceState(ConstraintState):
    """A state of an llguidance matcher; `advance` works on a copy (`LLMatcher.deep_copy`)."""

    def __init__(self, matcher, constraint: GuidanceConstraint):
        self.matcher, self.constraint = matcher, constraint
        self._allowed: np.ndarray | None = None

    def allowed(self) -> np.ndarray:
        if self._allowed is None:
            words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)  # 32-bit words, LE
            bits = np.unpackbits(words, bitorder="little")[: self.constraint.vocab_size]
            self._allowed = bits.astype(bool)  # (V,)
        return self._allowed

    def advance(self, token: int) -> GuidanceState:
        matcher = self.matcher.deep_copy()
        if not matcher.consume_token(int(token)):
            raise ConstraintError(f"constraint {self.constraint.describe()}: token {token} is not allowed "
                                  f"here ({matcher.get_error()})")
        return GuidanceState(matcher, self.constraint)

    @property
    def is_done(self) -> bool:
        return bool(self.matcher.is_stopped())

    def forced(self, limit: int) -> list[int]:
        """The tokens of the text the grammar forces from here, as llguidance tokenizes it."""
        return [int(t) for t in self.matcher.compute_ff_tokens()[:limit]]


class GuidanceConstraint(Constraint):
    """A grammar in llguidance's format, compiled for one tokenizer; refused here when invalid or when no
    token may start it."""

    def __init__(self, grammar: str, tokenizer, label: str, vocab_size: int | None = None):
        llguidance = _llguidance()
        self.grammar, self.tokenizer, self.label = grammar, tokenizer, label
        # The tokens masks cover: fewer than the tokenizer's where it holds a stand-in EOS past the target's
        # vocabulary (`guidance_tokenizer`), which is then never allowed.
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise ConstraintError(f"invalid {label}: {messages[0]}")
        start = self.start()
        some = start.allowed().any()  # first: the matcher knows it is stopped once it computed a mask
        if not some or start.matcher.is_stopped() and not start.matcher.is_accepting():
            raise ConstraintError(f"{label} cannot be satisfied: no token of the model's vocabulary can "
                                  "start it (and it does not accept the empty output)")

    def start(self) -> GuidanceState:
        matcher = _llguidance().LLMatcher(self.tokenizer, self.grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"invalid {self.label}: {matcher.get_error()}")
        return GuidanceState(matcher, self)

    def describe(self) -> str:
        return self.label


class _DecodedTokens:
    """What llguidance's `TokenizerWrapper` reads, for a tokenizer whose serialized form it cannot parse:
    each token's bytes as the tokenizer decodes it alone (right for tokenizers without byte pieces)."""

    def __init__(self, tokenizer, vocab: int, eos: int):
        self.tokenizer = tokenizer
        self.tokens = [tokenizer.decode([i]).encode() for i in range(vocab)] + [b"<eos>"] * (eos >= vocab)
        self.eos_token_id, self.bos_token_id, self.special_token_ids = eos, None, [eos]

    def __call__(self, text) -> list[int]:
        text = text.decode() if isinstance(text, bytes) else text
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def guidance_tokenizer(target: Target):
    """The llguidance tokenizer of `target`'s tokenizer, its EOS tokens the target's (made once). A target
    without EOS gets a stand-in one past its vocabulary, never allowed (`GuidanceConstraint.vocab_size`)."""
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ConstraintError(f"model '{target.name}' has no tokenizer, and a schema, regular expression or "
                              "grammar constrains text: load the model with its tokenizer")
    cached = _TOKENIZERS.get(id(tokenizer))
    if cached is None or cached[0] is not tokenizer:
        _llguidance()  # a clear error when it is not installed
        import llguidance.hf

        vocab = target.vocab_size
        eos = sorted(target.eos_token_ids) or [vocab]
        n_vocab = vocab + (eos == [vocab])
        try:
            made = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos)
        except ValueError:  # a tokenizer llguidance cannot parse (the tiny character-level one)
            wrapped = llguidance.TokenizerWrapper(_DecodedTokens(tokenizer, vocab, eos[0]))
            made = llguidance.LLTokenizer(wrapped)
        cached = _TOKENIZERS[id(tokenizer)] = (tokenizer, made)
    return cached[1]


def constraint_for(target: Target, *, json_schema: str | dict | None = None, regex: str | None = None,
                   grammar: str | None = None) -> GuidanceConstraint:
    """A constraint on `target`'s new tokens: exactly one of a JSON schema (a dict, or its JSON text), a
    regular expression, or a grammar (llguidance's Lark dialect, or GBNF with `::=` rules)."""
    text, label = grammar_text(json_schema=json_schema, regex=regex, grammar=grammar)
    tokenizer = guidance_tokenizer(target)
    return GuidanceConstraint(text, tokenizer, label, vocab_size=min(tokenizer.vocab_size, target.vocab_size))


def check_source(**source) -> None:
    """Refuse (`ConstraintError`) an invalid schema, regular expression or grammar (`constraint_for`'s
    keywords) without a tokenizer: before a model loads. Whether any token can start it is known only
    with the tokenizer (`constraint_for`)."""
    text, label = grammar_text(**source)
    message = _llguidance().LLMatcher.validate_grammar(text)
    if message and not message.startswith("WARNING"):
        raise ConstraintError(f"invalid {label}: {message}")


def grammar_text(*, json_schema: str | dict | None = None, regex: str | None = None,
                 grammar: str | None = None) -> tuple[str, str]:
    """llguidance's grammar for exactly one of a JSON schema, a regular expression or a grammar, and how
    to name it in messages."""
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar))
             if v is not None}
    if len(given) != 1:
        raise ConstraintError("give exactly one of json_schema, regex and grammar "
                              f"(got {', '.join(given) or 'none'})")
    llguidance = _llguidance()
    matcher = llguidance.LLMatcher
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(json_schema)
            except json.JSONDecodeError as err:
                raise ConstraintError(f"the JSON schema is not valid JSON: {err}") from err
        if not isinstance(json_schema, (dict, bool)):
            raise ConstraintError(f"a JSON schema is a JSON object, got {type(json_schema).__name__}")
        return matcher.grammar_from_json_schema(json_schema, defaults=JSON_LAYOUT), "JSON schema"
    if regex is not None:
        return matcher.grammar_from_regex(regex), f"regular expression {regex!r}"
    from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

    try:
        lark = any_to_lark(grammar)  # Lark (`start:` rules) as it is, GBNF converted
    except (GbnfToLarkError, ValueError) as err:
        raise ConstraintError(f"invalid grammar: neither llguidance's Lark dialect (rules like `start: ...`) "
                              f"nor GBNF that converts to it ({type(err).__name__}: {err})") from err
    return matcher.grammar_from_lark(lark), "grammar"
