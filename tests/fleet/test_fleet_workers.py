"""Four `provider-router run --workers-share` processes, one Redis, one local OpenRouter.

One budget that runs out mid-plan; the worker holding the most claimed prompts
is SIGKILLed. Proves, through the real command and `provider-router merge`:
total spend ≤ limit and ≥ 99 % of it, every completed prompt exactly once after
merging, the killed worker's claimed prompts completed by the others, and each
survivor's summary showing the whole fleet.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import RedisLedger
from provider_router.batch.fleet import GROUP, FleetQueue
from provider_router.batch.merge import MERGE_REPORT_FILE
from provider_router.batch.output import read_outputs
from provider_router.cli import main
from provider_router.plan import load_plan
from provider_router.testing import SimulatorServer
from tests.fleet.conftest import write_prompts
from tests.ledger.conftest import RedisServer

pytestmark = pytest.mark.redis

ROOT = Path(__file__).parents[2]
KEY = "sk-sim-fleet"
LIMIT = Decimal("0.25")
CREDITS = Decimal(5)
WORKERS = 4
DATASETS = ("a", "b")
KILL_DEADLINE = 30.0
"""Seconds for the fleet to complete its first prompts (it takes about 2)."""
EXIT_DEADLINE = 60.0
"""Seconds for the survivors to spend the budget and stop (it takes about 10)."""

PLAN = """\
model: moonshotai/kimi-k2.5
budget: {limit}
concurrency: 24
policy: {{exclude_below: int4}}
generation: {{max_tokens: 128}}
datasets:
  - {{name: a, input: a.jsonl}}
  - {{name: b, input: b.jsonl}}
ledger: {redis}
workers_share: {fleet}
"""


def _spawn(tmp_path: Path, index: int, base_url: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OPENROUTER_API_KEY": KEY,
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / f"w{index}"
    # Files, not pipes: a worker must never block on a pipe nobody reads yet.
    with log.with_suffix(".out").open("w") as out, log.with_suffix(".err").open("w") as err:
        return subprocess.Popen(  # noqa: S603 - our own command
            [
                sys.executable,
                "-m",
                "provider_router",
                "--log-level",
                "warning",
                "run",
                "--plan",
                str(tmp_path / "plan.yaml"),
                "--out",
                str(log),
                "--base-url",
                base_url,
                "--progress",
                "off",
                "--idle-timeout",
                "1.5",
                "--lease",
                "1.5",
            ],
            stdout=out,
            stderr=err,
            env=env,
            text=True,
        )


def _stderr(tmp_path: Path, index: int) -> str:
    return (tmp_path / f"w{index}.err").read_text()[-3000:]


async def _busiest_worker(observer: FleetQueue, pids: dict[int, int]) -> tuple[int, str] | None:
    """(index, consumer name) of the worker holding the most claimed prompts, if any holds one."""
    held: dict[str, int] = {}
    for ds in DATASETS:
        summary = await observer._client.xpending(observer._key("s", ds), GROUP)
        for consumer in summary.get("consumers") or []:
            held[consumer["name"]] = held.get(consumer["name"], 0) + int(consumer["pending"])
    # Consumer names are host:pid:suffix.
    owned = {name: n for name, n in held.items() if n and int(name.split(":")[-2]) in pids}
    if not owned:
        return None
    name = max(sorted(owned), key=owned.__getitem__)
    return pids[int(name.split(":")[-2])], name


def _committed(path: Path) -> set[str]:
    return {r["id"] for _, r in read_outputs(path)} if path.exists() else set()


async def _wait_exit(proc: subprocess.Popen[str], deadline: float) -> int:
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError("a worker did not stop in time (hung?)")
        await asyncio.sleep(0.05)
    return proc.returncode


@pytest.mark.slow
async def test_four_run_commands_one_killed_spend_the_budget_once_and_lose_nothing(
    redis_server: RedisServer, tmp_path: Path, fleet_name: str
) -> None:
    write_prompts(tmp_path / "a.jsonl", 800)
    write_prompts(tmp_path / "b.jsonl", 800, start=1000)
    (tmp_path / "plan.yaml").write_text(
        PLAN.format(limit=LIMIT, redis=redis_server.url, fleet=fleet_name)
    )
    plan = load_plan(tmp_path / "plan.yaml")
    async with SimulatorServer(speed=15, seed=3, credits=CREDITS, api_keys=[KEY]) as sim:
        workers = [_spawn(tmp_path, i, sim.url) for i in range(WORKERS)]
        pids = {w.pid: i for i, w in enumerate(workers)}
        observer = FleetQueue(redis_server.url, fleet_name, worker="observer")
        try:
            await observer.join(plan)
            # Kill a worker mid-plan, at a moment when it holds claimed prompts.
            deadline = time.monotonic() + KILL_DEADLINE
            picked = None
            while picked is None:
                for i, w in enumerate(workers):
                    assert w.poll() is None, f"worker {i} exited early:\n{_stderr(tmp_path, i)}"
                if time.monotonic() > deadline:
                    tails = "\n".join(_stderr(tmp_path, i) for i in range(WORKERS))
                    raise AssertionError(f"the fleet completed too little in time:\n{tails}")
                progress = await observer.progress()
                if sum(t.completed for t in progress.datasets.values()) >= 40:
                    picked = await _busiest_worker(observer, pids)
                if picked is None:
                    await asyncio.sleep(0.02)
            victim, consumer = picked
            workers[victim].send_signal(signal.SIGKILL)
            await _wait_exit(workers[victim], time.monotonic() + 10)
            held = {}
            for ds in DATASETS:
                stream = observer._key("s", ds)
                pending = await observer._client.xpending_range(
                    stream, GROUP, "-", "+", 1000, consumername=consumer
                )
                by_entry = {eid: f["id"] for eid, f in await observer._client.xrange(stream)}
                held[ds] = {by_entry[p["message_id"]] for p in pending}
            assert sum(len(ids) for ids in held.values()) > 0
            survivors = [i for i in range(WORKERS) if i != victim]

            deadline = time.monotonic() + EXIT_DEADLINE
            for i in survivors:
                code = await _wait_exit(workers[i], deadline)
                # The money, not the work, ran out: exit code 3 for every survivor.
                assert code == 3, f"worker {i} exited {code}:\n{_stderr(tmp_path, i)}"
                assert "Traceback" not in _stderr(tmp_path, i), _stderr(tmp_path, i)
            fleet_done = {
                ds: set(await observer._client.smembers(observer._key("done", ds)))
                for ds in DATASETS
            }
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
            await observer.close()
        charged = CREDITS - sim.balance

    # Money: the shared ledger never passed the limit and used (nearly) all of it.
    async with RedisLedger(redis_server.url, fleet_name, lease=1.5) as ledger:
        await ledger.recover()
        state = await ledger.snapshot()
    assert state.spent <= LIMIT
    assert state.spent >= LIMIT * Decimal("0.99")
    assert (state.open, state.reserved) == (0, 0)
    assert charged <= state.spent  # what OpenRouter really charged is covered

    # Each survivor's summary shows the whole fleet, not just itself.
    summaries: list[dict[str, Any]] = [
        json.loads((tmp_path / f"w{i}" / "summary.json").read_text()) for i in survivors
    ]
    for summary in summaries:
        assert summary["reason"] == "budget_exhausted"
        assert summary["fleet"]["name"] == fleet_name
        own_cost = sum(Decimal(d["this_run"]["cost"]) for d in summary["datasets"].values())
        assert own_cost < Decimal(summary["spent_usd"]) <= LIMIT
        for ds in DATASETS:
            assert summary["datasets"][ds]["prompts"] == 800
            mine = summary["datasets"][ds]["this_run"]["requests"]
            assert summary["datasets"][ds]["completed"] > mine
    for ds in DATASETS:
        # The last survivor to stop saw every acknowledged completion.
        assert max(s["datasets"][ds]["completed"] for s in summaries) == len(fleet_done[ds])
    # Every prompt the killed worker held went to a survivor.
    reclaimed = sum(s["fleet"]["this_worker"]["reclaimed_from_dead_workers"] for s in summaries)
    assert reclaimed >= sum(len(ids) for ids in held.values())

    # Work: the documented merge gives every completed prompt exactly once.
    dirs = [tmp_path / f"w{i}" for i in range(WORKERS)]
    merged = tmp_path / "merged"
    assert main(["merge", *map(str, dirs), "--out", str(merged), "--json"]) == 0
    report = json.loads((merged / MERGE_REPORT_FILE).read_text())
    merged_cost = Decimal(0)
    for ds in DATASETS:
        ids = [r["id"] for _, r in read_outputs(merged / f"{ds}.jsonl")]
        assert len(ids) == len(set(ids))
        committed = [_committed(d / f"{ds}.jsonl") for d in dirs]
        # Every prompt any worker committed is there once: the fleet's completions
        # plus what the killed worker journaled but could not acknowledge.
        assert set(ids) == set().union(*committed)
        assert fleet_done[ds] <= set(ids)
        assert set(ids) - fleet_done[ds] <= committed[victim]
        assert report["datasets"][ds]["records"] == len(ids)
        # What the killed worker had claimed but not committed, the others completed.
        others = [c for i, c in enumerate(committed) if i != victim]
        assert held[ds] - committed[victim] <= set().union(*others)
        merged_cost += Decimal(report["datasets"][ds]["cost"])
        merged_cost += Decimal(report["datasets"][ds]["duplicate_cost"])
    assert merged_cost <= state.spent
    fleet_cost = sum(
        (Decimal(s["datasets"][ds]["cost"]) for ds in DATASETS for s in summaries[:1]),
        Decimal(0),
    )
    assert fleet_cost <= merged_cost
