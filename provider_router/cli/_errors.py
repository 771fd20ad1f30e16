"""One-line messages for foreign failures the command line can name.

The library translates HTTP failures into its own errors; a few others reach
the command line untranslated and deserve a sentence, not a 60-line traceback:
a Redis server that cannot be reached, a directory or file we may not write.
Anything not recognised here is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from provider_router._exceptions import ConfigurationError

__all__ = ["EXIT_IO", "EXIT_UNAVAILABLE", "UsageError", "as_usage", "describe_failure"]


class UsageError(ConfigurationError):
    """A command given something it cannot use (a missing prompt file, an
    unwritable ``--out``, no API key): exit 2, before anything is sent."""


@contextlib.contextmanager
def as_usage() -> Iterator[None]:
    """What the command was given cannot be used: a :class:`ConfigurationError` raised
    while reading its flags, plan and prompt files is a :class:`UsageError` (exit 2).

    Wrap only the reading of what was given, never the run: a bad answer or a
    ledger that refuses is not a mistake in the command.
    """
    try:
        yield
    except UsageError:
        raise
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc


EXIT_UNAVAILABLE: Final = 69
"""A service we depend on (Redis) cannot be reached (``EX_UNAVAILABLE`` of sysexits.h)."""
EXIT_IO: Final = 74
"""A file or directory cannot be read or written (``EX_IOERR`` of sysexits.h)."""


def _redis_error(exc: BaseException) -> str | None:
    try:
        from redis import exceptions
    except ImportError:  # pragma: no cover - the redis extra is not installed
        return None
    if isinstance(exc, exceptions.ConnectionError | exceptions.TimeoutError):
        # redis-py names host and port, never the password of the URL.
        return f"cannot reach the Redis ledger: {exc}"
    if isinstance(exc, exceptions.RedisError):
        return f"the Redis ledger failed: {exc}"
    return None


def describe_failure(exc: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit code)`` for a failure we can name, else None."""
    redis_message = _redis_error(exc)
    if redis_message is not None:
        return redis_message, EXIT_UNAVAILABLE
    if isinstance(exc, OSError) and exc.filename is not None:
        what = exc.strerror or type(exc).__name__
        target = exc.filename if exc.filename2 is None else f"{exc.filename} → {exc.filename2}"
        return f"{what}: {target}", EXIT_IO
    return None
