"""`suffix`: SuffixDecoding (Oliaro et al., 2025) through the field's own library, arctic-inference.

The library keeps a suffix tree over each active request (its prompt and output so far) and one over a
bounded FIFO cache of earlier responses. At each step it matches the longest suffixes of the text in a
tree, and from the best match proposes the continuation tree whose nodes carry the estimated
probability of reaching them (the product of child/parent counts along the path), at most
`factor * match length + offset` tokens, none below `min_prob`.

`SuffixDecodingCache.speculate` returns only the better of the request's and the cache's drafts and does
not say which. So this drafter asks both trees (`_local_trees[req]` and `_global_tree`, the library's
native `SuffixTree`s, checked at construction) and, with `corpus=`, a REST datastore as a third, static
source (SAM-Decoding's static + dynamic split), and merges the drafts into one forest: the same token
under the same parent is one node, whose score is the highest probability any source gives it. Each
node is labelled with the source of that score and its match length (`DraftProposal.group`), so
adaptive speculation learns per source how far those probabilities can be trusted.

Everything the library does is called, not rewritten; what specframe adds (persistence, merging,
labels) is in this package. See docs/explanation/suffix-decoding.md.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import warnings
from collections import deque
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from specframe import (
    ConfigurationError, DraftContext, Drafter, DrafterCapabilities, DraftProposal, ScoreKind,
    SpecframeWarning, StepOutcome,
)
from specframe.kit.drafting import TokenizerIdentity
from specframe_suffix.drafts import REQUEST, RESPONSES, SourceDraft, merge
from specframe_suffix.store import (SuffixCacheError, append_responses, check_writable, load_responses,
                                   resolve_cache)

SUPPORTED = "0.3.0"  # the arctic-inference version whose internals (the two native trees) are read
INSTALL = (f'`make setup`, or: pip install "nanobind==2.9.2" cmake ninja setuptools wheel "protobuf>=5.29" '
           f"grpcio-tools && CMAKE_ARGS=-DPython_EXECUTABLE=$(which python) pip install "
           f"--no-build-isolation arctic-inference=={SUPPORTED}")

def import_library():
    """(SuffixDecodingCache, SuffixTree) from arctic-inference, or a `ConfigurationError` saying how to
    install it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as err:
        raise ConfigurationError(
            f"drafter 'suffix' needs arctic-inference {SUPPORTED} ({err}); install it with {INSTALL}"
        ) from None
    return SuffixDecodingCache, SuffixTree


def check_internals(cache, tree_class) -> None:
    """Refuse a library whose cache does not hold the two native trees this drafter queries."""
    ok = (isinstance(getattr(cache, "_local_trees", None), dict)
          and isinstance(getattr(cache, "_global_tree", None), tree_class)
          and all(hasattr(tree_class, m) for m in ("speculate_ndarray", "estimate_memory")))
    if not ok:
        try:
            installed = version("arctic-inference")
        except PackageNotFoundError:
            installed = "unknown"
        raise ConfigurationError(
            f"drafter 'suffix' reads the request and response trees of arctic-inference {SUPPORTED} "
            f"(SuffixDecodingCache._local_trees, _global_tree), which the installed version {installed} "
            f"lacks; install the supported version with {INSTALL}")


class SuffixDrafter(Drafter):
    """Options: `cache` (a file path, or a name stored as `$SPECFRAME_HOME/suffix-caches/NAME.json`;
    default: earlier responses are kept in memory only), `max_depth` (suffix tree depth), `max_cached`
    (earlier responses kept, oldest evicted first; 0 = the request alone), `factor` and `offset` (a
    match of n tokens proposes at most factor * n + offset; 2 and 1 by default, longer than the library's
    1 and 0 because the adaptive planner keeps only what pays), `min_prob` (lowest estimated probability
    proposed), `tree` (propose trees; False: one path per source) and `corpus` (a REST datastore name or
    directory drafted from as a third source, or a tuple of them, each drafted from and merged)."""

    name = "suffix"
    capabilities = DrafterCapabilities(proposes_trees=True, score_kind=ScoreKind.FREQUENCY,
                                       remembers_requests=True)

    # A draft is never longer than a step's budget, and the library keeps a C int of each count.
    option_limits = {"max_depth": (1, 4096), "max_cached": (0, 2**31 - 1)}

    def __init__(self, target, *, cache: str | None = None, max_depth: int = 64, max_cached: int = 256,
                 factor: float = 2.0, offset: float = 1.0, min_prob: float = 0.1, tree: bool = True,
                 corpus: str | tuple[str, ...] | None = None):
        super().__init__(target)
        check_options(cache, max_depth, max_cached, factor, offset, min_prob, tree, corpus)
        cache_class, tree_class = import_library()
        self.max_depth, self.max_cached = int(max_depth), int(max_cached)
        self.factor, self.offset, self.min_prob = float(factor), float(offset), float(min_prob)
        self.use_tree = tree
        self.identity = TokenizerIdentity.of(target)
        self.cache_label = None if cache is None else os.fspath(cache)
        self.cache_path = None if cache is None else resolve_cache(cache)
        stored = [] if self.cache_path is None else load_responses(self.cache_path, self.identity,
                                                                    self.cache_label)
        if self.cache_path is not None:
            check_writable(self.cache_path)  # before any work, not when the first response is saved
        self._unsaved: list[list[int]] = []  # responses not yet in the cache file, oldest first
        self.library = cache_class(max_tree_depth=self.max_depth, max_cached_requests=self.max_cached)
        check_internals(self.library, tree_class)
        self.finished: deque[list[int]] = deque(maxlen=self.max_cached)  # responses kept, oldest first
        self._ids = itertools.count()  # request ids in the library
        self._request: int | None = None  # the active request, once it proposed
        self._prompt_len = 0
        self._known = np.zeros(0, np.int32)  # the active request's prompt + output, as the library has it
        self._pending: list[int] = []  # tokens emitted since the latest `propose` (see `observe`)
        for response in stored[max(0, len(stored) - self.max_cached):]:
            self._replay(response)
        self.corpora = []
        if corpus is not None:
            from specframe_suffix.corpus import CorpusSource

            names = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
            self.corpora = [CorpusSource(name, target, self.max_depth, tree_class) for name in names]

    # --- drafting ----------------------------------------------------------------------------------

    def propose(self, context: DraftContext) -> DraftProposal:
        self._sync(context.tokens, context.prompt_len)
        if context.budget < 1:
            return DraftProposal.empty()
        return merge(self._drafts(context))

    def _drafts(self, context: DraftContext) -> list[SourceDraft]:
        """Each source's draft after the context (sources without a match give none)."""
        tokens, budget = context.tokens, context.budget
        window = np.ascontiguousarray(tokens[-self.max_depth:], dtype=np.int32)  # as the library's speculate
        drafts = [self._speculate(REQUEST, self.library._local_trees[self._request], window, budget)]
        if self.max_cached:
            drafts.append(self._speculate(RESPONSES, self.library._global_tree, window, budget))
        for corpus in self.corpora:
            drafts.append(corpus.draft(tokens, budget, self.factor, self.offset, self.min_prob))
        return [d for d in drafts if d is not None]

    def _speculate(self, source: int, tree, window: np.ndarray, budget: int) -> SourceDraft | None:
        draft = tree.speculate_ndarray(window, budget, self.factor, self.offset, self.min_prob, self.use_tree)
        token_ids = draft.token_ids  # each attribute read copies the native vector
        if not token_ids:
            return None
        return SourceDraft(source, token_ids, draft.parents, draft.probs, draft.match_len)

    def observe(self, outcome: StepOutcome) -> None:
        """Remember the emitted tokens. They reach the library at the next `propose` (from its context,
        which is what was really emitted) or when the request finishes (from the request's result, which
        excludes tokens emitted past EOS, a stop string or the length limit)."""
        self._pending.extend(outcome.emitted)

    def reset(self) -> None:
        """Called before each request: close the previous one, if `finish` did not (a request that raised,
        or direct use): its prompt is dropped and the tokens it emitted join the earlier responses."""
        self._close()

    def spawn(self) -> SuffixDrafter:
        """Another row's drafter: the same library (the tree of earlier responses, which learns every
        finished row, and the request ids), cache file and corpora; a request of its own."""
        other = copy.copy(self)
        other._request, other._prompt_len = None, 0
        other._known, other._pending = np.zeros(0, np.int32), []
        return other

    # --- requests in the library -------------------------------------------------------------------

    def _sync(self, tokens: np.ndarray, prompt_len: int) -> None:
        """Make the library's active request hold exactly `tokens`: start one at a request's first
        proposal (or when the context is not a continuation of the active one), else add what is new."""
        n = len(self._known)
        fresh = (self._request is None or prompt_len != self._prompt_len or len(tokens) < n
                 or not np.array_equal(tokens[:n], self._known))
        if fresh:
            if self._request is not None:  # a new request without `reset` (direct use)
                self._close()
            self._start(tokens[:prompt_len])
            n = prompt_len
        if len(tokens) > n:
            self._extend(tokens[n:])
        self._pending = []

    def _start(self, prompt) -> None:
        self._request = next(self._ids)
        self._known = np.ascontiguousarray(prompt, dtype=np.int32)
        self._prompt_len = len(self._known)
        self.library.start_request(self._request, self._known)

    def _extend(self, new) -> None:
        new = np.ascontiguousarray(new, dtype=np.int32)
        self.library.add_active_response(self._request, new)
        self._known = np.concatenate([self._known, new])

    def _replay(self, response: list[int]) -> None:
        """Add a stored response to the library's cache, as a request with no prompt."""
        if not response:
            return
        self._start([])
        self._extend(response)
        self.library.stop_request(self._request)
        self._request = None
        self.finished.append(list(response))

    def finish(self, prompt: Sequence[int], response: Sequence[int]) -> None:
        """The request ended with `response` (its exact new tokens): learn it, see `_close`."""
        self._close(response)

    def _close(self, tokens: Sequence[int] | None = None) -> None:
        """End the active request: the library drops its prompt and keeps its response among the earlier
        responses; with `cache=`, the cache file is rewritten. `tokens` (the request's new tokens, from
        `GenerationResult.tokens`) settle its exact end. A request that never proposed is recorded too."""
        if self._request is None:
            if not (tokens or self._pending):
                return
            self._start([])
        response = self._known[self._prompt_len:].tolist()
        tail = self._pending
        if tokens is not None:
            tokens = [int(t) for t in tokens]
            if tokens[: len(response)] == response:
                tail = tokens[len(response):]
        if tail:
            self._extend(tail)
        self.library.stop_request(self._request)
        response = self._known[self._prompt_len:].tolist()
        self._request, self._pending, self._known = None, [], np.zeros(0, np.int32)
        if self.max_cached and response:
            self.finished.append(response)
            self._save(response)

    def remember(self, prompt: Sequence[int], response: Sequence[int]) -> None:
        """Keep `response` among the earlier responses, as `finish` keeps a request this drafter saw (a
        resumed benchmark replays its recorded requests here). The library keeps responses, not prompts;
        with `cache=`, the cache file is rewritten."""
        self._close()
        if not (self.max_cached and len(response)):
            return
        self._replay([int(t) for t in response])
        self._save(self.finished[-1])

    def _save(self, response: list[int]) -> None:
        """With `cache=`, add `response` (and any an earlier save failed to write) to the cache file. A
        failure only warns: the request's result is there already, and the responses stay in memory to
        be saved with the next one."""
        if self.cache_path is None:
            return
        self._unsaved = [*self._unsaved, response][-self.max_cached:]
        try:
            append_responses(self.cache_path, self.identity, self._unsaved, self.max_cached, self.cache_label)
        except (OSError, SuffixCacheError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            warnings.warn(SpecframeWarning(
                f"drafter 'suffix': could not save {len(self._unsaved)} response(s) to the cache "
                f"{self.cache_path} ({reason}); they stay in memory and are saved with the next request "
                "(free space or fix the directory's permissions)"), stacklevel=2)
            return
        self._unsaved = []

    def stats(self) -> dict:
        """Responses and tokens kept, and the library's estimate of its trees' memory (walks every tree:
        call it between requests, not per step): `memory_bytes` for the request and earlier responses,
        `corpus_memory_bytes` for the corpora loaded into suffix trees (see `specframe_suffix.corpus`)."""
        trees = [self.library._global_tree, *self.library._local_trees.values()]
        return {
            "responses": len(self.finished),
            "tokens": sum(len(r) for r in self.finished),
            "active_tokens": len(self._known),
            "memory_bytes": int(sum(t.estimate_memory() for t in trees)),
            "corpus_memory_bytes": sum(corpus.memory_bytes for corpus in self.corpora),
            "cache": None if self.cache_path is None else str(self.cache_path),
        }


def check_options(cache, max_depth, max_cached, factor, offset, min_prob, tree, corpus) -> None:
    """Refuse option values of the wrong type or range, naming the option."""
    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def real(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    problems = []
    if not integer(max_depth) or not 1 <= max_depth <= 4096:
        problems.append(f"max_depth must be an integer from 1 to 4096, got {max_depth!r}")
    if not integer(max_cached) or not 0 <= max_cached < 2**31:
        problems.append(f"max_cached must be an integer >= 0 (0: no earlier responses), got {max_cached!r}")
    if not real(factor) or factor < 0:
        problems.append(f"factor must be a number >= 0, got {factor!r}")
    if not real(offset):
        problems.append(f"offset must be a finite number, got {offset!r}")
    if not real(min_prob) or not 0 <= min_prob <= 1:
        problems.append(f"min_prob must be a number in [0, 1], got {min_prob!r}")
    if not isinstance(tree, bool):
        problems.append(f"tree must be True or False, got {tree!r}")
    if cache is not None and not isinstance(cache, (str, os.PathLike)):
        problems.append(f"cache must be a name or a path, got {cache!r}")
    names = [corpus] if isinstance(corpus, (str, os.PathLike)) else corpus
    if corpus is not None and (not isinstance(names, (list, tuple)) or not names
                               or not all(isinstance(n, (str, os.PathLike)) for n in names)):
        problems.append(f"corpus must be a datastore name or path, or a tuple of them, got {corpus!r}")
    if cache is not None and integer(max_cached) and max_cached == 0:
        problems.append("cache= keeps earlier responses, so it needs max_cached >= 1")
    if problems:
        raise ConfigurationError("drafter 'suffix': " + "; ".join(problems))
