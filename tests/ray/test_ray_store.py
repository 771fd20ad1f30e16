"""The answer store and the key's two halves, against a real redis-server (no cluster)."""

from __future__ import annotations

import asyncio
import pickle
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from provider_router import ConfigurationError, LedgerUnavailableError
from provider_router.ray import AnswerStore
from provider_router.ray._secret import mask_key
from tests.ledger.conftest import RedisServer
from tests.ray.conftest import KEY

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def _hmget_calls(url: str) -> int:
    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


async def test_lookups_of_one_loop_turn_are_one_pipelined_hmget_per_hash(
    redis_server: RedisServer, job_name: str
) -> None:
    store = AnswerStore(redis_server.url, job_name)
    try:
        await store.put("default/p3", {"answer": "three", "cost": "0.5"})
        before = await _hmget_calls(redis_server.url)
        found = await asyncio.gather(*(store.get(f"default/p{i}") for i in range(300)))
        after = await _hmget_calls(redis_server.url)
    finally:
        await store.close()
    assert after - before == 3  # answers, unsent, failed: one round trip
    assert found[3] == {"answer": "three", "cost": "0.5"}
    assert [f for i, f in enumerate(found) if i != 3] == [None] * 299


async def test_an_answer_clears_an_earlier_refusal_and_failure(
    redis_server: RedisServer, job_name: str
) -> None:
    store = AnswerStore(redis_server.url, job_name)
    try:
        await store.not_sent("a/p1", '{"reason": "budget: ..."}')
        await store.failed("a/p1", "RequestTimeout")
        await store.failed("a/p2", "RequestTimeout")
        await store.put("a/p1", {"answer": "x"})
        assert await store.reasons("unsent") == {}
        assert await store.reasons("failed") == {"a/p2": {"kind": "RequestTimeout"}}
        assert [key async for key, _ in store.answers()] == ["a/p1"]
    finally:
        await store.close()


async def test_a_lookup_failure_past_the_outage_window_reaches_every_waiting_row(
    job_name: str,
) -> None:
    now = [0.0]

    async def sleep(seconds: float) -> None:  # the window passes without real waiting
        now[0] += seconds

    # Nothing listens on port 1; the password never reaches a message.
    url = "redis://:hunter2-secret@127.0.0.1:1/0"
    store = AnswerStore(url, job_name, outage_window=5, sleep=sleep, clock=lambda: now[0])
    try:
        results = await asyncio.gather(store.get("a/p1"), store.get("a/p2"), return_exceptions=True)
    finally:
        await store.close()
    assert all(isinstance(r, LedgerUnavailableError) for r in results), results
    assert all(isinstance(r.__cause__, redis.exceptions.ConnectionError) for r in results)
    assert "Redis at 127.0.0.1:1 (the Ray answer store)" in str(results[0])
    assert "hunter2" not in str(results[0])
    assert now[0] >= 5


def test_the_masked_half_says_nothing_of_the_key_and_the_pad_restores_it() -> None:
    from pydantic import SecretStr

    masked, pad = mask_key(SecretStr(KEY), "provider-router:ray:{job}")
    assert KEY.encode() not in pickle.dumps(masked)
    assert KEY not in repr(masked)
    assert masked.unmask(pad).get_secret_value() == KEY
    again, other_pad = mask_key(SecretStr(KEY), "provider-router:ray:{job}")
    assert other_pad != pad  # a new pad per job start: no two masked keys share one
    assert again.pad_name != masked.pad_name
    with pytest.raises(ConfigurationError, match=r"pad .* is missing"):
        masked.unmask(None)
    with pytest.raises(ConfigurationError, match="missing"):
        masked.unmask(pad[:-1])


def test_ray_datas_metadata_export_never_writes_the_masked_half() -> None:
    # Ray Data's metadata exporter (export_events) turns a stage's dataclass arguments
    # into dicts with dataclasses.asdict, which walks into nested dataclasses past their
    # __repr__: the masked half beside its pad's name would be in Ray's files.
    import dataclasses

    from pydantic import SecretStr

    @dataclasses.dataclass
    class Stage:
        key: object

    masked, pad = mask_key(SecretStr(KEY), "provider-router:ray:{job}")
    exported = str(dataclasses.asdict(Stage(masked)))
    assert masked.pad_name in exported
    assert repr(list(masked.masked)) not in exported
    assert repr(masked.masked) not in exported
    restored = pickle.loads(pickle.dumps(masked))  # noqa: S301 - our own bytes: how Ray ships it
    assert restored == masked
    assert restored.unmask(pad).get_secret_value() == KEY


async def test_a_prompt_not_sent_then_failed_on_resume_is_a_failure_not_a_budget_stop(
    redis_server: RedisServer, job_name: str
) -> None:
    from provider_router import RedisLedger
    from provider_router.ray._tally import tally

    store = AnswerStore(redis_server.url, job_name)
    ledger = RedisLedger(redis_server.url, job_name, Decimal(1))
    try:
        await store.not_sent("a/p1", {"reason": "budget: used up", "requested": "0.5"})
        await store.failed("a/p1", {"kind": "RequestTimeout"})  # the resume sent it: it failed
        state = await ledger.snapshot()
        summary = await tally(store, state, datasets={}, since=0, started=0, recovered=[])
    finally:
        await store.close()
        await ledger.close()
    assert summary.reason.value == "incomplete"
    assert summary.message.startswith("1 prompt(s) failed")
    [report] = summary.datasets
    assert report.prompts == 1


async def test_a_sending_lease_is_its_holders_to_renew_and_let_go(
    redis_server: RedisServer, job_name: str
) -> None:
    store = AnswerStore(redis_server.url, job_name)
    marker = store.sending_key("default/p1")
    try:
        assert (await store.hold("default/p1", "a", 60))[0] == "a"
        assert (await store.hold("default/p1", "a", 60))[0] == "a"  # a retry: still a's
        holder, stored = await store.hold("default/p1", "b", 60)
        assert (holder, stored.answer) == ("a", None)
        await store.renew(["default/p1"], "b", 600)  # not b's: unchanged
        assert await store._client.pttl(marker) <= 60_000
        await store.renew(["default/p1"], "a", 600)
        assert await store._client.pttl(marker) > 60_000
        await store.release("default/p1", "b")
        assert await store._client.get(marker) == b"a"
        await store.put("default/p1", {"answer": "one"})
        await store.release("default/p1", "a")
        holder, stored = await store.hold("default/p1", "b", 60)
        assert (holder, stored.answer) == ("b", {"answer": "one"})  # the answer after it
    finally:
        await store.close()


def _dead_actors_spill(directory: Path, lines: list[bytes]) -> Path:
    from provider_router.ray._spill import SpillFile

    spill = SpillFile(directory, "dead")
    spill.append("default/p1", {"answer": "spilled", "generation_id": "gen-1"})
    spill.close()  # the actor died: its lock is gone
    with spill.path.open("ab") as handle:
        handle.write(b"".join(lines))
    return spill.path


async def test_spilled_answers_are_stored_never_over_a_stored_one_and_a_torn_line_skipped(
    redis_server: RedisServer, job_name: str, tmp_path: Path, log_events: list[dict[str, Any]]
) -> None:
    from provider_router.ray._spill import store_spilled

    lines = [b'{"key":"default/p2","fields":{"answer":"two"}}\n', b'{"key":"default/p3","fi']
    path = await asyncio.to_thread(_dead_actors_spill, tmp_path, lines)
    store = AnswerStore(redis_server.url, job_name)
    try:
        await store.put("default/p2", {"answer": "stored first"})
        await store.failed("default/p1", {"kind": "ReadTimeout"})
        assert await store_spilled(store, tmp_path) == 1
        assert await store.get("default/p1") == {"answer": "spilled", "generation_id": "gen-1"}
        assert (await store.lookup("default/p1")).failed is None  # the answer wins
        assert await store.get("default/p2") == {"answer": "stored first"}  # not overwritten
        assert await store.get("default/p3") is None
    finally:
        await store.close()
    assert not await asyncio.to_thread(path.exists)
    assert [e["line"] for e in log_events if e["event"] == "ray.spill_unreadable"] == [3]
