"""One keep-alive HTTP/1.1 connection: write a request, frame its answer with llhttp.

The framing is llhttp's (through ``httptools``, as in aiohttp's own C parser), with
the leniencies aiohttp turns on for answers, as RFC 9112 §6 reads. What llhttp leaves
to its caller is done here: the limits of :mod:`provider_router._http.h1.limits`
(llhttp bounds no head), the end of a close-delimited body, a 101, an HTTP/1.0
answer with ``Transfer-Encoding``, and the body's codings. Anything that does not
parse is an :class:`~provider_router._http.h1.errors.H1Error` (the request was sent)
and closes the connection.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from provider_router._http.h1.decoding import CODINGS
from provider_router._http.h1.errors import H1Error, H1ReadTimeout
from provider_router._http.h1.limits import (
    MAX_FIELD_BYTES,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_INTERIM_ANSWERS,
    too_big,
)
from provider_router._http.h1.response import H1Response, RawHeaders

__all__ = ["H1Connection"]

_SLICE: Final = 8192
"""A read longer than this is parsed a slice at a time, and the limits checked between:
llhttp would otherwise take a whole read (up to 256 KiB) of folded header lines, whose
value ``httptools`` grows by copying, in one call."""

_MAX_HEAD_LINES: Final = 4 * MAX_HEADERS
"""Raw lines before the answer's head ends (interim heads and folded lines included)."""

_CONTENT_LENGTH: Final = b"content-length"
_CONTENT_ENCODING: Final = b"content-encoding"
_TRANSFER_ENCODING: Final = b"transfer-encoding"
_NAMED: Final = frozenset({len(_CONTENT_LENGTH), len(_CONTENT_ENCODING), len(_TRANSFER_ENCODING)})
_BLANKS: Final = b" \t"


class _Home(Protocol):
    """What a connection needs of the pool it belongs to."""

    loop: asyncio.AbstractEventLoop

    def _idle(self, conn: H1Connection, answer: H1Response | None) -> None: ...
    def _lost(self, conn: H1Connection) -> None: ...


class H1Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer framed as it arrives."""

    __slots__ = (
        "_buffer",
        "_closed",
        "_codings",
        "_fields",
        "_head_bytes",
        "_head_lines",
        "_idle_limit",
        "_interim",
        "_last_data",
        "_length",
        "_lines",
        "_parser",
        "_paused",
        "_pending",
        "_pool",
        "_progress",
        "_response",
        "_transfer",
        "_transport",
        "_until_close",
        "_waiter",
        "_watchdog",
        "expires",
    )

    def __init__(self, pool: _Home) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        # Bytes that came outside any answer (after one, or on an idle connection):
        # kept only as the mark of a connection never to reuse.
        self._buffer = b""
        self._waiter: asyncio.Future[H1Response] | None = None
        self._response: H1Response | None = None
        self._closed = False
        self._paused = False
        parser = self._parser = HttpResponseParser(self)
        # aiohttp's leniencies for answers (and no other): a paid answer is read when
        # aiohttp would read it.
        parser.set_dangerous_leniencies(
            lenient_headers=True,
            lenient_optional_cr_before_lf=True,
            lenient_spaces_after_chunk_size=True,
        )
        # The head being read: its fields, what framing and codings they name.
        self._fields: RawHeaders = []
        self._lines = 0  # header (or trailer) lines of the current head
        self._length = -1
        self._codings: list[bytes] = []  # Content-Encoding values
        self._transfer: list[bytes] = []  # Transfer-Encoding values
        self._until_close = False
        # Bounds across one exchange (see _parse).
        self._interim = 0
        self._head_bytes = 0
        self._head_lines = 0
        self._pending = 0
        self._progress = False
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
        response = self._response
        if (self._waiter is None) if response is None else response._whole:
            self._stray(data)  # no answer asked for, or the answer is whole
            return
        if len(data) <= _SLICE:
            self._parse(data)
            return
        view = memoryview(data)
        for start in range(0, len(data), _SLICE):
            if not self._parse(view[start : start + _SLICE]):
                response = self._response
                rest = data[start + _SLICE :]
                if rest and response is not None and response._whole and not self._closed:
                    self._stray(rest)  # the answer ended with a slice: the rest is not its own
                return

    def eof_received(self) -> None:
        self._closed = True  # never reused; the transport closes and connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._stop_watchdog()
        self._pool._lost(self)
        response = self._response
        if response is not None and not response._whole:
            if self._until_close and exc is None:
                response._finish()  # the body was close-delimited: this is its end
            else:
                what = "body" if self._until_close or not self._transfer else "chunked body"
                detail = f": {exc}" if exc is not None else ""
                response._finish(
                    H1Error(f"the connection closed before the answer's {what} ended{detail}")
                )
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
        self._interim = self._head_bytes = self._head_lines = self._pending = 0
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
        if response is not None and response._whole:
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

    # --- framing ------------------------------------------------------------------

    def _parse(self, data: bytes | memoryview) -> bool:
        """Frame one piece of the answer; False once the rest of the read is not its own."""
        self._progress = False
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            response = self._response
            if response is not None and response._whole and response._error is None:
                self._stray(bytes(data))  # the answer is whole: what follows it is not
            else:
                self.close(_failure(exc, self._response is None and not self._lines))
            return False
        response = self._response
        if response is None:  # all of this piece was head: bounded by its bytes and lines
            self._head_bytes += len(data)
            piece = bytes(data) if type(data) is memoryview else data
            self._head_lines += piece.count(b"\n")
            end = piece.rfind(b"\n")  # the line still open: llhttp calls nothing until it ends
            self._pending = len(piece) - end - 1 if end >= 0 else self._pending + len(piece)
            if self._pending > MAX_FIELD_BYTES:
                self.close(H1Error(too_big("a header line", MAX_FIELD_BYTES, "MAX_FIELD_BYTES")))
                return False
            if self._head_bytes > MAX_HEAD_BYTES:
                self.close(H1Error(too_big("the answer's head", MAX_HEAD_BYTES, "MAX_HEAD_BYTES")))
                return False
            if self._head_lines > _MAX_HEAD_LINES:
                self.close(H1Error(_too_many("header lines", MAX_HEADERS, "MAX_HEADERS")))
                return False
        elif response._whole:
            return False
        elif self._progress:
            self._pending = 0  # (a head that ended here: its line count is no longer needed)
        else:  # neither a body byte nor a field: a chunk line or a trailer still coming
            self._pending += len(data)
            if self._pending > MAX_FIELD_BYTES:
                what = "a chunk line or trailer"
                self.close(H1Error(too_big(what, MAX_FIELD_BYTES, "MAX_FIELD_BYTES")))
                return False
        return True

    def _stray(self, data: bytes) -> None:
        """Bytes no request asked for: the connection is never reused (closed if idle)."""
        self._buffer = data or b"?"
        response = self._response
        if response is not None:
            response._reusable = False
        elif self._waiter is None:
            self.close()

    # llhttp's callbacks (httptools calls them by name, during feed_data).

    def on_message_begin(self) -> None:
        self._progress = True
        if self._response is not None:  # a second answer after the first: not asked for
            raise H1Error("bytes after the answer")
        self._fields = []
        self._lines = 0
        self._length = -1
        self._codings = []
        self._transfer = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._progress = True
        lines = self._lines = self._lines + 1
        if lines > MAX_HEADERS:
            raise H1Error(_too_many("header lines", MAX_HEADERS, "MAX_HEADERS"))
        if len(name) + len(value) > MAX_FIELD_BYTES:
            raise H1Error(too_big("a header line", MAX_FIELD_BYTES, "MAX_FIELD_BYTES"))
        if self._response is not None:
            return  # a trailer: bounded, then dropped (aiohttp drops them too)
        if b"\0" in value:
            raise H1Error("malformed answer: a NUL byte in a header value")
        # llhttp strips the blanks before a value, not after; nor, leniently, before
        # the colon.
        value = value.rstrip(_BLANKS)
        if name[-1] in _BLANKS:
            name = name.rstrip(_BLANKS)
        self._fields.append((name, value))
        if len(name) in _NAMED:
            lower = name.lower()
            if lower == _CONTENT_LENGTH:
                self._length = int(value) if value.isdigit() else -1
            elif lower == _CONTENT_ENCODING:
                self._codings.append(value)
            elif lower == _TRANSFER_ENCODING:
                self._transfer.append(value)

    def on_headers_complete(self) -> None:
        self._progress = True
        parser = self._parser
        status = parser.get_status_code()
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise H1Error(f"malformed answer: bad status line (HTTP/{version[:8]})")
        if status < 100:
            raise H1Error(f"malformed answer: bad status line (status {status})")
        if status == 101:  # we never ask to switch protocols
            raise H1Error("malformed answer: 101 Switching Protocols to a plain POST")
        if status < 200:  # an interim answer; the real one follows
            self._interim += 1
            if self._interim > MAX_INTERIM_ANSWERS:
                limit = f"{MAX_INTERIM_ANSWERS} interim (1xx) answers"
                raise H1Error(f"malformed answer: more than {limit} (MAX_INTERIM_ANSWERS)")
            return
        transfer = _tokens(self._transfer)
        if transfer and version == "1.0":
            raise H1Error("malformed answer: Transfer-Encoding in an HTTP/1.0 answer")
        chunked = bool(transfer) and transfer[-1] == b"chunked"
        until_close = not chunked and self._length < 0 and status != 204 and status != 304
        self._until_close = until_close
        reusable = not until_close and parser.should_keep_alive()
        response = H1Response(self, status, self._fields, reusable)
        response._length = self._length
        self._lines = 0  # trailers have their own count
        if self._codings or len(transfer) > chunked:
            _codings(response, _tokens(self._codings), transfer[:-1] if chunked else transfer)
        self._response = response
        waiter = self._waiter
        self._waiter = None
        if waiter is None or waiter.done():
            # An answer to no request (or to one that was given up): never trust it.
            raise H1Error("an answer arrived that no request was waiting for")
        waiter.set_result(response)

    def on_body(self, body: bytes) -> None:
        self._progress = True
        self._response._feed(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        self._progress = True
        response = self._response
        if response is not None:  # else an interim answer ended: the real one follows
            response._finish()


def _tokens(values: list[bytes]) -> list[bytes]:
    """The comma-separated tokens of every line of one header (RFC 9110 §5.6.1), lower-case."""
    return [t for v in values for t in (part.strip(_BLANKS).lower() for part in v.split(b",")) if t]


def _codings(response: H1Response, content: list[bytes], transfer: list[bytes]) -> None:
    """Say how the body is decoded; a coding we cannot decode is refused when it is read."""
    codings = [c for c in (*transfer, *content) if c != b"identity"]
    if not codings:
        return
    coding = CODINGS.get(codings[0].decode("latin-1")) if len(codings) == 1 else None
    if coding is not None:
        response._coding = coding
        return
    # Named only when it is a coding's registered name: a header's value is never echoed
    # (a server may put anything there, the key included).
    spelled = ", ".join(c.decode("latin-1") if c in _KNOWN_CODINGS else "?" for c in codings[:4])
    response._refused = f"the answer's body has an unsupported encoding {spelled!r}"


_KNOWN_CODINGS: Final = frozenset(
    {b"br", b"zstd", b"compress", b"x-compress", b"gzip", b"x-gzip", b"deflate", b"chunked"}
)


def _too_many(what: str, limit: int, name: str) -> str:
    return f"malformed answer: more than {limit} {what} ({name})"


_HEADER_WORDS: Final = ("header", "Content-Length", "Transfer-Encoding")


def _failure(exc: Exception, at_start: bool) -> H1Error:
    """Our error for llhttp's (or for ours, raised in one of its callbacks)."""
    cause = exc.__context__
    if isinstance(cause, H1Error):
        return cause
    if isinstance(exc, HttpParserUpgrade):
        return H1Error("malformed answer: an upgrade to a plain POST")
    reason = str(exc) or type(exc).__name__
    if at_start and not any(word in reason for word in _HEADER_WORDS):
        return H1Error(f"malformed answer: bad status line ({reason})")
    return H1Error(f"malformed answer: {reason}")
