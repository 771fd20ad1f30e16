"""Paid answers in Redis, keyed by prompt: what makes a retried Ray task free.

Ray retries a task whose actor died by running the whole task again; without a record
of what was paid, every answer of that task would be bought a second time, and its
blocks would split differently, repeating ids in the output. So the stage stores each
paid answer here *before* returning it, and a retried task re-emits the same row for
nothing. Per job: hashes of ``answers``, ``unsent`` and ``failed`` notes (a note names
its run: a retried task of that run replays it, a later run sends the prompt again)
and ``duplicates``, and a ``sending:<row key>`` lease per row being sent
(:meth:`AnswerStore.hold`). Every write is idempotent, every call waits out an outage
as the ledger does, and the lookups of one event-loop turn are one ``HMGET``
(docs/workers.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar
from urllib.parse import urlsplit

from provider_router._exceptions import MissingDependencyError
from provider_router._types import Clock, Sleep
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW, OutageWindow

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["DEFAULT_STORE_PREFIX", "AnswerStore", "Stored"]

DEFAULT_STORE_PREFIX: Final = "provider-router:ray"
MAX_CONNECTIONS: Final = 16
"""Connections one stage actor holds at most; more callers wait for a free one."""
POOL_TIMEOUT: Final = 30.0
"""Seconds a call waits for a free connection before it fails."""
SOCKET_TIMEOUT: Final = 10.0
MAX_LOOKUP: Final = 1024
"""Keys in one ``HMGET`` at most (a bigger turn is split)."""


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stored:
    """What the store holds of one row key: its answer, or the notes of why it has none."""

    answer: dict[str, Any] | None = None
    unsent: dict[str, Any] | None = None
    failed: dict[str, Any] | None = None
    claim: str | None = None
    """The digest of the row that holds the key in this run (see :meth:`AnswerStore.lookup`)."""


_NOTHING: Final = Stored()
_Answer: TypeAlias = "asyncio.Future[Stored]"
_Waiting: TypeAlias = "list[tuple[_Answer, str | None]]"
_PUT_IF_ABSENT: Final = """
if redis.call('hsetnx', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('hdel', KEYS[2], ARGV[1])
redis.call('hdel', KEYS[3], ARGV[1])
return 1
"""
_SET_ASIDE: Final = """
local current = redis.call('hget', KEYS[1], ARGV[1])
if not current then return 0 end
local ok, answer = pcall(cjson.decode, current)
local digest = ''
if ok and type(answer) == 'table' and type(answer['request_digest']) == 'string' then
  digest = answer['request_digest']
end
if digest ~= ARGV[2] then return 0 end
redis.call('hset', KEYS[2], ARGV[1] .. '#' .. ARGV[3], current)
redis.call('hdel', KEYS[1], ARGV[1])
return 1
"""
_RELEASE: Final = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_RENEW: Final = """
local renewed = 0
for _, marker in ipairs(KEYS) do
  if redis.call('get', marker) == ARGV[1] then
    redis.call('pexpire', marker, ARGV[2])
    renewed = renewed + 1
  end
end
return renewed
"""
CLAIMS_TTL: Final = 30 * 24 * 3600
"""Seconds a run's claims are kept (as long as a key's pad: a run's dataset lives that long)."""


def _note(raw: bytes | str | None, kind_key: str) -> dict[str, Any] | None:
    """A note as a dict (a plain-text one, as an older store wrote, as its kind)."""
    if raw is None:
        return None
    text = _text(raw)
    try:
        value = json.loads(text)
    except ValueError:
        return {kind_key: text}
    return value if isinstance(value, dict) else {kind_key: text}


def _redis_client(url: str) -> tuple[Redis, tuple[type[BaseException], ...]]:
    try:
        import redis.asyncio as aioredis
        from redis import exceptions
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as exc:
        raise MissingDependencyError("provider_router.ray", "redis") from exc
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        # Ours is the only retry: redis-py's would sleep where tests cannot see it.
        retry=Retry(NoBackoff(), 0),
    )
    transient = (exceptions.ConnectionError, exceptions.TimeoutError, OSError)
    return aioredis.Redis(connection_pool=pool), transient


def _where(url: str) -> str:
    """Redis's address for messages, without the credentials a URL may carry."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return "Redis of the Ray answer store"
    return f"Redis at {parts.hostname}:{parts.port or 6379} (the Ray answer store)"


class AnswerStore:
    """The job's answers and refusals in Redis (see the module docstring).

    Args:
        url: the Redis URL (the same Redis as the job's ledger, or another).
        name: the job's name; one store per name.
        prefix: the key prefix.
        outage_window: seconds a Redis outage is waited out before a call fails.
        sleep, clock: awaited between retries, and monotonic seconds (tests).

    Create it inside the event loop that will use it (a Ray actor's loop exists
    only once its first row arrives).
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        prefix: str = DEFAULT_STORE_PREFIX,
        outage_window: float = DEFAULT_OUTAGE_WINDOW,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self._client, transient = _redis_client(url)
        self._outage = OutageWindow(_where(url), outage_window, transient, sleep=sleep, clock=clock)
        base = f"{prefix}:{{{name}}}:"
        self.answers_key = base + "answers"
        self.unsent_key = base + "unsent"
        self.failed_key = base + "failed"
        self.manifest_key = base + "manifest"
        self.moved_aside_key = base + "moved_aside"
        self.duplicates_key = base + "duplicates"
        self._base = base
        self._pending: dict[tuple[str, str | None], _Waiting] = {}
        self._lookups: set[asyncio.Task[None]] = set()

    async def _call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        return await self._outage.call(attempt)

    def __repr__(self) -> str:
        return f"AnswerStore({self.answers_key!r})"

    # --- lookups, coalesced -------------------------------------------------------------

    async def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer of ``key``, or None."""
        return (await self.lookup(key)).answer

    async def lookup(self, key: str, *, claim: tuple[str, str] | None = None) -> Stored:
        """What is stored of ``key`` (one pipelined round trip per loop turn).

        ``claim=(run, digest)`` also claims ``key`` for the row whose content has that
        digest in that run, unless another row claimed it first: :attr:`Stored.claim`
        is the digest of the row that holds it. Two rows of one id but different
        content can then never both be sent, and a retried task finds its own claim.

        Raises:
            LedgerUnavailableError: Redis was unreachable for longer than the window.
        """
        loop = asyncio.get_running_loop()
        future: _Answer = loop.create_future()
        if not self._pending:
            loop.call_soon(self._start_lookup)
        run = claim[0] if claim is not None else None
        self._pending.setdefault((key, run), []).append(
            (future, claim[1] if claim is not None else None)
        )
        return await future

    def _start_lookup(self) -> None:
        pending, self._pending = self._pending, {}
        by_run: dict[str | None, dict[str, _Waiting]] = {}
        for (key, run), rows in pending.items():
            by_run.setdefault(run, {})[key] = rows
        for run, of_run in by_run.items():
            items = list(of_run.items())
            for start in range(0, len(items), MAX_LOOKUP):
                chunk = dict(items[start : start + MAX_LOOKUP])
                task = asyncio.get_running_loop().create_task(self._lookup(run, chunk))
                self._lookups.add(task)
                task.add_done_callback(self._lookups.discard)

    async def _read(self, run: str | None, claims: dict[str, str]) -> list[list[Any]]:
        keys = list(claims)
        async with self._client.pipeline(transaction=False) as pipe:
            for hash_key in (self.answers_key, self.unsent_key, self.failed_key):
                pipe.hmget(hash_key, keys)
            if run is not None:
                claims_key = f"{self._base}claims:{run}"
                for key, digest in claims.items():
                    pipe.hsetnx(claims_key, key, digest)  # idempotent: safe to retry
                pipe.expire(claims_key, CLAIMS_TTL)
                pipe.hmget(claims_key, keys)
            values: list[Any] = await pipe.execute()
        if run is None:
            return [*values, [None] * len(keys)]
        return [*values[:3], values[-1]]

    async def _lookup(self, run: str | None, pending: dict[str, _Waiting]) -> None:
        # The first digest asked for a key in this turn claims it (if nobody did before).
        claims = {key: next((d for _, d in w if d is not None), "") for key, w in pending.items()}
        try:
            read = functools.partial(self._read, run, claims)
            answers, unsent, failed, holders = await self._call(read)
        except BaseException as exc:
            for waiting in pending.values():
                for future, _ in waiting:
                    if not future.done():
                        future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for waiting, answer, note, failure, holder in zip(
            pending.values(), answers, unsent, failed, holders, strict=True
        ):
            if answer is None and note is None and failure is None and holder is None:
                value = _NOTHING
            else:
                value = Stored(
                    None if answer is None else json.loads(answer),
                    _note(note, "reason"),
                    _note(failure, "kind"),
                    None if holder is None else _text(holder),
                )
            for future, _ in waiting:
                if not future.done():
                    future.set_result(value)

    # --- writes ---------------------------------------------------------------------------

    async def put(self, key: str, answer: dict[str, Any]) -> None:
        """Store a paid answer (and forget any earlier refusal or failure of ``key``)."""
        body = json.dumps(answer, separators=(",", ":"))
        # A partial of a method, not a nested function: no cells made per row.
        await self._call(functools.partial(self._write_answer, key, body))

    async def _write_answer(self, key: str, body: str) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(self.answers_key, key, body)
            pipe.hdel(self.unsent_key, key)
            pipe.hdel(self.failed_key, key)
            await pipe.execute()

    async def put_if_absent(self, key: str, answer: dict[str, Any]) -> bool:
        """Store a paid answer unless ``key`` has one (a spilled answer found later):
        True if stored. A note of ``key`` gives way to it, as with :meth:`put`."""
        body = json.dumps(answer, separators=(",", ":"))
        keys = (self.answers_key, self.unsent_key, self.failed_key)
        put = functools.partial(self._client.eval, _PUT_IF_ABSENT, 3, *keys, key, body)
        return bool(await self._call(put))

    async def set_aside(self, key: str, digest: str | None) -> bool:
        """Move ``key``'s stored answer, if it is still the one to the request ``digest``
        (None: one stored before digests), out of the answers into the ``moved_aside``
        hash (field ``<key>#<digest or time>``): paid for another request, so kept, never
        emitted again for ``key``. True if this call moved it."""
        tag = digest or f"before-digests-{time.time_ns()}"
        keys = (self.answers_key, self.moved_aside_key)
        move = functools.partial(self._client.eval, _SET_ASIDE, 2, *keys, key, digest or "", tag)
        return bool(await self._call(move))

    async def moved_aside(self) -> int:
        """How many answers were moved aside (:meth:`set_aside`), over every run."""
        return int(await self._call(lambda: self._client.hlen(self.moved_aside_key)))

    async def not_sent(self, key: str, note: str | dict[str, Any]) -> None:
        """Note that ``key`` was not sent, and why (``reason``: a budget stop, 402...)."""
        await self._note(self.unsent_key, self.failed_key, key, note)

    async def failed(self, key: str, note: str | dict[str, Any]) -> None:
        """Note that ``key`` failed (``kind``: the error's type; retried by the next run)."""
        await self._note(self.failed_key, self.unsent_key, key, note)

    async def _note(
        self, hash_key: str, other_key: str, key: str, note: str | dict[str, Any]
    ) -> None:
        # The latest note only: a prompt refused by the budget, then failed on a resume,
        # is a failure now (not a budget stop), and counts once.
        body = note if isinstance(note, str) else json.dumps(note)
        await self._call(functools.partial(self._write_note, hash_key, other_key, key, body))

    async def _write_note(self, hash_key: str, other_key: str, key: str, body: str) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(hash_key, key, body)
            pipe.hdel(other_key, key)
            await pipe.execute()

    # --- the sending lease --------------------------------------------------------------

    def sending_key(self, key: str) -> str:
        """The marker of the actor sending ``key`` now (its token, with a TTL)."""
        return f"{self._base}sending:{key}"

    async def hold(self, key: str, token: str, lease: float) -> tuple[str | None, Stored]:
        """Take ``key``'s sending lease for ``token`` unless another actor holds it, and
        read what is stored of ``key`` *after* it: ``(holder, stored)``.

        The holder stores the answer (or a note) before it lets go: whoever takes the
        lease next therefore reads it here, and never sends a second time. A dead
        holder's lease runs out after ``lease`` seconds (a live one renews it,
        :meth:`renew`). Idempotent (a retry after a lost reply finds its own token).

        Raises:
            LedgerUnavailableError: Redis was unreachable for longer than the window.
        """
        take = functools.partial(self._take, key, token, max(1, int(lease * 1000)))
        holder, answer, note, failure = await self._call(take)
        stored = Stored(
            None if answer is None else json.loads(answer),
            _note(note, "reason"),
            _note(failure, "kind"),
        )
        return (None if holder is None else _text(holder)), stored

    async def _take(self, key: str, token: str, ms: int) -> list[Any]:
        marker = self.sending_key(key)
        # In this order on one connection: a lease taken here was let go after its
        # holder's answer was written, so the reads after it see that answer.
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.set(marker, token, nx=True, px=ms)
            pipe.get(marker)
            pipe.hget(self.answers_key, key)
            pipe.hget(self.unsent_key, key)
            pipe.hget(self.failed_key, key)
            values: list[Any] = await pipe.execute()
        return values[1:]

    async def release(self, key: str, token: str) -> None:
        """Let ``key``'s sending lease go, if ``token`` still holds it."""
        marker = self.sending_key(key)
        await self._call(functools.partial(self._client.eval, _RELEASE, 1, marker, token))

    async def renew(self, keys: list[str], token: str, lease: float) -> None:
        """Extend the sending leases ``token`` holds of ``keys`` by ``lease`` seconds."""
        if not keys:
            return
        markers = [self.sending_key(key) for key in keys]
        ms = max(1, int(lease * 1000))
        renew = functools.partial(self._client.eval, _RENEW, len(markers), *markers, token, ms)
        await self._call(renew)

    # --- the driver's tally ---------------------------------------------------------------

    async def answers(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every stored answer, as ``(key, fields)`` (``HSCAN``: memory stays flat)."""
        async for raw_key, raw in self._client.hscan_iter(self.answers_key, count=1000):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            yield key, json.loads(raw)

    async def reasons(self, which: str) -> dict[str, dict[str, Any]]:
        """``unsent`` or ``failed``: row key -> its note (``reason`` / ``kind``...)."""
        return {key: note async for key, note in self.notes(which)}

    async def notes(self, which: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``unsent`` or ``failed`` notes as ``(row key, note)`` (``HSCAN``: flat memory)."""
        hash_key, kind_key = (
            (self.unsent_key, "reason") if which == "unsent" else (self.failed_key, "kind")
        )
        async for raw_key, raw in self._client.hscan_iter(hash_key, count=1000):
            yield _text(raw_key), _note(raw, kind_key) or {}

    async def duplicate(self, key: str, digest: str, message: str) -> None:
        """Note a row refused because another row of the run has its id."""
        field = f"{key}#{digest}"
        await self._call(functools.partial(self._client.hset, self.duplicates_key, field, message))

    async def duplicates(self) -> dict[str, str]:
        """``<row key>#<digest>`` -> why it was refused, for every refused duplicate."""
        raw = await self._call(lambda: self._client.hgetall(self.duplicates_key))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def get_pad(self, name: str) -> bytes | None:
        """The key's pad stored under ``name`` (see :mod:`provider_router.ray._secret`)."""
        value = await self._call(lambda: self._client.get(name))
        return value.encode() if isinstance(value, str) else value

    async def put_pad(self, name: str, pad: bytes, ttl: int) -> None:
        """Store a key's pad for ``ttl`` seconds."""
        await self._call(lambda: self._client.set(name, pad, ex=ttl))

    async def delete_pads(self, *names: str) -> None:
        """Delete pads (the job is finished: the masked halves in Ray's files say nothing)."""
        if names:
            await self._call(lambda: self._client.delete(*names))

    async def manifest(self) -> dict[str, Any] | None:
        """What the job was started with (model, parameters), or None for a new job."""
        raw = await self._call(lambda: self._client.get(self.manifest_key))
        return None if raw is None else dict(json.loads(raw))

    async def put_manifest(self, manifest: dict[str, Any]) -> None:
        body = json.dumps(manifest, sort_keys=True)
        await self._call(lambda: self._client.set(self.manifest_key, body))

    async def clear(self) -> None:
        """Delete the job's answers, refusals and manifest (a new job under an old name)."""
        keys = (
            self.answers_key,
            self.unsent_key,
            self.failed_key,
            self.manifest_key,
            self.duplicates_key,
            self.moved_aside_key,
        )
        await self._call(lambda: self._client.delete(*keys))

    async def close(self) -> None:
        for task in list(self._lookups):
            await asyncio.gather(task, return_exceptions=True)
        # The pool is ours (passed in), so redis-py leaves it open unless told.
        await self._client.aclose(close_connection_pool=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
