"""A worker's fleet source against a real redis-server: bounded, retried, never silent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as redis_errors

from provider_router.batch.fleet import GROUP, POOL_SIZE, FleetQueue, WorkItem
from provider_router.batch.fleet_source import FleetSource
from provider_router.batch.journal import FileJournal
from provider_router.plan import Plan
from tests.fleet.conftest import write_prompts

pytestmark = pytest.mark.redis

MakeQueue = Callable[..., FleetQueue]


class Sleeps:
    """An injected sleep: records each backoff and yields to the loop, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def big_plan(tmp_path: Path) -> Plan:
    path = write_prompts(tmp_path / "big.jsonl", 600)
    return Plan.model_validate({"model": "m/x", "datasets": [{"name": "d", "input": str(path)}]})


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[FileJournal]:
    opened = FileJournal.open(tmp_path / "out")
    yield opened
    opened.close("test")


def _connections(queue: FleetQueue) -> int:
    pool: Any = queue._client.connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)


async def _take(source: FleetSource, count: int) -> list[WorkItem]:
    taken: list[WorkItem] = []
    async for item in source:
        taken.append(item)
        if len(taken) == count:
            break
    return taken


async def _started(
    queue: FleetQueue, plan: Plan, journal: FileJournal, **options: Any
) -> tuple[FleetSource, Sleeps, WorkItem]:
    """A started source with an injected sleep, and the first prompt it yields."""
    sleeps = Sleeps()
    source = FleetSource(queue, plan, journal=journal, prefetch=5, sleep=sleeps, **options)
    await source.start()
    (item,) = await _take(source, 1)
    return source, sleeps, item


async def test_a_burst_of_acks_and_give_backs_stays_within_the_pool_and_all_land(
    make_queue: MakeQueue, big_plan: Plan, journal: FileJournal
) -> None:
    queue = make_queue(idle_timeout=30)
    source = FleetSource(queue, big_plan, journal=journal, prefetch=600)
    await source.start()
    await queue.wait_loaded()
    items = await _take(source, 600)
    fleet = source.journal
    # 300 results and 300 failures in one loop turn: one task per operation
    # (the old design) needed hundreds of connections; the writer needs one.
    for item in items[:300]:
        assert fleet.claim("d", item.prompt.id)
        fleet.complete(
            "d", item.prompt.id, b"{}\n", output_tokens=10, prompt_tokens=2, cost_units=5
        )
    fleet.flush()
    for item in items[300:]:
        assert fleet.claim("d", item.prompt.id)
        fleet.release("d", item.prompt.id, reason="ProviderUnavailableError")
    assert source.tally("d").completed == 300  # counted before acknowledged
    await source.close()
    assert _connections(queue) <= POOL_SIZE
    tally = (await queue.progress()).datasets["d"]
    assert (tally.completed, tally.output_tokens, tally.cost_units) == (300, 3000, 1500)
    assert (tally.in_flight, tally.queued) == (0, 300)
    again = await queue.claim(1000)
    assert {item.attempts for item in again} == {1}  # each failure counted once


async def test_a_transient_redis_failure_is_retried_with_backoff(
    make_queue: MakeQueue, big_plan: Plan, journal: FileJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = make_queue()
    source, sleeps, item = await _started(queue, big_plan, journal)
    real = queue.complete
    failures = [redis_errors.ConnectionError("reset"), redis_errors.TimeoutError("slow")]

    async def flaky(results: Any) -> list[bool]:
        if failures:
            raise failures.pop(0)
        return await real(results)

    monkeypatch.setattr(queue, "complete", flaky)
    assert source.journal.claim("d", item.prompt.id)
    source.journal.complete(
        "d", item.prompt.id, b"{}\n", output_tokens=1, prompt_tokens=1, cost_units=1
    )
    source.journal.flush()
    await source.close()  # drains the writer: no error left behind
    assert sleeps.delays == [0.05, 0.1]
    assert source.error is None
    assert (await queue.progress()).datasets["d"].completed == 1


async def test_redis_gone_for_good_stops_the_source_and_raises_instead_of_hanging(
    make_queue: MakeQueue, big_plan: Plan, journal: FileJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = make_queue()
    source, sleeps, item = await _started(queue, big_plan, journal, retry_for=1.0)

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise redis_errors.ConnectionError("Connection refused")

    monkeypatch.setattr(queue, "complete", down)
    monkeypatch.setattr(queue, "claim", down)
    assert source.journal.claim("d", item.prompt.id)
    source.journal.complete(
        "d", item.prompt.id, b"{}\n", output_tokens=1, prompt_tokens=1, cost_units=1
    )
    source.journal.flush()
    with pytest.raises(redis_errors.ConnectionError, match="refused"):
        async for _ in source:
            pass
    assert isinstance(source.error, redis_errors.ConnectionError)
    assert sum(sleeps.delays) >= 1.0  # it retried for retry_for, then gave up
    await source.close()  # already raised by the iteration: not raised twice


async def test_a_script_error_is_not_retried_and_close_raises_it(
    make_queue: MakeQueue, big_plan: Plan, journal: FileJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = make_queue()
    source, sleeps, item = await _started(queue, big_plan, journal)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise redis_errors.ResponseError("ERR Error running script")

    monkeypatch.setattr(queue, "give_back", broken)
    assert source.journal.claim("d", item.prompt.id)
    source.journal.release("d", item.prompt.id, reason="x")
    with pytest.raises(redis_errors.ResponseError, match="script"):
        await source.close()
    assert sleeps.delays == []


async def test_a_prompt_this_worker_finished_in_an_earlier_run_is_acknowledged_not_sent(
    make_queue: MakeQueue, big_plan: Plan, tmp_path: Path
) -> None:
    # The earlier run journaled p0, then died before acknowledging it.
    with FileJournal.open(tmp_path / "w") as earlier:
        assert earlier.claim("d", "p0")
        earlier.complete("d", "p0", b"{}\n", output_tokens=1, prompt_tokens=1, cost_units=1)
    journal = FileJournal.open(tmp_path / "w")
    try:
        source = FleetSource(make_queue(), big_plan, journal=journal, prefetch=600)
        async with source:
            await source.queue.wait_loaded()
            items = await _take(source, 600)
            first = next(i for i in items if i.prompt.id == "p0")
            assert not source.journal.claim("d", first.prompt.id)
            for item in items:
                if item is not first:
                    assert source.journal.claim("d", item.prompt.id)
                    source.journal.release("d", item.prompt.id, reason="stop")
        tally = (await source.queue.progress()).datasets["d"]
        assert (tally.completed, tally.in_flight) == (1, 0)
    finally:
        journal.close("test")


async def test_the_heartbeat_keeps_only_what_the_worker_knows_it_holds(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    worker, other = make_queue(worker="w", idle_timeout=5), make_queue(worker="o", idle_timeout=5)
    await worker.join(two_dataset_plan)
    await other.join(two_dataset_plan)
    await worker.wait_loaded()
    items = await worker.claim(3, datasets=["a"])
    for item in items:  # all look idle for a minute
        await worker._client.xclaim(
            worker._key("s", "a"), GROUP, "w", 0, [item.entry_id], idle=60_000, justid=True
        )
    # The worker lost track of two of them (say a claim reply that never arrived).
    await worker.maintain(reclaim=False, holding={"a": [items[0].entry_id]})
    taken = await other.reclaim()
    assert sorted(i.prompt.id for i in taken) == sorted(i.prompt.id for i in items[1:])


async def test_a_failed_loader_is_collected_and_taken_over(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    queue = make_queue()
    await queue.join(two_dataset_plan)
    await queue.wait_loaded()

    async def lost_connection() -> None:
        raise redis_errors.ConnectionError("reset by peer")

    async def broken() -> None:
        raise redis_errors.ResponseError("WRONGTYPE")

    queue._loader = asyncio.ensure_future(lost_connection())
    await asyncio.gather(queue._loader, return_exceptions=True)
    await queue.maintain(reclaim=False)  # transient: logged, let go, no error
    assert queue._loader is None
    queue._loader = asyncio.ensure_future(broken())
    await asyncio.gather(queue._loader, return_exceptions=True)
    with pytest.raises(redis_errors.ResponseError):
        await queue.maintain(reclaim=False)
