"""Assembling a pipeline from component names, with capability checks that fail loudly."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from specframe.errors import CapabilityError, SpecframeWarning, UnsupportedModelError
from specframe.interfaces import Drafter, StateBackend, TreeBuilder, Verifier
from specframe.models import Target
from specframe.options import check_options
from specframe.registry import ComponentSpec, PluginRegistry, get_registry
from specframe.sampling import SamplingParams


@dataclass
class Pipeline:
    """The four components of one speculative decoder, already checked to fit together."""

    drafter: Drafter
    tree_builder: TreeBuilder
    verifier: Verifier
    backend: StateBackend


def check_compatible(target: Target, drafter: type[Drafter], tree: type[TreeBuilder],
                     verifier: type[Verifier], backend: type[StateBackend],
                     sampling: SamplingParams) -> None:
    """Raise `CapabilityError` listing every mismatch between the chosen component classes."""
    reason = backend.unsupported_reason(target)
    if reason:
        raise UnsupportedModelError(f"backend '{backend.name}' cannot serve model '{target.name}': {reason}")
    problems = []
    d, t, v, b = drafter.capabilities, tree.capabilities, verifier.capabilities, backend.capabilities
    if d.needs_hidden_states and not b.provides_hidden_states:
        problems.append(f"drafter '{drafter.name}' needs target hidden states, which backend "
                        f"'{backend.name}' does not provide")
    if v.needs_draft_probs and not d.provides_draft_probs:
        problems.append(f"verifier '{verifier.name}' needs draft probabilities, which drafter "
                        f"'{drafter.name}' does not provide (use 'sample-match' or 'greedy')")
    if v.needs_draft_probs and not t.keeps_draft_probs:
        problems.append(f"verifier '{verifier.name}' needs draft probabilities, which tree builder "
                        f"'{tree.name}' drops")
    if (v.uses_draft_probs and d.samples_drafts and not sampling.greedy
            and not (t.keeps_draw_order and t.keeps_draft_probs)):
        problems.append(
            f"tree builder '{tree.name}' chooses among the drafts that drafter '{drafter.name}' samples by "
            f"their scores, so the kept drafts are no longer draws from q and verifier '{verifier.name}' "
            "would be biased; with sampled drafts use tree 'chain', 'trie' or 'static' (they keep a "
            f"draw-order prefix), or verify '{tree.name}' trees with 'sample-match'")
    if t.needs_score_kind is not None and d.score_kind is not t.needs_score_kind:
        problems.append(f"tree builder '{tree.name}' ranks nodes by {t.needs_score_kind.value} scores, but "
                        f"drafter '{drafter.name}' scores by {d.score_kind.value}; use a tree builder that "
                        "takes any score, such as 'chain'")
    if not b.supports_trees and d.proposes_trees and not t.makes_chains:
        problems.append(f"backend '{backend.name}' scores chains only, but drafter '{drafter.name}' proposes "
                        f"trees and tree builder '{tree.name}' may keep them; use the tree builder 'chain'")
    if t.needs_draft_probs and not d.provides_draft_probs:
        problems.append(f"tree builder '{tree.name}' expands by draft probabilities, which drafter "
                        f"'{drafter.name}' does not provide")
    if not sampling.greedy and not v.supports_sampling:
        problems.append(f"verifier '{verifier.name}' is greedy only, but temperature is "
                        f"{sampling.temperature} (use 'sample-match', 'rejection' or temperature 0)")
    if problems:
        raise CapabilityError("these components do not fit together: " + "; ".join(problems))
    if not sampling.greedy and not v.lossless:
        warnings.warn(SpecframeWarning(
            f"verifier '{verifier.name}' is lossy: at temperature {sampling.temperature} the output does not "
            "follow the target model's distribution; use 'sample-match' or 'rejection' for lossless "
            "sampling"), stacklevel=3)


def assemble(target: Target, drafter: str | ComponentSpec = "pld", tree: str | ComponentSpec = "chain",
             verifier: str | ComponentSpec = "greedy", backend: str | ComponentSpec = "kv",
             sampling: SamplingParams | None = None, registry: PluginRegistry | None = None) -> Pipeline:
    """Look up, check and instantiate the four components. Names may carry options: `pld(max_ngram=4)`."""
    registry = registry or get_registry()
    sampling = sampling or SamplingParams()
    specs = [s if isinstance(s, ComponentSpec) else ComponentSpec.parse(s)
             for s in (drafter, tree, verifier, backend)]
    kinds = ("drafter", "tree builder", "verifier", "backend")
    classes = [registry.get(kind, spec.name) for kind, spec in zip(kinds, specs)]
    check_compatible(target, *classes, sampling)
    d_cls, t_cls, v_cls, b_cls = classes
    d_spec, t_spec, v_spec, b_spec = specs
    return Pipeline(
        drafter=_construct("drafter", d_cls, d_spec, target),
        tree_builder=_construct("tree builder", t_cls, t_spec),
        verifier=_construct("verifier", v_cls, v_spec),
        backend=_construct("backend", b_cls, b_spec, target,
                           want_hidden=d_cls.capabilities.needs_hidden_states),
    )


def _construct(kind: str, cls: type, spec: ComponentSpec, *args, **kwargs):
    """Instantiate a component after checking its options against the constructor's signature."""
    check_options(kind, cls, spec.options)
    return cls(*args, **kwargs, **spec.options)
