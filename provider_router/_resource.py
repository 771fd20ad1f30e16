"""The ``async with`` protocol, written once.

Every object of ours that holds a session, a socket or a store is used as
``async with obj:``. :class:`AsyncResource` holds the two dunder methods; a
class says what entering and leaving mean through two hooks, which usually
call its public life-cycle methods (``close()``, ``aclose()``, ``start()``...).

Neutral ground: it imports nothing from the package, so both the client side
and the simulator (``provider_router.testing``) may use it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncResource"]


class AsyncResource:
    """Mixin for objects used as ``async with obj:``.

    Entering awaits :meth:`_on_enter` (nothing by default) and gives back the object
    itself; leaving awaits :meth:`_on_exit`, also when the block raised, and never
    suppresses the exception. When the block is already failing, an error from the
    clean-up does not replace it: the block's error is raised, with a note naming
    the clean-up failure.
    """

    __slots__ = ()

    async def _on_enter(self) -> None:
        """Get ready for use (``async with`` entry); nothing by default."""

    async def _on_exit(self) -> None:
        """Free what the object holds (``async with`` exit)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self._on_enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self._on_exit()
            return
        try:
            await self._on_exit()
        except Exception as cleanup:
            exc.add_note(f"while cleaning up after it: {cleanup!r}")
