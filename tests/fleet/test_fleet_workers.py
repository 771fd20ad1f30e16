"""Four worker processes, one Redis, one local OpenRouter, one budget; one is SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import RedisLedger
from provider_router._money import from_units
from provider_router.batch.fleet import GROUP, FleetQueue
from provider_router.batch.merge import merge_outputs
from provider_router.batch.output import read_outputs
from provider_router.batch.plan import load_plan
from provider_router.cli import main
from provider_router.testing import SimulatorServer
from tests.fleet.conftest import write_prompts
from tests.ledger.conftest import RedisServer

pytestmark = pytest.mark.redis

WORKER = Path(__file__).with_name("fleet_worker.py")
ROOT = Path(__file__).parents[2]
KEY = "sk-sim-fleet"
LIMIT = Decimal("0.25")
CREDITS = Decimal(5)

PLAN = """\
model: moonshotai/kimi-k2.5
concurrency: 24
policy: {exclude_below: int4}
generation: {max_tokens: 128}
datasets:
  - {name: a, input: a.jsonl}
  - {name: b, input: b.jsonl}
"""


def _spawn(config: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Files, not pipes: a worker must never block on a pipe nobody reads yet.
    with config.with_suffix(".out").open("w") as out, config.with_suffix(".err").open("w") as err:
        return subprocess.Popen(  # noqa: S603 - our own worker script
            [sys.executable, str(WORKER), str(config)], stdout=out, stderr=err, env=env, text=True
        )


async def _wait(proc: subprocess.Popen[str], seconds: float) -> tuple[str, str]:
    await asyncio.to_thread(proc.wait, timeout=seconds)
    config = Path(proc.args[-1])  # type: ignore[index]
    return config.with_suffix(".out").read_text(), config.with_suffix(".err").read_text()


async def _busiest_worker(observer: FleetQueue) -> int | None:
    """The index of the worker holding the most claimed prompts, if any holds one."""
    held: dict[str, int] = {}
    for ds in ("a", "b"):
        summary = await observer._client.xpending(observer._key("s", ds), GROUP)
        for consumer in summary.get("consumers") or []:
            name = consumer["name"]
            name = name.decode() if isinstance(name, bytes) else name
            held[name] = held.get(name, 0) + int(consumer["pending"])
    workers = {name: count for name, count in held.items() if name.startswith("w") and count}
    if not workers:
        return None
    return int(max(sorted(workers), key=workers.__getitem__)[1:])


def _committed(path: Path) -> set[str]:
    return {r["id"] for _, r in read_outputs(path)} if path.exists() else set()


@pytest.mark.slow
async def test_four_workers_one_killed_spend_the_budget_once_and_lose_nothing(
    redis_server: RedisServer, tmp_path: Path, fleet_name: str
) -> None:
    write_prompts(tmp_path / "a.jsonl", 800)
    write_prompts(tmp_path / "b.jsonl", 800, start=1000)
    (tmp_path / "plan.yaml").write_text(PLAN)
    plan = load_plan(tmp_path / "plan.yaml")
    ledger_name = f"{fleet_name}-ledger"
    async with SimulatorServer(speed=15, seed=3, credits=CREDITS, api_keys=[KEY]) as sim:
        workers = []
        for index in range(4):
            config = tmp_path / f"w{index}.json"
            config.write_text(
                json.dumps(
                    {
                        "plan": str(tmp_path / "plan.yaml"),
                        "redis": redis_server.url,
                        "fleet": fleet_name,
                        "worker": f"w{index}",
                        "idle": 1.5,
                        "ledger": ledger_name,
                        "limit": str(LIMIT),
                        "lease": 1.5,
                        "out": str(tmp_path / f"w{index}"),
                        "base_url": sim.url,
                        "api_key": KEY,
                    }
                )
            )
            workers.append(_spawn(config))

        observer = FleetQueue(redis_server.url, fleet_name, worker="observer")
        await observer.join(plan)
        try:
            # Kill a worker mid-plan, at a moment when it holds claimed prompts.
            victim = None
            while victim is None:
                progress = await observer.progress()
                done = sum(t.completed for t in progress.datasets.values())
                assert all(w.poll() is None for w in workers), "a worker exited early"
                if done >= 40:
                    victim = await _busiest_worker(observer)
                if victim is None:
                    await asyncio.sleep(0.02)
            workers[victim].send_signal(signal.SIGKILL)
            await _wait(workers[victim], 10)
            held = {}
            for ds in ("a", "b"):
                pending = await observer._client.xpending_range(
                    observer._key("s", ds), GROUP, "-", "+", 1000, consumername=f"w{victim}"
                )
                entries = await observer._client.xrange(observer._key("s", ds))
                by_entry = {eid: fields["id"] for eid, fields in entries}
                held[ds] = {by_entry[p["message_id"]] for p in pending}
            assert sum(len(ids) for ids in held.values()) > 0
            survivors = [w for i, w in enumerate(workers) if i != victim]

            outputs = [await _wait(w, 60) for w in survivors]
            for w, (_, err) in zip(survivors, outputs, strict=True):
                assert w.returncode == 0, err[-3000:]
            stats = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
            assert sum(s["budget_stops"] for s in stats) >= 3  # the money, not the work, ran out
            # Every prompt the killed worker held went to a survivor.
            assert sum(s["reclaimed"] for s in stats) >= sum(len(ids) for ids in held.values())

            fleet_done = {
                ds: set(await observer._client.smembers(observer._key("done", ds)))
                for ds in ("a", "b")
            }
            final = await observer.progress()
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
            await observer.close()
        charged = CREDITS - sim.balance

    # Money: the shared ledger never passed the limit and used (nearly) all of it.
    async with RedisLedger(redis_server.url, ledger_name, lease=1.5) as ledger:
        await ledger.recover()
        state = await ledger.snapshot()
    assert state.spent <= LIMIT
    assert state.spent >= LIMIT * Decimal("0.99")
    assert (state.open, state.reserved) == (0, 0)
    assert charged <= state.spent  # what OpenRouter really charged is covered

    # Work: merging gives every completed prompt exactly once.
    dirs = [tmp_path / f"w{i}" for i in range(4)]
    report = merge_outputs(dirs, tmp_path / "merged")
    for ds in ("a", "b"):
        ids = [r["id"] for _, r in read_outputs(tmp_path / "merged" / f"{ds}.jsonl")]
        assert len(ids) == len(set(ids))
        committed = [_committed(tmp_path / f"w{i}" / f"{ds}.jsonl") for i in range(4)]
        # Every prompt any worker committed is there once: the fleet's completions
        # plus what the killed worker journaled but could not acknowledge.
        assert set(ids) == set().union(*committed)
        assert fleet_done[ds] <= set(ids)
        assert set(ids) - fleet_done[ds] <= committed[victim]
        assert report.datasets[ds].records == len(ids)
        # What the killed worker had claimed but not committed, the others completed.
        others = [c for i, c in enumerate(committed) if i != victim]
        assert held[ds] - committed[victim] <= set().union(*others)
    merged_cost = sum((d.cost + d.duplicate_cost for d in report.datasets.values()), Decimal(0))
    assert merged_cost <= state.spent
    assert from_units(sum(t.cost_units for t in final.datasets.values())) <= merged_cost
    # The documented command does the same.
    assert main(["merge", *map(str, dirs), "--out", str(tmp_path / "merged"), "--json"]) == 0
