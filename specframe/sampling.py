"""Sampling controls shared by plain decoding, bonus tokens and every sampling verifier.

There is one implementation of temperature / top-k / top-p (`Sampler.probs`), so that a speculative
run and a plain run draw from exactly the same processed target distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specframe.errors import ConfigurationError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ConfigurationError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigurationError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigurationError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Turns target logits into the processed distribution p and draws from it with a seeded generator."""

    def __init__(self, params: SamplingParams | None = None, device: str | torch.device = "cpu"):
        self.params = params or SamplingParams()
        self.generator = torch.Generator(device=device)
        if self.params.seed is not None:
            self.generator.manual_seed(self.params.seed)
        else:
            self.generator.seed()

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p.

        Greedy (temperature 0) gives the one-hot distribution of the argmax.
        """
        logits = logits.float()
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        logits = logits / self.params.temperature
        if self.params.top_k:
            k = min(self.params.top_k, logits.shape[-1])
            kth = torch.topk(logits, k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.params.top_p < 1:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            drop_sorted = cumulative - sorted_logits.softmax(-1) >= self.params.top_p  # keeps the first token
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token from a (V,) distribution."""
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def sample(self, logits: torch.Tensor) -> int:
        """One token from (V,) logits: argmax when greedy, else a draw from `probs(logits)`."""
        if self.greedy:
            return int(logits.argmax())
        return self.draw(self.probs(logits))
