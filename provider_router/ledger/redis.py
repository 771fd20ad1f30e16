"""A ledger in Redis: one budget for any number of processes on any number of hosts.

Each batch of operations is one Lua script call, which Redis runs atomically: every
reserve checks and updates the shared totals in one step, so no two workers can
together pass the limit. Money is integer picodollars, exact for every limit a ledger
accepts (:mod:`~provider_router.ledger._redis_lua`). Reservations carry a lease their
owner renews; whoever calls :meth:`RedisLedger.recover` after a dead worker's lease
ran out reconciles its open reservations or counts them at worst case. Lease
deadlines use the callers' wall clocks, so hosts' clocks must agree to well within a
lease (NTP does). Needs the ``redis`` extra.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from provider_router._exceptions import (
    ConfigurationError,
    LedgerUnavailableError,
    MissingDependencyError,
)
from provider_router._format import decimal_str
from provider_router._money import from_units
from provider_router._types import Clock, Sleep
from provider_router.ledger import _group_commit as b
from provider_router.ledger._base import LedgerState, Reservation, limit_units
from provider_router.ledger._durable import DurableLedger
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW, OutageWindow
from provider_router.ledger._redis_lua import BATCH, INIT
from provider_router.ledger._totals import Totals

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisLedger"]

DEFAULT_PREFIX: Final = "provider-router:ledger"
DEFAULT_LEASE: Final = 60.0
DEFAULT_POLL_INTERVAL: Final = 0.05
SOCKET_TIMEOUT: Final = 10.0
"""Seconds before a silent Redis counts as unreachable (a script call takes milliseconds)."""


def _import_redis_retry() -> tuple[Any, Any, Any]:
    import redis.asyncio.retry
    import redis.backoff
    import redis.exceptions

    return redis.exceptions, redis.asyncio.retry, redis.backoff


def _where(url: str) -> str:
    """Redis's address for messages, without the credentials a URL may carry."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return f"Redis at {parts.path or 'its socket'}"
    return f"Redis at {parts.hostname}:{parts.port or 6379}"


def _import_redis() -> Any:
    try:
        import redis.asyncio
    except ImportError as exc:
        raise MissingDependencyError("RedisLedger", "redis") from exc
    return redis.asyncio


class RedisLedger(DurableLedger):
    """A :class:`~provider_router.Ledger` shared through Redis.

    Args:
        url: a Redis URL such as ``redis://host:6379/0``.
        name: the ledger's name; every process using the same name shares one budget.
        limit: the budget in USD; required the first time a name is used. Opening
            an existing ledger with a different limit is refused (use :meth:`set_limit`).
        lease: seconds an open reservation stays owned without renewal.
        poll_interval: seconds between retries of waiting reservations.
        commit_interval: seconds between the starts of two batches under load
            (default 10 ms: group commit sized by time, stretched up to 2.5×
            when reservations are held for seconds; ``0`` commits at once).
        prefix: the key prefix (keys are ``<prefix>:{<name>}:...``).
        outage_window: seconds an unreachable Redis is waited out: every call is
            retried with backoff (0.05 s doubling to 2 s), so admission pauses and
            resumes with nothing lost. Past it, calls raise
            :class:`~provider_router.LedgerUnavailableError`.
        clock: wall-clock seconds for leases; injected in tests.
        sleep, monotonic: the retry's sleep and clock; injected in tests.

    Attributes:
        identity: a random id fixed when the ledger was created (known after the
            first call reached Redis); a batch journal records it.
        created: whether this instance created the ledger.

    Raises:
        MissingDependencyError: the ``redis`` package is not installed.
        ConfigurationError: a bad name or limit (a missing or changed limit is
            reported by the first operation, which is the first to reach Redis).
    """

    def __init__(
        self,
        url: str,
        name: str,
        limit: Decimal | None = None,
        *,
        lease: float = DEFAULT_LEASE,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        commit_interval: float = b.DEFAULT_COMMIT_INTERVAL,
        prefix: str = DEFAULT_PREFIX,
        outage_window: float = DEFAULT_OUTAGE_WINDOW,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        monotonic: Clock = time.monotonic,
    ) -> None:
        aioredis = _import_redis()
        super().__init__(
            lease=lease, poll_interval=poll_interval, clock=clock, commit_interval=commit_interval
        )
        if not name or "{" in name or "}" in name:
            raise ConfigurationError(
                f"a Redis ledger name must be non-empty, without braces: {name!r}"
            )
        self.name = name
        self._limit = None if limit is None else limit_units(limit)
        base = f"{prefix}:{{{name}}}:"
        self._keys = [base + "totals", base + "leases", base + "recovered"]
        self._res_prefix = base
        if not outage_window > 0:
            raise ConfigurationError(
                f"outage_window must be positive seconds, got {outage_window!r}"
            )
        exceptions, retry, backoff = _import_redis_retry()
        # Ours is the only retry (redis-py's own would resend a script whose reply was
        # lost, and sleep where tests cannot see it); the script makes resending safe.
        self._client: Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
            retry=retry.Retry(backoff.NoBackoff(), 0),
        )
        self._outage = OutageWindow(
            _where(url),
            outage_window,
            (exceptions.ConnectionError, exceptions.TimeoutError, OSError),
            sleep=sleep,
            clock=monotonic,
        )
        self._response_error: type[Exception] = exceptions.ResponseError
        self._batches = itertools.count(1)
        # A retried batch must find its answer: remember it a minute past the window.
        self._remember = math.ceil(outage_window) + 60
        self._batch_script = self._client.register_script(BATCH)
        self._ready = False
        self._url = url
        self.identity: str | None = None
        self.created = False

    def __repr__(self) -> str:
        return f"RedisLedger(name={self.name!r})"

    async def exists(self) -> bool:
        """Whether a ledger of this name is already in Redis (a new one needs a limit)."""
        return bool(await self._client.exists(self._keys[0]))

    async def _init(self) -> None:
        arg = "" if self._limit is None else str(self._limit)
        found = await self._client.eval(INIT, 1, self._keys[0], arg, uuid.uuid4().hex)
        if found is None:
            raise ConfigurationError(f"Redis ledger {self.name!r} is new: give it a limit")
        stored, identity, created = found
        self.identity, self.created = _text(identity), bool(int(created))
        stored_units = int(stored)
        if self._limit is not None and stored_units != self._limit:
            raise ConfigurationError(
                f"Redis ledger {self.name!r} has a limit of "
                f"${decimal_str(from_units(stored_units))}, not "
                f"${decimal_str(from_units(self._limit))}: change it with set_limit() or "
                "`provider-router ledger topup`, never by reopening"
            )
        self._ready = True

    async def _execute(self, batch: list[b.Op]) -> tuple[int, int, int]:
        if not self._ready:
            await self._outage.call(self._init)
        now = self._clock()
        batch_id = f"{self.owner}:{next(self._batches)}"
        args: list[Any] = [
            self._res_prefix,
            repr(now),
            repr(self.lease),
            self.owner,
            batch_id,
            self._remember,
        ]
        groups: list[b.Op] = []
        for op in batch:
            if op.kind == b.RENEW:
                for res_id in op.value[1]:
                    args += (b.RENEW, res_id, 0, "", 0, "", "")
                    groups.append(op)
                continue
            cost: Any = repr(op.value) if op.kind == b.CLAIM else op.cost
            est = "" if op.estimate is None else op.estimate
            args += (op.kind, op.id, op.units, op.key, cost, est, op.generation_id or "")
            groups.append(op)
        try:
            totals, outcomes, payloads = await self._outage.call(
                lambda: self._batch_script(keys=self._keys, args=args)
            )
        except self._response_error as exc:
            if "provider-router ledger missing" not in str(exc):
                raise
            raise LedgerUnavailableError(
                f"Redis ledger {self.name!r} is gone from {self._outage.what} (restarted "
                "without persistence, or its keys were deleted): its totals and open "
                "reservations are lost. Restore Redis's data (run it with appendonly yes), "
                "or create a new ledger deliberately"
            ) from None
        for op, outcome, payload in zip(groups, outcomes, payloads, strict=True):
            op.outcome = int(outcome)
            if op.kind == b.SNAPSHOT:
                op.value = _state(payload)
            elif op.kind in (b.LIST_OPEN, b.CLAIM):
                op.value = [_reservation(entry) for entry in payload]
        return int(totals[0]), int(totals[1]), int(totals[2])

    async def _close_store(self) -> None:
        await self._client.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _state(payload: list[bytes]) -> LedgerState:
    return Totals(*(int(x) for x in payload)).state()


def _reservation(entry: list[bytes]) -> Reservation:
    res_id, units, key, gen, owner = (_text(x) for x in entry)
    return Reservation(res_id, int(units), key, gen or None, owner)
