"""Settings read from environment variables, checked where they are read, so that a misspelled value fails
with the list of accepted ones instead of silently falling back to a default."""

from __future__ import annotations

import os

from specframe.terms.errors import ConfigurationError


def env_choice(env: str, choices: tuple[str, ...], what: str) -> str:
    """The value of environment variable `env`, one of `choices` (the first when unset or empty);
    any other value is a `ConfigurationError` naming `what` the variable chooses and the choices."""
    value = os.environ.get(env, "").strip().lower() or choices[0]
    if value not in choices:
        raise ConfigurationError(f"{env}={value!r} is not a {what}: use one of {', '.join(choices)}")
    return value
