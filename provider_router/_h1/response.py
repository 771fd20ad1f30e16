"""One answer on a lean connection: status and headers on arrival, the body whole or streamed."""

from __future__ import annotations

import asyncio
import re
import zlib
from typing import Final, Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from provider_router._h1.errors import H1Error

__all__ = ["H1Response"]

PAUSE_BYTES: Final = 1 << 20
"""A streamed body buffered past this pauses reading until the reader catches up."""

_HEADER: Final = re.compile(r"\r\n([^:\r\n]+):[ \t]*([^\r\n]*?)[ \t]*(?=\r\n|\Z)")


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
    :class:`provider_router._http.PostResponse` reads either.
    """

    __slots__ = (
        "_body",
        "_buffered",
        "_chunk_waiter",
        "_conn",
        "_decoder",
        "_encoding",
        "_eof",
        "_error",
        "_head",
        "_headers",
        "_paused",
        "_reusable",
        "_waiter",
        "status",
    )

    def __init__(self, conn: _Carrier, status: int, head: str, reusable: bool) -> None:
        self._conn: _Carrier | None = conn
        self.status = status
        self._head = head
        self._headers: CIMultiDictProxy[str] | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._error: H1Error | None = None
        self._waiter: asyncio.Future[None] | None = None  # read(): woken at the end
        self._chunk_waiter: asyncio.Future[None] | None = None  # iteration: woken per piece
        self._paused = False
        self._reusable = reusable
        self._encoding: str | None = None
        self._decoder: zlib._Decompress | None = None

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The answer's headers (case-insensitive), parsed on first use."""
        headers = self._headers
        if headers is None:
            headers = self._headers = CIMultiDictProxy(CIMultiDict(_HEADER.findall(self._head)))
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
            H1Error: the connection broke before the body's end (a truncated body).
        """
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
        """The bytes that arrived since the last call, waiting for some.

        Raises:
            StopAsyncIteration: the body ended.
            H1Error: it was cut short (``H1ReadTimeout``: nothing came in time).
        """
        while not self._body:
            if self._eof:
                if self._error is not None:
                    raise self._error
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
        if self._encoding is not None:
            data = self._decode_piece(data)
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
        waiter = self._chunk_waiter
        if waiter is not None:
            self._chunk_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        else:
            self._buffered += len(data)
            if self._buffered > PAUSE_BYTES and not self._paused and self._waiter is None:
                # A stream read slower than it arrives: stop reading the socket (the
                # server's sending slows to match) until the reader takes what is here.
                conn = self._conn
                if conn is not None:
                    self._paused = True
                    conn.pause(True)

    def _finish(self, error: H1Error | None = None) -> None:
        self._eof = True
        self._error = error
        for waiter in (self._waiter, self._chunk_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self._waiter = self._chunk_waiter = None

    def _decoded(self) -> bytes:
        body = b"".join(self._body)
        if self._encoding is None or not body:
            return body
        data = self._decode_piece(body)
        decoder = self._decoder
        assert decoder is not None  # made by _decode_piece
        if not decoder.eof:  # a whole body that stops mid-stream is not a body
            raise H1Error(f"the answer's {self._encoding} body is cut short")
        return data

    def _decode_piece(self, data: bytes) -> bytes:
        """Decode the next piece of a compressed body (streamed or whole)."""
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = zlib.decompressobj(_wbits(self._encoding, data))
        try:
            return decoder.decompress(data)
        except zlib.error:
            raise H1Error(f"the answer's {self._encoding} body could not be decoded") from None


def _wbits(encoding: str | None, start: bytes) -> int:
    """zlib's window bits for a body: gzip or zlib detected (47); for ``deflate`` a raw
    stream (-15) when it lacks the zlib header some servers leave out."""
    if encoding == "gzip":
        return 47
    if len(start) < 2:
        return 15  # too little to tell: the standard's zlib stream
    zlib_header = start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0
    return 15 if zlib_header else -15
