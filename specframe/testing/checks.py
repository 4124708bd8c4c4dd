"""Conformance checks: plain functions that raise `AssertionError` naming the component and the fault.

`specframe.testing.suites` wraps them as pytest classes; they can also be called from any test. Each
check fixes the other three components to simple, trusted ones so a failure points at the component
under test.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch

from specframe.decode.loop import SpeculativeDecoder
from specframe.terms.cost import PolynomialCost
from specframe.contract.interfaces import BuildContext, Drafter, StateBackend, TreeBuilder, Verifier
from specframe.terms.kinds import ComponentKind
from specframe.terms.target import Target
from specframe.plugging.pipeline import assemble
from specframe.terms.proposal import DraftProposal, DrawMethod, ScoreKind
from specframe.terms.records import TargetScores
from specframe.plugging.registry import get_registry
from specframe.plugging.specs import ComponentSpec
from specframe.terms.sampling import Sampler, SamplingParams
from specframe.testing.exact import spelled
from specframe.testing.synthetic import (
    FirstNodesTreeBuilder, NoisyTargetDrafter, random_proposal, random_tree,
)
from specframe.testing.targets import reference_greedy, reference_hidden, reference_logits
from specframe.terms.tree import SAMPLED_DRAWS, TokenTree

KIND_OF = {Drafter: "drafter", TreeBuilder: "tree builder", Verifier: "verifier", StateBackend: "backend"}
REFERENCE = {"first-n": FirstNodesTreeBuilder, "noisy-target": NoisyTargetDrafter}


def _fail(message: str) -> None:
    raise AssertionError(message)


def resolve(kind: str, component: str | type) -> tuple[type, dict]:
    """A component class and its options from a class, a registered name or a spec like `pld(matches=3)`."""
    if isinstance(component, type):
        return component, {}
    spec = ComponentSpec.parse(component)
    cls = REFERENCE.get(spec.name) or get_registry().get(kind, spec.name)
    return cls, spec.options


def make_decoder(target: Target, drafter: str | type = "pld", tree: str | type = "chain",
                 verifier: str | type = "greedy", backend: str | type = "kv", *, budget: int = 8,
                 sampling: SamplingParams | None = None, options: dict | None = None) -> SpeculativeDecoder:
    """A decoder from classes or names, built by `specframe.assemble` (checked and constructed exactly as
    any pipeline), without registering anything: classes are used as they are.

    `options` maps a kind (a `ComponentKind`, or its value such as "drafter") to extra constructor options.
    """
    sampling = sampling or SamplingParams()
    options = options or {}
    resolved = {kind: resolve(kind, c) for kind, c in zip(ComponentKind, (drafter, tree, verifier, backend))}
    extra = {kind: {**opts, **options.get(kind, {})} for kind, (_, opts) in resolved.items()}
    pipeline = assemble(target, *(cls for cls, _ in resolved.values()), sampling=sampling, options=extra)
    return SpeculativeDecoder(target, pipeline, budget=budget, sampling=sampling)


def check_class(cls: type, base: type) -> None:
    """A registrable class: the right base, a non-empty `name`, capabilities of the declared type."""
    kind = KIND_OF[base]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        _fail(f"{cls!r} is not a subclass of specframe.{base.__name__}")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        _fail(f"{kind} class {cls.__qualname__} needs a non-empty string `name`")
    declared = type(base.capabilities)
    if not isinstance(cls.capabilities, declared):
        _fail(f"{kind} '{cls.name}': `capabilities` must be a {declared.__name__}, got {cls.capabilities!r}")


def check_proposal(proposal: DraftProposal, vocab_size: int, name: str = "?", *,
                   provides_draft_probs: bool = False, score_kind: ScoreKind | None = None) -> None:
    """A well-formed proposal: a `DraftProposal`, tokens in the vocabulary, scores of the declared kind
    (never increasing downwards for log-probabilities and frequencies), q rows that are distributions."""
    if not isinstance(proposal, DraftProposal):
        _fail(f"drafter '{name}' returned {type(proposal).__name__}, not a DraftProposal")
    n = len(proposal)
    if n and (proposal.tokens.min() < 0 or proposal.tokens.max() >= vocab_size):
        _fail(f"drafter '{name}' proposed token ids outside [0, {vocab_size}): {proposal.tokens.tolist()}")
    if n and not np.all(np.isfinite(proposal.scores)):
        _fail(f"drafter '{name}' gave non-finite scores {proposal.scores.tolist()}")
    if n and score_kind is not None and proposal.score_kind is not score_kind:
        _fail(f"drafter '{name}' declares {score_kind.value} scores but proposed {proposal.score_kind.value} "
              "scores (set DraftProposal.score_kind, or DrafterCapabilities.score_kind)")
    if n and proposal.score_kind in (ScoreKind.LOG_PROB, ScoreKind.FREQUENCY):
        parents = proposal.parents
        child, parent = np.flatnonzero(parents >= 0), parents[parents >= 0]
        if np.any(proposal.scores[child] > proposal.scores[parent] + 1e-6):
            _fail(f"drafter '{name}': {proposal.score_kind.value} scores must never increase from a parent "
                  f"to its child, got {proposal.scores.tolist()} for parents {parents.tolist()}")
        if proposal.score_kind is ScoreKind.LOG_PROB and np.any(proposal.scores > 1e-6):
            _fail(f"drafter '{name}': log-prob scores must be <= 0, got {proposal.scores.tolist()}")
    q = proposal.draft_probs
    if provides_draft_probs and n and q is None:
        _fail(f"drafter '{name}' declares provides_draft_probs but left draft_probs empty")
    if q is not None and n:
        if q.shape != (n, vocab_size):
            _fail(f"drafter '{name}': draft_probs has shape {tuple(q.shape)}, expected ({n}, {vocab_size})")
        sums = q.float().sum(-1)  # (N,)
        if (q < 0).any() or not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            _fail(f"drafter '{name}': draft_probs rows must be distributions (row sums {sums.tolist()})")
        if proposal.draw in SAMPLED_DRAWS:
            drawn = q[torch.arange(n), torch.from_numpy(proposal.tokens)]  # (N,)
            if (drawn <= 0).any():
                _fail(f"drafter '{name}' says its tokens were sampled from draft_probs, but some have q = 0")


def check_tree_builder(builder: TreeBuilder, rng: np.random.Generator, trials: int = 60, *,
                       draws: Sequence[DrawMethod] = (DrawMethod.SAMPLED, DrawMethod.TOPK),
                       may_return_empty: bool = False) -> None:
    """On random proposals (with q drawn as each of `draws`, and without q) and budgets from 1 to 12, with
    and without a cost model, `build` never raises and returns a tree `check_tree` accepts; a non-empty
    proposal gets a non-empty tree unless `may_return_empty` (builders that prune by what pays)."""
    name, caps = type(builder).name, type(builder).capabilities
    cost = PolynomialCost((2e-4, 1e-2))  # a made-up cost (per step, per node) for builders that read one
    for trial in range(trials):
        with_probs = caps.needs_draft_probs or trial % 2 == 0
        draw = draws[trial % len(draws)] if with_probs else DrawMethod.RETRIEVED
        proposal = random_proposal(rng, 16, with_probs=with_probs, draw=draw)
        budget = 1 if trial % 3 == 0 else int(rng.integers(1, 13))
        context = BuildContext(budget, cost if trial % 4 < 2 else None)
        try:
            tree = builder.build(proposal, context)
        except Exception as exc:  # a builder must cut any proposal to any budget, 1 included
            raise AssertionError(f"tree builder '{name}' raised {type(exc).__name__}: {exc} on a "
                                 f"{draw.value} proposal of {len(proposal)} nodes (parents "
                                 f"{proposal.parents.tolist()}) with {context}") from exc
        check_tree(tree, proposal, context.budget, name, keeps_draft_probs=caps.keeps_draft_probs)
        if len(proposal) and not len(tree) and not may_return_empty:
            _fail(f"tree builder '{name}' returned an empty tree for a proposal of {len(proposal)} nodes and "
                  f"budget {context.budget} (set may_return_empty = True if that is intended)")


def check_tree(tree: TokenTree, proposal: DraftProposal, budget: int, name: str = "?", *,
               keeps_draft_probs: bool = True) -> None:
    """A sub-forest of the proposal of at most `budget` nodes: closed under parents (each node's parent is
    a tree node before it, or the root), each node a proposal node under the proposal node of its parent,
    and with `keeps_draft_probs` each node carrying its proposal node's q row."""
    if not isinstance(tree, TokenTree):
        _fail(f"tree builder '{name}' returned {type(tree).__name__}, not a TokenTree")
    if len(tree) > budget:
        _fail(f"tree builder '{name}' returned {len(tree)} nodes for a budget of {budget}")
    parents = tree.parents
    if len(tree) and (np.any(parents >= np.arange(len(tree))) or np.any(parents < -1)):
        _fail(f"tree builder '{name}' returned parents {parents.tolist()}, not closed under parents "
              "(-1 <= parents[i] < i: keep every ancestor, before its descendants)")
    source = _source_nodes(tree, proposal, name)
    if keeps_draft_probs and proposal.draft_probs is not None and len(tree):
        if tree.draft_probs is None or tree.draft_probs.shape != (len(tree), proposal.draft_probs.shape[1]):
            _fail(f"tree builder '{name}' declares keeps_draft_probs but the tree has no (N, V) draft_probs")
        for i, j in enumerate(source):
            if not torch.allclose(tree.draft_probs[i], proposal.draft_probs[j]):
                _fail(f"tree builder '{name}': node {i} carries a q that is not its proposal node's")


def _source_nodes(tree: TokenTree, proposal: DraftProposal, name: str) -> list[int]:
    """The proposal node each tree node stands for. The k-th tree child carrying a token under a node is
    matched with the k-th such child in the proposal (a raw i.i.d. stream repeats tokens among siblings)."""
    source: list[int] = []
    used: dict[tuple[int, int], int] = {}  # (proposal parent, token) -> tree children matched so far
    for i, (parent, token) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
        above = source[parent] if parent >= 0 else -1
        same = [c for c in proposal.children[above + 1] if proposal.tokens[c] == token]
        k = used.get((above, token), 0)
        if k >= len(same):
            _fail(f"tree builder '{name}': node {i} spells {list(spelled(tree, i))}, which is no path of the "
                  "proposal" + (f" (or not {k + 1} times)" if same else ""))
        used[(above, token)] = k + 1
        source.append(same[k])
    return source


def check_lossless(decoder: SpeculativeDecoder, prompts: Sequence[Sequence[int]], max_new_tokens: int = 48,
                   label: str = "pipeline") -> None:
    """Greedy speculative output equals plain greedy decoding token for token, twice (reset works)."""
    for prompt in prompts:
        expected = reference_greedy(decoder.target, prompt, max_new_tokens)
        for attempt in ("first", "repeated"):
            got = decoder.generate(list(prompt), max_new_tokens=max_new_tokens).tokens
            if got != expected:
                k = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                         min(len(got), len(expected)))
                _fail(f"{label} is not lossless ({attempt} run): greedy output differs from plain decoding "
                      f"at new token {k}: got {got[k:k + 8]}..., expected {expected[k:k + 8]}...")


def check_batch_rows(make_decoder: Callable[[], SpeculativeDecoder], prompts: Sequence[Sequence[int]],
                     max_new_tokens: int = 32, label: str = "pipeline") -> None:
    """Each row of `generate_batch` decodes as its request alone through a fresh decoder: the same greedy
    tokens (lossless per row) and, unless the drafter remembers requests (`remembers_requests`: rows that
    end earlier rightly feed the others), the same tree sizes and accepted drafts step by step, which shows
    that `Drafter.spawn` keeps each row's per-request state apart. The prompts are decoded all at once,
    then again two at a time (rows leaving and joining the batch)."""
    remembers = make_decoder().pipeline.drafter.capabilities.remembers_requests
    alone = [make_decoder().generate(list(prompt), max_new_tokens=max_new_tokens) for prompt in prompts]
    for size in (len(prompts), 2):
        rows = make_decoder().generate_batch([list(p) for p in prompts], max_new_tokens, batch_size=size)
        for i, (row, one) in enumerate(zip(rows, alone)):
            where = f"{label}, prompt {i} of a batch decoded {size} at a time"
            if row.tokens != one.tokens:
                k = next((j for j, (a, b) in enumerate(zip(row.tokens, one.tokens)) if a != b),
                         min(len(row.tokens), len(one.tokens)))
                _fail(f"{where}: its tokens differ from the request decoded alone at new token {k}: got "
                      f"{row.tokens[k:k + 8]}..., alone {one.tokens[k:k + 8]}...")
            if not remembers and (row.metrics.tree_sizes, row.metrics.accepted_draft_tokens) != (
                    one.metrics.tree_sizes, one.metrics.accepted_draft_tokens):
                _fail(f"{where}: it drafted differently from the request alone (tree sizes "
                      f"{row.metrics.tree_sizes[:12]}... vs {one.metrics.tree_sizes[:12]}...): rows share "
                      "per-request drafter state; override `Drafter.spawn` to give each row its own")


def check_verifier_greedy(verifier: Verifier, rng: np.random.Generator, vocab_size: int = 16,
                          trials: int = 200, need_probs: bool = False, *, maximal: bool = False) -> None:
    """On random trees and logits at temperature 0: a valid path and the inputs untouched; for a verifier
    declared lossless, every emitted token (the accepted path, then the bonus) is the one plain greedy
    decoding emits there. With `maximal`, the path must also be the longest the target agrees with (the
    whole argmax walk through the tree): lossless allows accepting less, at a cost in speed only."""
    name = type(verifier).name
    sampler = Sampler(SamplingParams())
    for _ in range(trials):
        tree = random_tree(rng, vocab_size, int(rng.integers(0, 12)), with_probs=need_probs)
        logits = torch.from_numpy(rng.normal(size=(len(tree) + 1, vocab_size))).float()  # (N + 1, V)
        # Make draft tokens the argmax often enough that long paths get accepted.
        for i, tok in enumerate(tree.tokens.tolist()):
            if rng.random() < 0.7:
                logits[tree.parents[i] + 1, tok] += 10.0
        before_logits, before_tokens = logits.clone(), tree.tokens.copy()
        result = verifier.verify(tree, TargetScores(logits=logits), sampler)
        check_result(result, tree, vocab_size, name)
        if not torch.equal(logits, before_logits) or not np.array_equal(tree.tokens, before_tokens):
            _fail(f"verifier '{name}' modified the tree or the scores it was given")
        emitted = [int(t) for t in tree.tokens[result.path]] + [int(result.bonus)]
        expected = _argmax_walk(tree, logits)
        if type(verifier).capabilities.lossless and emitted != expected[:len(emitted)]:
            k = next(i for i, (a, b) in enumerate(zip(emitted + [None], expected)) if a != b)
            _fail(f"verifier '{name}' is declared lossless but at temperature 0 emitted {emitted}, where "
                  f"plain greedy decoding emits {expected[:len(emitted)]} (token {k} differs)")
        if maximal and len(emitted) < len(expected):
            _fail(f"verifier '{name}' accepted {len(result.path)} of the {len(expected) - 1} tree nodes the "
                  f"target agrees with at temperature 0 (emitted {emitted}, the longest agreeing path gives "
                  f"{expected}); a lossless verifier may stop early, so leave `maximal` off if that is "
                  "intended")


def check_result(result, tree: TokenTree, vocab_size: int, name: str) -> None:
    """A path that starts at a child of the root and descends, and a bonus token in the vocabulary."""
    node = -1
    for step in result.path:
        if not 0 <= step < len(tree) or int(tree.parents[step]) != node:
            _fail(f"verifier '{name}' returned path {result.path}, which is not a root-to-node path of a "
                  f"tree with parents {tree.parents.tolist()}")
        node = step
    if not 0 <= int(result.bonus) < vocab_size:
        _fail(f"verifier '{name}' returned bonus token {result.bonus}, outside [0, {vocab_size})")


def _argmax_walk(tree: TokenTree, logits: torch.Tensor) -> list[int]:
    best = logits.argmax(-1).tolist()
    out, node = [], -1
    while True:
        want = best[node + 1]
        out.append(want)
        node = tree.child(node, want)
        if node is None:
            return out


def check_backend_scores(backend_cls: type, target: Target, prompt: Sequence[int], rng: np.random.Generator,
                         trees: int = 4, atol: float = 1e-4) -> None:
    """Tree logits equal plain forward logits along every path; scoring never changes the state and a new
    score discards the previous one; scores carry their tree; only the latest scores can be committed,
    once; commit appends the root and the path and makes the bonus pending."""
    name = backend_cls.name
    reason = backend_cls.unsupported_reason(target)
    if reason:
        _fail(f"backend '{name}' refuses the test target '{target.name}': {reason}")
    want_hidden = backend_cls.capabilities.provides_hidden_states
    backend = backend_cls(target, want_hidden=want_hidden)
    vocab = target.vocab_size
    history = list(prompt)
    backend.prefill(history)
    if backend.committed_length != len(history) - 1:
        _fail(f"backend '{name}': committed_length after prefill of {len(history)} ids is "
              f"{backend.committed_length}, expected {len(history) - 1} (the last id stays pending)")
    for _ in range(trees):
        decoy = _score_checked(backend, _draw_tree(backend_cls, rng, vocab), vocab)  # discarded by the next
        tree = _draw_tree(backend_cls, rng, vocab)
        scores = _score_checked(backend, tree, vocab)
        again = _score_checked(backend, tree, vocab)
        if not torch.allclose(scores.logits, again.logits, atol=atol):
            _fail(f"backend '{name}': scoring the same tree twice gave different logits "
                  "(score changed state)")
        for i in range(-1, len(tree)):
            path = [] if i < 0 else tree.path_to(i)
            ids = history + [int(t) for t in tree.tokens[path]]
            ref = reference_logits(target, ids)[-1]  # (V,)
            got = scores.logits[i + 1].float().cpu()
            if not torch.allclose(got, ref.cpu(), atol=atol, rtol=1e-3):
                _fail(f"backend '{name}': logits at tree node {i} (path {path}, parents "
                      f"{tree.parents.tolist()}) differ from a plain forward pass by "
                      f"{(got - ref.cpu()).abs().max():.2e}")
            if want_hidden and scores.hidden is not None and i == len(tree) - 1:
                ref_h = reference_hidden(target, ids)[-1].cpu()
                if not torch.allclose(scores.hidden[i + 1].float().cpu(), ref_h, atol=atol, rtol=1e-3):
                    _fail(f"backend '{name}': hidden state at node {i} differs from a plain forward pass")
        path = tree.path_to(int(rng.integers(len(tree)))) if len(tree) and rng.random() < 0.8 else []
        bonus = int(rng.integers(vocab))
        before = backend.committed_length
        _refuse_commit(backend, decoy, "of an earlier score() (two newer score() calls came after it)")
        _refuse_commit(backend, scores,
                       "of an earlier score() (a newer score() of the same tree came after it)")
        backend.commit(again, path, bonus)
        _refuse_commit(backend, again, "that were committed already")
        history += [int(t) for t in tree.tokens[path]] + [bonus]
        if backend.committed_length != before + 1 + len(path):
            _fail(f"backend '{name}': committed_length went from {before} to {backend.committed_length} "
                  f"after committing a path of {len(path)} nodes; expected {before + 1 + len(path)} "
                  "(root + path)")
    final = backend.score(TokenTree.empty()).logits[0].float().cpu()
    ref = reference_logits(target, history)[-1].cpu()
    if not torch.allclose(final, ref, atol=atol, rtol=1e-3):
        _fail(f"backend '{name}': after {trees} commits the next-token logits differ from a plain forward "
              f"over the same {len(history)} tokens by {(final - ref).abs().max():.2e}")


def check_fresh_state_per_copy(backend_cls: type, target: Target, prompts: Sequence[Sequence[int]],
                               rng: np.random.Generator, steps: int = 3, atol: float = 1e-4,
                               options: dict | None = None) -> None:
    """What `BackendCapabilities.fresh_state_per_copy` declares and the default `StateBackend.batch`
    (`RowByRow`) relies on: shallow copies of one backend, prefilled with different prompts one after the
    other, then scored all and committed all in turns, each give a plain forward's logits over their own
    tokens, so no copy disturbs another."""
    name = backend_cls.name
    want_hidden = backend_cls.capabilities.provides_hidden_states
    original = backend_cls(target, want_hidden=want_hidden, **(options or {}))
    vocab = target.vocab_size
    rows = []
    for prompt in prompts:  # as `RowByRow.add` does
        row = copy.copy(original)
        row.prefill(list(prompt))
        rows.append((row, list(prompt)))

    def expect(i: int, history: list[int], logits: torch.Tensor, where: str) -> None:
        ref = reference_logits(target, history)[-1].cpu()  # (V,)
        got = logits.float().cpu()
        if not torch.allclose(got, ref, atol=atol, rtol=1e-3):
            _fail(f"backend '{name}' declares fresh_state_per_copy, but copy {i} of {len(rows)} copies of "
                  f"one backend, prefilled with different prompts and stepped in turns, gave logits {where} "
                  f"that differ from a plain forward over its own tokens by {(got - ref).abs().max():.2e}: "
                  "the copies share state that prefill, score or commit changes in place. Make prefill "
                  "assign new objects, or leave fresh_state_per_copy False (the default batch() then "
                  "refuses)")

    for step in range(steps):
        trees = [_draw_tree(backend_cls, rng, vocab) for _ in rows]
        scored = [_score_checked(row, tree, vocab) for (row, _), tree in zip(rows, trees)]
        for i, ((_, history), tree, scores) in enumerate(zip(rows, trees, scored)):
            for node in range(-1, len(tree)):
                path = [] if node < 0 else tree.path_to(node)
                expect(i, history + [int(t) for t in tree.tokens[path]], scores.logits[node + 1],
                       f"at step {step}, tree node {node}")
        for (row, history), tree, scores in zip(rows, trees, scored):
            path = tree.path_to(int(rng.integers(len(tree)))) if len(tree) else []
            bonus = int(rng.integers(vocab))
            row.commit(scores, path, bonus)
            history += [int(t) for t in tree.tokens[path]] + [bonus]
    for i, (row, history) in enumerate(rows):
        expect(i, history, row.score(TokenTree.empty()).logits[0], f"after {steps} commits")


def _draw_tree(backend_cls: type, rng: np.random.Generator, vocab: int) -> TokenTree:
    """A random tree of 0 to 9 nodes, or a chain for backends that do not support trees."""
    size = int(rng.integers(0, 10))
    if backend_cls.capabilities.supports_trees:
        return random_tree(rng, vocab, size)
    return TokenTree(rng.integers(0, vocab, size), np.arange(size) - 1)  # node i under node i - 1


def _score_checked(backend: StateBackend, tree: TokenTree, vocab: int) -> TargetScores:
    """`backend.score(tree)`, checked to give (N + 1, V) logits and to carry the tree it scored."""
    name = type(backend).name
    scores = backend.score(tree)
    if scores.logits.shape != (len(tree) + 1, vocab):
        _fail(f"backend '{name}': logits of shape {tuple(scores.logits.shape)} for a tree of {len(tree)} "
              f"nodes, expected ({len(tree) + 1}, {vocab})")
    got = scores.tree
    if not (isinstance(got, TokenTree) and np.array_equal(got.tokens, tree.tokens)
            and np.array_equal(got.parents, tree.parents)):
        _fail(f"backend '{name}': score() must set TargetScores.tree to the tree it scored (commit reads "
              f"the accepted nodes from it), got {'None' if got is None else 'another tree'}")
    return scores


def _refuse_commit(backend: StateBackend, stale: TargetScores, why: str) -> None:
    """Committing `stale` must raise ValueError and leave the backend as it was."""
    name = type(backend).name
    before = backend.committed_length
    try:
        backend.commit(stale, [], 0)
    except ValueError:
        if backend.committed_length != before:
            _fail(f"backend '{name}': a refused commit() changed committed_length from {before} to "
                  f"{backend.committed_length}; check the scores before touching the state")
        return
    _fail(f"backend '{name}': commit() accepted scores {why}; only the latest score() may be committed, "
          "once: raise ValueError otherwise (start commit with `self.redeem(scored)`)")
