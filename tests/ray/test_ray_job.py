"""RayJob on a local cluster: the budget, the ledger and exactly-once, end to end."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.ledger.conftest import RedisServer
from tests.ray._sim_thread import SimulatorThread
from tests.ray.conftest import CREDITS, MODEL, make_job, prompts

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.timeout(240)]


def _run(job: Any, rows: list[dict[str, Any]], blocks: int = 4) -> list[dict[str, Any]]:
    import ray

    out: list[dict[str, Any]] = job.generate(
        ray.data.from_items(rows, override_num_blocks=blocks)
    ).take_all()
    return out


def test_every_prompt_once_and_the_ledger_equals_what_openrouter_charged(
    ray_session: Path,
    redis_server: RedisServer,
    sim: SimulatorThread,
    job_name: str,
    tmp_path: Path,
) -> None:
    job = make_job(sim, redis_server, job_name)
    rows = _run(job, prompts(60))
    ids = [row["id"] for row in rows]
    assert sorted(ids) == sorted(f"p{i}" for i in range(60))
    assert {row["status"] for row in rows} == {"answered"}
    assert all(row["generation_id"] and row["provider"] for row in rows)
    assert all(row["prompt"].startswith("question") for row in rows)  # input columns kept
    paid = sum((Decimal(row["cost"]) for row in rows), Decimal(0))
    summary = job.finish(tmp_path)
    charged = sim.charged(CREDITS)
    assert paid == summary.spent == charged > 0
    assert summary.reserved == 0
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["reason"] == "complete"
    assert Decimal(written["spent_usd"]) == charged
    assert written["datasets"]["default"]["completed"] == 60
    assert len(sim.server.requests) == 60


def test_a_budget_stop_keeps_every_paid_answer_and_a_top_up_pays_only_the_rest(
    ray_session: Path,
    redis_server: RedisServer,
    sim: SimulatorThread,
    job_name: str,
    tmp_path: Path,
) -> None:
    from provider_router.ray import JobStopped

    budget = Decimal("0.02")
    job = make_job(sim, redis_server, job_name, budget=str(budget), concurrency=8)
    first = _run(job, prompts(80))
    statuses = Counter(row["status"] for row in first)
    assert statuses["answered"] > 0
    assert statuses["not_sent"] > 0  # refused rows are emitted, never dropped
    assert statuses["answered"] + statuses["not_sent"] == 80
    assert sorted(row["id"] for row in first) == sorted(f"p{i}" for i in range(80))
    with pytest.raises(JobStopped) as stopped:
        job.finish(tmp_path)
    summary = stopped.value.summary
    assert summary.reason.value == "budget_exhausted"
    assert "budget=" in str(stopped.value)
    assert "resumes it" in str(stopped.value)
    assert json.loads((tmp_path / "summary.json").read_text())["reason"] == "budget_exhausted"
    paid = sum((Decimal(r["cost"]) for r in first if r["status"] == "answered"), Decimal(0))
    assert paid == summary.spent == sim.charged(CREDITS)
    assert summary.spent <= budget
    answered = {r["id"]: r["generation_id"] for r in first if r["status"] == "answered"}
    sent_before = len(sim.server.requests)
    assert sent_before == len(answered)

    resumed = make_job(sim, redis_server, job_name, budget="5")
    second = _run(resumed, prompts(80))
    assert Counter(row["status"] for row in second) == {"answered": 80}
    assert sorted(row["id"] for row in second) == sorted(f"p{i}" for i in range(80))
    for row in second:  # the answers paid before come back as they were, free
        if row["id"] in answered:
            assert row["generation_id"] == answered[row["id"]]
    assert len(sim.server.requests) - sent_before == 80 - len(answered)
    final = resumed.finish(tmp_path)
    assert final.reason.value == "complete"
    assert final.spent == sim.charged(CREDITS)
    assert final.budget == Decimal(5)


def test_the_budget_is_the_jobs_below_what_it_spent_or_over_a_topup_is_refused(
    ray_session: Path,
    redis_server: RedisServer,
    sim: SimulatorThread,
    job_name: str,
    tmp_path: Path,
) -> None:
    import asyncio

    import ray

    from provider_router import JobRefused, LedgerState, RedisLedger
    from provider_router.ray import JobStopped

    first = make_job(sim, redis_server, job_name, budget="0.02", concurrency=8)
    _run(first, prompts(60))
    with pytest.raises(JobStopped):
        first.finish(tmp_path)

    async def ledger(limit: Decimal | None = None) -> LedgerState:
        async with RedisLedger(redis_server.url, job_name) as book:
            if limit is not None:
                await book.set_limit(limit)
            return await book.snapshot()

    spent = asyncio.run(ledger()).spent
    ds = ray.data.from_items(prompts(60))
    with pytest.raises(JobRefused, match=r"is below the .* this job already spent"):
        make_job(sim, redis_server, job_name, budget="0.001").generate(ds)
    # The operator stops the job at what it spent: the old budget no longer raises it.
    assert asyncio.run(ledger(spent)).limit == spent
    with pytest.raises(JobRefused, match=r"set outside this job's runs.*--raise-budget"):
        make_job(sim, redis_server, job_name, budget="0.02").generate(ds)
    assert asyncio.run(ledger()).limit == spent, "nothing changed"
    resumed = make_job(sim, redis_server, job_name, budget="5", raise_budget=True)
    assert Counter(row["status"] for row in _run(resumed, prompts(60))) == {"answered": 60}
    assert resumed.finish(tmp_path).budget == Decimal(5)


def test_a_job_refuses_what_would_lose_paid_answers_or_leak_nothing_to_send_with(
    ray_session: Path,
    redis_server: RedisServer,
    sim: SimulatorThread,
    job_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from provider_router import ConfigurationError
    from provider_router.ray import RayJob

    with pytest.raises(ConfigurationError, match="no API key"):
        RayJob(MODEL, budget="1", redis_url=redis_server.url, name=job_name, base_url=sim.url)
    job = make_job(sim, redis_server, job_name, actors=None)
    assert job.actors == 1  # one per alive node: the session's local cluster has one
    context = ray.data.DataContext.get_current()
    monkeypatch.setattr(context, "max_errored_blocks", 1)
    with pytest.raises(ConfigurationError, match="max_errored_blocks is 1"):
        job.generate(ray.data.from_items(prompts(2)))


def test_bad_rows_come_out_marked_and_cost_nothing(
    ray_session: Path, redis_server: RedisServer, sim: SimulatorThread, job_name: str
) -> None:
    job = make_job(sim, redis_server, job_name)
    rows = [*prompts(3), {"id": "x1", "text": "no prompt here"}, {"id": "x2", "prompt": ""}]
    out = {row["id"]: row for row in _run(job, rows, blocks=2)}
    assert out["x1"]["status"] == "bad_input"
    assert "neither `messages` nor `prompt`" in out["x1"]["error"]
    assert out["x2"]["status"] == "bad_input"
    assert [out[f"p{i}"]["status"] for i in range(3)] == ["answered"] * 3
    assert len(sim.server.requests) == 3


def test_a_rejected_key_stops_sending_and_the_job_ends_in_an_error(
    ray_session: Path, redis_server: RedisServer, sim: SimulatorThread, job_name: str
) -> None:
    job = make_job(sim, redis_server, job_name, api_key="sk-or-v1-" + "0" * 40, concurrency=2)
    rows = _run(job, prompts(20), blocks=2)
    assert {row["status"] for row in rows} == {"not_sent"}
    assert all("error: " in row["error"] for row in rows)
    assert len(sim.server.requests) <= 20  # a 401 is never retried
    summary = job.finish()
    assert summary.reason.value == "error"
    assert summary.spent == 0


async def _pads(url: str, name: str) -> list[bytes]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        return [key async for key in client.scan_iter(match=f"*{{{name}}}:pad:*")]
    finally:
        await client.aclose()


def test_finish_deletes_the_keys_pads_and_other_async_stages_keep_rays_concurrency(
    ray_session: Path, redis_server: RedisServer, sim: SimulatorThread, job_name: str
) -> None:
    import asyncio

    from ray.data._internal.planner import plan_udf_map_op as planner

    default = planner.DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY
    job = make_job(sim, redis_server, job_name, concurrency=64, actors=1)
    assert job.per_actor > default
    rows = _run(job, prompts(10), blocks=2)
    assert {row["status"] for row in rows} == {"answered"}
    # The user's other async stages, planned after ours, get Ray's own default.
    assert default == planner.DEFAULT_ASYNC_ROW_UDF_MAX_CONCURRENCY
    assert asyncio.run(_pads(redis_server.url, job_name))  # the actors read it from here
    job.finish()
    assert asyncio.run(_pads(redis_server.url, job_name)) == []


def test_our_stage_alone_is_planned_with_the_jobs_concurrency(ray_session: Path) -> None:
    from ray.data import ActorPoolStrategy
    from ray.data._internal.planner import plan_udf_map_op as planner

    from provider_router.ray import PromptStage, StageConfig
    from provider_router.ray._concurrency import stage_concurrency
    from provider_router.ray._secret import MaskedKey

    config = StageConfig(
        model=MODEL,
        name="n",
        redis_url="redis://127.0.0.1:1/0",
        store_prefix="p",
        key=MaskedKey("pad", b"x"),
        dataset="default",
        max_tokens=8,
        concurrency=700,
    )

    class Other:
        async def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            return [row]

    compute = ActorPoolStrategy(size=1)
    ours, _ = planner._get_udf(PromptStage, (), {}, (config,), {}, compute=compute)
    other, _ = planner._get_udf(Other, (), {}, (), {}, compute=compute)
    assert stage_concurrency(ours) == 700
    assert stage_concurrency(other) is None


def test_a_resume_with_another_model_or_parameters_is_refused(
    ray_session: Path, redis_server: RedisServer, sim: SimulatorThread, job_name: str
) -> None:
    import ray

    from provider_router import ConfigurationError

    ds = ray.data.from_items(prompts(2))
    # Temperatures Kimi's endpoints accept (the bundled market holds Moonshot's rules).
    make_job(sim, redis_server, job_name, params={"temperature": 0.6}).generate(ds)
    make_job(sim, redis_server, job_name, params={"temperature": 0.6}).generate(ds)  # a resume
    with pytest.raises(ConfigurationError, match=r"was started with .*temperature"):
        make_job(sim, redis_server, job_name, params={"temperature": 1.0}).generate(ds)
    with pytest.raises(ConfigurationError, match="max_tokens"):
        make_job(sim, redis_server, job_name, max_tokens=64, params={"temperature": 0.6}).generate(
            ds
        )
    other = make_job(sim, redis_server, job_name, params={"temperature": 0.6})
    other.model = "moonshotai/kimi-k3"
    with pytest.raises(ConfigurationError, match=r"started with model .moonshotai/kimi-k2\.5."):
        other.generate(ds)
    # Another dataset of the same job may have its own.
    make_job(sim, redis_server, job_name).generate(ds, dataset="second", max_tokens=32)


def test_router_options_are_checked_on_the_driver_not_first_on_a_worker(
    redis_server: RedisServer, sim: SimulatorThread, job_name: str
) -> None:
    from provider_router import ConfigurationError

    # The stage's routers and finish()'s are built with them: a mistake is said here.
    with pytest.raises(ConfigurationError, match="Authorization"):
        make_job(sim, redis_server, job_name, router_options={"headers": {"Authorization": "x"}})
    job = make_job(sim, redis_server, job_name, router_options={"headers": {"X-Title": "t"}})
    assert job.router_options == {"headers": {"X-Title": "t"}}
