"""An incremental parser for OpenRouter's server-sent events.

Bytes arrive in arbitrary pieces; :class:`SSEParser` turns them into the ``data``
payload of each complete event, whatever the split (a multi-byte UTF-8 character or
a ``\\r\\n`` may straddle two pieces). It follows the WHATWG event-stream rules
OpenRouter uses: lines end in ``\\n`` or ``\\r\\n`` (OpenRouter never sends a bare
``\\r``, so a split ``\\r|\\n`` is one line end); comments (keep-alives) and
fields other than ``data`` are ignored; ``data:`` lines accumulate until a blank line
dispatches the event; an event still open when the stream ends is discarded, so a
truncated stream never yields a half event. The ``data: [DONE]`` sentinel is reported
as :data:`DONE`.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DONE", "MAX_EVENT_BYTES", "SSEParser", "SSETooLong"]

DONE: Final = "[DONE]"
"""The data of the event that ends an OpenRouter stream."""

MAX_EVENT_BYTES: Final = 8 * 1024 * 1024
"""One line, and one event's data lines together, longer than this end the stream
(:class:`SSETooLong`). OpenRouter's events are a few hundred bytes; the largest
(a final chunk with usage, a tool call's arguments at once) a few KB."""


class SSETooLong(ValueError):
    """A line or an event past :data:`MAX_EVENT_BYTES`: the stream cannot be read on."""


class SSEParser:
    """Feed bytes, get back the data of every event they complete.

    The work is linear in the bytes fed, however they are split: a line still
    open is kept as its pieces and joined once, when its end comes.

    Example::

        parser = SSEParser()
        for piece in pieces:
            for data in parser.feed(piece):
                if data == DONE:
                    ...
                handle(json.loads(data))
    """

    __slots__ = ("_data", "_event_bytes", "_has_data", "_open", "_open_bytes")

    def __init__(self) -> None:
        self._open: list[bytes] = []  # the pieces of the line still open
        self._open_bytes = 0
        self._data: list[str] = []
        self._event_bytes = 0
        self._has_data = False

    def feed(self, chunk: bytes) -> list[str]:
        """Add ``chunk``; return the data of each event completed by it, in order.

        Raises:
            SSETooLong: a line or an event is past :data:`MAX_EVENT_BYTES`.
        """
        if b"\n" not in chunk:
            if chunk:
                self._open.append(chunk)
                self._open_bytes += len(chunk)
                if self._open_bytes > MAX_EVENT_BYTES:
                    raise SSETooLong(_too_long("a line"))
            return []
        if self._open:
            self._open.append(chunk)
            chunk = b"".join(self._open)
            self._open = []
            self._open_bytes = 0
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if rest:
            self._open.append(rest)
            self._open_bytes = len(rest)
        events: list[str] = []
        for raw in lines:
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw:
                if self._has_data:
                    events.append("\n".join(self._data))
                    self._data = []
                    self._event_bytes = 0
                    self._has_data = False
                continue
            if raw[0] == 0x3A:  # ":" comment, e.g. keep-alive
                continue
            name, colon, value = raw.partition(b":")
            if name != b"data":
                continue
            if colon and value.startswith(b" "):
                value = value[1:]
            self._event_bytes += len(value)
            if self._event_bytes > MAX_EVENT_BYTES or len(raw) > MAX_EVENT_BYTES:
                raise SSETooLong(_too_long("an event"))
            self._data.append(value.decode("utf-8", "replace"))
            self._has_data = True
        if self._open_bytes > MAX_EVENT_BYTES:
            raise SSETooLong(_too_long("a line"))
        return events

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished line or event are buffered."""
        return bool(self._open) or self._has_data

    def close(self) -> None:
        """Forget any unfinished event (the stream ended)."""
        self._open = []
        self._open_bytes = 0
        self._data = []
        self._event_bytes = 0
        self._has_data = False


def _too_long(what: str) -> str:
    limit = f"{MAX_EVENT_BYTES:,} bytes: MAX_EVENT_BYTES"
    return f"{what} of the event stream is too long (over {limit})"
