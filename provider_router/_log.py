"""The library's loggers: structlog events handed to stdlib :mod:`logging`, silent by default.

A library must not decide where its logs go (Python's logging HOWTO, "Configuring
Logging for a Library"). A bare ``structlog.get_logger()`` does: unconfigured
structlog prints every level to stdout. So each module's logger is a structlog
:class:`~structlog.stdlib.BoundLogger` wrapped around the stdlib logger of the same
name, with a fixed processor chain that ignores ``structlog.configure()``:

* :func:`structlog.stdlib.filter_by_level` first, so an event below the stdlib
  logger's effective level is dropped before anything else runs;
* :func:`structlog.stdlib.render_to_log_kwargs` last, so the stdlib record carries
  the event name as its message and every field as a record attribute (``extra``).

The package's root logger ``provider_router`` has a :class:`logging.NullHandler`:
with nothing configured, nothing reaches stderr (not even warnings through
:data:`logging.lastResort`). An application opts in with ordinary logging
(``logging.basicConfig(level=logging.INFO)``), or renders the fields with
:class:`structlog.stdlib.ProcessorFormatter` and :class:`structlog.stdlib.ExtraAdder`
as the CLI does (``provider_router/cli/_logging.py``).

Even a filtered call builds its keyword dict and walks the processor chain (a few
µs), so per-request events are logged at debug behind one level check
(``if log.isEnabledFor(DEBUG): log.debug(...)``), which costs a dict lookup.
"""

from __future__ import annotations

import logging
from typing import Final

import structlog

__all__ = ["DEBUG", "ROOT_LOGGER", "get_logger"]

ROOT_LOGGER: Final = "provider_router"
"""The package's root logger: every library event goes through it."""

DEBUG: Final = logging.DEBUG

_PROCESSORS: Final[list[structlog.typing.Processor]] = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.render_to_log_kwargs,
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The structlog logger of module ``name``, writing to ``logging.getLogger(name)``.

    Built once per module at import, never rebuilt per call (a lazy proxy would
    re-bind itself on every call unless structlog's cache is on, which is the
    application's setting, not ours).
    """
    return structlog.stdlib.BoundLogger(logging.getLogger(name), _PROCESSORS, {})


def _install_null_handler() -> None:
    root = logging.getLogger(ROOT_LOGGER)
    if not any(isinstance(handler, logging.NullHandler) for handler in root.handlers):
        root.addHandler(logging.NullHandler())


_install_null_handler()
