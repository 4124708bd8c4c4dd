"""`ssm-tree` and `ssm-unrolled`: state backends for Mamba2, Mamba-1, gated DeltaNet, LFM2 and hybrid models.

`ssm-tree` verifies a packed token tree in one forward with STree's tree scan (Wu et al., "STree:
Speculative Tree Decoding for Hybrid State-Space Models"); `ssm-unrolled` is the paper's baseline,
running every root-to-leaf path as its own sequence in a batch. Both offer a `cost_model()` (a core
`PolynomialCost` in the packed tree size) that the decode loop passes to tree builders.
"""

from __future__ import annotations

import specframe
from specframe_ssm.backend import SSMTreeBackend
from specframe_ssm.cost import calibrate, full_binary_tree
from specframe_ssm.unrolled import SSMUnrolledBackend

__all__ = ["SSMTreeBackend", "SSMUnrolledBackend", "calibrate", "full_binary_tree"]


@specframe.hookimpl
def register_state_backends(register):
    register(SSMTreeBackend)
    register(SSMUnrolledBackend)
