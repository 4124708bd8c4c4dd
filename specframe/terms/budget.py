"""What a decoder's budget says: a number of tree nodes filled every step, or `auto` / `auto:CAP`
(adaptive speculation, `docs/explanation/adaptive-speculation.md`). Parsed by one function, which the
command line calls before it loads a model and the decoder when it is made."""

from __future__ import annotations

from specframe.terms.errors import ConfigurationError

# Default cap of `budget="auto"`. The planner rarely keeps more than 16 nodes on a CPU, but long copies
# (extraction, translation, code) pay past 16: replayed, 24 raised tau 1-3 % over 16 on Spec-Bench,
# HumanEval and best-of-8 replays, and 32 added nothing.
AUTO_CAP = 24
MAX_BUDGET = 4096  # nodes a step may fill: its tree's attention mask is budget x context


def parse_budget(budget: int | str) -> tuple[int, bool]:
    """(cap, adaptive) from a budget: a node count, `"auto"` or `"auto:CAP"`."""
    text = str(budget).strip().lower()
    adaptive = text == "auto" or text.startswith("auto:")
    number = (text.partition(":")[2] or str(AUTO_CAP)) if adaptive else text
    try:
        cap = int(number)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ConfigurationError(
            "budget must be a number of tree nodes >= 1, 'auto' or 'auto:CAP' (e.g. auto:24), "
            f"got {budget!r}; for plain decoding use the drafter 'none'")
    if cap > MAX_BUDGET:
        raise ConfigurationError(f"budget {budget!r} is more tree nodes than a step can verify; pass at most "
                                 f"{MAX_BUDGET}")
    return cap, adaptive
