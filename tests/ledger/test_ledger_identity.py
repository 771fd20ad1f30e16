"""A job's Redis ledger is the one its journal recorded (issue #10, item 5)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import DataFileError, RedisLedger
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from tests.ledger.conftest import RedisServer

pytestmark = pytest.mark.redis

D = Decimal
Factory = Callable[..., Awaitable[SimulatorServer]]


def small_plan(tmp_path: Path, requests: int) -> Plan:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"q{n}", "prompt": f"question {n}"}) + "\n" for n in range(10))
    )
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": "5",
            "concurrency": 4,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 200},
            "datasets": [{"name": "p", "input": str(prompts), "max_requests": requests}],
        }
    )


async def run(plan: Plan, out: Path, sim: SimulatorServer, ledger: RedisLedger) -> StopReason:
    runner = JobRunner(plan, out, ledger=ledger, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    return (await runner.run()).reason


async def test_a_redis_ledger_that_was_flushed_and_created_again_is_refused(
    tmp_path: Path, redis_server: RedisServer, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=31)
    out = tmp_path / "out"
    async with RedisLedger(redis_server.url, "job-identity", D(5)) as first:
        assert await run(small_plan(tmp_path, 3), out, sim, first) is StopReason.COMPLETE
        identity = first.identity
        await first._client.delete(*first._keys)  # Redis lost the ledger (no persistence)
    charged = sim.simulator.usage
    async with RedisLedger(redis_server.url, "job-identity", D(5)) as again:
        with pytest.raises(DataFileError, match="is not this job's ledger") as info:
            await run(small_plan(tmp_path, 6), out, sim, again)
        assert again.created
        assert identity is not None
        assert identity in str(info.value)
        assert "Restore the job's own ledger" in str(info.value)
    assert sim.simulator.usage == charged  # nothing sent on a budget restarted at $0


async def test_the_same_redis_ledger_resumes(
    tmp_path: Path, redis_server: RedisServer, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=32)
    out = tmp_path / "out"
    async with RedisLedger(redis_server.url, "job-resume", D(5)) as first:
        assert await run(small_plan(tmp_path, 3), out, sim, first) is StopReason.COMPLETE
    async with RedisLedger(redis_server.url, "job-resume") as again:
        assert await run(small_plan(tmp_path, 6), out, sim, again) is StopReason.COMPLETE
        assert not again.created
        assert (await again.snapshot()).spent == sim.simulator.usage
