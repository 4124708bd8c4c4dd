"""`Target`: the target model with its tokenizer, what drafters and backends are built around
(`specframe.runtime.load.load_target` makes one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Target:
    """The target model with its tokenizer: what drafters and backends are built around."""

    model: torch.nn.Module
    tokenizer: object  # a transformers tokenizer, or None for tiny test models
    name: str

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30) or (1 << 30))

    @property
    def eos_token_ids(self) -> set[int]:
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        if ids is None:
            ids = getattr(self.model.config, "eos_token_id", None)
        if ids is None:
            return set()
        return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])}
