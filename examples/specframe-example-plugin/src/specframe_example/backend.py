"""`recompute`: a state backend whose only state is the list of committed token ids.

Each `score` runs the committed tokens, the pending root and the packed tree through the model in one
forward pass, with no cache: an explicit 4D mask (committed tokens see the ones before them; each tree
entry sees every committed token, its ancestors and itself) and explicit position ids (a node sits at
its depth after the root). Slow, since every step recomputes the whole sequence, and obviously right:
the smallest complete example of the `StateBackend` contract, and a reference for faster backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specframe import BackendCapabilities, StateBackend, TargetScores, TokenTree

if TYPE_CHECKING:  # torch is imported in the methods that use it
    import torch

# Layer types a mask and position ids fully describe: attention over every earlier token, or no state.
SERVED_TYPES = {"full_attention", "mlp", "moe"}
# Families whose configs list no layer types and whose layers are all full attention.
UNTYPED_ATTENTION_ONLY = ("llama", "mistral", "qwen2")


class RecomputeBackend(StateBackend):
    name = "recompute"
    # prefill assigns a new token list, so copies of the backend, each prefilled, decode independent rows
    capabilities = BackendCapabilities(supports_trees=True, provides_hidden_states=True,
                                       fresh_state_per_copy=True)

    def __init__(self, target, *, want_hidden: bool = False):
        super().__init__(target, want_hidden=want_hidden)  # unknown options raise a clear error
        self.committed: list[int] = []  # the tokens whose effect is the state
        self.pending: int | None = None  # the last emitted token: the root of the next tree

    @classmethod
    def unsupported_reason(cls, target) -> str | None:
        layer_types = getattr(target.config, "layer_types", None)
        model_type = getattr(target.config, "model_type", "")
        if not layer_types and model_type not in UNTYPED_ATTENTION_ONLY:
            return (f"its config lists no layer types and its model type '{model_type}' is not one known to "
                    f"be attention only ({', '.join(UNTYPED_ATTENTION_ONLY)}): its layers may keep state "
                    "that a 4D attention mask does not restrict to a node's ancestors")
        others = sorted(set(layer_types or []) - SERVED_TYPES)
        if others:
            return (f"it has {others} layers, which a 4D attention mask cannot restrict to a node's "
                    "ancestors; only full-attention models are served")
        return None

    @property
    def committed_length(self) -> int:
        return len(self.committed)

    def prefill(self, ids: list[int]) -> None:
        self.committed, self.pending = [int(t) for t in ids[:-1]], int(ids[-1])

    def score(self, tree: TokenTree) -> TargetScores:
        import torch  # here, not at the top: `specframe plugins` and `--help` import this module

        prefix, device = len(self.committed), self.target.device
        ids = torch.tensor([self.committed + [self.pending] + tree.tokens.tolist()], device=device)  # (1, S)
        positions = np.concatenate([np.arange(prefix), prefix + tree.position_offsets])  # (S,)
        with torch.inference_mode():
            out = self.target.model(input_ids=ids, position_ids=torch.from_numpy(positions)[None].to(device),
                                    attention_mask=self._mask(prefix, tree), use_cache=False,
                                    output_hidden_states=self.want_hidden)
        logits = out.logits[0, prefix:].float()  # (T, V): the root, then node i at row i + 1
        hidden = out.hidden_states[-1][0, prefix:] if self.want_hidden else None  # (T, H)
        return self.issue(TargetScores(logits=logits, hidden=hidden, tree=tree))

    def _mask(self, prefix: int, tree: TokenTree) -> torch.Tensor:
        """(1, 1, S, S) additive mask over S = prefix + T entries: causal, except that packed tree entries
        see each other only along ancestor paths."""
        import torch

        size = prefix + len(tree) + 1
        allowed = torch.ones(size, size, dtype=torch.bool).tril()  # (S, S)
        allowed[prefix:, prefix:] = torch.from_numpy(tree.ancestor_mask)  # (T, T)
        dtype = self.target.model.dtype
        mask = torch.zeros(size, size, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(self.target.device)

    def commit(self, scored: TargetScores, path: list[int], bonus: int) -> None:
        self.redeem(scored)  # ValueError unless these are the latest scores, not committed yet
        self.committed += [self.pending, *scored.tree.tokens[path].tolist()]
        self.pending = int(bonus)
