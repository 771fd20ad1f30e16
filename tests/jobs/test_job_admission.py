"""A job on a capacity-limited market says what it paid against the floor, and where
its requests waited: in its output lines, ``summary.json`` and ``report.html``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router.jobs import JobRunner
from provider_router.jobs.observe.standard import standard_observers
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

KIMI = "moonshotai/kimi-k2.5"
Factory = Callable[..., Awaitable[SimulatorServer]]


def limited(capacity: int) -> list[dict[str, Any]]:
    return [
        {"kind": "rate_limit", "provider": tag, "max_in_flight": capacity}
        for tag in ("chutes", "novita", "deepinfra")
    ]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Say hello, number {i}."}] for i in range(n)]


async def test_a_job_says_what_it_paid_against_the_floor_and_where_requests_waited(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=200.0, completion_tokens=20, faults=limited(2))
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text(
        "".join(json.dumps({"messages": m}) + "\n" for m in prompts(24)), encoding="utf-8"
    )
    plan = Plan.single(
        [prompts_file],
        model=KIMI,
        budget=Decimal(5),
        concurrency=12,
        max_tokens=50,
        exclude_below="int4",
        max_premium="none",
    )
    assert plan.max_premium is None
    out = tmp_path / "out"
    runner = JobRunner(
        plan.with_overrides(max_premium=Decimal("0.02")),
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        observers=standard_observers(),
    )
    summary = await runner.run()
    assert runner.router is not None
    assert runner.router.max_premium == Decimal("0.02")
    written = json.loads((out / "summary.json").read_text())
    figures = written["price_vs_floor"]
    assert figures["floor_endpoint"] == "chutes"
    assert figures["max_premium"] == "0.02"
    ratio = Decimal(figures["paid_usd"]) / Decimal(figures["floor_usd"])
    assert Decimal(figures["ratio"]) == ratio.quantize(Decimal("0.0001"))
    assert 1 <= ratio <= Decimal("1.05")
    assert written["admission"]["chutes"]["refused"] > 0
    assert written["admission"]["chutes"]["capacity_estimate"] is not None
    rows = [json.loads(line) for line in (out / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 24
    assert {row["endpoint"] for row in rows} <= set(runner.router.plan.order)
    assert sum(Decimal(row["floor_cost"]) for row in rows) == Decimal(figures["floor_usd"])
    assert all(row["waited_s"] >= 0 and row["refusals"] >= 0 for row in rows)
    sentence = summary.floor_sentence()
    assert sentence is not None
    assert "the floor" in sentence
    report = (out / "report.html").read_text()
    assert "the floor" in report
    assert "Where requests waited" in report
