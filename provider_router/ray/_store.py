"""Paid answers in Redis, keyed by prompt: what makes a retried Ray task free.

Ray retries a task whose actor died by running the whole task again; without a
record of what was already paid, every answer of that task would be bought a
second time (1,263-1,280 rows paid twice per kill, measured in #22), and the
retry's answers differ, so its blocks split differently and ids repeat in the
output. The stage therefore stores each paid answer here *before* returning it;
a retried task finds it and re-emits the same row for nothing, so blocks split
the same way and the output has each id once.

Three hashes per job (``<prefix>:{<name>}:...``):

* ``answers``: row key -> the answer's fields (JSON), written once per paid answer;
* ``unsent``: row key -> why it was not sent (the budget, OpenRouter's credits...);
* ``failed``: row key -> the error kind of a prompt that failed (retried next run).

Storing an answer removes its key from the other two in the same transaction, so
a resumed run's tally is always "answered, or the latest reason it is not".

Lookups are coalesced: every :meth:`AnswerStore.get` issued in one event-loop turn
(Ray Data starts a task's rows together) becomes one ``HMGET``. The connection
pool blocks when it is empty instead of failing: 256 rows calling Redis at once
exhausted redis-py's default pool ("Too many connections") in the prototype.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from provider_router._exceptions import MissingDependencyError

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["DEFAULT_STORE_PREFIX", "AnswerStore"]

DEFAULT_STORE_PREFIX: Final = "provider-router:ray"
MAX_CONNECTIONS: Final = 16
"""Connections one stage actor holds at most; more callers wait for a free one."""
POOL_TIMEOUT: Final = 30.0
"""Seconds a call waits for a free connection before it fails."""
SOCKET_TIMEOUT: Final = 10.0
MAX_LOOKUP: Final = 1024
"""Keys in one ``HMGET`` at most (a bigger turn is split)."""


_Answer: TypeAlias = "asyncio.Future[dict[str, Any] | None]"


def _redis_client(url: str) -> Redis:
    try:
        import redis.asyncio as aioredis
    except ImportError as exc:
        raise MissingDependencyError("provider_router.ray", "redis") from exc
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
    )
    return aioredis.Redis(connection_pool=pool)


class AnswerStore:
    """The job's answers and refusals in Redis (see the module docstring).

    Args:
        url: the Redis URL (the same Redis as the job's ledger, or another).
        name: the job's name; one store per name.
        prefix: the key prefix.

    Create it inside the event loop that will use it (a Ray actor's loop exists
    only once its first row arrives).
    """

    def __init__(self, url: str, name: str, *, prefix: str = DEFAULT_STORE_PREFIX) -> None:
        self._client = _redis_client(url)
        base = f"{prefix}:{{{name}}}:"
        self.answers_key = base + "answers"
        self.unsent_key = base + "unsent"
        self.failed_key = base + "failed"
        self._pending: dict[str, list[_Answer]] = {}
        self._lookups: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"AnswerStore({self.answers_key!r})"

    # --- lookups, coalesced -------------------------------------------------------------

    async def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer of ``key``, or None (one ``HMGET`` per loop turn)."""
        loop = asyncio.get_running_loop()
        future: _Answer = loop.create_future()
        if not self._pending:
            loop.call_soon(self._start_lookup)
        self._pending.setdefault(key, []).append(future)
        return await future

    def _start_lookup(self) -> None:
        pending, self._pending = self._pending, {}
        keys = list(pending)
        for start in range(0, len(keys), MAX_LOOKUP):
            chunk = {k: pending[k] for k in keys[start : start + MAX_LOOKUP]}
            task = asyncio.get_running_loop().create_task(self._lookup(chunk))
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)

    async def _lookup(
        self, pending: dict[str, list[asyncio.Future[dict[str, Any] | None]]]
    ) -> None:
        try:
            values = await self._client.hmget(self.answers_key, list(pending))
        except BaseException as exc:
            for futures in pending.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_key, futures), raw in zip(pending.items(), values, strict=True):
            value = None if raw is None else json.loads(raw)
            for future in futures:
                if not future.done():
                    future.set_result(value)

    # --- writes ---------------------------------------------------------------------------

    async def put(self, key: str, answer: dict[str, Any]) -> None:
        """Store a paid answer (and forget any earlier refusal or failure of ``key``)."""
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(self.answers_key, key, json.dumps(answer, separators=(",", ":")))
            pipe.hdel(self.unsent_key, key)
            pipe.hdel(self.failed_key, key)
            await pipe.execute()

    async def not_sent(self, key: str, reason: str) -> None:
        """Note that ``key`` was not sent, and why (a budget stop, 402...)."""
        await self._client.hset(self.unsent_key, key, reason)

    async def failed(self, key: str, kind: str) -> None:
        """Note that ``key`` failed with an error of ``kind`` (retried by the next run)."""
        await self._client.hset(self.failed_key, key, kind)

    # --- the driver's tally ---------------------------------------------------------------

    async def answers(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every stored answer, as ``(key, fields)`` (``HSCAN``: memory stays flat)."""
        async for raw_key, raw in self._client.hscan_iter(self.answers_key, count=1000):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            yield key, json.loads(raw)

    async def reasons(self, which: str) -> dict[str, str]:
        """``unsent`` or ``failed``: row key -> reason."""
        hash_key = self.unsent_key if which == "unsent" else self.failed_key
        raw = await self._client.hgetall(hash_key)
        return {_text(k): _text(v) for k, v in raw.items()}

    async def get_pad(self, name: str) -> bytes | None:
        """The key's pad stored under ``name`` (see :mod:`provider_router.ray._secret`)."""
        value = await self._client.get(name)
        return value.encode() if isinstance(value, str) else value

    async def put_pad(self, name: str, pad: bytes, ttl: int) -> None:
        """Store a key's pad for ``ttl`` seconds."""
        await self._client.set(name, pad, ex=ttl)

    async def clear(self) -> None:
        """Delete the job's answers and refusals (a new job under an old name)."""
        await self._client.delete(self.answers_key, self.unsent_key, self.failed_key)

    async def close(self) -> None:
        for task in list(self._lookups):
            await asyncio.gather(task, return_exceptions=True)
        # The pool is ours (passed in), so redis-py leaves it open unless told.
        await self._client.aclose(close_connection_pool=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
