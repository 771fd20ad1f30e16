"""The driver's word to the stage's actors, against a real redis-server: a dataset's
output-token target admits requests as ``run`` dispatches them, the stop word, the counts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from provider_router.ray._control import (
    CONTROL_INTERVAL,
    CONTROL_TTL,
    CONTROL_UNREACHABLE,
    INTERRUPTED,
    TARGET_REACHED,
    JobControl,
    StageControl,
)
from tests.ledger.conftest import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

CAP = 256


def _answer(tokens: int, cost: str = "0.001", provider: str = "Chutes", attempts: int = 1) -> Any:
    usage = SimpleNamespace(completion_tokens=tokens, prompt_tokens=10)
    return SimpleNamespace(
        quarantined=False, usage=usage, cost=Decimal(cost), provider=provider, attempts=attempts
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def control(
    redis_server: RedisServer, job_name: str
) -> AsyncIterator[tuple[JobControl, StageControl, _Clock, list[float]]]:
    clock = _Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        await asyncio.sleep(0)

    driver = JobControl(redis_server.url, job_name)
    stage = StageControl(redis_server.url, job_name, clock=clock, sleep=sleep)
    try:
        yield driver, stage, clock, slept
    finally:
        await stage.close()
        await driver.close()


async def test_before_any_length_is_known_each_request_in_flight_counts_at_its_cap(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
) -> None:
    driver, stage, _, slept = control
    await driver.begin({"a": (0, 0, Decimal(0))}, {"a": (1000, CAP)})
    # 0, 256, 512, 768 priced in flight: each below 1,000, so four go out ...
    assert [await stage.admit("a") for _ in range(4)] == [None] * 4
    assert slept == []
    # ... and the fifth waits (768 + 256 is not below 1,000) until one lands short.
    waiting, release = asyncio.Event(), asyncio.Event()

    async def held(seconds: float) -> None:
        slept.append(seconds)
        waiting.set()
        await release.wait()

    stage._sleep = held
    fifth = asyncio.ensure_future(stage.admit("a"))
    await asyncio.wait_for(waiting.wait(), 10)  # it asked, found no room, and waits
    assert not fifth.done()
    assert slept == [CONTROL_INTERVAL]
    await stage.landed("a", _answer(100))  # 100 + 3 x 256 = 868 < 1,000
    release.set()
    assert await fifth is None
    assert slept == [CONTROL_INTERVAL]
    counts = (await driver.counts())["a"]
    assert (counts.done, counts.output_tokens, counts.flight) == (1, 100, 4)


async def test_once_the_target_is_reached_every_further_row_is_held_without_waiting(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
) -> None:
    driver, stage, _, slept = control
    await driver.begin({"a": (3, 900, Decimal("0.3"))}, {"a": (1000, CAP)})
    assert await stage.admit("a") is None
    await stage.landed("a", _answer(150))  # 1,050: reached
    assert [await stage.admit("a") for _ in range(3)] == [TARGET_REACHED] * 3
    assert slept == []
    assert await stage.admit("b") is None  # a dataset without a target is not held
    counts = await driver.counts()
    assert (counts["a"].done, counts["a"].output_tokens) == (4, 1050)
    assert counts["a"].cost == Decimal("0.301")


async def test_a_failed_request_frees_its_place_and_adds_no_length(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
) -> None:
    driver, stage, _, _ = control
    await driver.begin({}, {"a": (300, CAP)})
    assert await stage.admit("a") is None  # 0 + 256 in flight
    assert await stage.admit("a") is None
    await stage.landed("a", None)  # failed: nothing written
    await stage.landed("a", None)
    counts = (await driver.counts())["a"]
    assert (counts.done, counts.output_tokens, counts.flight) == (0, 0, 0)
    assert await stage.admit("a") is None


async def test_the_stop_word_reaches_every_actor_within_the_interval(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
) -> None:
    driver, stage, clock, _ = control
    await driver.begin({}, {})
    assert await stage.admit("a") is None
    await driver.stop(INTERRUPTED)
    clock.now += CONTROL_INTERVAL
    assert await stage.admit("a") == INTERRUPTED
    await driver.begin({}, {})  # the next run starts without it
    clock.now += CONTROL_INTERVAL
    assert await stage.admit("a") is None


async def test_counts_per_provider_for_the_metrics(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
) -> None:
    driver, stage, _, _ = control
    await driver.begin({}, {})
    await stage.admit("a")
    await stage.landed("a", _answer(10, "0.5", "Chutes", attempts=3))
    await stage.landed("a", _answer(20, "0.25", "Chutes"))
    await stage.landed("a", _answer(5, "0.125", "Moonshot AI"))
    providers = await driver.providers()
    chutes = {"done": 2, "out": 30, "prompt": 20, "cost": 750 * 10**9, "retries": 2}
    assert providers["Chutes"] == chutes
    assert providers["Moonshot AI"]["done"] == 1


async def test_an_unreachable_redis_holds_rows_back_and_never_raises() -> None:
    stage = StageControl("redis://127.0.0.1:1/0", "down")
    try:
        assert await stage.admit("a") == CONTROL_UNREACHABLE  # targets unknown: hold
        await stage.landed("a", _answer(10))  # counts only: no error
    finally:
        await stage.close()


async def test_no_word_of_a_run_outlives_it(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
    redis_server: RedisServer,
    job_name: str,
) -> None:
    import redis.asyncio as aioredis

    driver, _, _, _ = control
    await driver.begin({}, {"a": (10, CAP)})
    await driver.stop(INTERRUPTED)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        # A driver killed hard: its word expires on its own.
        assert 0 < await client.ttl(driver.control_key) <= CONTROL_TTL
        await driver.end()
        assert await client.exists(driver.control_key) == 0
    finally:
        await client.aclose()
    later = StageControl(redis_server.url, job_name)  # a library job of the same name
    try:
        assert await later.admit("a") is None
    finally:
        await later.close()


async def test_the_stop_word_stops_the_actors_router(
    control: tuple[JobControl, StageControl, _Clock, list[float]],
) -> None:
    driver, stage, _, _ = control
    await driver.begin({}, {})
    stopped = asyncio.Event()
    stage.watch(stopped.set)  # the stage passes Router.stop: waiting requests start no attempt
    await asyncio.sleep(0)
    assert not stopped.is_set()
    await driver.stop(INTERRUPTED)
    await asyncio.wait_for(stopped.wait(), 10)
