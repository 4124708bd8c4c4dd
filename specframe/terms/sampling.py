"""Sampling controls shared by plain decoding, bonus tokens and every sampling verifier.

There is one implementation of temperature / top-k / top-p (`Sampler.probs`), so that a speculative
run and a plain run draw from exactly the same processed target distribution p.

Randomness comes from one seeded `torch.Generator` per request, and every random decision is made from
uniform numbers (`Sampler.uniform`): a token is drawn by inverse CDF with exactly one uniform
(`Sampler.draw`). So a seeded run is reproducible, and a verifier that draws one token per emitted token
(`sample-match`) emits the same tokens as plain sampling with the same seed, up to floating-point
differences between tree-scored and sequentially-scored logits. Drafters that sample their drafts use a
second generator derived from the same seed (`Sampler.draw_drafts`), so drafting never shifts the
verifier's stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from specframe.terms.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from specframe.terms.constraint import ConstraintState


SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
DRAFT_SEED_OFFSET = 0x5EED  # the drafting generator's seed is the request's seed plus this
DraftDraw = Literal["auto", "top-k", "sample"]
"""The values of the `draw` option of drafters with real probabilities: `auto` samples drafts when the
request samples, `top-k` always takes the most likely, `sample` always draws (see `samples_drafts`)."""
DRAFT_DRAWS = get_args(DraftDraw)


def check_draw(component: str, draw: str) -> str:
    """Validate a drafter's `draw` option at construction; returns it."""
    if draw not in DRAFT_DRAWS:
        raise ConfigurationError(f"{component}: draw must be one of {', '.join(DRAFT_DRAWS)}, got {draw!r} "
                                 "(auto samples drafts when the request samples)")
    return draw


def samples_drafts(draw: str, sampler: Sampler | None) -> bool:
    """Whether a drafter with option `draw` samples its drafts for this request.

    `auto` samples when the request samples (temperature > 0), so the `rejection` verifier can accept a
    draft with probability min(1, p/q); greedy requests keep deterministic top-k drafts, which verify
    best against an argmax. `top-k` and `sample` force one way.
    """
    if draw == "auto":
        return sampler is not None and not sampler.greedy
    return draw == "sample" and sampler is not None


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1 switch those filters off.

    The filters apply in the order of Hugging Face's `generate`: temperature, then top-k, then top-p.
    Under a constraint (structured output) the target's logits are first masked to the tokens it allows
    (`specframe.terms.constraint`), then these filters apply: mask, temperature, top-k, top-p, in that
    order, and greedy is the argmax of the masked logits.
    `seed` None draws a fresh seed per request (see `Sampler.initial_seed` to reproduce it).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not (
                math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigurationError(
                f"sampling: temperature must be a finite number >= 0, got {self.temperature!r}; "
                "use 0 for greedy decoding or e.g. 0.7 for sampling (--temperature)")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not (
                0 < self.top_p <= 1):
            raise ConfigurationError(
                f"sampling: top_p must be in (0, 1], got {self.top_p!r}; use 1 to switch nucleus "
                "filtering off or e.g. 0.9 to keep the smallest set of tokens holding 90% of the mass "
                "(--top-p)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigurationError(
                f"sampling: top_k must be an integer >= 0, got {self.top_k!r}; use 0 to switch top-k "
                "filtering off or e.g. 50 to keep the 50 most likely tokens (--top-k)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigurationError(f"sampling: seed must be an integer or None, got {self.seed!r} (--seed)")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ConfigurationError(
                f"sampling: seed must fit in 64 bits (from -2**63 to 2**64 - 1), got {self.seed}; "
                "pass a --seed in that range, e.g. 1234")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def argmax(logits: torch.Tensor) -> int:
    """The index of the largest of (V,) `logits`, the first on ties (and the first NaN, if any), as
    `torch.argmax` gives it. On the CPU numpy's vectorised argmax is used: over SmolLM2's 49152 logits it
    takes a tenth of the time torch's takes (one thread), and the greedy verifier reduces one row per
    emitted token."""
    import torch

    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and logits.dim() == 1:
        return int(logits.detach().numpy().argmax())
    return int(logits.argmax())


class Sampler:
    """Turns target logits into the processed distribution p and draws from it with a seeded generator.

    `constraint` is the request's constraint state at the current root (None: unconstrained), kept up to
    date by the decoder after every step: drafters read it (`forced` proposes what it forces). The logits
    a sampler receives under a constraint are already masked, so `probs` applies the mask before
    temperature, top-k and top-p (see `SamplingParams`)."""

    def __init__(self, params: SamplingParams | None = None, device: str | torch.device = "cpu",
                 constraint: ConstraintState | None = None):
        import torch

        self.constraint = constraint
        self.params = params or SamplingParams()
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        if self.params.seed is not None:
            self.generator.manual_seed(self.params.seed)
        else:
            self.generator.seed()
        self.initial_seed = self.generator.initial_seed()  # pass as `seed` to replay this request
        self.draft_generator = torch.Generator(device=self.device)
        self.draft_generator.manual_seed((self.initial_seed + DRAFT_SEED_OFFSET) % 2**63)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p (logits a
        constraint forbids arrive as -inf, masked before these filters, and keep probability 0).

        Greedy (temperature 0) gives the one-hot distribution of the argmax (first index on ties, as
        `sample` and the greedy verifier). top-k keeps every token tied with the k-th; top-p keeps the
        smallest set of most likely tokens whose mass reaches top_p (always at least one token).
        """
        import torch

        logits = logits.float()
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        logits = logits / self.params.temperature
        if self.params.top_k and self.params.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.params.top_k, dim=-1).values[..., -1:]  # (..., 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.params.top_p < 1:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
            sorted_probs = sorted_logits.softmax(-1)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs  # (..., V) mass of strictly better tokens
            drop_sorted = mass_before >= self.params.top_p  # never drops the first token
            drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(-1)

    def uniform(self) -> float:
        """One number from U[0, 1), from this request's generator."""
        import torch

        return float(torch.rand((), generator=self.generator, device=self.device, dtype=torch.float64))

    def draw(self, probs: torch.Tensor) -> int:
        """One token from a (V,) distribution (need not be normalized) by inverse CDF with one uniform.

        Tokens with zero probability are never drawn.
        """
        import torch

        cdf = probs.to(torch.float64).cumsum(-1)  # (V,)
        total = cdf[-1]
        if not total > 0:
            raise ValueError("Sampler.draw: the distribution has no mass (all probabilities are zero)")
        u = torch.rand((), generator=self.generator, device=self.device, dtype=torch.float64)
        index = int(torch.searchsorted(cdf, u * total, right=True))  # first i with cdf[i] > u * total
        if index >= len(cdf):  # u * total rounded up to total: take the last token with mass
            index = int(torch.nonzero(probs > 0)[-1])
        return index

    def draw_drafts(self, probs: torch.Tensor, n: int) -> list[list[int]]:
        """`n` i.i.d. draft draws from each row of (R, V) `probs`, merged at their first appearance.

        Row r gives the distinct tokens in the order they were first drawn: the order the `rejection`
        verifier needs (see `DrawMethod`). Draws come from the drafting generator, not the verifier's.
        """
        import torch

        draws = torch.multinomial(probs.float(), n, replacement=True,
                                  generator=self.draft_generator)  # (R, n)
        return [list(dict.fromkeys(row)) for row in draws.tolist()]

    def sample(self, logits: torch.Tensor) -> int:
        """One token from (V,) logits: argmax when greedy, else a draw from `probs(logits)`."""
        if self.greedy:
            return argmax(logits)
        return self.draw(self.probs(logits))
