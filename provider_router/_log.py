"""The library's loggers: structured events handed to stdlib :mod:`logging`, silent by default.

A library must not decide where its logs go, and unconfigured structlog prints every
level to stdout. So :class:`EventLogger` keeps structlog's calling convention
(``log.info("route.done", key=..., cost=...)``) but writes the record structlog's
``render_to_log_kwargs`` would (the event as message, the fields as ``extra``) to the
stdlib logger of the same name, and the application's logging decides. It is written
out rather than built from structlog, whose import and filtered-out calls cost more
(docs/performance.md): this checks one cached level first. The package's root logger
has a :class:`logging.NullHandler`, so nothing reaches stderr unasked; the CLI
renders the fields with structlog (``provider_router/cli/_logging.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["DEBUG", "ROOT_LOGGER", "EventLogger", "get_logger"]

ROOT_LOGGER: Final = "provider_router"
"""The package's root logger: every library event goes through it."""

DEBUG: Final = logging.DEBUG
INFO: Final = logging.INFO
WARNING: Final = logging.WARNING
ERROR: Final = logging.ERROR
CRITICAL: Final = logging.CRITICAL

# debug() -> _emit() -> Logger.log(): the record names the caller of debug().
_STACKLEVEL: Final = 3


class EventLogger:
    """structlog-style event calls onto one stdlib logger (see the module docstring).

    Args:
        logger: the stdlib logger records go to.
        context: fields bound to every event (see :meth:`bind`).
    """

    __slots__ = ("_context", "_logger")

    def __init__(self, logger: logging.Logger, context: Mapping[str, Any] | None = None) -> None:
        self._logger = logger
        self._context = dict(context) if context else None

    @property
    def name(self) -> str:
        """The stdlib logger's name."""
        return self._logger.name

    def isEnabledFor(self, level: int) -> bool:
        """Whether an event at ``level`` would be handled (a cached dict lookup)."""
        return self._logger.isEnabledFor(level)

    def bind(self, **fields: Any) -> EventLogger:
        """A logger that adds ``fields`` to every event."""
        return EventLogger(self._logger, {**(self._context or {}), **fields})

    def debug(self, event: str, **fields: Any) -> None:
        """Log ``event`` at debug with ``fields``."""
        if self._logger.isEnabledFor(DEBUG):
            self._emit(DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log ``event`` at info with ``fields``."""
        if self._logger.isEnabledFor(INFO):
            self._emit(INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log ``event`` at warning with ``fields``."""
        if self._logger.isEnabledFor(WARNING):
            self._emit(WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log ``event`` at error with ``fields``."""
        if self._logger.isEnabledFor(ERROR):
            self._emit(ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """Log ``event`` at error with the exception being handled."""
        if self._logger.isEnabledFor(ERROR):
            fields.setdefault("exc_info", True)
            self._emit(ERROR, event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        """Log ``event`` at critical with ``fields``."""
        if self._logger.isEnabledFor(CRITICAL):
            self._emit(CRITICAL, event, fields)

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        exc_info = fields.pop("exc_info", None)
        stack_info = bool(fields.pop("stack_info", False))
        if self._context:
            fields = {**self._context, **fields}
        self._logger.log(
            level,
            event,
            exc_info=exc_info,
            stack_info=stack_info,
            stacklevel=_STACKLEVEL,
            extra=fields,
        )

    def __repr__(self) -> str:
        return f"EventLogger({self._logger.name!r})"


def get_logger(name: str) -> EventLogger:
    """The event logger of module ``name``, writing to ``logging.getLogger(name)``."""
    return EventLogger(logging.getLogger(name))


def _install_null_handler() -> None:
    root = logging.getLogger(ROOT_LOGGER)
    if not any(isinstance(handler, logging.NullHandler) for handler in root.handlers):
        root.addHandler(logging.NullHandler())


_install_null_handler()
