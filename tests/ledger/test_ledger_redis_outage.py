"""Redis outages: waited out within the window, a clear stop past it (issue #10, item 7).

A real redis-server (with AOF, so its data survives) is stopped and started again
on the same port. The ledger's retry sleep and clock are injected: the test's
sleep advances the clock and, where the scenario says so, brings Redis back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _polling import until

from provider_router import ConfigurationError, LedgerUnavailableError, RedisLedger
from provider_router.cli import build_parser
from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.run import open_shared_ledger
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from tests.ledger.conftest import RestartableRedis

pytestmark = pytest.mark.redis

D = Decimal
Factory = Callable[..., Awaitable[SimulatorServer]]


class OutageClock:
    """The ledger's retry clock and sleep: no real waiting; ``on_sleep(n)`` after each sleep."""

    def __init__(self, on_sleep: Callable[[int], None] | None = None) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))
        await asyncio.sleep(0)


def ledger(url: str, name: str, clock: OutageClock, window: float = 60.0) -> RedisLedger:
    return RedisLedger(url, name, D(10), outage_window=window, sleep=clock.sleep, monotonic=clock)


async def test_a_short_outage_pauses_the_ledger_and_loses_nothing(
    restartable_redis: RestartableRedis,
) -> None:
    redis = restartable_redis
    clock = OutageClock(lambda n: redis.start() if n == 4 else None)
    async with ledger(redis.url, "short", clock) as book:
        held = [await book.reserve(D(1), key=f"k{i}") for i in range(3)]
        redis.stop()
        # Everything asked during the outage waits, then happens exactly once.
        settled, released, new, _ = await asyncio.gather(
            book.settle(held[0], D("0.25"), estimate=D("0.2")),
            book.release(held[1]),
            book.reserve(D(2), key="during the outage"),
            book.attach(held[2], "gen-2"),
        )
        assert (settled, released, new.key) == (None, None, "during the outage")
        assert len(clock.sleeps) == 4
        assert clock.sleeps == [0.05, 0.1, 0.2, 0.4]  # exponential backoff, all in-window
        state = await book.snapshot()
        assert (state.spent, state.reserved, state.open) == (D("0.25"), D(3), 2)
        assert (state.settled, state.released, state.drift) == (1, 1, D("0.05"))
        assert {r.generation_id for r in await book.open_reservations()} == {"gen-2", None}


async def test_a_long_outage_is_one_clear_error_then_calls_fail_fast_until_redis_is_back(
    restartable_redis: RestartableRedis,
) -> None:
    redis = restartable_redis
    clock = OutageClock()
    url = redis.url.replace("redis://", "redis://:s3cret-pw@")  # never shown
    async with RedisLedger(redis.url, "long", D(10)) as setup:
        await setup.reserve(D(1), key="before")
    async with RedisLedger(
        url, "long", outage_window=5.0, sleep=clock.sleep, monotonic=clock
    ) as book:
        first = await book.reserve(D(1), key="first")
        redis.stop()
        with pytest.raises(LedgerUnavailableError) as info:
            await book.settle(first, D("0.5"))
        message = str(info.value)
        assert f"Redis at 127.0.0.1:{redis.port} has been unreachable for 5 s" in message
        assert "outage window (5 s)" in message
        assert "Nothing is lost" in message
        assert "s3cret" not in message + repr(info.value)
        assert clock.now - 1000.0 == pytest.approx(5.0)  # waited exactly the window
        tried = len(clock.sleeps)
        # Still down: the next call fails at once instead of waiting another window.
        with pytest.raises(LedgerUnavailableError):
            await book.reserve(D(1), key="second")
        assert len(clock.sleeps) == tried
        # Back: the same ledger works again, and nothing was lost or applied twice.
        redis.start()
        await book.settle(first, D("0.5"))
        state = await book.snapshot()
        assert (state.spent, state.reserved, state.open, state.settled) == (D("0.5"), D(1), 1, 1)


class ReplyDropper:
    """A TCP proxy to Redis that, when armed, swallows the next reply and cuts the connection.

    This is a reply lost after Redis applied the command: a retry must not apply it twice.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.armed = False
        self.dropped = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def upstream() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if self.armed:
                    self.armed = False
                    self.dropped += 1
                    writer.transport.abort()
                    return
                writer.write(data)
                await writer.drain()

        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        finally:
            up_writer.close()
            writer.close()
            self.tasks.discard(task)


async def test_a_batch_whose_reply_was_lost_is_not_applied_twice(
    restartable_redis: RestartableRedis,
) -> None:
    proxy = ReplyDropper(restartable_redis.port)
    url = await proxy.start()
    clock = OutageClock()
    try:
        async with ledger(url, "lost-reply", clock) as book:
            first = await book.reserve(D(1), key="a")  # connected, script loaded
            proxy.armed = True
            second = await book.reserve(D(2), key="b")
            assert proxy.dropped == 1
            assert len(clock.sleeps) == 1  # one retry, answered from the script's memory
            proxy.armed = True
            await book.settle(first, D("0.75"))
            assert proxy.dropped == 2
            state = await book.snapshot()
            assert (state.reserved, state.open) == (D(2), 1)
            assert (state.spent, state.settled) == (D("0.75"), 1)
            await book.settle(second, D(1))
            assert (await book.snapshot()).spent == D("1.75")
    finally:
        await proxy.close()


def test_the_outage_window_must_be_positive(restartable_redis: RestartableRedis) -> None:
    with pytest.raises(ConfigurationError, match="outage_window must be positive"):
        RedisLedger(restartable_redis.url, "x", D(1), outage_window=0)


# --- a batch run through an outage --------------------------------------------------------

PROMPTS = 40


def outage_plan(tmp_path: Path) -> Plan:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"q{n}", "prompt": f"question {n}"}) + "\n" for n in range(PROMPTS)
        )
    )
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": "10",
            "concurrency": 8,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 300},
            "datasets": [{"name": "p", "input": str(prompts)}],
        }
    )


def records(out: Path) -> list[str]:
    path = out / "p.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


async def run_through_outage(
    plan: Plan, out: Path, sim: SimulatorServer, book: RedisLedger, redis: RestartableRedis
) -> RunSummary:
    runner = JobRunner(plan, out, ledger=book, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    task = asyncio.ensure_future(runner.run())
    await until(lambda: len(records(out)) >= 5 or task.done())
    redis.stop()
    return await task


async def test_a_run_rides_out_a_short_outage_and_completes_exactly_once(
    tmp_path: Path, restartable_redis: RestartableRedis, openrouter_sim_factory: Factory
) -> None:
    redis = restartable_redis
    sim = await openrouter_sim_factory(seed=11)
    clock = OutageClock(lambda n: redis.start() if n == 4 else None)
    out = tmp_path / "out"
    async with ledger(redis.url, "run-short", clock) as book:
        summary = await run_through_outage(outage_plan(tmp_path), out, sim, book, redis)
        assert len(clock.sleeps) >= 4  # the run really met the outage
        state = await book.snapshot()
    assert (summary.reason, EXIT_CODES[summary.reason]) == (StopReason.COMPLETE, 0)
    done = records(out)
    assert sorted(done) == sorted(f"q{n}" for n in range(PROMPTS))  # each exactly once
    assert (state.open, state.reserved) == (0, 0)
    assert state.spent == sim.simulator.usage  # every charge recorded, none twice


async def test_a_long_outage_stops_the_run_with_one_line_and_it_resumes(
    tmp_path: Path, restartable_redis: RestartableRedis, openrouter_sim_factory: Factory
) -> None:
    redis = restartable_redis
    sim = await openrouter_sim_factory(seed=12)
    clock = OutageClock()
    out = tmp_path / "out"
    plan = outage_plan(tmp_path)
    async with ledger(redis.url, "run-long", clock, window=5.0) as book:
        summary = await run_through_outage(plan, out, sim, book, redis)
    assert (summary.reason, EXIT_CODES[summary.reason]) == (StopReason.ERROR, 1)
    assert "has been unreachable for 5 s, longer than its outage window" in summary.message
    assert "run the same command again" in summary.message
    first = records(out)
    assert len(first) == len(set(first)) < PROMPTS
    # Redis back: the same run resumes. Reservations left open (paid answers whose settle
    # could not be written are kept in the outputs) are recovered at their real cost.
    redis.start()
    later = time.time() + 3600  # the first run's leases have run out
    async with RedisLedger(redis.url, "run-long", clock=lambda: later) as again:
        runner = JobRunner(plan, out, ledger=again, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
        summary = await runner.run()
        state = await again.snapshot()
    assert (summary.reason, EXIT_CODES[summary.reason]) == (StopReason.COMPLETE, 0)
    done = records(out)
    assert sorted(done) == sorted(f"q{n}" for n in range(PROMPTS))
    assert (state.open, state.reserved) == (0, 0)
    assert sim.simulator.usage <= state.spent <= state.limit  # no charge forgotten


async def test_the_command_line_sets_the_outage_window(restartable_redis: RestartableRedis) -> None:
    args = build_parser().parse_args(["run", "p.jsonl", "--out", "o", "--outage-window", "90"])
    assert args.outage_window == 90
    assert build_parser().parse_args(["run", "p.jsonl", "--out", "o"]).outage_window == 60
    book = await open_shared_ledger(restartable_redis.url, "cli-window", D(1), outage_window=90)
    async with book:
        assert book._outage.window == 90


async def test_a_ledger_that_redis_lost_is_one_clear_error(
    restartable_redis: RestartableRedis,
) -> None:
    async with RedisLedger(restartable_redis.url, "lost", D(10)) as book:
        res = await book.reserve(D(1), key="a")
        await book._client.flushall()  # what a restart without persistence leaves
        with pytest.raises(LedgerUnavailableError, match="'lost' is gone from Redis at") as info:
            await book.settle(res, D("0.5"))
        assert "appendonly yes" in str(info.value)
