"""The checks a decoding request passes before any work, whoever takes it: `specframe generate` before it
loads the model, `SpeculativeDecoder.generate` before it decodes. Both refuse the same input with the
same message; what needs the model (token ids in its vocabulary, its context length) the decoder checks
after these."""

from __future__ import annotations

from collections.abc import Sequence

from specframe.terms.errors import ConfigurationError, PromptError


def check_request_input(prompt: str | Sequence[int], max_new_tokens: int, stop: str | Sequence[str], *,
                        stop_name: str = "stop") -> tuple[str, ...]:
    """Refuse a text prompt that is empty or not valid UTF-8, a `max_new_tokens` below 1 and stop strings
    that are empty or not text; return the stop strings as a tuple (`stop="abc"` is one stop string).
    `stop_name` is what the caller calls the stop strings in its messages (`--stop` on the command line)."""
    if isinstance(prompt, str):
        check_text(prompt, "the prompt")
        if not prompt.strip():
            raise PromptError("the prompt is empty: give some text to continue")
    if max_new_tokens <= 0:
        raise ConfigurationError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise ConfigurationError(
            f'stop strings must be non-empty text, got {list(stop)!r}: {stop_name} "" would stop after the '
            f"first token, since every text contains the empty string; give a non-empty stop string, or "
            f"leave {stop_name} out")
    for s in stop:
        check_text(s, f"a {stop_name} string")
    return stop


def check_text(text: str, what: str) -> None:
    """Refuse text that is not valid UTF-8. On Linux, argv bytes that are not UTF-8 arrive as lone
    surrogates (Python's surrogateescape), which tokenizers reject with an obscure TypeError; guessing
    another encoding or replacing the bytes would silently change what the model is asked."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape")
        bad = " ".join(f"0x{ord(c) - 0xDC00:02x}" for c in text if "\udc80" <= c <= "\udcff")
        raise PromptError(
            f"{what} is not valid UTF-8 text: {raw[:40]!r} holds the byte(s) {bad or '(a lone surrogate)'}; "
            "pass UTF-8 text (convert it first, e.g. `iconv -f latin1 -t utf-8`)") from None
