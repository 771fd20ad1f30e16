"""An incremental parser for OpenRouter's server-sent events.

Bytes arrive in arbitrary pieces; :class:`SSEParser` turns them into the
``data`` payload of each complete event, whatever the split (a multi-byte UTF-8
character or a ``\\r\\n`` may straddle two pieces). It follows the WHATWG
event-stream rules that OpenRouter uses:

* lines end in ``\\n`` or ``\\r\\n`` (OpenRouter never sends a bare ``\\r``, so a
  lone ``\\r`` is not treated as a line end: that keeps a split ``\\r|\\n`` from
  reading as two lines);
* a line starting with ``:`` is a comment (``: OPENROUTER PROCESSING``
  keep-alives) and is ignored;
* ``data:`` lines accumulate (joined by ``\\n``) until a blank line dispatches
  the event; one space after the colon is dropped;
* other fields (``event``, ``id``, ``retry``) are ignored: OpenRouter does not
  use them on chat completions;
* an event still open when the stream ends is discarded, as the standard says:
  a truncated stream must not yield a half event.

The ``data: [DONE]`` sentinel is reported as :data:`DONE`.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DONE", "SSEParser"]

DONE: Final = "[DONE]"
"""The data of the event that ends an OpenRouter stream."""


class SSEParser:
    """Feed bytes, get back the data of every event they complete.

    Example::

        parser = SSEParser()
        for piece in pieces:
            for data in parser.feed(piece):
                if data == DONE:
                    ...
                handle(json.loads(data))
    """

    __slots__ = ("_buffer", "_data", "_has_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._has_data = False

    def feed(self, chunk: bytes) -> list[str]:
        """Add ``chunk``; return the data of each event completed by it, in order."""
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\n" not in buffer:
            self._buffer = buffer
            return []
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        events: list[str] = []
        for raw in lines:
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw:
                if self._has_data:
                    events.append("\n".join(self._data))
                    self._data = []
                    self._has_data = False
                continue
            if raw[0] == 0x3A:  # ":" comment, e.g. keep-alive
                continue
            name, colon, value = raw.partition(b":")
            if name != b"data":
                continue
            if colon and value.startswith(b" "):
                value = value[1:]
            self._data.append(value.decode("utf-8", "replace"))
            self._has_data = True
        return events

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished line or event are buffered."""
        return bool(self._buffer) or self._has_data

    def close(self) -> None:
        """Forget any unfinished event (the stream ended)."""
        self._buffer = b""
        self._data = []
        self._has_data = False
