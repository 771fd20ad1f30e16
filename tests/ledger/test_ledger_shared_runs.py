"""Runs sharing one Redis ledger: one shared limit, and each run's budget its own.

The shared limit is what every run on the ledger may spend together, changed only by
``ledger topup``; a run's ``--budget`` is its own cap inside it and never moves the
shared limit, nor any other run's cap, whether it is higher or lower; no run spends
past its own budget, even when the shared limit is raised while it runs. Against a
real ``redis-server`` and the local OpenRouter, each change made while another run is
live.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import read_records, write_prompts

from provider_router import JobRefused, RedisLedger
from provider_router._format import decimal_str
from provider_router.cli.run import resume_command
from provider_router.jobs import RunOutcome, StopReason, run_plan
from provider_router.jobs.finish import resume_budget
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

pytestmark = pytest.mark.redis

Factory = Callable[..., Awaitable[SimulatorServer]]
D = Decimal


def shared_plan(prompts: Path, url: str, name: str, budget: str) -> Plan:
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": budget,
            "concurrency": 4,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 400},
            "datasets": [{"name": "p", "input": str(prompts)}],
            "ledger": url,
            "ledger_name": name,
        }
    )


async def start(plan: Plan, out: Path, sim: SimulatorServer) -> asyncio.Future[RunOutcome]:
    return asyncio.ensure_future(
        run_plan(plan, out, api_key=DEFAULT_TEST_KEY, base_url=sim.url, preflight=False)
    )


def own_spend(out: Path) -> Decimal:
    """What a run's own answers cost (its outputs)."""
    return sum((D(r["cost"]) for r in read_records(out / "p.jsonl")), D(0))


async def until_answered(run: asyncio.Future[RunOutcome], out: Path, count: int) -> None:
    while len(read_records(out / "p.jsonl")) < count:
        assert not run.done(), "the run ended before the test could act while it ran"
        await asyncio.sleep(0.01)


async def shared_limit(url: str, name: str) -> Decimal:
    async with RedisLedger(url, name) as ledger:
        return (await ledger.snapshot()).limit


async def test_a_higher_budget_or_a_raised_limit_never_lets_a_live_run_pass_its_own(
    tmp_path: Path, openrouter_sim_factory: Factory, redis_server: object
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    name = f"shared-raise-{os.getpid()}"
    sim = await openrouter_sim_factory(seed=11, speed=40)
    prompts = write_prompts(tmp_path / "p.jsonl", 150)
    a_out = tmp_path / "a"
    a = await start(shared_plan(prompts, url, name, "0.1"), a_out, sim)
    await until_answered(a, a_out, 5)
    # A second run with a higher --budget, while A runs: refused, the limit unmoved.
    with pytest.raises(JobRefused, match=r"above the \$0\.10 limit of the shared ledger"):
        await run_plan(
            shared_plan(prompts, url, name, "5"),
            tmp_path / "b",
            api_key=DEFAULT_TEST_KEY,
            base_url=sim.url,
        )
    assert await shared_limit(url, name) == D("0.1")
    # The operator raises the shared limit while A runs: A still keeps to its own $0.10.
    await until_answered(a, a_out, 10)
    async with RedisLedger(url, name) as ledger:
        await ledger.set_limit(D(5))
    outcome = await a
    summary = outcome.summary
    assert summary is not None
    assert summary.reason is StopReason.BUDGET, summary.message
    assert own_spend(a_out) <= D("0.1")
    assert summary.spent <= summary.budget == D("0.1")
    assert "the budget of $0.10 is used up" in summary.message
    assert summary.shared is not None
    assert summary.shared.limit == D(5)
    # Its resume raises its own budget only: the shared limit has room for it.
    resume = resume_budget(summary)
    assert resume.budget == summary.budget_to_finish
    assert resume.shared_limit is None
    line = resume_command(["run", "--plan", "a.yaml"], resume, summary.shared)
    assert line == f"provider-router run --plan a.yaml --budget {decimal_str(resume.budget)}"
    again = await run_plan(
        shared_plan(prompts, url, name, str(resume.budget)),
        a_out,
        api_key=DEFAULT_TEST_KEY,
        base_url=sim.url,
        preflight=False,
    )
    assert again.reason is StopReason.COMPLETE
    assert len(read_records(a_out / "p.jsonl")) == 150
    assert await shared_limit(url, name) == D(5)


async def test_a_lower_budget_or_a_lowered_limit_never_moves_a_live_runs_cap(
    tmp_path: Path, openrouter_sim_factory: Factory, redis_server: object
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    name = f"shared-lower-{os.getpid()}"
    sim = await openrouter_sim_factory(seed=12, speed=40)
    prompts = write_prompts(tmp_path / "p.jsonl", 150)
    a_out, b_out = tmp_path / "a", tmp_path / "b"
    a = await start(shared_plan(prompts, url, name, "0.2"), a_out, sim)
    await until_answered(a, a_out, 5)
    # A second run with a lower --budget, while A runs: its own cap, the shared limit unmoved.
    b = await start(shared_plan(prompts, url, name, "0.03"), b_out, sim)
    await until_answered(b, b_out, 3)
    assert not a.done()
    assert await shared_limit(url, name) == D("0.2")
    b_outcome = await b
    assert b_outcome.reason is StopReason.BUDGET
    assert own_spend(b_out) <= D("0.03")
    assert await shared_limit(url, name) == D("0.2"), "B's budget did not lower A's"
    assert not a.done()
    # The operator lowers the shared limit while A runs: A stops on it, and says so.
    async with RedisLedger(url, name) as ledger:
        state = await ledger.snapshot()
        await ledger.set_limit(state.spent + state.reserved)
    outcome = await a
    summary = outcome.summary
    assert summary is not None
    assert summary.reason is StopReason.BUDGET
    assert f"the shared ledger {name!r} is used up" in summary.message
    assert "a settle overran its reservation)" not in summary.message
    assert own_spend(a_out) <= D("0.2")
    # What resumes it: the shared limit raised first, then the same run.
    resume = resume_budget(summary)
    assert resume.shared_limit is not None
    assert summary.shared is not None
    line = resume_command(["run", "--plan", "a.yaml"], resume, summary.shared)
    assert line.startswith(f"provider-router ledger topup {url} --name {name} --limit ")
    assert line.endswith(
        f"&& provider-router run --plan a.yaml --budget {decimal_str(resume.budget)}"
    )
    async with RedisLedger(url, name) as ledger:
        await ledger.set_limit(resume.shared_limit)
    again = await run_plan(
        shared_plan(prompts, url, name, str(resume.budget)),
        a_out,
        api_key=DEFAULT_TEST_KEY,
        base_url=sim.url,
        preflight=False,
    )
    assert again.reason is StopReason.COMPLETE, again.summary and again.summary.message
    assert len(read_records(a_out / "p.jsonl")) == 150


async def test_a_budget_below_what_the_job_spent_on_a_shared_ledger_is_refused(
    tmp_path: Path, openrouter_sim_factory: Factory, redis_server: object
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    name = f"shared-below-{os.getpid()}"
    sim = await openrouter_sim_factory(seed=13, speed=200)
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "a"
    first = await run_plan(
        shared_plan(prompts, url, name, "0.02"), out, api_key=DEFAULT_TEST_KEY, base_url=sim.url
    )
    assert first.reason is StopReason.BUDGET
    usage = sim.simulator.usage
    with pytest.raises(JobRefused, match=r"below the .* this job already spent from the shared"):
        await run_plan(
            shared_plan(prompts, url, name, "0.001"),
            out,
            api_key=DEFAULT_TEST_KEY,
            base_url=sim.url,
        )
    assert sim.simulator.usage == usage
    assert await shared_limit(url, name) == D("0.02")
