"""Logging set-up for the command line (the library itself never configures logging).

The library's events reach stdlib logging (``provider_router/_log.py``): the event
name is the record's message and each field a record attribute. The CLI attaches
one stderr handler to the package logger ``provider_router`` that renders them
through :class:`structlog.stdlib.ProcessorFormatter`, fields recovered by
:class:`structlog.stdlib.ExtraAdder`, as console text or JSON.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

import structlog

from provider_router._log import ROOT_LOGGER

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

_HANDLER_NAME: Final = "provider_router.cli"


def configure_logging(*, level: str = "warning", fmt: str = "auto") -> None:
    """Send the library's events to stderr, filtered at ``level``, as console text or JSON.

    Calling it again replaces the handler it installed before (one line per event).
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    pre_chain: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.ExtraAdder(),
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=pre_chain,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger(ROOT_LOGGER)
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    # structlog-native loggers (``structlog.get_logger()``) go the same way.
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
