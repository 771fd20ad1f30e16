"""The shared work queue against a real redis-server: enqueue once, claim, ack, reclaim."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import ConfigurationError, DataFileError, MissingDependencyError
from provider_router.batch.fleet import GROUP, ClaimLimit, FleetQueue, WorkItem
from provider_router.plan import Plan
from tests.fleet.conftest import write_prompts

pytestmark = pytest.mark.redis

MakeQueue = Callable[..., FleetQueue]


async def _claim_all(queue: FleetQueue, *, rounds: int = 20) -> list[WorkItem]:
    items: list[WorkItem] = []
    for _ in range(rounds):
        batch = await queue.claim(100)
        if not batch:
            break
        items += batch
    return items


async def _age(queue: FleetQueue, items: list[WorkItem], *, owner: str, ms: int) -> None:
    """Make ``items`` look idle for ``ms`` (XCLAIM's IDLE option), instead of sleeping."""
    client = queue._client
    for item in items:
        await client.xclaim(
            queue._key("s", item.dataset), GROUP, owner, 0, [item.entry_id], idle=ms, justid=True
        )


async def test_workers_joining_together_enqueue_every_prompt_exactly_once(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    queues = [make_queue() for _ in range(4)]
    await asyncio.gather(*(q.join(two_dataset_plan) for q in queues))
    for queue in queues:
        await queue.wait_loaded()
    progress = await queues[0].progress()
    assert progress.loaded
    assert {name: t.total for name, t in progress.datasets.items()} == {"a": 30, "b": 20}
    assert {name: t.queued for name, t in progress.datasets.items()} == {"a": 30, "b": 20}

    claimed = await asyncio.gather(*(_claim_all(q) for q in queues))
    ids = [(item.dataset, item.prompt.id) for batch in claimed for item in batch]
    assert len(ids) == 50
    assert len(set(ids)) == 50  # each prompt went to exactly one worker
    first = next(item for batch in claimed for item in batch if item.prompt.id == "p0")
    assert first.prompt.messages == [{"role": "user", "content": "question 0"}]
    assert first.prompt.line == 1
    assert first.prompt.source.name == "a.jsonl"


async def test_a_loader_that_died_half_way_is_taken_over_without_duplicates(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    ghost, queue = make_queue(worker="ghost"), make_queue()
    client = queue._client
    # The ghost took the lock and enqueued some prompts of "a", then died.
    await client.set(queue._key("lock"), "ghost")
    await ghost.join(two_dataset_plan)
    assert ghost._loader is None  # the lock is taken: it does not load
    keys = [queue._key(kind, "a") for kind in ("ids", "s", "tally")]
    await ghost._scripts["ENQUEUE"](keys=keys, args=["p3", '{"x":1}', "p4", '{"x":1}'])

    await queue.join(two_dataset_plan)
    assert not (await queue.progress()).loaded
    await client.delete(queue._key("lock"))  # the ghost's lock expired
    await queue.maintain(reclaim=False)
    await queue.wait_loaded()

    progress = await queue.progress()
    assert progress.loaded
    assert progress.datasets["a"].total == 30  # p3 and p4 were not added again
    assert await client.xlen(queue._key("s", "a")) == 30


async def test_complete_acks_counts_and_flags_a_second_completion_as_duplicate(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    queue = make_queue()
    await queue.join(two_dataset_plan)
    await queue.wait_loaded()
    items = await queue.claim(10, datasets=["a"])
    assert len(items) == 10
    assert {item.dataset for item in items} == {"a"}

    progress = await queue.progress()
    assert (progress.datasets["a"].in_flight, progress.datasets["a"].queued) == (10, 20)
    assert progress.workers == 1

    flags = await queue.complete([(item, 100, 7, 1_000_000) for item in items[:4]])
    assert flags == [True] * 4
    again = await queue.complete([(items[0], 100, 7, 1_000_000)])
    assert again == [False]

    tally = (await queue.progress()).datasets["a"]
    assert (tally.completed, tally.output_tokens, tally.prompt_tokens) == (4, 400, 28)
    assert tally.cost == Decimal("0.000004")
    assert (tally.duplicates, tally.in_flight, tally.queued) == (1, 6, 20)


async def test_a_dead_workers_prompts_go_to_another_and_a_live_one_keeps_its_own(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    dead = make_queue(worker="dead", idle_timeout=5)
    live = make_queue(worker="live", idle_timeout=5)
    await dead.join(two_dataset_plan)
    await live.join(two_dataset_plan)
    await dead.wait_loaded()
    await live.wait_loaded()
    lost = await dead.claim(6, datasets=["a"])
    kept = await live.claim(4, datasets=["b"])
    # Both look idle for a minute; only the live worker sends its heartbeat.
    await _age(dead, lost, owner="dead", ms=60_000)
    await _age(live, kept, owner="live", ms=60_000)
    await live.maintain(reclaim=False)

    reclaimed = await live.reclaim()
    assert sorted(i.prompt.id for i in reclaimed) == sorted(i.prompt.id for i in lost)
    assert all(i.dataset == "a" for i in reclaimed)
    # The dead worker's heartbeat, should it come back, cannot take them back.
    await dead.maintain(reclaim=False)
    pending = await live._client.xpending_range(
        live._key("s", "a"), GROUP, "-", "+", 100, consumername="live"
    )
    assert len(pending) == 6
    assert await dead.reclaim() == []


async def test_a_reclaimed_prompt_already_done_is_dropped_not_sent_again(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    slow, other = make_queue(worker="slow"), make_queue(worker="other", idle_timeout=5)
    await slow.join(two_dataset_plan)
    await other.join(two_dataset_plan)
    await slow.wait_loaded()
    items = await slow.claim(2, datasets=["a"])
    # Another worker completed items[0] (say on a redelivery), then slow went silent.
    done_key = other._key("done", "a")
    await other._client.sadd(done_key, items[0].prompt.id)
    await _age(slow, items, owner="slow", ms=60_000)
    reclaimed = await other.reclaim()
    assert [i.prompt.id for i in reclaimed] == [items[1].prompt.id]
    tally = (await other.progress()).datasets["a"]
    assert tally.in_flight == 1


async def test_give_back_requeues_and_park_sets_aside_until_a_worker_joins(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    queue = make_queue()
    await queue.join(two_dataset_plan)
    await queue.wait_loaded()
    items = await queue.claim(3, datasets=["b"])
    assert await queue.give_back(items[:2]) == 2
    assert await queue.give_back(items[2:], park=True) == 1
    assert await queue.give_back(items[2:]) == 0  # no longer held: nothing happens

    tally = (await queue.progress()).datasets["b"]
    assert (tally.queued, tally.in_flight, tally.parked, tally.total) == (19, 0, 1, 20)
    again = await _claim_all(queue)
    requeued = {i.prompt.id: i.attempts for i in again if i.attempts}
    assert requeued == {items[0].prompt.id: 1, items[1].prompt.id: 1}

    later = make_queue()
    await later.join(two_dataset_plan)  # the next run: parked prompts come back
    tally = (await later.progress()).datasets["b"]
    assert (tally.parked, tally.queued) == (0, 1)
    back = await later.claim(10, datasets=["b"])
    assert [i.prompt.id for i in back] == [items[2].prompt.id]


async def test_a_different_plan_under_the_same_name_is_refused(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    await make_queue().join(two_dataset_plan)
    other = two_dataset_plan.model_copy(update={"model": "openai/gpt-5"})
    with pytest.raises(ConfigurationError, match="already runs another plan"):
        await make_queue().join(other)


async def test_strict_refuses_a_bad_line_before_enqueueing_anything(
    make_queue: MakeQueue, tmp_path: Path
) -> None:
    path = write_prompts(tmp_path / "bad.jsonl", 3)
    with path.open("a") as fh:
        fh.write('{"id": "x"}\n')
    plan = Plan.model_validate({"model": "m/x", "datasets": [{"name": "d", "input": str(path)}]})
    queue = make_queue()
    with pytest.raises(DataFileError, match=r"bad\.jsonl:4: line has neither"):
        await queue.join(plan, strict=True)
    assert await queue._client.exists(queue._key("s", "d")) == 0

    await queue.join(plan)  # not strict: the bad line is skipped and counted
    await queue.wait_loaded()
    tally = (await queue.progress()).datasets["d"]
    assert (tally.total, tally.bad_lines) == (3, 1)
    assert [str(p) for p in queue.load_problems] == [
        f"{path}:4: line has neither `messages` nor `prompt` (keys: id)"
    ]


def test_bad_arguments_are_named(redis_server: object) -> None:
    with pytest.raises(ConfigurationError, match="fleet name"):
        FleetQueue("redis://127.0.0.1:1/0", "a{b}")
    with pytest.raises(ConfigurationError, match="idle_timeout"):
        FleetQueue("redis://127.0.0.1:1/0", "ok", idle_timeout=0)


def test_without_the_redis_package_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'provider-router\[redis\]'"):
        FleetQueue("redis://127.0.0.1:1/0", "x")


def test_payload_round_trips_metadata(tmp_path: Path) -> None:
    from provider_router.batch.fleet_records import decode_item
    from provider_router.prompts import PromptReader

    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"prompt": "hé", "source": "magicoder", "n": [1, 2]}) + "\n")
    (prompt,) = list(PromptReader([path]))
    item = WorkItem("d", prompt, "1-0")
    back = decode_item("d", "1-0", {"id": prompt.id, "p": item.payload, "n": "2"})
    assert back.prompt == prompt
    assert back.attempts == 2


async def test_capped_claims_count_every_workers_claimed_prompts(
    make_queue: MakeQueue, two_dataset_plan: Plan
) -> None:
    """Redis decides each claim: completed plus every worker's pending against the caps."""
    first, second = make_queue(), make_queue()
    for queue in (first, second):
        await queue.join(two_dataset_plan)
    await first.wait_loaded()
    await second.wait_loaded()
    cap = {"a": ClaimLimit(max_requests=7)}
    assert len(await first.claim(5, datasets=["a"], limits=cap)) == 5
    taken = await second.claim(5, datasets=["a"], limits=cap)
    assert len(taken) == 2  # 7 - 5 pending elsewhere
    assert await second.claim(5, datasets=["a"], limits=cap) == []
    await second.complete([(taken[0], 10, 1, 1)])  # completed still counts against the cap
    assert await first.claim(5, datasets=["a"], limits=cap) == []
    await second.give_back(taken[1:])  # given back: its slot is free again
    assert len(await first.claim(5, datasets=["a"], limits=cap)) == 1


@pytest.mark.parametrize(
    ("mean", "spread", "expected"),
    [
        (None, 0.0, 4),  # each at the cap: 0, 300, 600, 900 < 1,000 (the 4th may land over)
        (100.0, 50.0, 9),  # 8 × 100 + 50 √8 = 941 < 1,000; 9 × 100 + 150 = 1,050 is not
    ],
)
async def test_a_target_admits_claims_by_the_workers_in_flight_price(
    make_queue: MakeQueue,
    two_dataset_plan: Plan,
    mean: float | None,
    spread: float,
    expected: int,
) -> None:
    queue = make_queue()
    await queue.join(two_dataset_plan)
    await queue.wait_loaded()
    limit = ClaimLimit(target_output_tokens=1000, cap=300, mean=mean, spread=spread)
    items = await queue.claim(30, datasets=["a"], limits={"a": limit})
    assert len(items) == expected
    # A short answer lands: 10 tokens out and one fewer pending make room for one more.
    await queue.complete([(items[0], 10, 1, 1)])
    assert len(await queue.claim(30, datasets=["a"], limits={"a": limit})) == 1
    assert await queue.claim(30, datasets=["a"], limits={"a": limit}) == []
