"""specframe: try, combine and compare speculative decoding methods.

Importing specframe loads no plugin; components are discovered from the `specframe` entry-point group on
first use. Typical use::

    import specframe
    result = specframe.generate("def fib(n):", drafter="pld", tree="chain", verifier="greedy")
"""

from specframe.decoding import DEFAULT_BUDGET, GenerationResult, SpeculativeDecoder, generate
from specframe.errors import (
    CapabilityError, ConfigurationError, DuplicateComponentError, ModelLoadError, PromptError,
    SpecframeError, UnknownComponentError, UnsupportedModelError,
)
from specframe.hookspecs import hookimpl
from specframe.interfaces import (
    BackendCapabilities, Drafter, DrafterCapabilities, StateBackend, TreeBuilder, TreeBuilderCapabilities,
    Verifier, VerifierCapabilities,
)
from specframe.metrics import DecodeMetrics
from specframe.models import Target, load_target
from specframe.pipeline import Pipeline, assemble
from specframe.records import (
    DraftContext, DraftProposal, DrawMethod, ScoreKind, StepEvent, StepOutcome, TargetScores, VerifyResult,
)
from specframe.registry import ComponentSpec, PluginRegistry, get_registry
from specframe.sampling import Sampler, SamplingParams
from specframe.tree import TokenTree

__version__ = "0.1.0"

__all__ = [
    "BackendCapabilities", "CapabilityError", "ComponentSpec", "ConfigurationError", "DEFAULT_BUDGET",
    "DecodeMetrics", "DraftContext", "DraftProposal", "Drafter", "DrafterCapabilities", "DrawMethod",
    "DuplicateComponentError", "GenerationResult", "ModelLoadError", "Pipeline", "PluginRegistry",
    "PromptError", "Sampler", "SamplingParams", "ScoreKind", "SpecframeError", "SpeculativeDecoder", "StateBackend",
    "StepEvent", "StepOutcome", "Target", "TargetScores", "TokenTree", "TreeBuilder",
    "TreeBuilderCapabilities", "UnknownComponentError", "UnsupportedModelError", "Verifier",
    "VerifierCapabilities", "VerifyResult", "assemble", "generate", "get_registry", "hookimpl", "load_target",
]
