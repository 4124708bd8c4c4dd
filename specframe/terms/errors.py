"""Exception classes. Every message names the component, what was wrong and how to fix it."""

from __future__ import annotations

import errno
import os


class SpecframeError(Exception):
    """Base class of every error specframe raises on purpose."""


class ConfigurationError(SpecframeError, ValueError):
    """A setting is out of range or inconsistent (budget 0, temperature < 0, ...)."""


class UnknownComponentError(SpecframeError, KeyError):
    """A plugin name that no installed plugin registered, or (`unavailable` says why) that only a plugin
    which failed to load provides."""

    def __init__(self, kind: str, name: str, known: list[str], note: str = "", unavailable: str = ""):
        self.kind, self.name, self.known = kind, name, known
        listing = ", ".join(sorted(known)) or "(none registered)"
        lead = f"{kind} '{name}' is not available: {unavailable}." if unavailable else \
            f"unknown {kind} '{name}'."
        super().__init__(
            f"{lead} Known {kind}s: {listing}. "
            + (f"Note: {note}. " if note else "")
            + "Run `specframe plugins` to see what is installed."
        )

    def __str__(self) -> str:  # KeyError would otherwise print the repr
        return self.args[0]


class DuplicateComponentError(SpecframeError):
    """Two plugins registered the same name for the same kind of component."""


class CapabilityError(SpecframeError):
    """A pipeline combines components that cannot work together."""


class UnsupportedModelError(CapabilityError):
    """A state backend cannot serve the given model."""


class PromptError(SpecframeError, ValueError):
    """A prompt is empty or does not fit the model's context."""


class ModelLoadError(SpecframeError):
    """A model could not be found or converted."""


class OutputError(SpecframeError):
    """Results could not be written where they were asked for (a full disk, a directory that turned
    read-only); the message says what was kept and how to go on."""


class DrafterError(SpecframeError):
    """A drafter failed in the middle of a request (a damaged store it reads, a bug in it). The request
    stops there rather than going on without the drafter: a run measuring a method must not quietly
    measure another. Every token emitted before the failure was verified by the target, so `partial`, a
    `GenerationResult` whose `finish_reason` is "error" (a list of them, one per prompt, None for those
    not started, from `generate_batch`), holds what plain decoding gives up to there; `specframe
    generate` prints its text before the `error:` line. The drafter's own exception is the `__cause__`
    (a specframe error it raises before the first token, with nothing to keep, is raised as it is)."""

    def __init__(self, message: str, partial=None):
        super().__init__(message)
        self.partial = partial


class SpecframeWarning(UserWarning):
    """Warnings specframe emits itself (tests turn them into errors)."""


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def io_failure(err: Exception, fix: str) -> str:
    """A failed read or write in words, for the error that replaces it: the system's reason and file, and
    `fix`, preceded by freeing space when the disk is full. `err` is an `OSError` or an error that carries
    one in its text (safetensors' `SafetensorError`: "IoError(Os { code: 28, ... })")."""
    text = " ".join(str(err).split())
    reason = err.strerror if isinstance(err, OSError) and err.strerror else text
    if getattr(err, "filename", None):
        reason += f": {err.filename}"
    full = getattr(err, "errno", None) in FULL_DISK or any(os.strerror(code) in text for code in FULL_DISK)
    return f"{reason}; {'free some space on that disk, or ' if full else ''}{fix}"
