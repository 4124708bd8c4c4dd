"""What the decoder checks of a constraint (structured output) before any work.

Masking the target's logits before the verifier sees them (`RequestRow.masked`) makes every verifier
verify against the constrained law, since verifiers read only logits; what can still go wrong is a
constraint that is not one, one compiled for a larger vocabulary than the target's, and a backend that
declares it cannot take part (`BackendCapabilities.honours_constraints`: a backend that decodes on its own
and returns no logits to mask).
"""

from __future__ import annotations

from specframe.plugging.pipeline import Pipeline
from specframe.terms.constraint import Constraint, ConstraintError
from specframe.terms.target import Target


def check_constraint(constraint: Constraint, pipeline: Pipeline, target: Target) -> None:
    """Refuse (`ConstraintError`) a `constraint` that `pipeline` on `target` cannot honour."""
    if not isinstance(constraint, Constraint):
        raise ConstraintError(
            f"constraint must be a specframe Constraint, got {type(constraint).__name__}: make one with "
            "specframe.constraint_for(target, json_schema=... | regex=... | grammar=...)")
    if constraint.vocab_size > target.vocab_size:
        raise ConstraintError(
            f"constraint {constraint.describe()} was compiled for a vocabulary of {constraint.vocab_size} "
            f"tokens but model '{target.name}' has {target.vocab_size} logits: compile it with this model's "
            "tokenizer (specframe.constraint_for(target, ...))")
    backend = pipeline.backend
    if not backend.capabilities.honours_constraints:
        raise ConstraintError(
            f"backend '{backend.name}' declares that it cannot honour a constraint (it returns no logits to "
            "mask: BackendCapabilities.honours_constraints=False): decode structured output with another "
            "backend, or without --json-schema / --regex / --grammar")
