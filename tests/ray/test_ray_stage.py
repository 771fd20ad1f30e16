"""The stage's rows one by one, in this process (no cluster): a real redis-server, the
local OpenRouter over real sockets, the stage called as Ray Data calls it."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from provider_router import LedgerUnavailableError, RedisLedger, RetryPolicy
from provider_router.ray import FAILED, NOT_SENT, AnswerStore, PromptStage, StageConfig
from provider_router.ray._secret import PAD_TTL, mask_key
from provider_router.testing import SimulatorServer
from tests.ledger.conftest import RedisServer, RestartableRedis, restartable_redis
from tests.ray.conftest import CREDITS, KEY, MODEL

__all__ = ["restartable_redis"]

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

PREFIX = "provider-router:ray"
FIRST = {"id": "p1", "prompt": "question 1"}


class Killed(BaseException):
    """What a SIGKILL looks like to the code after it: nothing of it runs."""


class OutageClock:
    """The store's retry clock and sleep: no real waiting; ``on_sleep(n)`` after each."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.now = 1000.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.sleeps)
        await asyncio.sleep(0)


@pytest.fixture
async def simulator() -> AsyncIterator[SimulatorServer]:
    server = SimulatorServer(api_keys=[KEY], speed=math.inf, credits=CREDITS)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def make_stage(
    url: str, name: str, base_url: str, *, run: str = "run-1", **overrides: Any
) -> PromptStage:
    """A stage as RayJob.generate builds it: the ledger's limit and the key's pad set."""
    ledger = RedisLedger(url, name, Decimal(5))
    try:
        await ledger.snapshot()  # creates it with its limit
    finally:
        await ledger.close()
    masked, pad = mask_key(SecretStr(KEY), f"{PREFIX}:{{{name}}}")
    store = AnswerStore(url, name)
    try:
        await store.put_pad(masked.pad_name, pad, PAD_TTL)
    finally:
        await store.close()
    options: dict[str, Any] = {
        "model": MODEL,
        "name": name,
        "redis_url": url,
        "store_prefix": PREFIX,
        "key": masked,
        "dataset": "default",
        "max_tokens": 64,
        "base_url": base_url,
        "concurrency": 8,
        "recover_interval": 3600.0,
        "run": run,
        **overrides,
    }
    known = {f.name for f in dataclasses.fields(StageConfig)}
    return PromptStage(StageConfig(**{k: v for k, v in options.items() if k in known}))


async def close_stage(stage: PromptStage) -> None:
    if stage._recovering is not None:
        stage._recovering.cancel()
        await asyncio.gather(stage._recovering, return_exceptions=True)
    if stage._router is not None:
        await stage._router.close()
    if stage._ledger is not None:
        await stage._ledger.close()
    if stage._store is not None:
        await stage._store.close()
    if stage._control is not None:
        await stage._control.close()


@pytest.fixture
async def new_stage(
    redis_server: RedisServer, simulator: SimulatorServer
) -> AsyncIterator[Callable[..., Awaitable[PromptStage]]]:
    """Builds stages of one job (each a new actor) on the session's Redis; closes them."""
    name, made = fresh_name(), []

    async def build(**overrides: Any) -> PromptStage:
        made.append(await make_stage(redis_server.url, name, simulator.url, **overrides))
        return made[-1]

    try:
        yield build
    finally:
        for stage in made:
            await close_stage(stage)


async def one_row(
    url: str, name: str, base_url: str, row: dict[str, Any], **overrides: Any
) -> dict[str, Any]:
    """``row`` through a new stage (a new actor: a retried task, or a resumed job)."""
    stage = await make_stage(url, name, base_url, **overrides)
    try:
        [out] = await stage(row)
    finally:
        await close_stage(stage)
    return out


def fresh_name() -> str:
    return f"stage-{secrets.token_hex(4)}"


async def test_a_kill_right_after_the_settle_loses_no_paid_answer(
    redis_server: RedisServer, simulator: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = fresh_name()
    settle = RedisLedger.settle

    async def settle_then_die(self: RedisLedger, *args: Any, **kwargs: Any) -> Any:
        await settle(self, *args, **kwargs)
        raise Killed  # the actor is gone between the ledger's settle and anything after it

    first = await make_stage(redis_server.url, name, simulator.url)
    monkeypatch.setattr(RedisLedger, "settle", settle_then_die)
    with pytest.raises(Killed):
        await first({"id": "p1", "prompt": "question 1"})
    monkeypatch.setattr(RedisLedger, "settle", settle)
    await close_stage(first)
    assert len(simulator.requests) == 1

    # Ray's task retry, on a new actor:
    row = await one_row(redis_server.url, name, simulator.url, {"id": "p1", "prompt": "question 1"})
    assert row["status"] == "answered"
    assert row["answer"]
    assert row["generation_id"]
    assert len(simulator.requests) == 1  # re-emitted free, not bought again
    assert Decimal(row["cost"]) == CREDITS - simulator.balance


async def row_in_outage(
    redis: RestartableRedis, simulator: SimulatorServer, clock: OutageClock, *, window: float
) -> dict[str, Any]:
    """:data:`FIRST` through a stage whose store's retries run on ``clock``, Redis
    stopped first (``clock`` may start it again)."""
    name = fresh_name()
    stage = await make_stage(redis.url, name, simulator.url)
    stage._store = AnswerStore(
        redis.url, name, outage_window=window, sleep=clock.sleep, clock=clock
    )
    redis.stop()
    try:
        [row] = await stage(dict(FIRST))
    finally:
        if redis.server is None:
            redis.start()
        await close_stage(stage)
    return row


async def test_a_redis_blip_at_the_lookup_is_waited_out_and_the_row_answered(
    restartable_redis: RestartableRedis, simulator: SimulatorServer
) -> None:
    clock = OutageClock(lambda n: restartable_redis.start() if n == 3 else None)
    row = await row_in_outage(restartable_redis, simulator, clock, window=30)
    assert clock.sleeps >= 3
    assert row["status"] == "answered"
    assert len(simulator.requests) == 1


async def test_redis_gone_past_the_window_is_a_not_sent_row_never_a_raise_nor_a_blind_send(
    restartable_redis: RestartableRedis, simulator: SimulatorServer
) -> None:
    row = await row_in_outage(restartable_redis, simulator, OutageClock(), window=5)
    assert row["status"] == NOT_SENT
    assert "unreachable" in row["error"]
    assert "outage window (5 s)" in row["error"]
    assert simulator.requests == []  # unknown whether it was paid: not sent blind


class _StoreDown(AnswerStore):
    """A store whose writes fail as after a whole outage window (until told otherwise)."""

    down = True

    async def put(self, key: str, answer: dict[str, Any]) -> None:
        if self.down:
            raise LedgerUnavailableError("Redis has been unreachable for 60 s")
        await super().put(key, answer)


async def test_a_paid_answer_redis_cannot_take_is_kept_replayed_and_stored_later(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    name = fresh_name()
    stage = await make_stage(redis_server.url, name, simulator.url)
    store = stage._store = _StoreDown(redis_server.url, name)
    try:
        [row] = await stage({"id": "p1", "prompt": "question 1"})
        assert row["status"] == "answered"
        assert row["answer"]
        assert "not stored in Redis yet" in row["error"]
        [again] = await stage({"id": "p1", "prompt": "question 1"})  # a retried task
        assert again["generation_id"] == row["generation_id"]
        assert len(simulator.requests) == 1
        store.down = False
        await stage._store_unstored()
        assert (await store.get("default/p1") or {})["generation_id"] == row["generation_id"]
        assert stage._unstored == {}
    finally:
        await close_stage(stage)


def _spill_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jsonl"))


async def test_a_paid_answer_redis_cannot_take_outlives_its_actors_death_on_the_node(
    redis_server: RedisServer, simulator: SimulatorServer, tmp_path: Path
) -> None:
    name, node = fresh_name(), {"spill_dir": str(tmp_path)}
    first = await make_stage(redis_server.url, name, simulator.url, **node)
    first._store = _StoreDown(redis_server.url, name)
    try:
        [row] = await first(dict(FIRST))
        assert "not stored in Redis yet" in row["error"]
        [spill] = _spill_files(tmp_path)  # on the node's disk, not only in memory
        first._spill.close()  # the actor is killed: its lock goes, its memory too
    finally:
        await close_stage(first)
    # Ray's retry on a new actor of the node, Redis back (the dead one's lease held):
    again = await one_row(redis_server.url, name, simulator.url, dict(FIRST), **node)
    assert again["status"] == "answered"
    assert again["generation_id"] == row["generation_id"]
    assert again["error"] is None
    assert len(simulator.requests) == 1  # not bought a second time
    assert not spill.exists()


async def test_a_live_actors_spill_is_its_own_to_store(
    redis_server: RedisServer, simulator: SimulatorServer, tmp_path: Path
) -> None:
    name, node = fresh_name(), {"spill_dir": str(tmp_path)}
    first = await make_stage(redis_server.url, name, simulator.url, **node)
    store = first._store = _StoreDown(redis_server.url, name)
    second = await make_stage(redis_server.url, name, simulator.url, **node)
    try:
        [row] = await first(dict(FIRST))
        second._store = AnswerStore(redis_server.url, name)
        await second._adopt_spills()  # first lives: its file is locked, left alone
        assert await second._store.get("default/p1") is None
        store.down = False
        await first._store_unstored()
        assert (await store.get("default/p1") or {})["generation_id"] == row["generation_id"]
        assert _spill_files(tmp_path) == []
    finally:
        await close_stage(first)
        await close_stage(second)


async def test_a_row_the_router_refuses_comes_out_with_a_status_and_the_rest_go_on(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    name = fresh_name()
    stage = await make_stage(redis_server.url, name, simulator.url)
    bad = {"id": "bad", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}
    try:
        [refused] = await stage(bad)
        [fine] = await stage({"id": "p1", "prompt": "question 1"})
    finally:
        await close_stage(stage)
    assert refused["status"] == "bad_input"
    assert "only 'text' and 'image_url' parts are priced" in refused["error"]
    assert fine["status"] == "answered"
    assert len(simulator.requests) == 1


async def test_an_openrouter_unreachable_at_the_first_fetch_is_rows_not_sent_not_a_failed_job(
    redis_server: RedisServer,
) -> None:
    name = fresh_name()
    stage = await make_stage(redis_server.url, name, "http://127.0.0.1:1/api/v1")
    try:
        rows = [await stage({"id": f"p{i}", "prompt": f"q {i}"}) for i in range(2)]
    finally:
        await close_stage(stage)
    statuses = {row["status"] for [row] in rows}
    assert statuses <= {NOT_SENT, FAILED}
    assert all(row["error"] for [row] in rows)


async def test_a_retried_task_replays_its_rows_notes_and_a_new_run_sends_them_again(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    name = fresh_name()
    store = AnswerStore(redis_server.url, name)
    try:
        await store.not_sent("default/p1", {"reason": "budget: used up", "run": "run-1"})
    finally:
        await store.close()
    row = await one_row(redis_server.url, name, simulator.url, FIRST, run="run-1")
    assert (row["status"], row["error"]) == (NOT_SENT, "budget: used up")
    assert simulator.requests == []  # the same row as the first attempt: blocks split alike

    row = await one_row(redis_server.url, name, simulator.url, FIRST, run="run-2")
    assert row["status"] == "answered"
    assert len(simulator.requests) == 1


async def test_a_duplicate_id_with_other_content_is_refused_in_runs_words_and_never_paid(
    new_stage: Callable[..., Awaitable[PromptStage]], simulator: SimulatorServer
) -> None:
    one, two = await new_stage(), await new_stage()  # two actors
    first, second = dict(FIRST), {"id": "p1", "prompt": "other"}
    rows = await asyncio.gather(one(first), two(second))
    by_prompt = {row["prompt"]: row for [row] in rows}
    # Ray retries both tasks: each row comes out as it did the first time.
    again = {row["prompt"]: row for [row] in await asyncio.gather(two(first), one(second))}
    statuses = sorted(row["status"] for row in by_prompt.values())
    assert statuses == ["answered", "bad_input"]
    [refused] = [row for row in by_prompt.values() if row["status"] == "bad_input"]
    assert refused["error"] == "duplicate id 'p1': an earlier line of this dataset already has it"
    assert {p: r["status"] for p, r in again.items()} == {
        p: r["status"] for p, r in by_prompt.items()
    }
    assert len(simulator.requests) == 1
    summary = await _tally_of(one.config.redis_url, one.config.name)
    assert summary.bad_lines == [f"default: {refused['error']}"]  # once, though refused twice
    assert summary.datasets[0].bad_lines == 1


async def _tally_of(url: str, name: str) -> Any:
    from provider_router.ray._tally import tally

    store, ledger = AnswerStore(url, name), RedisLedger(url, name)
    try:
        state = await ledger.snapshot()
        return await tally(store, state, datasets={}, since=0, started=0, recovered=[])
    finally:
        await store.close()
        await ledger.close()


async def test_the_same_row_twice_at_once_is_one_request(
    new_stage: Callable[..., Awaitable[PromptStage]], simulator: SimulatorServer
) -> None:
    stage = await new_stage()
    [[a], [b]] = await asyncio.gather(stage(dict(FIRST)), stage(dict(FIRST)))
    assert a["status"] == b["status"] == "answered"
    assert a["generation_id"] == b["generation_id"]
    assert len(simulator.requests) == 1


BILLED_ERROR = {"kind": "stream_error", "after_tokens": 10, "no_fallback": True,
                "reported": 0.002, "confirm": True}  # fmt: skip


async def test_a_billed_partial_answer_is_kept_in_its_failed_row_and_replayed_free(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    simulator.add_fault(BILLED_ERROR)  # every attempt: an error finish that was charged
    name, once = fresh_name(), {"router_options": {"retry": RetryPolicy(max_attempts=1)}}
    row = await one_row(redis_server.url, name, simulator.url, dict(FIRST), **once)
    assert row["status"] == FAILED
    assert (row["finish_reason"], row["cost"]) == ("error", "0.002")
    assert row["answer"]  # what was paid for, in its row
    assert row["generation_id"]
    assert len(simulator.requests) == 1
    # Ray's retry of the task (same run): the same row, not bought again.
    again = await one_row(redis_server.url, name, simulator.url, dict(FIRST), **once)
    assert again == row
    assert len(simulator.requests) == 1


async def test_a_billed_partial_answer_then_the_answer_is_answered_and_stored(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    simulator.add_fault({**BILLED_ERROR, "times": 1})
    name = fresh_name()
    row = await one_row(redis_server.url, name, simulator.url, dict(FIRST))
    assert row["status"] == "answered"
    assert row["finish_reason"] != "error"
    assert len(simulator.requests) == 2
    store = AnswerStore(redis_server.url, name)
    try:
        stored = await store.lookup("default/p1")
    finally:
        await store.close()
    assert stored.answer is not None
    assert stored.answer["generation_id"] == row["generation_id"]
    assert stored.failed is None  # the partial's note gave way to the answer


async def _no_wait(seconds: float) -> None:
    await asyncio.sleep(0)  # the holder's request goes on meanwhile


async def test_the_same_row_in_two_actors_at_once_is_paid_once_and_emitted_by_both(
    new_stage: Callable[..., Awaitable[PromptStage]], simulator: SimulatorServer
) -> None:
    one, two = await new_stage(), await new_stage()  # two actors of one job, one run
    one._sleep = two._sleep = _no_wait
    [[a], [b]] = await asyncio.gather(one(dict(FIRST)), two(dict(FIRST)))
    assert len(simulator.requests) == 1
    assert a["status"] == b["status"] == "answered"
    assert a["generation_id"] == b["generation_id"]  # the one paid answer, twice
    store = one._store
    assert store is not None
    assert await store._client.exists(store.sending_key("default/p1")) == 0  # let go
    assert one._held == two._held == set()


async def test_a_dead_actors_sending_lease_runs_out_and_the_row_is_sent_then(
    new_stage: Callable[..., Awaitable[PromptStage]], simulator: SimulatorServer
) -> None:
    stage = await new_stage()
    store = AnswerStore(stage.config.redis_url, stage.config.name)
    try:
        # The marker of an actor killed while it sent the row (nothing stored).
        assert (await store.hold("default/p1", "dead-actor", 60))[0] == "dead-actor"
        waits: list[float] = []

        async def wait(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 3:  # its lease runs out: nobody renews it
                await store._client.delete(store.sending_key("default/p1"))

        stage._sleep = wait
        [row] = await stage(dict(FIRST))
    finally:
        await store.close()
    assert waits  # it waited for the holder first
    assert row["status"] == "answered"
    assert len(simulator.requests) == 1


async def test_a_replayed_answer_is_the_very_row_first_emitted(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    name = fresh_name()
    row = {"id": "p1", "prompt": "question 1"}
    emitted = await one_row(redis_server.url, name, simulator.url, row)
    replayed = await one_row(redis_server.url, name, simulator.url, dict(row))
    assert replayed == emitted  # the same bytes: a retried task's blocks split alike
    assert len(simulator.requests) == 1


async def test_on_paid_sees_the_answer_before_its_settle_and_a_failing_hook_settles_anyway(
    simulator: SimulatorServer, log_events: list[dict[str, Any]]
) -> None:
    from provider_router import MemoryLedger, Router

    ledger = MemoryLedger(Decimal(1))
    seen: list[tuple[str, Decimal, Decimal]] = []

    async def before_settle(paid: Any) -> None:
        state = await ledger.snapshot()
        seen.append((paid.text, state.spent, state.reserved))
        raise RuntimeError("the caller's store is down")

    async with Router(MODEL, ledger=ledger, base_url=simulator.url, api_key=KEY) as router:
        result = await router.chat(
            [{"role": "user", "content": "hi"}], max_tokens=16, on_paid=before_settle
        )
    [(text, spent, reserved)] = seen
    assert text == result.text
    assert (spent, reserved > 0) == (0, True)  # not settled yet when the hook ran
    state = await ledger.snapshot()
    assert state.spent == result.cost > 0  # settled all the same
    assert state.reserved == 0
    [failed] = [e for e in log_events if e["event"] == "route.on_paid_failed"]
    assert "the caller's store is down" in failed["error"]


async def test_a_stored_answer_to_an_earlier_content_is_kept_aside_and_the_new_text_sent(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    name = fresh_name()
    first = await one_row(redis_server.url, name, simulator.url, FIRST, run="run-1")
    assert first["status"] == "answered"
    # The prompt gets new text under its id; a later run (or a driver that never wrote
    # the first answer) must not emit the old text's answer for it.
    edited = {"id": "p1", "prompt": "question 1, edited at much greater length"}
    row = await one_row(redis_server.url, name, simulator.url, edited, run="run-2")
    assert row["status"] == "answered"
    assert len(simulator.requests) == 2, "the new text was sent"
    assert row["generation_id"] != first["generation_id"]
    assert row["prompt_tokens"] > first["prompt_tokens"]
    assert row["request_digest"] != first["request_digest"]
    store = AnswerStore(redis_server.url, name)
    try:
        assert await store.moved_aside() == 1, "the old answer is kept, not overwritten"
        assert (await store.get("default/p1") or {})["generation_id"] == row["generation_id"]
    finally:
        await store.close()
    # The new text's answer is now the row's: a retried task replays it free.
    again = await one_row(redis_server.url, name, simulator.url, edited, run="run-3")
    assert again["generation_id"] == row["generation_id"]
    assert len(simulator.requests) == 2


async def test_a_stored_answer_from_before_digests_is_kept_aside_and_the_row_sent(
    redis_server: RedisServer, simulator: SimulatorServer
) -> None:
    name = fresh_name()
    store = AnswerStore(redis_server.url, name)
    try:  # as an older stage stored it: no request digest
        await store.put("default/p1", {"answer": "old", "generation_id": "gen-old", "cost": "0"})
    finally:
        await store.close()
    row = await one_row(redis_server.url, name, simulator.url, FIRST, run="run-2")
    assert row["status"] == "answered"
    assert row["generation_id"] != "gen-old"
    assert len(simulator.requests) == 1
    store = AnswerStore(redis_server.url, name)
    try:
        assert await store.moved_aside() == 1
    finally:
        await store.close()
