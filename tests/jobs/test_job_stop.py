"""A batch stopped while its requests back off starts no attempt (#21, item 4).

After the first Ctrl-C on a run whose upstream failed slowly, attempts 4-6 still
started minutes later, each with a new reservation. The back-off is an injected
sleep that never ends by itself: only the stop can end it.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

from _job_helpers import write_prompts
from _polling import until

from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Any
FAILING = [{"kind": "provider_error", "status": 503, "no_fallback": True}]


class EndlessBackoff:
    """A sleep that records its waits and returns only when cancelled."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.Event().wait()


async def test_a_batch_stopped_while_retries_back_off_starts_no_attempt(
    openrouter_sim_factory: Factory, tmp_path: Path
) -> None:
    sim: SimulatorServer = await openrouter_sim_factory(faults=FAILING)
    sleep = EndlessBackoff()
    plan = Plan.single(
        [write_prompts(tmp_path / "p.jsonl", 10)],
        model="moonshotai/kimi-k2.5",
        budget=Decimal(1),
        max_tokens=50,
        concurrency=3,
        exclude_below="int4",
    )
    runner = JobRunner(
        plan, tmp_path / "out", base_url=sim.url, api_key=DEFAULT_TEST_KEY,
        router_options={"sleep": sleep},
    )  # fmt: skip
    run = asyncio.ensure_future(runner.run())
    await until(lambda: len(sleep.waits) >= 3)  # every request in flight backs off
    runner.stop(StopReason.INTERRUPTED, "interrupted by Ctrl-C")
    summary = await asyncio.wait_for(run, 30)
    assert summary.reason is StopReason.INTERRUPTED
    assert len([r for r in sim.requests if r.route == "chat"]) == 3  # first attempts only
    assert summary.spent == summary.reserved == 0
    assert sum(d.run.failures for d in summary.datasets) == 0  # left for the next run
