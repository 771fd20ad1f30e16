"""How a stream's events leave the simulator: one write per event, or gathered.

At a finite speed each SSE event is written when it is due (the simulator sleeps
between them). At infinite speed no time passes between events, so a real server's
back-to-back events would share TCP segments all the same; writing each one
separately only costs CPU (aiohttp's chunked framing and one ``send`` per event:
about a third of the simulator's time per stream). :class:`EventWriter` then
gathers them and writes up to :data:`GATHER_BYTES` at a time: what the client
reads is byte-for-byte the same stream. A client that goes away is still noticed
when a write fails (``ConnectionResetError``) or the task is cancelled, at most
:data:`GATHER_BYTES` later than with one write per event (the transport buffers
that much before it pushes back anyway).
"""

from __future__ import annotations

from aiohttp import web

__all__ = ["GATHER_BYTES", "EventWriter"]

GATHER_BYTES = 64 * 1024
"""Gathered bytes written at once: aiohttp's write-buffer high-water mark."""


class EventWriter:
    """Writes a stream's events to ``response``; ``gather``: hold them until
    :data:`GATHER_BYTES` have collected or :meth:`flush` is called."""

    __slots__ = ("_gather", "_parts", "_response", "_size", "_tap")

    def __init__(
        self, response: web.StreamResponse, *, gather: bool, tap: list[bytes] | None = None
    ) -> None:
        self._response = response
        self._gather = gather
        self._parts: list[bytes] = []
        self._size = 0
        self._tap = tap
        """Collects every event written (a stream kept by the response cache)."""

    async def write(self, data: bytes) -> None:
        if self._tap is not None:
            self._tap.append(data)
        if not self._gather:
            await self._response.write(data)
            return
        self._parts.append(data)
        self._size += len(data)
        if self._size >= GATHER_BYTES:
            await self.flush()

    async def flush(self) -> None:
        """Write what was gathered (before ending, aborting or waiting)."""
        if self._parts:
            data = b"".join(self._parts)
            self._parts.clear()
            self._size = 0
            await self._response.write(data)
