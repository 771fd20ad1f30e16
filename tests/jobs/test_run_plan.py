"""`run_plan`: what `provider-router run` does, from Python alone, against the local OpenRouter.

A library user gives a plan and a job directory and gets one outcome back; the
library prints nothing, and what a caller wants to see it plugs in through hooks.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import assert_consistent, read_records, write_prompts

from provider_router import JobRefused
from provider_router.jobs import (
    BatchOptions,
    BatchPart,
    JobRunner,
    RunHooks,
    RunOutcome,
    StopReason,
    run_plan,
)
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.observe.timeline import read_timeline
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def plan(tmp_path: Path, budget: str = "10", **datasets: str) -> Plan:
    """Datasets a (30 prompts) and b (20), each on the route ``datasets`` names (sync)."""
    specs = []
    for name, count in (("a", 30), ("b", 20)):
        path = write_prompts(tmp_path / f"{name}.jsonl", count, prefix=name)
        specs.append({"name": name, "input": str(path), "route": datasets.get(name, "sync")})
    model = "moonshotai/kimi-k3" if datasets else "moonshotai/kimi-k2.5"
    return Plan.model_validate(
        {
            "model": model,
            "budget": budget,
            "concurrency": 8,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 300},
            "datasets": specs,
        }
    )


async def run(p: Plan, out: Path, sim: SimulatorServer, **options: Any) -> RunOutcome:
    return await run_plan(p, out, api_key=DEFAULT_TEST_KEY, base_url=sim.url, **options)


async def test_a_plan_runs_to_completion_with_run_plan_alone(
    tmp_path: Path, openrouter_sim_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    outcome = await run(plan(tmp_path), out, sim)
    assert outcome.reason is StopReason.COMPLETE
    assert outcome.batch is None, "no dataset takes the Batch API route"
    assert outcome.summary is not None
    assert outcome.budget_to_resume is None
    records = assert_consistent(out, ["a", "b"])
    assert len(records) == 50
    # The preflight's 1-token request first, then every prompt: all paid from the job's ledger.
    assert outcome.summary.spent == sim.simulator.usage
    saved = json.loads((out / "summary.json").read_text())
    assert saved["reason"] == "complete"
    assert "exit_code" not in saved, "the exit code is the command's, not the library's"
    assert status_lines(out, now=time.time())[0] == f"{out}: finished: complete"
    assert capsys.readouterr() == ("", ""), "the library prints nothing"
    again = await run(plan(tmp_path), out, sim)
    assert again.reason is StopReason.COMPLETE
    assert len(assert_consistent(out, ["a", "b"])) == 50, "resumed: nothing sent twice"


async def test_a_budget_stop_is_the_outcome_and_add_budget_finishes_the_plan(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=9)
    out = tmp_path / "out"
    stopped = await run(plan(tmp_path, budget="0.02"), out, sim, preflight=False)
    assert stopped.reason is StopReason.BUDGET
    assert stopped.summary is not None
    assert stopped.summary.spent <= Decimal("0.02")
    needed = stopped.budget_to_resume
    assert needed is not None
    assert needed > Decimal("0.02")
    assert needed == stopped.summary.budget_to_finish
    done = len(read_records(out / "a.jsonl")) + len(read_records(out / "b.jsonl"))
    assert 0 < done < 50
    # What --add-budget does: the job's own ledger's limit plus the amount.
    finished = await run(plan(tmp_path, budget="0.02"), out, sim, add_budget=needed)
    assert finished.reason is StopReason.COMPLETE
    assert finished.summary is not None
    assert finished.summary.budget == Decimal("0.02") + needed
    assert len(assert_consistent(out, ["a", "b"])) == 50


async def test_what_cannot_be_used_is_refused_before_anything_is_written(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    p = plan(tmp_path)
    (tmp_path / "b.jsonl").unlink()
    out = tmp_path / "out"
    with pytest.raises(JobRefused, match=r"prompt file .*b\.jsonl of dataset 'b' does not exist"):
        await run(p, out, sim)
    assert not out.exists()
    assert sim.simulator.usage == 0


async def test_hooks_see_the_start_the_runner_and_the_batch_part(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # a through the Batch API, b sync: the batch part first, then the runner.
    sim = await openrouter_sim_factory(speed=float("inf"), seed=3)
    seen: list[object] = []

    @asynccontextmanager
    async def around_sync(runner: JobRunner) -> AsyncIterator[None]:
        seen.append(("sync", [d.name for d in runner.plan.datasets]))
        yield
        seen.append("sync done")

    hooks = RunHooks(
        on_start=lambda: seen.append("start"),
        on_batch_line=lambda line: seen.append(("line", line.split(":")[0])),
        on_batch_done=lambda part: seen.append(("batch done", part.reason)),
        around_sync=around_sync,
    )
    fast = BatchOptions(poll=0.02, lost_grace=0.3)
    outcome = await run(plan(tmp_path, a="batch"), tmp_path / "out", sim, batch=fast, hooks=hooks)
    assert outcome.reason is StopReason.COMPLETE
    assert isinstance(outcome.batch, BatchPart)
    assert outcome.batch.result.lines_done == 30
    assert not outcome.batch.ends_run
    assert outcome.batch.lines[0].startswith("Batch route: 1 batches submitted, 1 collected")
    assert seen[0] == "start"
    assert ("line", "batches of a") in seen
    assert seen[-3:] == [("batch done", StopReason.COMPLETE), ("sync", ["b"]), "sync done"]
    assert len(read_records(tmp_path / "out" / "a.jsonl")) == 30
    assert len(read_records(tmp_path / "out" / "b.jsonl")) == 20


async def test_run_plan_leaves_the_timeline_report_and_batches_of_both_routes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # The runner and the Batch API route have no observers unless given; run_plan gives
    # each part the standard ones, so the job directory holds what the command leaves.
    sim = await openrouter_sim_factory(speed=float("inf"), seed=3)
    out = tmp_path / "out"
    fast = BatchOptions(poll=0.02, lost_grace=0.3)
    outcome = await run(plan(tmp_path, a="batch"), out, sim, batch=fast)
    assert outcome.reason is StopReason.COMPLETE
    assert (out / "report.html").is_file()
    finals = [row for row in read_timeline(out / "timeline.ndjson") if row.get("final")]
    assert len(finals) == 2, "a last line from the Batch API route, then one from the runner"
    saved = json.loads((out / "summary.json").read_text())
    assert saved["batches"], "the sync part's summary says what the Batch API route did"
