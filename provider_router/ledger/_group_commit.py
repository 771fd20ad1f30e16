"""Group commit: operations from concurrent coroutines share one store round trip.

Every ledger call becomes an :class:`Op` with a future. Ops that arrive while a batch
is being written wait for the next one, so under load each transaction (SQLite) or
script call (Redis) carries many operations and its fixed cost is shared; with one
caller a batch holds one op. A call returns only after its batch is durable.
Reservations that asked to wait and did not fit stay queued, first come first served,
and are retried after the settles of every later batch and on a poll timer. Batches
are also sized by time: one starts at least ``commit_interval`` after the one before,
stretched with how long reservations are held (up to :data:`MAX_STRETCH` times), so
each commit carries that much work instead of whoever happened to be waiting; an idle
store still commits at once (docs/ledger.md).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from provider_router._exceptions import ConfigurationError
from provider_router._log import get_logger
from provider_router.ledger._base import exhausted, new_reservation

log = get_logger(__name__)

DEFAULT_COMMIT_INTERVAL = 0.01
"""Seconds between the starts of two batches under load (see the module docstring)."""
DEFAULT_MAX_BATCH = 512
"""Pending ops that start a batch at once, without waiting out the commit interval."""
HOLD_SHARE = 0.0125
"""The commit interval may grow to this share of the mean reserve-to-settle time..."""
MAX_STRETCH = 2.5
"""...but to no more than this many times ``commit_interval``."""
_HOLD_WEIGHT = 1 / 64  # of each new hold in the moving average

# Op kinds. Reservations are applied after everything that may free room.
RESERVE = 0
ATTACH = 1
SETTLE = 2
RELEASE = 3
SET_LIMIT = 4
SNAPSHOT = 5
LIST_OPEN = 6
CLAIM = 7
RECONCILE = 8
CHARGE_WORST = 9
RENEW = 10

# Outcomes a store writes into ``Op.outcome``.
OK = 0
REFUSED = 1  # does not fit now; might after settles
NEVER = 2  # would not fit even if everything in flight settled at no cost
NOT_OPEN = 3  # unknown id, or already settled or released
LATE = 4  # the reservation was closed by recovery: nothing (more) to do

_ACTIONS = {
    ATTACH: "attach to",
    SETTLE: "settle",
    RELEASE: "release",
    RECONCILE: "reconcile",
    CHARGE_WORST: "recover",
}


class Op:
    """One ledger operation on its way to the store (a plain slotted record)."""

    __slots__ = (
        "cost",
        "deadline",
        "estimate",
        "future",
        "generation_id",
        "id",
        "key",
        "kind",
        "outcome",
        "provider",
        "units",
        "value",
        "waiting",
    )

    def __init__(self, kind: int, id: str = "", units: int = 0, key: str = "") -> None:
        self.kind = kind
        self.id = id
        self.units = units
        self.key = key
        self.cost = 0
        self.estimate: int | None = None
        self.provider: str | None = None
        self.generation_id: str | None = None
        self.waiting = False
        self.deadline: float | None = None
        self.future: asyncio.Future[Any] | None = None
        self.outcome = OK
        self.value: Any = None


Execute = Callable[[list[Op]], Awaitable[tuple[int, int, int]]]
"""Apply a batch in order, set each op's outcome and value; return the totals
``(limit, spent, reserved)`` after the batch, in units."""


class Batcher:
    """Queues ops, writes them in batches through ``execute``, resolves their futures.

    Args:
        execute: applies one batch atomically (one transaction or one script call).
        owner: the owning ledger instance id, stamped on reservations.
        poll_interval: seconds between retries of waiting reservations when no
            local activity retries them (room freed by other processes).
        on_failure: told of each batch the store could not apply (before its
            callers hear of it); default: an error event naming the cause.
    """

    def __init__(
        self,
        execute: Execute,
        *,
        owner: str,
        poll_interval: float,
        commit_interval: float = 0.0,
        max_batch: int = DEFAULT_MAX_BATCH,
        on_failure: Callable[[list[Op], Exception], None] | None = None,
    ) -> None:
        self._execute = execute
        self._on_failure = on_failure or _log_batch_failure
        self._commit_interval = commit_interval
        self._max_batch = max_batch
        self._started = -math.inf
        self._pause: asyncio.Future[None] | None = None
        self._hurry = False
        self._owner = owner
        self._poll_interval = poll_interval
        self._pending: list[Op] = []
        self._waiters: deque[Op] = deque()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = (0, 0, 0)
        self._poll_due = False
        self._hold = 0.0
        self._interval = commit_interval
        self.mine: dict[str, float | None] = {}
        """Ids of the reservations this instance holds open (for lease renewal), with
        the loop time they were admitted (``None`` for those taken over by recovery)."""

    def submit(self, op: Op) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        op.future = fut = loop.create_future()
        self._pending.append(op)
        if len(self._pending) >= self._max_batch:
            self._end_pause()
        if self._task is None:
            self._task = loop.create_task(self._run())
        return fut

    def submit_quietly(self, op: Op) -> None:
        """Submit an op nobody awaits (a lease renewal, a release after a cancel)."""
        self.submit(op).add_done_callback(_log_failure)

    @property
    def busy(self) -> bool:
        return self._task is not None or bool(self._pending)

    async def drain(self) -> None:
        """Wait until every submitted op is written (at once: no more commit pauses)."""
        self._hurry = True
        self._end_pause()
        try:
            while self._task is not None:
                await asyncio.shield(self._task)
        finally:
            self._hurry = False

    def queued_for_room(self) -> int:
        """Reservations queued for room that have not fitted yet (nor been cancelled)."""
        return sum(1 for op in self._waiters if op.future is None or not op.future.done())

    def fail_waiters(self, exc: Exception) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for op in self._waiters:
            if op.future is not None and not op.future.done():
                op.future.set_exception(exc)
        self._waiters.clear()

    # --- the write loop -----------------------------------------------------------

    def _end_pause(self) -> None:
        pause = self._pause
        if pause is not None and not pause.done():
            pause.set_result(None)

    @property
    def interval(self) -> float:
        """The current commit interval (``commit_interval``, stretched by long holds)."""
        return self._interval

    def _held(self, since: float, now: float) -> None:
        """Fold one reserve-to-settle time into the average; re-size the interval."""
        hold = now - since
        self._hold += (hold - self._hold) * _HOLD_WEIGHT if self._hold else hold
        base = self._commit_interval
        self._interval = min(max(base, self._hold * HOLD_SHARE), base * MAX_STRETCH)

    async def _wait_interval(self, loop: asyncio.AbstractEventLoop) -> None:
        delay = self._started + self._interval - loop.time()
        if delay <= 0 or self._hurry or len(self._pending) >= self._max_batch:
            return
        self._pause = pause = loop.create_future()
        timer = loop.call_later(delay, _resolve, pause)
        try:
            await pause
        finally:
            timer.cancel()
            self._pause = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._commit_interval > 0:
                    await self._wait_interval(loop)
                batch = self._build()
                if not batch:
                    return
                self._started = loop.time()
                try:
                    self._last = await self._execute(batch)
                except Exception as exc:
                    self._on_failure(batch, exc)
                    for op in batch:
                        _fail(op, exc)
                    continue
                self._deliver(batch)
        finally:
            self._task = None
            self._arm_poll()

    def _build(self) -> list[Op]:
        pending, self._pending = self._pending, []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        frees = [op for op in pending if op.kind != RESERVE]
        news = [op for op in pending if op.kind == RESERVE]
        # Waiters are retried only when room may have come free: after local
        # settles (in this same batch) or when the poll timer fires (other processes).
        retry, self._poll_due = bool(frees) or self._poll_due, False
        if not retry:
            return news
        now = asyncio.get_running_loop().time()
        waiting: list[Op] = []
        while self._waiters:
            op = self._waiters.popleft()
            fut = op.future
            if fut is None or fut.done():  # cancelled while waiting
                continue
            if op.deadline is not None and now >= op.deadline:
                fut.set_exception(exhausted(op.units, *self._last))
                continue
            waiting.append(op)
        return frees + waiting + news

    def _deliver(self, batch: list[Op]) -> None:
        limit, spent, reserved = self._last
        now = asyncio.get_running_loop().time()
        mine = self.mine
        for op in batch:
            fut = op.future
            assert fut is not None
            outcome = op.outcome
            if op.kind == RESERVE:
                if outcome == OK:
                    res = new_reservation(op.id, op.units, op.key, self._owner)
                    mine[op.id] = now
                    if fut.done():  # the caller gave up while the row was written
                        self._give_back(op.id, op.units)
                    else:
                        fut.set_result(res)
                    continue
                if outcome == REFUSED and op.waiting:
                    op.outcome = OK
                    self._waiters.append(op)
                    continue
                if not fut.done():
                    fut.set_exception(exhausted(op.units, limit, spent, reserved))
                continue
            if op.kind in (SETTLE, RELEASE, CHARGE_WORST, RECONCILE):
                since = mine.pop(op.id, None)
                if since is not None and outcome == OK:
                    self._held(since, now)
            if fut.done():
                continue
            if outcome == NOT_OPEN:
                fut.set_exception(
                    ConfigurationError(
                        f"cannot {_ACTIONS.get(op.kind, 'use')} reservation {op.id!r}: it is "
                        "not open in this ledger (unknown, or already settled or released)"
                    )
                )
            else:
                if outcome == LATE:
                    log.warning("ledger.late_close", reservation=op.id, kind=op.kind)
                fut.set_result(op.value)

    def _give_back(self, res_id: str, units: int) -> None:
        op = Op(RELEASE, res_id, units)
        self.submit_quietly(op)

    def _arm_poll(self) -> None:
        if not self._waiters or self._timer is not None or self._pending:
            if self._pending and self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run())
            return
        loop = asyncio.get_running_loop()
        delay = self._poll_interval
        deadlines = [op.deadline for op in self._waiters if op.deadline is not None]
        if deadlines:
            delay = max(0.0, min(delay, min(deadlines) - loop.time()))
        self._timer = loop.call_later(delay, self._poll)

    def _poll(self) -> None:
        self._timer = None
        self._poll_due = True
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _log_batch_failure(batch: list[Op], exc: Exception) -> None:
    log.error("ledger.write_failed", ops=len(batch), error=repr(exc))


def _fail(op: Op, exc: Exception) -> None:
    if op.future is not None and not op.future.done():
        op.future.set_exception(exc)


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and (exc := fut.exception()) is not None:
        log.error("ledger.background_op_failed", error=repr(exc))
