"""Undo a body's ``gzip`` or ``deflate`` coding incrementally, never producing more than asked.

zlib's ``max_length`` keeps the input that would inflate past the bound
(``unconsumed_tail``): a 2 MB gzip bomb costs at most the bytes the caller asks
for, however far it would inflate. Each gzip member is decoded in turn (RFC 1952
allows several; ``zlib`` alone stops at the first); a ``deflate`` body is the
zlib stream the standard names, or the raw deflate some servers send. A body that
ends before its compressed stream does is cut short, whole or streamed.
"""

from __future__ import annotations

import zlib
from typing import Final

from provider_router._h1.errors import H1Error

__all__ = ["CODINGS", "BodyDecoder"]

CODINGS: Final = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
"""The codings decoded (what an answer may name → how it is decoded)."""

_GZIP_OR_ZLIB: Final = 47  # zlib's wbits: detect a gzip or zlib header
_ZLIB: Final = 15
_RAW: Final = -15


class BodyDecoder:
    """One body's coding, undone piece by piece (:meth:`feed`, :meth:`more`, :meth:`finish`)."""

    __slots__ = ("_coding", "_input", "_stream")

    def __init__(self, coding: str) -> None:
        self._coding = coding  # "gzip" or "deflate"
        self._input = b""  # taken from the body, not decoded yet
        self._stream: zlib._Decompress | None = None

    @property
    def pending(self) -> bool:
        """Whether input is waiting that may decode to more (call :meth:`more`)."""
        stream = self._stream
        return bool(self._input) and (stream is None or not stream.eof or self._coding == "gzip")

    def feed(self, data: bytes, limit: int) -> bytes:
        """Add ``data``; return at most ``limit`` decoded bytes (the rest stays pending)."""
        self._input = self._input + data if self._input else data
        return self.more(limit)

    def more(self, limit: int) -> bytes:
        """Up to ``limit`` more decoded bytes from the input already fed."""
        out: list[bytes] = []
        room = limit
        while self._input and room > 0:
            stream = self._stream
            if stream is None or stream.eof:
                if stream is not None and self._coding != "gzip":
                    self._input = b""  # bytes after a deflate stream's end: not the body's
                    break
                wbits = self._wbits()
                if wbits is None:
                    break  # too few bytes yet to tell a zlib stream from a raw one
                stream = self._stream = zlib.decompressobj(wbits)  # the next gzip member
            try:
                piece = stream.decompress(self._input, room)
            except zlib.error:
                raise H1Error(f"the answer's {self._coding} body could not be decoded") from None
            self._input = stream.unused_data if stream.eof else stream.unconsumed_tail
            out.append(piece)
            room -= len(piece)
            if not piece and not stream.eof and not stream.unconsumed_tail:
                break  # all input taken: more is needed
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self) -> None:
        """The body ended: raise unless its compressed stream ended too.

        Raises:
            H1Error: the body stopped mid-stream (a cut or a bad body).
        """
        stream = self._stream
        if stream is None or not stream.eof or (self._input and self._coding == "gzip"):
            raise H1Error(f"the answer's {self._coding} body is cut short")

    def _wbits(self) -> int | None:
        if self._coding == "gzip":
            return _GZIP_OR_ZLIB
        start = self._input
        if len(start) < 2:
            return None
        zlib_header = start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0
        return _ZLIB if zlib_header else _RAW
