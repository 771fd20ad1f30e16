"""The batch runner as a fleet worker (in process): shared work, shared targets, fleet view."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import ConfigurationError, RedisLedger
from provider_router.batch.fleet import FleetQueue
from provider_router.batch.merge import merge_outputs
from provider_router.batch.output import read_outputs
from provider_router.batch.progress import progress_lines
from provider_router.batch.runner import BatchRunner
from provider_router.batch.summary import StopReason
from provider_router.cli import main
from provider_router.plan import Plan, load_plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer
from tests.fleet.conftest import write_prompts
from tests.ledger.conftest import RedisServer

pytestmark = pytest.mark.redis

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"


def _plan(tmp_path: Path, **dataset: Any) -> Plan:
    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": "10",
            "concurrency": 8,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 300},
            "datasets": [
                {"name": "a", "input": str(write_prompts(tmp_path / "a.jsonl", 60)), **dataset},
                {"name": "b", "input": str(write_prompts(tmp_path / "b.jsonl", 40, start=100))},
            ],
        }
    )


async def _fleet_run(
    plan: Plan, tmp_path: Path, sim: SimulatorServer, redis: RedisServer, name: str, workers: int
) -> list[tuple[BatchRunner, Any]]:
    runners = []
    ledgers = [RedisLedger(redis.url, name, plan.budget) for _ in range(workers)]
    for index, ledger in enumerate(ledgers):
        runners.append(
            BatchRunner(
                plan,
                tmp_path / f"w{index}",
                base_url=sim.url,
                api_key=DEFAULT_TEST_KEY,
                ledger=ledger,
                fleet=FleetQueue(redis.url, name, worker=f"w{index}", idle_timeout=3),
            )
        )
    try:
        summaries = await asyncio.gather(*(r.run() for r in runners))
    finally:
        for ledger in ledgers:
            await ledger.close()
    return list(zip(runners, summaries, strict=True))


async def test_two_workers_share_the_plan_each_prompt_done_once(
    tmp_path: Path, openrouter_sim_factory: Factory, redis_server: RedisServer, fleet_name: str
) -> None:
    sim = await openrouter_sim_factory(seed=5, speed=200)
    plan = _plan(tmp_path)
    results = await _fleet_run(plan, tmp_path, sim, redis_server, fleet_name, 2)
    for runner, summary in results:
        assert summary.reason is StopReason.COMPLETE, summary.message
        # The summary is the fleet's: every prompt, whoever did it.
        assert [d.completed for d in summary.datasets] == [60, 40]
        assert [d.prompts for d in summary.datasets] == [60, 40]
        assert summary.fleet is not None
        assert summary.fleet["name"] == fleet_name
        assert summary.spent == sim.simulator.usage  # the shared ledger: everyone's spend
        written = json.loads((runner.out / "summary.json").read_text())
        assert written["fleet"]["datasets"]["a"]["completed"] == 60
        lines = progress_lines(runner.progress())
        assert "fleet: " in lines[0]
        assert "in flight here" in lines[0]
        assert "done=60/60" in lines[1]
    own = [sum(d.run.requests for d in summary.datasets) for _, summary in results]
    assert sum(own) == 100
    assert min(own) > 0
    report = merge_outputs([tmp_path / "w0", tmp_path / "w1"], tmp_path / "merged")
    assert {ds: m.records for ds, m in report.datasets.items()} == {"a": 60, "b": 40}
    assert sum(m.duplicates for m in report.datasets.values()) == 0
    ids = [r["id"] for _, r in read_outputs(tmp_path / "merged" / "a.jsonl")]
    assert sorted(ids) == sorted(f"p{i}" for i in range(60))


async def test_a_target_holds_for_the_whole_fleet(
    tmp_path: Path, openrouter_sim_factory: Factory, redis_server: RedisServer, fleet_name: str
) -> None:
    """Answers of 290 of 300 tokens: each worker alone guessing 150 each overshot together."""
    sim = await openrouter_sim_factory(seed=6, speed=200, completion_tokens=290)
    plan = _plan(tmp_path, target_output_tokens=3000)
    results = await _fleet_run(plan, tmp_path, sim, redis_server, fleet_name, 2)
    done = [list(read_outputs(tmp_path / f"w{i}" / "a.jsonl")) for i in range(2)]
    tokens = sum(r["usage"]["completion_tokens"] for records in done for _, r in records)
    assert 3000 <= tokens < 3000 + 300  # one request's grain, not a worker's wave
    for _, summary in results:
        assert summary.reason is StopReason.COMPLETE, summary.message
        assert summary.datasets[0].output_tokens == tokens


async def test_a_request_cap_holds_for_the_whole_fleet(
    tmp_path: Path, openrouter_sim_factory: Factory, redis_server: RedisServer, fleet_name: str
) -> None:
    sim = await openrouter_sim_factory(seed=6, speed=200)
    plan = _plan(tmp_path, max_requests=20)
    results = await _fleet_run(plan, tmp_path, sim, redis_server, fleet_name, 2)
    done_a = [sum(1 for _ in read_outputs(tmp_path / f"w{i}" / "a.jsonl")) for i in range(2)]
    # Redis counts every worker's claimed prompts at each claim: exactly the cap.
    assert sum(done_a) == 20
    assert [s.datasets[0].completed for _, s in results] == [20, 20]
    for _, summary in results:
        assert summary.reason is StopReason.COMPLETE
        assert summary.datasets[1].completed == 40
    fleet = results[0][1].fleet
    assert fleet is not None
    assert fleet["datasets"]["a"]["queued"] + sum(done_a) == 60  # the rest stays queued


def test_a_fleet_without_a_shared_ledger_is_refused(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    plan = _plan(tmp_path)
    with pytest.raises(ConfigurationError, match="share one budget"):
        BatchRunner(plan, tmp_path / "o", fleet=FleetQueue(redis_server.url, "x"))


def test_plan_file_and_flags_name_the_shared_ledger_and_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path / "a.jsonl", 2)
    path = tmp_path / "plan.yaml"
    path.write_text(
        "model: m/x\nbudget: 1\ndatasets: [{name: a, input: a.jsonl}]\n"
        "ledger: redis://127.0.0.1:1/0\nworkers_share: team-b3\n"
    )
    plan = load_plan(path)
    assert (plan.ledger, plan.shared_ledger_name) == ("redis://127.0.0.1:1/0", "team-b3")
    flagged = plan.with_overrides(ledger_name="money", workers_share="other")
    assert (flagged.shared_ledger_name, flagged.workers_share) == ("money", "other")

    path.write_text("model: m/x\ndatasets: [{name: a, input: a.jsonl}]\nworkers_share: b3\n")
    with pytest.raises(
        ConfigurationError, match=r"plan\.yaml.*workers_share needs a shared ledger"
    ):
        load_plan(path)
    path.write_text("model: m/x\ndatasets: [{name: a, input: a.jsonl}]\nledger: /tmp/x.sqlite\n")
    with pytest.raises(ConfigurationError, match=r"plan\.yaml:3: .*must be a Redis URL"):
        load_plan(path)
    prompts = str(tmp_path / "a.jsonl")
    common = ["run", prompts, "--out", str(tmp_path / "o"), "--model", "m/x", "--budget", "1"]
    assert main([*common, "--workers-share", "b3"]) == 2  # a bad command
    assert "workers_share needs a shared ledger" in capsys.readouterr().err
    assert main([*common, "--ledger", "redis://127.0.0.1:1/0"]) == 2
    assert "needs a name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*common, "--idle-timeout", "0"])
    assert "seconds above 0" in capsys.readouterr().err


async def test_a_worker_joins_a_running_ledger_and_a_new_one_takes_its_budget(
    redis_server: RedisServer, fleet_name: str
) -> None:
    from provider_router.cli.run import open_shared_ledger

    first = await open_shared_ledger(redis_server.url, fleet_name, Decimal("2.5"))
    async with first:
        assert (await first.snapshot()).limit == Decimal("2.5")
    second = await open_shared_ledger(redis_server.url, fleet_name, Decimal(7))
    async with second:  # an existing ledger keeps its limit (the runner adjusts it)
        assert (await second.snapshot()).limit == Decimal("2.5")


async def test_redis_failing_for_good_stops_the_worker_with_an_error_not_a_hang(
    tmp_path: Path,
    openrouter_sim_factory: Factory,
    redis_server: RedisServer,
    fleet_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis import exceptions as redis_errors

    sim = await openrouter_sim_factory(seed=7, speed=200)
    plan = _plan(tmp_path)
    queue = FleetQueue(redis_server.url, fleet_name, worker="w0", idle_timeout=3)
    real_claim = queue.claim
    claims = 0

    async def claim(*args: Any, **kwargs: Any) -> Any:
        nonlocal claims
        claims += 1
        if claims > 2:
            raise redis_errors.ResponseError("NOGROUP the consumer group is gone")
        return await real_claim(*args, **kwargs)

    monkeypatch.setattr(queue, "claim", claim)
    async with RedisLedger(redis_server.url, fleet_name, plan.budget) as ledger:
        runner = BatchRunner(
            plan,
            tmp_path / "w0",
            base_url=sim.url,
            api_key=DEFAULT_TEST_KEY,
            ledger=ledger,
            fleet=queue,
        )
        summary = await asyncio.wait_for(runner.run(), 30)
    assert summary.reason is StopReason.ERROR
    assert summary.exit_code == 1
    assert "NOGROUP" in summary.message
    # What it had sent finished and is in its journal: nothing in flight was dropped.
    outputs = [tmp_path / "w0" / f"{ds}.jsonl" for ds in ("a", "b")]
    done = sum(1 for path in outputs if path.exists() for _ in read_outputs(path))
    assert done == sum(d.run.requests for d in summary.datasets) > 0
