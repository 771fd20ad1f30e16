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

from provider_router._http.h1.errors import H1Error

__all__ = ["CODINGS", "BodyDecoder"]

CODINGS: Final = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
"""The codings decoded (what an answer may name → how it is decoded)."""

_GZIP_OR_ZLIB: Final = 47  # zlib's wbits: detect a gzip or zlib header
_ZLIB: Final = 15
_RAW: Final = -15
_STEP: Final = 64 * 1024  # input and output per zlib call (see BodyDecoder)


class BodyDecoder:
    """One body's coding, undone piece by piece (:meth:`feed`, :meth:`more`, :meth:`finish`).

    zlib is handed at most :data:`_STEP` bytes of input and asked for at most
    :data:`_STEP` bytes of output a call: with a large input or output zlib copies
    what it keeps back, and those copies cost more than the inflating.
    """

    __slots__ = ("_at", "_coding", "_input", "_stream", "_tail")

    def __init__(self, coding: str) -> None:
        self._coding = coding  # "gzip" or "deflate"
        self._input = b""  # taken from the body; decoded up to _at
        self._at = 0
        self._tail = b""  # handed to zlib, given back undecoded
        self._stream: zlib._Decompress | None = None

    @property
    def pending(self) -> bool:
        """Whether input is waiting that may decode to more (call :meth:`more`)."""
        if not self._tail and self._at >= len(self._input):
            return False
        stream = self._stream
        return stream is None or not stream.eof or self._coding == "gzip"

    def feed(self, data: bytes, limit: int) -> bytes:
        """Add ``data``; return at most ``limit`` decoded bytes (the rest stays pending)."""
        if self._at < len(self._input):
            self._input = self._input[self._at :] + data
        else:
            self._input = data
        self._at = 0
        return self.more(limit)

    def more(self, limit: int) -> bytes:
        """Up to ``limit`` more decoded bytes from the input already fed."""
        out: list[bytes] = []
        room = limit
        while room > 0:
            if not self._tail:
                if self._at >= len(self._input):
                    break  # all input taken: more is needed
                self._tail = self._input[self._at : self._at + _STEP]
                self._at += len(self._tail)
            stream = self._stream
            if stream is None or stream.eof:
                if stream is not None and self._coding != "gzip":
                    self._tail, self._at = b"", len(self._input)  # after a deflate stream's end
                    break
                wbits = self._wbits()
                if wbits is None:
                    break  # too few bytes yet to tell a zlib stream from a raw one
                stream = self._stream = zlib.decompressobj(wbits)  # the next gzip member
            try:
                piece = stream.decompress(self._tail, min(room, _STEP))
            except zlib.error:
                raise H1Error(f"the answer's {self._coding} body could not be decoded") from None
            self._tail = stream.unused_data if stream.eof else stream.unconsumed_tail
            if piece:
                out.append(piece)
                room -= len(piece)
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self) -> None:
        """The body ended: raise unless its compressed stream ended too.

        Raises:
            H1Error: the body stopped mid-stream (a cut or a bad body).
        """
        stream = self._stream
        if stream is None or not stream.eof or (self._coding == "gzip" and self.pending):
            raise H1Error(f"the answer's {self._coding} body is cut short")

    def _wbits(self) -> int | None:
        if self._coding == "gzip":
            return _GZIP_OR_ZLIB
        start = self._tail
        if len(start) < 2:
            if self._at >= len(self._input):
                return None
            start = self._tail = start + self._input[self._at : self._at + 1]
            self._at += 1
        zlib_header = start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0
        return _ZLIB if zlib_header else _RAW
