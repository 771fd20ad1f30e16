"""Logging for the command line: counts by default, every event on request.

The library logs through the standard library and is silent until someone configures
logging; this module is that someone for the command line. Every event goes through
one :class:`EventReport` handler on the ``provider_router`` logger. At ``--log-level
warning`` (the default) or ``error``, events are *counted* by kind and
:func:`report_events` prints one sentence per kind at the end, so a run with thousands
in flight never floods stderr nor interrupts the live display; at ``info`` or
``debug`` every event is printed as it happens. ``--log-format console|json`` picks the
rendering; ``auto`` is console, in colour on a terminal only, and in JSON the count
lines are ``{"event": "log.count", ...}`` objects whose ``message`` is the sentence.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import textwrap
from collections import Counter
from typing import Any, Final

import structlog

from provider_router._log import ROOT_LOGGER
from provider_router.cli._event_phrases import describe_kind

__all__ = ["EventReport", "configure_logging", "describe_kind", "report_events"]

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_EACH_EVENT_LEVELS: Final = frozenset({"debug", "info"})

# Event-dict fields that name the kind of an event (the first one present wins).
_KIND_FIELDS: Final = ("error_type", "kind", "reason", "limit_source")

# Events whose count line also says the first one's cause (its ``error`` field):
# what a failed ledger write means for money cannot be left to a count.
_SAY_FIRST: Final = frozenset({"ledger.write_failed"})

_COUNT_EVENT: Final = "log.count"


def _event_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The structlog event dict behind ``record``, however it was logged."""
    if isinstance(record.msg, dict):  # structlog's wrap_for_formatter
        return record.msg
    # render_to_log_kwargs / plain stdlib: the event is the message, fields are extras.
    extras = {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STANDARD_ATTRS and not k.startswith("_")
    }
    return {"event": record.getMessage(), **extras}


_STANDARD_ATTRS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class EventReport(logging.Handler):
    """Prints each event (``each=True``) or counts them by ``(event, kind)``.

    Writes to the ``sys.stderr`` of the moment (so a redirected stream is honoured).
    """

    def __init__(self, *, each: bool, fmt: str, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.each = each
        self.fmt = fmt
        self.counts: Counter[tuple[str, str | None, int]] = Counter()
        self.first: dict[tuple[str, str | None, int], str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.each:
                sys.stderr.write(self.format(record) + "\n")
                sys.stderr.flush()
                return
            event = _event_dict(record)
            kind = next((str(event[k]) for k in _KIND_FIELDS if event.get(k)), None)
            name = str(event.get("event", record.getMessage()))
            key = (name, kind, record.levelno)
            self.counts[key] += 1
            if name in _SAY_FIRST and event.get("error"):
                self.first.setdefault(key, str(event["error"]))
        except Exception:  # pragma: no cover - logging must never break the run
            self.handleError(record)

    def report(self) -> list[str]:
        """Write one line per counted kind (most frequent first), reset, return the lines."""
        lines = []
        for (event, kind, levelno), count in sorted(
            self.counts.items(), key=lambda item: (-item[1], item[0][0], item[0][1] or "")
        ):
            text = describe_kind(event, kind, count)
            first = self.first.get((event, kind, levelno))
            if first is not None:
                text += f"; the first: {first}"
            if self.fmt == "json":
                lines.append(
                    json.dumps(
                        {
                            "event": _COUNT_EVENT,
                            "name": event,
                            "kind": kind,
                            "count": count,
                            "level": logging.getLevelName(levelno).lower(),
                            "message": text,
                        }
                    )
                )
            else:
                lines.append(f"provider-router: {text}")
        self.counts.clear()
        self.first.clear()
        # On a terminal each sentence is wrapped to its width (the terminal would cut words).
        width = shutil.get_terminal_size().columns if sys.stderr.isatty() else 0
        for line in lines:
            if width > 20 and self.fmt != "json":
                line = "\n".join(textwrap.wrap(line, width, subsequent_indent="  "))
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return lines


_installed: EventReport | None = None


def configure_logging(*, level: str = "warning", fmt: str = "auto") -> EventReport:
    """Route every ``provider_router`` event through one :class:`EventReport` on stderr.

    Configuring again replaces the previous handler (tests call ``main`` many times).
    """
    global _installed
    if fmt == "auto":
        fmt = "console"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    # The library's events arrive as stdlib records (``provider_router/_log.py``):
    # the event name is the message, each field an attribute (ExtraAdder).
    pre_chain: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.ExtraAdder(),
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # structlog-native loggers (``structlog.get_logger()``) meet them in the same handler.
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = EventReport(each=level in _EACH_EVENT_LEVELS, fmt=fmt)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer,
            ],
            foreign_pre_chain=pre_chain,
        )
    )
    package = logging.getLogger(ROOT_LOGGER)
    if _installed is not None:
        package.removeHandler(_installed)
    package.addHandler(handler)
    package.setLevel(_LEVELS[level])
    _installed = handler
    return handler


def report_events() -> list[str]:
    """Print the counted events (one line per kind) and reset the counts."""
    return [] if _installed is None else _installed.report()
