"""Several workers, one plan: the prompts of a shared plan as Redis streams.

Every worker of a fleet runs the same plan with the same ``--workers-share NAME``.
Redis's own work distribution does the rest:

* **Enqueue once.** Each dataset is a stream with one consumer group. The first
  worker to take the loader lock (``SET NX`` with an expiry it renews) reads the
  input files and adds every prompt; each add is guarded by a Lua script
  (``SADD`` to the set of enqueued ids, ``XADD`` only when new), so a loader that
  dies half-way and the one that takes over never enqueue a prompt twice. A
  ``loaded`` marker says when the whole plan is in. Workers start consuming at
  once, while the loader is still adding.
* **Claim.** ``XREADGROUP`` hands each entry to exactly one worker.
* **Acknowledge when journaled.** A worker writes the result to its own journal
  and outputs first, then :meth:`FleetQueue.complete` acknowledges (``XACK``),
  deletes the entry and counts it in the fleet's tallies, in one script; a second
  completion of the same prompt (possible only if a worker was presumed dead
  while it was merely slow) is counted as a duplicate, and ``provider-router
  merge`` keeps exactly one record.
* **Recover a dead worker's prompts.** A live worker touches its pending entries
  every ``idle_timeout / 3`` seconds (a heartbeat); entries idle longer than
  ``idle_timeout`` belong to a dead worker, and ``XAUTOCLAIM`` moves them to a
  live one (:meth:`FleetQueue.reclaim`).
* **Give back.** A worker that stops (budget spent, Ctrl-C) puts its claimed but
  unsent prompts back at the end of the stream; a prompt that failed for good is
  parked until a worker next joins (the next run).

Progress is fleet-wide: :meth:`FleetQueue.progress` reads every dataset's tally
(completed, tokens, cost), what is in flight (the group's pending entries) and
what is still queued.

Needs the ``redis`` extra: ``pip install 'provider-router[redis]'``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from provider_router._exceptions import ConfigurationError, MissingDependencyError
from provider_router._log import get_logger
from provider_router._resource import AsyncResource
from provider_router.batch import _fleet_lua as lua
from provider_router.batch.fleet_records import (
    ClaimLimit,
    FleetProgress,
    FleetTally,
    WorkItem,
    decode_item,
    encode_prompt,
    read_tally,
)
from provider_router.plan import Plan
from provider_router.prompts import PromptReader, first_problem_error, validate_files

if TYPE_CHECKING:
    from redis.asyncio import Redis

# The records the queue hands out are fleet_records.py's; they stay importable from
# here, where provider_router's public API has always named them.
__all__ = [
    "DEFAULT_FLEET_PREFIX",
    "DEFAULT_IDLE_TIMEOUT",
    "ClaimLimit",
    "FleetProgress",
    "FleetQueue",
    "FleetTally",
    "WorkItem",
    "describe_error",
    "is_transient",
]

log = get_logger(__name__)

DEFAULT_FLEET_PREFIX: Final = "provider-router:fleet"
DEFAULT_IDLE_TIMEOUT: Final = 30.0
"""Seconds a worker may stay silent before its claimed prompts go to the others."""
GROUP: Final = "workers"
_LOAD_BATCH = 500
_LOCK_SECONDS = 30.0
POOL_SIZE: Final = 8
"""Connections per worker. A worker runs a handful of Redis calls at once (one
blocking claim, the acknowledgement writer, the heartbeat, the loader, a
progress read); more than that is a bug, and queues for a connection."""
_POOL_WAIT = 30.0
"""Seconds a call waits for a free connection before failing (never forever)."""
_SOCKET_TIMEOUT = 30.0
"""Seconds before a silent Redis counts as gone (a blocking claim waits far less)."""
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _import_redis() -> Any:
    try:
        import redis.asyncio
    except ImportError as exc:
        raise MissingDependencyError("Shared workers (--workers-share)", "redis") from exc
    return redis.asyncio


def is_transient(exc: BaseException) -> bool:
    """Whether a Redis failure may pass if retried (a lost or busy connection, a timeout).

    Script errors, wrong types and our own :class:`ConfigurationError` are not:
    retrying them cannot help.
    """
    try:
        from redis import exceptions as redis_errors
    except ImportError:  # pragma: no cover - fleets need redis
        return False
    transient = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
    return isinstance(exc, transient)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` (redis-py's own ``repr`` of its errors leaves the message out)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def plan_fingerprint(plan: Plan) -> str:
    """What must agree between the workers of one fleet: model and datasets."""
    shape = {"model": plan.model, "datasets": [d.name for d in plan.datasets]}
    return hashlib.sha256(_dumps(shape).encode()).hexdigest()[:16]


class FleetQueue(AsyncResource):
    """The shared work queue of one plan (see the module docstring).

    Args:
        url: a Redis URL such as ``redis://host:6379/0``.
        name: the fleet's name (``--workers-share NAME``); workers with the same
            name and plan share the work.
        worker: this worker's consumer name (default: host, pid and a random suffix).
        idle_timeout: seconds after which a silent worker's claimed prompts are
            reclaimed by the others; heartbeats go out every third of it.
        prefix: the key prefix (keys are ``<prefix>:{<name>}:...``).

    Raises:
        MissingDependencyError: the ``redis`` package is not installed.
        ConfigurationError: a bad name or idle timeout.
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        worker: str | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        prefix: str = DEFAULT_FLEET_PREFIX,
    ) -> None:
        aioredis = _import_redis()
        if not name or "{" in name or "}" in name:
            raise ConfigurationError(f"a fleet name must be non-empty, without braces: {name!r}")
        if not idle_timeout > 0:
            raise ConfigurationError(f"idle_timeout must be positive seconds, got {idle_timeout!r}")
        self.name = name
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.idle_timeout = float(idle_timeout)
        self._base = f"{prefix}:{{{name}}}:"
        # Blocking, bounded pool: a burst of calls queues for a connection instead of
        # failing with MaxConnectionsError (the client closes the pool it owns).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_SIZE,
            timeout=_POOL_WAIT,
            socket_timeout=_SOCKET_TIMEOUT,
            socket_connect_timeout=_SOCKET_TIMEOUT,
            decode_responses=True,
        )
        self._client: Redis = aioredis.Redis.from_pool(pool)
        self._scripts = {
            key: self._client.register_script(getattr(lua, key))
            for key in ("ENQUEUE", "COMPLETE", "GIVE_BACK", "UNPARK", "TOUCH", "CLAIM_CAPPED")
        }
        self._lock_renew = self._client.register_script(lua.LOCK_RENEW)
        self._lock_release = self._client.register_script(lua.LOCK_RELEASE)
        self._plan: Plan | None = None
        self._strict = False
        self._loader: asyncio.Task[None] | None = None
        self.load_problems: list[Exception] = []
        """Bad lines this worker's loader skipped (empty unless it loaded)."""
        self.totals: dict[str, tuple[int, int, int, int]] = {}
        """Per dataset, the fleet's (completed, output tokens, prompt tokens, cost units)
        as of this worker's last :meth:`complete` (which includes what it acknowledged)."""

    def __repr__(self) -> str:
        return f"FleetQueue(name={self.name!r}, worker={self.worker!r})"

    def _key(self, kind: str, dataset: str | None = None) -> str:
        return self._base + (kind if dataset is None else f"{kind}:{dataset}")

    @property
    def datasets(self) -> list[str]:
        """The plan's dataset names (after :meth:`join`)."""
        if self._plan is None:
            raise ConfigurationError("join the fleet first: await queue.join(plan)")
        return [d.name for d in self._plan.datasets]

    # --- joining and loading ----------------------------------------------------------

    async def join(self, plan: Plan, *, strict: bool = False) -> None:
        """Join the fleet for ``plan``: check it matches, and start loading if no one has.

        Prompts parked as failed go back into the queue. Loading runs in the
        background; claim at once.

        Raises:
            ConfigurationError: the fleet's name is in use by a different plan.
            DataFileError: ``strict`` and an input line is bad (before anything
                is enqueued).
        """
        if strict:
            for spec in plan.datasets:
                _, problems = await asyncio.to_thread(validate_files, spec.inputs)
                if problems:
                    raise first_problem_error(problems)
        fingerprint = plan_fingerprint(plan)
        meta = self._key("meta")
        await self._client.hsetnx(meta, "fingerprint", fingerprint)
        stored = await self._client.hget(meta, "fingerprint")
        if stored != fingerprint:
            raise ConfigurationError(
                f"the fleet {self.name!r} already runs another plan (other model or "
                "datasets); give this plan its own --workers-share name"
            )
        self._plan = plan
        self._strict = strict
        for dataset in self.datasets:
            try:
                await self._client.xgroup_create(
                    self._key("s", dataset), GROUP, id="0", mkstream=True
                )
            except Exception as exc:  # the group exists: another worker made it
                if "BUSYGROUP" not in str(exc):
                    raise
            # Prompts parked as failed get another chance whenever a worker joins.
            await self._scripts["UNPARK"](
                keys=[self._key(kind, dataset) for kind in ("s", "parked", "tally")]
            )
        await self.maintain(reclaim=False)
        log.info("fleet.join", fleet=self.name, worker=self.worker)

    async def _take_lock(self) -> bool:
        taken = await self._client.set(
            self._key("lock"), self.worker, nx=True, px=int(_LOCK_SECONDS * 1000)
        )
        return bool(taken)

    async def _load(self, plan: Plan) -> None:
        """Enqueue every prompt of ``plan`` (idempotent), holding the loader lock."""
        lock = self._key("lock")
        try:
            for dataset in plan.datasets:
                keys = [
                    self._key("ids", dataset.name),
                    self._key("s", dataset.name),
                    self._key("tally", dataset.name),
                ]
                reader = PromptReader(dataset.inputs)
                args: list[str] = []
                for prompt in reader:
                    args += (prompt.id, encode_prompt(prompt))
                    if len(args) >= 2 * _LOAD_BATCH:
                        await self._enqueue(keys, args, lock)
                        args = []
                if args:
                    await self._enqueue(keys, args, lock)
                self.load_problems.extend(reader.problems)
                await self._client.hset(self._key("meta"), f"bad:{dataset.name}", reader.bad_lines)
            await self._client.hset(self._key("meta"), "loaded", 1)
            log.info("fleet.loaded", fleet=self.name, worker=self.worker)
        finally:
            await self._lock_release(keys=[lock], args=[self.worker])

    async def _enqueue(self, keys: list[str], args: list[str], lock: str) -> None:
        renewed = await self._lock_renew(keys=[lock], args=[self.worker, int(_LOCK_SECONDS * 1000)])
        if not renewed:
            raise ConfigurationError("lost the fleet's loader lock (this worker stalled)")
        await self._scripts["ENQUEUE"](keys=keys, args=args)

    async def _loaded(self) -> bool:
        return bool(await self._client.hget(self._key("meta"), "loaded"))

    # --- claiming and completing -----------------------------------------------------

    async def claim(
        self,
        count: int,
        *,
        datasets: Iterable[str] | None = None,
        block: float | None = None,
        limits: Mapping[str, ClaimLimit] | None = None,
    ) -> list[WorkItem]:
        """Claim up to about ``count`` new prompts, spread over ``datasets`` (default: all).

        Args:
            count: how many the worker can take now.
            datasets: the datasets still wanted (a dataset at its target is left out).
            block: seconds to wait for a prompt when none is queued (``None``: do not
                wait). Only datasets without ``limits`` wait: a capped one waits for
                other workers' results, which the caller polls for.
            limits: fleet-wide caps per dataset, checked atomically in Redis with
                every worker's claimed prompts counted (see :class:`ClaimLimit`).
        """
        names = list(self.datasets if datasets is None else datasets)
        if count < 1 or not names:
            return []
        per = max(1, count // len(names))
        limits = limits or {}
        items: list[WorkItem] = []
        for dataset in names:
            limit = limits.get(dataset)
            if limit is not None:
                items.extend(await self._claim_capped(dataset, per, limit))
        free = [ds for ds in names if ds not in limits]
        if not free:
            return items
        streams = {self._key("s", ds): ">" for ds in free}
        wait = None if block is None or items else max(1, int(block * 1000))
        reply = await self._client.xreadgroup(
            GROUP,
            self.worker,
            streams,  # type: ignore[arg-type]
            count=per,
            block=wait,
        )
        replies: list[Any] = list(reply or [])
        for stream, entries in replies:
            dataset = str(stream)[len(self._base) + 2 :]
            items.extend(decode_item(dataset, eid, f) for eid, f in entries if f)
        return items

    async def _claim_capped(self, dataset: str, count: int, limit: ClaimLimit) -> list[WorkItem]:
        def arg(value: int | None) -> str:
            return "" if value is None else str(value)

        entries = await self._scripts["CLAIM_CAPPED"](
            keys=[self._key("s", dataset), self._key("tally", dataset)],
            args=[
                GROUP,
                self.worker,
                count,
                arg(limit.max_requests),
                arg(limit.target_output_tokens),
                str(max(1, limit.cap)),
                "" if limit.mean is None else repr(float(limit.mean)),
                repr(float(limit.spread)),
            ],
        )
        items = []
        for entry_id, flat in entries or []:
            if flat:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                items.append(decode_item(dataset, entry_id, fields))
        return items

    async def complete(self, results: Sequence[tuple[WorkItem, int, int, int]]) -> list[bool]:
        """Acknowledge journaled results: ``(item, output_tokens, prompt_tokens, cost_units)``.

        Call only once the result is durably in this worker's journal and output.
        Returns, per result, ``True`` for a first completion and ``False`` for a
        duplicate (the prompt was already completed by another worker).
        """
        by_dataset: dict[str, list[int]] = {}
        for index, (item, *_rest) in enumerate(results):
            by_dataset.setdefault(item.dataset, []).append(index)
        first = [False] * len(results)
        for dataset, indexes in by_dataset.items():
            args: list[Any] = [GROUP]
            for index in indexes:
                item, out, prompt_tokens, cost = results[index]
                args += (item.entry_id, item.prompt.id, out, prompt_tokens, cost)
            keys = [
                self._key("s", dataset),
                self._key("done", dataset),
                self._key("tally", dataset),
            ]
            flags, totals = await self._scripts["COMPLETE"](keys=keys, args=args)
            self.totals[dataset] = tuple(int(x or 0) for x in totals)  # type: ignore[assignment]
            for index, flag in zip(indexes, flags, strict=True):
                first[index] = bool(flag)
        duplicates = first.count(False)
        if duplicates:
            log.warning("fleet.duplicates", fleet=self.name, count=duplicates)
        return first

    async def give_back(
        self, items: Sequence[WorkItem], *, park: bool = False, failed: bool = True
    ) -> int:
        """Return claimed prompts to the queue (``park``: set them aside until the next run).

        Only prompts this worker still holds are returned; the count says how many.
        A prompt given back because it ``failed`` counts one more attempt; one
        returned unsent (the worker stopped, its dataset reached its target) does not.
        """
        given = 0
        by_dataset: dict[str, list[WorkItem]] = {}
        for item in items:
            by_dataset.setdefault(item.dataset, []).append(item)
        for dataset, group in by_dataset.items():
            args: list[Any] = [GROUP, self.worker, 1 if park else 0]
            for item in group:
                attempts = item.attempts + 1 if failed else item.attempts
                args += (item.entry_id, item.prompt.id, item.payload, attempts)
            keys = [
                self._key("s", dataset),
                self._key("parked", dataset),
                self._key("tally", dataset),
            ]
            given += int(await self._scripts["GIVE_BACK"](keys=keys, args=args))
        return given

    # --- keeping the fleet healthy ---------------------------------------------------------

    async def maintain(
        self, *, reclaim: bool = True, holding: Mapping[str, Iterable[str]] | None = None
    ) -> list[WorkItem]:
        """The periodic duty of every worker (call every ``idle_timeout / 3`` seconds).

        Touches this worker's claimed prompts (so no one takes them), takes over
        loading if the loader died before finishing, and (``reclaim``) returns
        the prompts of dead workers that this worker now holds.

        Args:
            reclaim: also take over the prompts of dead workers.
            holding: the entry ids this worker knows it holds, per dataset; only
                those are kept alive, so an entry it lost track of goes back to
                the fleet after ``idle_timeout``. ``None``: keep every entry it holds.
        """
        for dataset in self.datasets:
            args = [GROUP, self.worker]
            if holding is not None:
                # A sentinel id keeps the list non-empty: "keep none of them".
                args += ["0-0", *holding.get(dataset, ())]
            await self._scripts["TOUCH"](keys=[self._key("s", dataset)], args=args)
        self._check_loader()
        loading = self._loader is not None and not self._loader.done()
        if (
            not loading
            and self._plan is not None
            and not await self._loaded()
            and await self._take_lock()
        ):
            self._loader = asyncio.create_task(self._load(self._plan))
        return await self.reclaim() if reclaim else []

    def _check_loader(self) -> None:
        """Collect a finished loader's outcome (its failure is never left unretrieved).

        A transient failure lets go of the loading (the lock is released), so the
        next heartbeat of any worker takes over; any other failure is raised.
        """
        loader = self._loader
        if loader is None or not loader.done():
            return
        self._loader = None
        exc = None if loader.cancelled() else loader.exception()
        if exc is None:
            return
        if not is_transient(exc):
            raise exc
        log.warning(
            "fleet.load_failed", fleet=self.name, worker=self.worker, error=describe_error(exc)
        )

    async def reclaim(self, *, count: int = 1000) -> list[WorkItem]:
        """Take over prompts idle longer than ``idle_timeout`` (their worker died).

        Prompts already completed (the dead worker acknowledged nothing, but
        another worker did the prompt) are acknowledged and dropped here.
        """
        idle_ms = int(self.idle_timeout * 1000)
        found: list[WorkItem] = []
        for dataset in self.datasets:
            stream = self._key("s", dataset)
            start = "0-0"
            while True:
                reply = await self._client.xautoclaim(
                    stream, GROUP, self.worker, idle_ms, start_id=start, count=count
                )
                start, entries = reply[0], reply[1]
                found.extend(decode_item(dataset, eid, f) for eid, f in entries if f)
                if start == "0-0" or not entries:
                    break
        if not found:
            return []
        found = await self._drop_done(found)
        log.warning("fleet.reclaimed", fleet=self.name, worker=self.worker, prompts=len(found))
        return found

    async def _drop_done(self, items: list[WorkItem]) -> list[WorkItem]:
        keep: list[WorkItem] = []
        for dataset in {item.dataset for item in items}:
            mine = [item for item in items if item.dataset == dataset]
            flags = await self._client.smismember(
                self._key("done", dataset), [item.prompt.id for item in mine]
            )
            stale = [item.entry_id for item, done in zip(mine, flags, strict=True) if done]
            if stale:
                stream = self._key("s", dataset)
                await self._client.xack(stream, GROUP, *stale)
                await self._client.xdel(stream, *stale)
            keep.extend(item for item, done in zip(mine, flags, strict=True) if not done)
        return keep

    async def wait_loaded(self) -> None:
        """Wait until this worker's own loader (if it is loading) has finished.

        Raises:
            Exception: what made the loader fail.
        """
        if self._loader is not None:
            loader, self._loader = self._loader, None
            await loader

    # --- progress ---------------------------------------------------------------------------

    async def progress(self) -> FleetProgress:
        """The whole fleet's progress, per dataset."""
        names = self.datasets
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(self._key("meta"))
        for dataset in names:
            stream = self._key("s", dataset)
            pipe.hgetall(self._key("tally", dataset))
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
            pipe.xinfo_consumers(stream, GROUP)
        replies = await pipe.execute()
        meta = replies[0]
        tallies: dict[str, FleetTally] = {}
        workers: set[str] = set()
        idle_ms = self.idle_timeout * 1000
        for index, dataset in enumerate(names):
            tally, length, pending, consumers = replies[1 + 4 * index : 5 + 4 * index]
            in_flight = int(pending["pending"])
            workers.update(c["name"] for c in consumers if c.get("inactive", c["idle"]) < idle_ms)
            tallies[dataset] = read_tally(
                tally,
                in_flight=in_flight,
                length=int(length),
                bad_lines=int(meta.get(f"bad:{dataset}", 0)),
            )
        return FleetProgress(tallies, loaded=meta.get("loaded") == "1", workers=len(workers))

    # --- lifecycle ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop loading (another worker takes over) and close the connection."""
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
            await asyncio.gather(self._loader, return_exceptions=True)
        await self._client.aclose()

    async def _on_exit(self) -> None:
        await self.close()
