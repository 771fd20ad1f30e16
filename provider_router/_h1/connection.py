"""One keep-alive HTTP/1.1 connection: write a request, parse its answer as it arrives.

The answer's framing follows RFC 9112 §6: a 1xx is skipped, a 204/304 has no
body, ``Transfer-Encoding: chunked`` wins over ``Content-Length``, and an answer
with neither ends when the server closes. Anything that does not parse is an
:class:`~provider_router._h1.errors.H1Error` (the request was sent) and closes
the connection.
"""

from __future__ import annotations

import asyncio
import re
from typing import Final, Protocol

from provider_router._h1.errors import H1Error, H1ReadTimeout
from provider_router._h1.response import H1Response

__all__ = ["MAX_HEAD_BYTES", "H1Connection"]

MAX_HEAD_BYTES: Final = 64 * 1024
"""A status line and headers (or a chunk line) longer than this are refused as malformed."""

_HEAD_END: Final = b"\r\n\r\n"
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_NAME_SPACE: Final = re.compile(rb"(?m)^([^:\r\n]*?)[ \t]+:")
_CONNECTION: Final = re.compile(rb"\r\nconnection:([^\r\n]*)")

# Body framing of the answer being read.
_LENGTH: Final = 0  # Content-Length: ``_left`` bytes to come
_CHUNKED: Final = 1  # Transfer-Encoding: chunked
_UNTIL_CLOSE: Final = 2  # neither: the body ends when the server closes

# Where a chunked body is.
_SIZE: Final = 0  # at a chunk-size line
_DATA: Final = 1  # inside a chunk: ``_left`` bytes to come
_DATA_END: Final = 2  # after a chunk's data: its CRLF
_TRAILER: Final = 3  # after the last chunk: trailer lines up to an empty one


class _Home(Protocol):
    """What a connection needs of the pool it belongs to."""

    loop: asyncio.AbstractEventLoop

    def _idle(self, conn: H1Connection, answer: H1Response | None) -> None: ...
    def _lost(self, conn: H1Connection) -> None: ...


class H1Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    __slots__ = (
        "_buffer",
        "_chunk",
        "_closed",
        "_framing",
        "_idle_limit",
        "_last_data",
        "_left",
        "_paused",
        "_pool",
        "_response",
        "_transport",
        "_waiter",
        "_watchdog",
        "expires",
    )

    def __init__(self, pool: _Home) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._waiter: asyncio.Future[H1Response] | None = None
        self._response: H1Response | None = None
        self._framing = _LENGTH
        self._chunk = _SIZE
        self._left = 0
        self._closed = False
        self._paused = False
        # The read (idle) timeout of a stream: one timer, re-armed only when it fires.
        self._idle_limit: float | None = None
        self._last_data = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self.expires = 0.0  # when idle: not reused from then on (set by the pool)

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by either side)."""
        return self._closed

    # --- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._idle_limit is not None:
            self._last_data = self._pool.loop.time()
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        try:
            if self._response is None:
                data = self._head(data)
            if self._response is not None and data:
                self._body(data)
        except H1Error as exc:
            self.close(exc)

    def eof_received(self) -> None:
        self._closed = True  # never reused; the transport closes and connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._stop_watchdog()
        self._pool._lost(self)
        response = self._response
        if response is not None and not response._eof:
            if self._framing == _UNTIL_CLOSE and exc is None:
                response._finish()  # the body was close-delimited: this is its end
            else:
                response._finish(H1Error(_truncated(self._framing, exc)))
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                detail = f": {exc}" if exc is not None else ""
                waiter.set_exception(H1Error(f"server disconnected before the answer{detail}"))

    # --- one exchange -------------------------------------------------------------

    def send(self, request: bytes, idle_limit: float | None) -> asyncio.Future[H1Response]:
        """Write ``request``; the future resolves with the answer once its headers are in.

        ``idle_limit``: seconds without a byte after which the exchange fails with
        :class:`H1ReadTimeout` (aiohttp's ``sock_read``), or ``None``.
        """
        loop = self._pool.loop
        waiter = self._waiter = loop.create_future()
        self._response = None
        if idle_limit is not None:
            self._idle_limit = idle_limit
            self._last_data = now = loop.time()
            self._watchdog = loop.call_at(now + idle_limit, self._watch)
        try:
            self._transport.write(request)  # type: ignore[union-attr]
        except (OSError, RuntimeError) as exc:  # closed under us: part may have gone out
            raise H1Error(f"the connection failed while sending: {exc}") from exc
        return waiter

    def recycle(self) -> None:
        """Back to the pool (the answer ended cleanly)."""
        answer = self._response
        self._response = None
        self._stop_watchdog()
        if self._closed or self._buffer:
            self.close()  # bytes after the answer: this connection cannot be trusted
            return
        if self._paused:
            self.pause(False)
        self._pool._idle(self, answer)  # its headers may say how long the server keeps it

    def close(self, error: H1Error | None = None) -> None:
        """Close the connection (the pool forgets it when the close completes); an
        exchange still under way fails with ``error`` (default: closed under it)."""
        self._stop_watchdog()
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(
                error or H1Error("the connection was closed before the answer came")
            )
        response = self._response
        self._response = None
        if response is not None and not response._eof:
            response._finish(error or H1Error("the connection was closed before the answer ended"))
        transport = self._transport
        if transport is not None and not self._closed:
            self._closed = True
            transport.close()
            self._pool._lost(self)

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the socket: a streamed body's reader is behind."""
        transport = self._transport
        if transport is None or self._closed or paused == self._paused:
            return
        self._paused = paused
        if paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _watch(self) -> None:
        self._watchdog = None
        limit = self._idle_limit
        if limit is None or self._closed:
            return
        response = self._response
        if response is not None and response._eof:
            return  # the answer is whole: nothing left to wait for
        loop = self._pool.loop
        if self._paused:
            self._last_data = loop.time()  # we stopped reading: that silence is ours
        due = self._last_data + limit
        if loop.time() < due:
            self._watchdog = loop.call_at(due, self._watch)
            return
        self.close(H1ReadTimeout(f"nothing arrived for {limit:g} s"))

    def _stop_watchdog(self) -> None:
        self._idle_limit = None
        watchdog = self._watchdog
        if watchdog is not None:
            self._watchdog = None
            watchdog.cancel()

    # --- parsing ------------------------------------------------------------------

    def _head(self, data: bytes) -> bytes:
        """Parse a status line and headers from ``data``; what follows them is returned."""
        while True:
            end = data.find(_HEAD_END)
            # Bare LF line ends (RFC 9112 §2.2 lets a recipient accept them; aiohttp does):
            # a head that ends in LF LF before any CRLF CRLF.
            bare = data.find(b"\n\n", 0, end if end >= 0 else len(data))
            if bare >= 0:
                head = data[:bare].replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
                data = data[bare + 2 :]
            elif end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise H1Error("malformed answer: headers too long")
                self._buffer = data
                return b""
            else:
                head = data[:end]
                data = data[end + 4 :]
            if b" :" in head or b"\t:" in head:
                # Whitespace between a field's name and its colon: invalid, but read as
                # aiohttp reads it (an answer that may have been paid for is not dropped).
                head = _NAME_SPACE.sub(rb"\1:", head)
            if head[:7] != b"HTTP/1." or len(head) < 12 or head[12:13] not in (b"", b" ", b"\r"):
                raise H1Error(f"malformed answer: bad status line {_start(head)!r}")
            try:
                status = int(head[9:12])
            except ValueError:
                raise H1Error(f"malformed answer: bad status line {_start(head)!r}") from None
            if status < 100:
                raise H1Error(f"malformed answer: bad status line {_start(head)!r}")
            if status == 101:  # we never ask to switch protocols
                raise H1Error("malformed answer: 101 Switching Protocols to a plain POST")
            if status >= 200:
                break
            # 1xx: an interim answer; the real one follows.
        self._start_body(head, status)
        return data

    def _start_body(self, head: bytes, status: int) -> None:
        lower = head.lower()
        reusable = head[7:8] == b"1" and not (
            b"\r\nconnection:" in lower and b"close" in _tokens(lower, _CONNECTION)
        )
        response = H1Response(self, status, head.decode("utf-8", "surrogateescape"), reusable)
        if b"\r\ncontent-encoding:" in lower:
            encoding = _value(lower, b"\r\ncontent-encoding:").decode("latin-1")
            if encoding not in ("", "identity"):
                if encoding not in ("gzip", "x-gzip", "deflate"):
                    raise H1Error(f"the answer's body has an unsupported encoding {encoding!r}")
                response._encoding = "deflate" if encoding == "deflate" else "gzip"
        self._response = response
        if status == 204 or status == 304:
            self._framing = _LENGTH
            self._left = 0
        elif b"\r\ntransfer-encoding:" in lower:
            codings = _value(lower, b"\r\ntransfer-encoding:")
            if codings.rsplit(b",", 1)[-1].strip() == b"chunked":
                self._framing = _CHUNKED
                self._chunk = _SIZE
            else:
                self._framing = _UNTIL_CLOSE
                response._reusable = False
        elif b"\r\ncontent-length:" in lower:
            length = _value(lower, b"\r\ncontent-length:")
            if not length.isdigit() or lower.count(b"\r\ncontent-length:") > 1:
                raise H1Error(f"malformed answer: Content-Length {length[:40]!r}")
            self._framing = _LENGTH
            self._left = int(length)
        else:
            self._framing = _UNTIL_CLOSE
            response._reusable = False
        if self._framing == _LENGTH and not self._left:
            response._finish()
        waiter = self._waiter
        self._waiter = None
        if waiter is None or waiter.done():
            # An answer to no request (or to one that was given up): never trust it.
            raise H1Error("an answer arrived that no request was waiting for")
        waiter.set_result(response)

    def _body(self, data: bytes) -> None:
        response = self._response
        assert response is not None  # called only while an answer is being read
        if response._eof:
            # Bytes after the answer's end: never reuse this connection.
            response._reusable = False
            return
        framing = self._framing
        if framing == _LENGTH:
            left = self._left
            if len(data) < left:
                response._feed(data)
                self._left = left - len(data)
                return
            response._feed(data[:left] if len(data) > left else data)
            self._left = 0
            if len(data) > left:
                response._reusable = False
            response._finish()
        elif framing == _UNTIL_CLOSE:
            response._feed(data)
        else:
            self._chunked(response, data)

    def _chunked(self, response: H1Response, data: bytes) -> None:
        at = 0
        size = len(data)
        while at < size:
            state = self._chunk
            if state == _DATA:
                take = min(self._left, size - at)
                response._feed(data[at : at + take] if take < size else data)
                at += take
                self._left -= take
                if not self._left:
                    self._chunk = _DATA_END
                continue
            end = data.find(b"\r\n", at)
            if end < 0:
                if size - at > MAX_HEAD_BYTES:
                    raise H1Error("malformed answer: a chunk line too long")
                self._buffer = data[at:]
                return
            line = data[at:end]
            at = end + 2
            if state == _SIZE:
                digits = line.split(b";", 1)[0].strip()
                if _HEX.fullmatch(digits) is None:
                    raise H1Error(f"malformed answer: chunk size {digits[:20]!r}")
                chunk = int(digits, 16)
                if chunk:
                    self._chunk = _DATA
                    self._left = chunk
                else:
                    self._chunk = _TRAILER
            elif state == _DATA_END:
                if line:
                    raise H1Error("malformed answer: a chunk longer than its size")
                self._chunk = _SIZE
            elif not line:  # _TRAILER: the empty line ends the body
                if at < size:
                    response._reusable = False
                response._finish()
                return


def _value(lower_head: bytes, name: bytes) -> bytes:
    start = lower_head.find(name) + len(name)
    end = lower_head.find(b"\r\n", start)
    return lower_head[start : end if end >= 0 else None].strip()


def _tokens(lower_head: bytes, header: re.Pattern[bytes]) -> set[bytes]:
    """The comma-separated tokens of every line of one header (RFC 9110 §5.6.1)."""
    return {
        token.strip(b" \t") for line in header.findall(lower_head) for token in line.split(b",")
    }


def _start(head: bytes) -> bytes:
    return head.split(b"\r\n", 1)[0][:40]


def _truncated(framing: int, exc: Exception | None) -> str:
    what = "chunked body" if framing == _CHUNKED else "body"
    detail = f": {exc}" if exc is not None else ""
    return f"the connection closed before the answer's {what} ended{detail}"
