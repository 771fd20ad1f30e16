"""One answer on a lean connection: status and headers on arrival, the body whole or streamed."""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from provider_router._http.h1.decoding import BodyDecoder
from provider_router._http.h1.errors import H1Error
from provider_router._http.h1.limits import (
    DECODE_PIECE_BYTES,
    MAX_BODY_BYTES,
    MAX_DECODED_BYTES,
    too_big,
)

__all__ = ["H1Response"]

PAUSE_BYTES: Final = 1 << 20
"""A streamed body buffered past this pauses reading until the reader catches up."""

RawHeaders = list[tuple[bytes, bytes]]
"""The head's fields as llhttp gave them (names and values stripped of blanks)."""


class _Carrier(Protocol):
    """What an answer needs of the connection that carries it."""

    def recycle(self) -> None: ...
    def close(self) -> None: ...
    def pause(self, paused: bool) -> None: ...


class H1Response:
    """One answer: status and headers on arrival, the body as it comes.

    It offers the part of aiohttp's ``ClientResponse`` the HTTP layer uses
    (``status``, ``headers``, ``content.is_eof()``, ``content.iter_any()``,
    ``read()``, ``release()``, ``close()``), so
    :class:`provider_router._http.session.PostResponse` reads either. A body read whole
    is bounded by :data:`~provider_router._http.h1.limits.MAX_BODY_BYTES` as it came
    and :data:`~provider_router._http.h1.limits.MAX_DECODED_BYTES` decoded; a coding it
    cannot decode (``br``, ``zstd``) fails only when the body is read, so an error
    status (a 429 and its ``Retry-After``) still
    reaches the caller.
    """

    __slots__ = (
        "_body",
        "_buffered",
        "_chunk_waiter",
        "_coding",
        "_conn",
        "_decoder",
        "_eof",
        "_error",
        "_headers",
        "_length",
        "_paused",
        "_raw",
        "_refused",
        "_reusable",
        "_waiter",
        "_whole",
        "status",
    )

    def __init__(self, conn: _Carrier, status: int, raw: RawHeaders, reusable: bool) -> None:
        self._conn: _Carrier | None = conn
        self.status = status
        self._raw = raw
        self._headers: CIMultiDictProxy[str] | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._eof = False  # the body is here (decoded, for a compressed one read whole)
        self._whole = False  # the body came to its end on the wire
        self._error: H1Error | None = None
        self._waiter: asyncio.Future[None] | None = None  # read(): woken at the end
        self._chunk_waiter: asyncio.Future[None] | None = None  # iteration: woken per piece
        self._paused = False
        self._reusable = reusable
        self._coding: str | None = None  # "gzip" or "deflate": decoded as read
        self._refused: str | None = None  # why the body cannot be decoded, said when read
        self._decoder: BodyDecoder | None = None
        self._length = -1  # the Content-Length, when one was given

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The answer's headers (case-insensitive), decoded on first use."""
        headers = self._headers
        if headers is None:
            fields = [
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
                for name, value in self._raw
            ]
            headers = self._headers = CIMultiDictProxy(CIMultiDict(fields))
        return headers

    @property
    def content(self) -> H1Response:
        """Itself: the body-reading calls aiohttp keeps on ``response.content``."""
        return self

    def is_eof(self) -> bool:
        """Whether the body has ended (whole, or cut short: see :meth:`exception`)."""
        return self._eof

    def exception(self) -> H1Error | None:
        """Why the body ended short, if it did."""
        return self._error

    def read_nowait(self) -> bytes:
        """The whole body, once :meth:`is_eof` (raises the failure that ended it short)."""
        if self._error is not None:
            raise self._error
        return self._decoded()

    async def read(self) -> bytes:
        """The whole body, waiting for it.

        Raises:
            H1Error: the connection broke before the body's end (a truncated body), or
                the body is past :data:`~provider_router._http.h1.limits.MAX_BODY_BYTES` or
                in a coding not decoded.
        """
        if self._refused is not None:
            raise H1Error(self._refused)
        if self._length > MAX_BODY_BYTES:  # refused before a byte of it is buffered
            raise H1Error(too_big("the answer's Content-Length", MAX_BODY_BYTES, "MAX_BODY_BYTES"))
        if not self._eof:
            if self._paused:  # paused before anyone read: the whole body is wanted now
                self._paused = False
                if self._conn is not None:
                    self._conn.pause(False)
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return self.read_nowait()

    def iter_any(self) -> H1Response:
        """The body's pieces as they arrive (``async for``), as aiohttp's ``iter_any``."""
        return self

    def __aiter__(self) -> H1Response:
        return self

    async def __anext__(self) -> bytes:
        """The bytes that arrived since the last call (decoded), waiting for some.

        Raises:
            StopAsyncIteration: the body ended.
            H1Error: it was cut short (``H1ReadTimeout``: nothing came in time), or its
                coding cannot be decoded or stops short.
        """
        decoder = self._decoder
        if decoder is not None and decoder.pending:  # a bounded piece left input behind
            await asyncio.sleep(0)  # one loop turn per piece: a bomb never holds the loop
            piece = decoder.more(DECODE_PIECE_BYTES)
            if piece:
                return piece
        while not self._body:
            if self._eof:
                if self._error is not None:
                    raise self._error
                if decoder is not None:
                    decoder.finish()
                raise StopAsyncIteration
            waiter = self._chunk_waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._chunk_waiter = None
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            conn = self._conn
            if conn is not None:
                conn.pause(False)
        if self._coding is not None:
            if self._refused is not None:
                raise H1Error(self._refused)
            if decoder is None:
                decoder = self._decoder = BodyDecoder(self._coding)
            data = decoder.feed(data, DECODE_PIECE_BYTES)
        return data

    def release(self) -> None:
        """Done with the answer: its connection is reused if the answer ended cleanly
        (whether or not it was read, as aiohttp hands a connection back at the body's
        end), else closed."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            if self._eof and self._reusable and self._error is None:
                conn.recycle()
            else:
                conn.close()

    close = release
    """Done with the answer, maybe not read to its end: the same as :meth:`release`
    (an answer still arriving closes its connection either way)."""

    # --- fed by the connection ----------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._body.append(data)
        self._buffered += len(data)
        waiter = self._chunk_waiter
        if waiter is not None:
            self._chunk_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif self._buffered > PAUSE_BYTES:
            if self._waiter is not None:  # read whole: bounded
                if self._buffered > MAX_BODY_BYTES:
                    raise H1Error(too_big("the answer's body", MAX_BODY_BYTES, "MAX_BODY_BYTES"))
            elif not self._paused:
                # A stream read slower than it arrives: stop reading the socket (the
                # server's sending slows to match) until the reader takes what is here.
                conn = self._conn
                if conn is not None:
                    self._paused = True
                    conn.pause(True)

    def _finish(self, error: H1Error | None = None) -> None:
        self._whole = True
        if error is None and self._coding is not None and self._decoder is None and self._body:
            # A compressed body whole before anyone read it: decoded here, a loop turn
            # per piece (no bomb holds the loop), before it counts as ended.
            raw = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body = []
            self._buffered = 0
            self._inflate(BodyDecoder(self._coding), [], raw)
            return
        self._end(error)

    def _inflate(self, decoder: BodyDecoder, decoded: list[bytes], raw: bytes = b"") -> None:
        if self._eof:
            return  # closed meanwhile
        piece = decoder.feed(raw, DECODE_PIECE_BYTES) if raw else decoder.more(DECODE_PIECE_BYTES)
        if piece:
            decoded.append(piece)
            self._buffered += len(piece)
            if self._buffered > MAX_DECODED_BYTES:
                what = "the answer's decoded body"
                self._end(H1Error(too_big(what, MAX_DECODED_BYTES, "MAX_DECODED_BYTES")))
                return
        if decoder.pending:
            asyncio.get_running_loop().call_soon(self._inflate, decoder, decoded)
            return
        try:
            decoder.finish()  # a whole body that stops mid-stream is not a body
        except H1Error as exc:
            self._end(exc)
            return
        self._body = decoded
        self._coding = None  # decoded: read or iterated as it is now
        self._end()

    def _end(self, error: H1Error | None = None) -> None:
        self._whole = True
        self._eof = True
        self._error = error
        for waiter in (self._waiter, self._chunk_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self._waiter = self._chunk_waiter = None

    def _decoded(self) -> bytes:
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        if self._refused is not None:
            raise H1Error(self._refused)
        if self._coding is None or not data:
            return data
        decoder = BodyDecoder(self._coding)
        decoded = decoder.feed(data, MAX_DECODED_BYTES + 1)
        if len(decoded) > MAX_DECODED_BYTES:
            what = "the answer's decoded body"
            raise H1Error(too_big(what, MAX_DECODED_BYTES, "MAX_DECODED_BYTES"))
        decoder.finish()  # a whole body that stops mid-stream is not a body
        return decoded
