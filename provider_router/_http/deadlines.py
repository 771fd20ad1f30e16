"""Request deadlines for the HTTP layer: one loop timer per client, not one per request.

aiohttp's per-request ``total`` timeout arms a loop timer for every request: a heap
insert and removal among thousands of live timers (docs/performance.md). Here a
request registers itself in a FIFO of its timeout value (deadlines of one value
arrive in order), and one timer per client wakes at the earliest deadline and
expires every request past it: at most :data:`GRANULARITY` late, never early.

A deadline behaves as aiohttp's ``TimerContext``: it cancels the request's task only
while that task waits inside the HTTP layer, and turns that cancel into
``TimeoutError``; one that passes while the caller runs its own code (a ledger write
between two stream reads) makes the next wait raise instead (docs/client.md).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Final

__all__ = ["GRANULARITY", "Deadline", "Deadlines"]

GRANULARITY: Final = 0.01
"""Seconds after its deadline a request may still run (plus event-loop lag)."""

_LIVE: Final = 0
_EXPIRED: Final = 1  # the deadline passed: the next guarded wait raises TimeoutError
_CANCELLED: Final = 2  # the deadline cancelled the task in a guarded wait: take it back

_NEVER: Final = float("inf")


class Deadline:
    """One request's deadline, registered in its client's :class:`Deadlines` until ended.

    A guarded wait is ``with deadline: await ...`` (:meth:`Deadlines.begin` enters the
    first one, which ``_leave(exc)`` ends with the exception it raised, ``None`` when
    it returned); ``_end()`` unregisters.
    """

    __slots__ = ("_cancelling", "_fifo", "_owner", "_state", "_task", "_when")

    _fifo: dict[Deadline, None] | None
    _owner: Deadlines
    _task: asyncio.Task[object] | None
    _when: float
    _state: int
    _cancelling: int

    def _complete(self) -> bool:
        """Whether nothing is left to wait for (then a passed deadline changes nothing)."""
        return False

    def _enter(self) -> None:
        """Start a guarded wait in the current task; ``TimeoutError`` if already expired."""
        if self._state:
            raise TimeoutError
        task: asyncio.Task[object] = asyncio.current_task()  # type: ignore[assignment]
        # As asyncio.timeout does: a cancel pending before the wait is not ours to take back.
        self._cancelling = task.cancelling()
        self._task = task

    __enter__ = _enter

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave(exc)  # raises TimeoutError when the deadline's own cancel ended the wait

    def _leave(self, exc: BaseException | None) -> None:
        """End a guarded wait; ``TimeoutError`` when the deadline (alone) cancelled it."""
        task = self._task
        self._task = None
        if self._state == _CANCELLED and task is not None:
            self._state = _EXPIRED
            if task.uncancel() <= self._cancelling and isinstance(exc, asyncio.CancelledError):
                raise TimeoutError from exc

    def _end(self) -> None:
        """Unregister (the request ended: released, closed, failed). Safe to call twice."""
        fifo = self._fifo
        if fifo is not None:
            self._fifo = None
            del fifo[self]
            if not fifo and self._owner._closed:
                self._owner._stop_if_idle()


class Deadlines:
    """The deadlines of one client's requests, enforced by one loop timer."""

    __slots__ = ("_armed_at", "_closed", "_fifos", "_loop", "_timer")

    def __init__(self) -> None:
        self._fifos: dict[float, dict[Deadline, None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = _NEVER
        self._closed = False

    def __len__(self) -> int:
        """Requests registered now."""
        return sum(len(fifo) for fifo in self._fifos.values())

    @property
    def timer_armed(self) -> bool:
        """Whether the loop timer is pending."""
        return self._timer is not None

    def begin(self, entry: Deadline, seconds: float) -> None:
        """Register ``entry`` to expire ``seconds`` from now and start its first guarded
        wait in the current task (one call on the per-request path)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        fifo = self._fifos.get(seconds)
        if fifo is None:
            fifo = self._fifos[seconds] = {}
        fifo[entry] = None
        entry._fifo = fifo
        entry._owner = self
        entry._when = when
        entry._state = _LIVE
        entry._enter()
        if when < self._armed_at:
            self._arm(loop, when)

    def close(self) -> None:
        """Stop the timer now if nothing is registered, else once the last request ends."""
        self._closed = True
        self._stop_if_idle()

    def _stop_if_idle(self) -> None:
        if any(self._fifos.values()):
            return
        self._fifos.clear()
        timer = self._timer
        if timer is not None:
            self._timer = None
            self._armed_at = _NEVER
            timer.cancel()

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self._armed_at = when
        self._timer = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Expire every request whose deadline passed; re-arm for the earliest left."""
        self._timer = None
        self._armed_at = _NEVER
        loop = self._loop
        assert loop is not None  # armed only by begin()
        now = loop.time()
        earliest = _NEVER
        for seconds, fifo in list(self._fifos.items()):
            expired: list[Deadline] = []
            for entry in fifo:  # sorted: stop at the first deadline still ahead
                if entry._when > now:
                    earliest = min(earliest, entry._when)
                    break
                expired.append(entry)
            for entry in expired:
                del fifo[entry]
                entry._fifo = None
                _expire(entry)
            if not fifo:
                del self._fifos[seconds]
        if earliest < _NEVER:
            # Deadlines that pass within GRANULARITY of now share the next wake-up.
            self._arm(loop, max(earliest, now + GRANULARITY))


def _expire(entry: Deadline) -> None:
    task = entry._task
    if task is not None:
        entry._state = _CANCELLED
        task.cancel()
    elif not entry._complete():
        entry._state = _EXPIRED
