"""The driver's word to a running stage: stop sending, and each dataset's token target.

Ray gives a driver one way to tell running actors anything: kill them, and with them
the requests they have in flight (paid for, their answers lost). So the driver of
``provider-router run --ray`` writes to the job's Redis (a ``control`` hash: ``stop``
and each dataset's target, renewed while it runs; a ``counts`` hash: what landed), and
every actor reads it there (:class:`StageControl`) at most every
:data:`CONTROL_INTERVAL` seconds. A row that finds ``stop`` set is not sent; a row of a
dataset with a target is admitted by one Lua script while the dataset's output plus
the price of its requests in flight stays below the target, priced as
:mod:`provider_router.jobs.targets` prices. Nothing here raises into a row: an
unreachable Redis keeps the last word read and holds target rows back (docs/design.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from provider_router._log import get_logger
from provider_router._money import from_units, to_units
from provider_router.jobs.targets import DEFAULT_MARGIN_Z, MIN_SAMPLES
from provider_router.ray._store import DEFAULT_STORE_PREFIX, _redis_client

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from provider_router.client.results import ChatResult

__all__ = [
    "CONTROL_INTERVAL",
    "CONTROL_UNREACHABLE",
    "INTERRUPTED",
    "TARGET_REACHED",
    "DatasetCounts",
    "JobControl",
    "StageControl",
]

log = get_logger(__name__)

CONTROL_INTERVAL: Final = 0.5
"""Seconds an actor keeps the driver's last word before it reads it again."""
CONTROL_TTL: Final = 120
"""Seconds the driver's word outlives its last renewal: a driver killed hard leaves no
stop word or target behind for a later job of the same name."""
TARGET_REACHED: Final = "target: its output-token target is reached or in flight"
INTERRUPTED: Final = "interrupted: Ctrl-C (no new requests)"
CONTROL_UNREACHABLE: Final = "held: the job's control in Redis is unreachable"
_CONFIDENCE_LOG: Final = math.log(3 / 1e-3)
"""``ln(3/δ)`` of the mean's upper bound, as :mod:`provider_router.jobs.targets`."""

# KEYS[1] counts; ARGV dataset, target, cap, z, min samples, ln(3/δ).
# Admit one more while out + price(in flight) < target (targets.InFlightPricer.price):
# 1 admitted, 0 not yet (wait for requests in flight to land), -1 the target is reached.
_ADMIT: Final = """
local ds = ARGV[1]
local target, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local z, min_n, L = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function get(f) return tonumber(redis.call('HGET', KEYS[1], ds .. ':' .. f) or '0') end
local out, flight, n = get('out'), get('flight'), get('n')
local price = flight * cap
if flight > 0 and n >= min_n then
  local sum, sumsq = get('sum'), get('sumsq')
  local mean = sum / n
  local var = math.max(0, (sumsq - sum * mean) / (n - 1))
  local upper = mean + math.sqrt(2 * var * L / n) + 3 * cap * L / n
  price = math.min(price, flight * upper + z * math.sqrt(var) * math.sqrt(flight))
end
if out >= target then return -1 end
if out + price < target then
  redis.call('HINCRBY', KEYS[1], ds .. ':flight', 1)
  return 1
end
return 0
"""

# KEYS[1] counts, KEYS[2] providers; ARGV dataset, admitted (0/1), tokens ('' = no
# answer), cost units, provider, prompt tokens, attempts beyond the first.
_LAND: Final = """
local ds = ARGV[1]
if ARGV[2] == '1' then
  local left = redis.call('HINCRBY', KEYS[1], ds .. ':flight', -1)
  if left < 0 then redis.call('HSET', KEYS[1], ds .. ':flight', 0) end
end
if ARGV[3] ~= '' then
  local t = tonumber(ARGV[3])
  redis.call('HINCRBY', KEYS[1], ds .. ':done', 1)
  redis.call('HINCRBY', KEYS[1], ds .. ':out', t)
  redis.call('HINCRBY', KEYS[1], ds .. ':cost', ARGV[4])
  local p = ARGV[5]
  redis.call('HINCRBY', KEYS[2], p .. ':done', 1)
  redis.call('HINCRBY', KEYS[2], p .. ':out', t)
  redis.call('HINCRBY', KEYS[2], p .. ':prompt', ARGV[6])
  redis.call('HINCRBY', KEYS[2], p .. ':retries', ARGV[7])
  redis.call('HINCRBY', KEYS[2], p .. ':cost', ARGV[4])
  if ARGV[2] == '1' then
    redis.call('HINCRBY', KEYS[1], ds .. ':n', 1)
    redis.call('HINCRBY', KEYS[1], ds .. ':sum', t)
    redis.call('HINCRBY', KEYS[1], ds .. ':sumsq', t * t)
  end
end
return 1
"""


def _keys(name: str, prefix: str) -> tuple[str, str, str]:
    base = f"{prefix}:{{{name}}}:"
    return base + "control", base + "counts", base + "providers"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class StageControl:
    """An actor's side (see the module docstring); create it in the actor's loop.

    Args:
        url: the job's Redis.
        name: the job's name.
        prefix: the store's key prefix.
        clock, sleep: monotonic seconds and the wait between two asks (tests).
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        prefix: str = DEFAULT_STORE_PREFIX,
        clock: Any = time.monotonic,
        sleep: Any = asyncio.sleep,
    ) -> None:
        self._client: Redis = _redis_client(url)[0]
        self.control_key, self.counts_key, self.providers_key = _keys(name, prefix)
        self._clock = clock
        self._sleep = sleep
        self._read_at: float | None = None
        self._read_ok: float | None = None
        self._reading: asyncio.Future[None] | None = None
        self._stop: str | None = None
        self._targets: dict[str, tuple[int, int]] = {}
        self._gates: dict[str, asyncio.Lock] = {}
        self._watching: asyncio.Task[None] | None = None
        self._reached: set[str] = set()
        self._admit: Any = self._client.register_script(_ADMIT)
        self._land: Any = self._client.register_script(_LAND)

    def __repr__(self) -> str:
        return f"StageControl({self.control_key!r})"

    async def _fresh(self) -> None:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < CONTROL_INTERVAL:
            return
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
        reading = self._reading
        try:
            await asyncio.shield(reading)
        finally:
            if self._reading is reading and reading.done():
                self._reading = None

    async def _read(self) -> None:
        try:
            raw = await self._client.hgetall(self.control_key)
        except Exception as exc:  # keep the last word; target rows are held meanwhile
            log.warning("ray.control_unreachable", error=repr(exc))
            self._targets = {name: (-1, cap) for name, (_, cap) in self._targets.items()}
            self._read_at = self._clock()
            return
        fields = {_text(k): _text(v) for k, v in raw.items()}
        self._stop = fields.get("stop") or None
        targets = {}
        for field, value in fields.items():
            if field.startswith("target:"):
                target, _, cap = value.partition(":")
                targets[field.removeprefix("target:")] = (int(target), int(cap))
        # A target once read holds for this actor's life (the word may expire meanwhile
        # if the driver stalls: never forget a target then).
        self._targets = {**self._targets, **targets}
        self._read_at = self._read_ok = self._clock()

    async def admit(self, dataset: str) -> str | None:
        """Why this row must not be sent (None: send it); waits while its target has
        no room yet for another request (requests in flight may still land short).

        One row per actor and dataset asks Redis at a time, once per
        :data:`CONTROL_INTERVAL` while there is no room; the others queue behind it.
        """
        await self._fresh()
        if self._stop is not None:
            return self._stop
        if self._read_ok is None:
            return CONTROL_UNREACHABLE  # which datasets have a target is not known yet
        if dataset not in self._targets:
            return None
        gate = self._gates.setdefault(dataset, asyncio.Lock())
        async with gate:
            while True:
                if dataset in self._reached:
                    return TARGET_REACHED
                await self._fresh()
                if self._stop is not None:
                    return self._stop
                target, cap = self._targets.get(dataset, (-1, 0))
                if target < 0:
                    return CONTROL_UNREACHABLE
                try:
                    args = [dataset, target, cap, DEFAULT_MARGIN_Z, MIN_SAMPLES, _CONFIDENCE_LOG]
                    admitted = int(await self._admit(keys=[self.counts_key], args=args))
                except Exception as exc:
                    log.warning("ray.control_unreachable", error=repr(exc))
                    return CONTROL_UNREACHABLE
                if admitted > 0:
                    return None
                if admitted < 0:
                    self._reached.add(dataset)
                    continue
                await self._sleep(CONTROL_INTERVAL)

    def watch(self, on_stop: Callable[[], object]) -> None:
        """Call ``on_stop`` once the stop word is read (``Router.stop``: requests waiting for
        a slot in the actor's router start no attempt; those in flight finish)."""
        self._watching = asyncio.get_running_loop().create_task(self._watch(on_stop))

    async def _watch(self, on_stop: Callable[[], object]) -> None:
        while self._stop is None:
            await self._sleep(CONTROL_INTERVAL)
            await self._fresh()
        on_stop()

    async def landed(self, dataset: str, result: ChatResult | None) -> None:
        """A request admitted by :meth:`admit` ended (``result``: its answer, if any)."""
        admitted = "1" if dataset in self._targets else "0"
        usage = None if result is None or result.quarantined else result.usage
        if usage is None and admitted == "0":
            return
        tokens = "" if usage is None else str(usage.completion_tokens)
        units = 0 if result is None or result.cost is None else to_units(result.cost)
        provider = (result.provider if result is not None else None) or "unknown"
        prompt = 0 if usage is None else usage.prompt_tokens
        retries = 0 if result is None else max(result.attempts - 1, 0)
        args = [dataset, admitted, tokens, units, provider, prompt, retries]
        try:
            await self._land(keys=[self.counts_key, self.providers_key], args=args)
        except Exception as exc:  # the counts are the display's and the target's, not money
            log.warning("ray.control_unreachable", error=repr(exc))

    async def close(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.gather(self._watching, return_exceptions=True)
        if self._reading is not None:
            await asyncio.gather(self._reading, return_exceptions=True)
        await self._client.aclose(close_connection_pool=True)


class DatasetCounts:
    """One dataset's counts as the driver reads them."""

    __slots__ = ("cost", "done", "flight", "output_tokens")

    def __init__(self, done: int, output_tokens: int, cost: Decimal, flight: int) -> None:
        self.done = done
        self.output_tokens = output_tokens
        self.cost = cost
        self.flight = flight

    def __repr__(self) -> str:
        return f"DatasetCounts(done={self.done}, output_tokens={self.output_tokens})"


class JobControl:
    """The driver's side: starts a run's counts, sets targets, stops, reads the counts.

    Create it inside the loop that uses it.
    """

    def __init__(self, url: str, name: str, *, prefix: str = DEFAULT_STORE_PREFIX) -> None:
        self._client: Redis = _redis_client(url)[0]
        self.control_key, self.counts_key, self.providers_key = _keys(name, prefix)

    def __repr__(self) -> str:
        return f"JobControl({self.control_key!r})"

    async def begin(
        self,
        written: Mapping[str, tuple[int, int, Decimal]],
        targets: Mapping[str, tuple[int, int]],
    ) -> None:
        """A new run: counts from what is written, ``targets`` (dataset: target, cap)."""
        counts: dict[str, int] = {}
        for dataset, (done, tokens, cost) in written.items():
            counts |= {f"{dataset}:done": done, f"{dataset}:out": tokens}
            counts[f"{dataset}:cost"] = to_units(cost)
        control = {f"target:{name}": f"{target}:{cap}" for name, (target, cap) in targets.items()}
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self.control_key, self.counts_key, self.providers_key)
            if counts:
                pipe.hset(self.counts_key, mapping=counts)  # type: ignore[arg-type]
            if control:
                pipe.hset(self.control_key, mapping=control)  # type: ignore[arg-type]
                pipe.expire(self.control_key, CONTROL_TTL)
            await pipe.execute()

    async def keep_alive(self) -> None:
        """Renew the word (the driver does every second or so)."""
        await self._client.expire(self.control_key, CONTROL_TTL)

    async def end(self) -> None:
        """The run is over: no stop word or target stays for a later job of this name."""
        await self._client.delete(self.control_key)

    async def stop(self, reason: str) -> None:
        """Every actor sends nothing more from its next look on (within a second)."""
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(self.control_key, "stop", reason)
            pipe.expire(self.control_key, CONTROL_TTL)
            await pipe.execute()

    async def counts(self) -> dict[str, DatasetCounts]:
        """Every dataset's counts."""
        raw = await self._client.hgetall(self.counts_key)
        fields: dict[str, dict[str, int]] = {}
        for key, value in raw.items():
            dataset, _, what = _text(key).rpartition(":")
            fields.setdefault(dataset, {})[what] = int(value)
        return {
            name: DatasetCounts(
                f.get("done", 0), f.get("out", 0), from_units(f.get("cost", 0)), f.get("flight", 0)
            )
            for name, f in fields.items()
        }

    async def providers(self) -> dict[str, dict[str, int]]:
        """This run's answers per provider: ``done``, ``out``, ``prompt`` tokens, ``cost``
        units, ``retries``."""
        raw = await self._client.hgetall(self.providers_key)
        found: dict[str, dict[str, int]] = {}
        for key, value in raw.items():
            provider, _, what = _text(key).rpartition(":")
            found.setdefault(provider, {})[what] = int(value)
        return found

    async def close(self) -> None:
        await self._client.aclose(close_connection_pool=True)
