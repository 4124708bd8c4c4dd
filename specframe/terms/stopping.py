"""Stop strings, found by decoding only the end of the output.

Decoding the whole output after each emitted token costs time that grows with the output: on SmolLM2's
tokenizer, a noticeable share of a CPU step after a few thousand tokens; decoding the tail costs the same
small time at any length. A stop string that ends in this step's tokens starts at most its own length in
characters before them, so that many characters' worth of earlier tokens is all that needs decoding
(`tests/core/terms/test_stopping.py` checks the result against decoding everything).
"""

from __future__ import annotations

from collections.abc import Sequence

# Every token decodes to at least one byte (byte-level BPE, or SentencePiece's byte fallback) and a
# character takes at most four, so this many tokens per character of the longest stop string, plus a
# margin for tokens that decode to nothing and for a character cut at the window's start, cover it.
BYTES_PER_CHAR, MARGIN = 4, 8


class StopStrings:
    """Where the output first holds one of `stops`, checked one step at a time."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer, self.stops = tokenizer, tuple(stops)
        self.window = BYTES_PER_CHAR * max((len(s) for s in self.stops), default=0) + MARGIN

    def first_hit(self, new: Sequence[int], emitted: Sequence[int]) -> int | None:
        """The index of the first of `emitted` after which the text holds a stop string, or None.

        `new` is the output before this step and must hold none (the loop stops at the first).
        """
        if not self.stops:
            return None
        tail = list(new[max(0, len(new) - self.window):])
        for i in range(len(emitted)):
            text = self.tokenizer.decode(tail + list(emitted[: i + 1]))
            if any(s in text for s in self.stops):
                return i
        return None
