"""specframe: try, combine and compare speculative decoding methods.

Importing specframe loads no plugin; components are discovered from the `specframe` entry-point group on
first use. Typical use::

    import specframe
    result = specframe.generate("def fib(n):", drafter="pld", tree="chain", verifier="greedy")
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specframe.decode.loop import DEFAULT_BUDGET, SpeculativeDecoder, generate
    from specframe.terms.errors import (
        CapabilityError, ConfigurationError, DrafterError, DuplicateComponentError, ModelLoadError,
        PromptError, SpecframeError, SpecframeWarning, UnknownComponentError, UnsupportedModelError,
    )
    from specframe.contract.extensions import CliOption, ModelRecipe, Preset
    from specframe.contract.hookspecs import hookimpl
    from specframe.contract.interfaces import (
        BackendCapabilities, BatchBackend, BuildContext, Drafter, DrafterCapabilities, RowByRow, StateBackend,
        TreeBuilder, TreeBuilderCapabilities, Verifier, VerifierCapabilities,
    )
    from specframe.contract.peers import Peer, PeerSpec
    from specframe.terms.cost import CostModel, PolynomialCost
    from specframe.terms.kinds import ComponentKind
    from specframe.terms.metrics import DecodeMetrics
    from specframe.plugging.models import load_target
    from specframe.terms.target import Target
    from specframe.plugging.pipeline import Pipeline, assemble
    from specframe.terms.proposal import DraftContext, DraftProposal, DrawMethod, ScoreKind
    from specframe.terms.records import StepEvent, StepOutcome, TargetScores, VerifyResult
    from specframe.terms.result import GenerationResult, StreamDelta
    from specframe.plugging.registry import PluginRegistry, get_registry
    from specframe.plugging.specs import ComponentSpec
    from specframe.terms.sampling import Sampler, SamplingParams
    from specframe.terms.tree import TokenTree

__version__ = "0.1.0"

# Where each public name lives. They are imported on first use (PEP 562), so that `import specframe`, a
# plugin's registration and `specframe --help` load neither torch nor transformers.
_EXPORTS = {
    "specframe.decode.loop": ("DEFAULT_BUDGET", "SpeculativeDecoder", "generate"),
    "specframe.terms.errors": ("CapabilityError", "ConfigurationError", "DrafterError",
                               "DuplicateComponentError", "ModelLoadError", "PromptError", "SpecframeError",
                               "SpecframeWarning", "UnknownComponentError", "UnsupportedModelError"),
    "specframe.contract.extensions": ("CliOption", "ModelRecipe", "Preset"),
    "specframe.contract.hookspecs": ("hookimpl",),
    "specframe.contract.interfaces": ("BackendCapabilities", "BatchBackend", "BuildContext", "Drafter",
                                      "DrafterCapabilities", "RowByRow", "StateBackend", "TreeBuilder",
                                      "TreeBuilderCapabilities", "Verifier", "VerifierCapabilities"),
    "specframe.contract.peers": ("Peer", "PeerSpec"),
    "specframe.terms.cost": ("CostModel", "PolynomialCost"),
    "specframe.terms.kinds": ("ComponentKind",),
    "specframe.terms.metrics": ("DecodeMetrics",),
    "specframe.plugging.models": ("load_target",),
    "specframe.terms.target": ("Target",),
    "specframe.plugging.pipeline": ("Pipeline", "assemble"),
    "specframe.terms.proposal": ("DraftContext", "DraftProposal", "DrawMethod", "ScoreKind"),
    "specframe.terms.records": ("StepEvent", "StepOutcome", "TargetScores", "VerifyResult"),
    "specframe.terms.result": ("GenerationResult", "StreamDelta"),
    "specframe.plugging.registry": ("PluginRegistry", "get_registry"),
    "specframe.plugging.specs": ("ComponentSpec",),
    "specframe.terms.sampling": ("Sampler", "SamplingParams"),
    "specframe.terms.tree": ("TokenTree",),
    "specframe.terms.constraint": ("Constraint", "ConstraintError", "ConstraintState"),
    "specframe.runtime.structured": ("constraint_for",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'specframe' has no attribute '{name}'")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


__all__ = [
    "assemble", "BackendCapabilities", "BatchBackend", "BuildContext", "CapabilityError", "CliOption",
    "ComponentKind",
    "ComponentSpec", "ConfigurationError", "Constraint", "ConstraintError", "ConstraintState",
    "constraint_for", "CostModel", "DecodeMetrics", "DEFAULT_BUDGET", "DraftContext",
    "Drafter", "DrafterCapabilities", "DrafterError", "DraftProposal", "DrawMethod",
    "DuplicateComponentError", "generate",
    "GenerationResult", "StreamDelta", "get_registry", "hookimpl", "load_target", "ModelLoadError",
    "ModelRecipe",
    "Peer", "PeerSpec", "Pipeline", "PluginRegistry", "PolynomialCost", "Preset", "PromptError", "RowByRow",
    "Sampler",
    "SamplingParams", "ScoreKind", "SpecframeError", "SpecframeWarning", "SpeculativeDecoder", "StateBackend",
    "StepEvent",
    "StepOutcome", "Target", "TargetScores", "TokenTree", "TreeBuilder", "TreeBuilderCapabilities",
    "UnknownComponentError", "UnsupportedModelError", "Verifier", "VerifierCapabilities", "VerifyResult",
]
