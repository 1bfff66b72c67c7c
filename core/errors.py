"""Every exception `core` raises on purpose, in one place.

Each message says what happened, what was kept safe, and what to do next. Configuration
errors name the field, show the bad value with ``!r``, list the allowed values and suggest
a fix (see :func:`config_error`).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = (
    "BatchFormatError",
    "ConfigError",
    "CoreError",
    "EmptyLoaderError",
    "LossFormatError",
    "config_error",
)


class CoreError(Exception):
    """Base class of every error raised by `core` itself."""


class ConfigError(CoreError, ValueError):
    """Raised before training starts when an argument or config field has a bad value."""


class EmptyLoaderError(ConfigError):
    """Raised when a training or validation loader yields no batch at all."""


class BatchFormatError(CoreError, TypeError):
    """Raised when a batch is neither an ``(inputs, targets)`` pair nor a dict of tensors."""


class LossFormatError(CoreError, TypeError):
    """Raised when the loss (from ``loss_fn`` or the model) is not a scalar floating tensor."""


def _short_repr(value: object) -> str:
    text = repr(value)
    if "\n" in text or len(text) > 120:
        kind = type(value)
        return f"<{kind.__module__}.{kind.__qualname__} object>"
    return text


def config_error(
    field: str,
    value: object,
    allowed: str | Iterable[object],
    fix: str | None = None,
    *,
    error: type[ConfigError] = ConfigError,
) -> ConfigError:
    """Build a :class:`ConfigError` with the house message format.

    >>> str(config_error("max_epochs", 0, "an integer >= 1"))
    'max_epochs=0 is invalid; allowed: an integer >= 1.'
    """
    allowed_text = allowed if isinstance(allowed, str) else ", ".join(repr(a) for a in allowed)
    message = f"{field}={_short_repr(value)} is invalid; allowed: {allowed_text}."
    if fix:
        message += f" Fix: {fix}"
    return error(message)
