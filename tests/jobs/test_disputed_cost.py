"""A job whose server lies about ``usage.cost`` keeps its budget (#21, item 1).

The local OpenRouter answers an absurd, negative or non-number ``usage.cost``
(``usage_cost`` fault) while billing and recording the truth. The job books at
most its worst cases, halts with one line naming the generation id, records the
figure as disputed in the journal (``ledger show`` and the summary list it), and a
later honest run never prints the absurd figure as spent.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import ledger_spent, read_records, write_prompts

from provider_router.cli import main
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Any
KIMI = "moonshotai/kimi-k2.5"


async def _no_wait(_: float) -> None:
    return None


def runner(tmp_path: Path, sim: SimulatorServer, *, preflight: bool = False) -> JobRunner:
    plan = Plan.single(
        [write_prompts(tmp_path / "p.jsonl", 6)],
        model=KIMI,
        budget=Decimal(1),
        max_tokens=50,
        concurrency=1,
        exclude_below="int4",
    )
    return JobRunner(
        plan,
        tmp_path / "out",
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        preflight=preflight,
        router_options={"sleep": _no_wait},
    )


def charged(sim: SimulatorServer) -> Decimal:
    return sum((r.cost for r in sim.requests if r.route == "chat"), Decimal(0))


@pytest.mark.parametrize("preflight", [False, True], ids=["run", "preflight"])
@pytest.mark.parametrize("reported", [1000000, -5], ids=["absurd", "negative"])
async def test_a_disputed_cost_halts_the_job_without_booking_it(
    openrouter_sim_factory: Factory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    preflight: bool,
    reported: int,
) -> None:
    # The run streams; the preflight's pinned request is JSON: the fault hits one.
    fault = {"kind": "usage_cost", "reported": reported, "stream": not preflight, "times": 1}
    sim: SimulatorServer = await openrouter_sim_factory(completion_tokens=50, faults=[fault])
    job = runner(tmp_path, sim, preflight=preflight)
    if preflight:
        from provider_router._exceptions import PreflightFailed

        with pytest.raises(PreflightFailed):
            await job.run()
        assert job.preflight_report is not None
        [failed] = job.preflight_report.failures
        assert failed.name == "usage.cost"
        message = failed.detail
    else:
        summary = await job.run()
        assert summary.reason is StopReason.ERROR
        message = summary.message
        assert len(summary.disputed) == 1
        assert len(read_records(tmp_path / "out" / "p.jsonl")) == 1  # the paid answer kept
    assert message.count("disputed cost: the server's usage.cost") == 1
    assert "check generation gen-" in message
    spent = ledger_spent(tmp_path / "out")
    assert charged(sim) <= spent < Decimal("0.01")  # its worst case, not the figure
    capsys.readouterr()
    show = ["ledger", "show", str(tmp_path / "out" / "ledger.sqlite")]
    assert await asyncio.to_thread(main, show) == 0
    shown = capsys.readouterr().out
    assert "(0 open)" in shown
    assert f"the answer's usage.cost ${reported} was not booked" in shown
    assert str(reported) not in shown.split("disputed")[0]  # never as spent

    # An honest rerun finishes without printing the figure as spent.
    sim.simulator.faults.clear()
    again = await runner(tmp_path, sim).run()
    assert again.reason is StopReason.COMPLETE
    assert again.spent < Decimal("0.01")
    assert len(again.disputed) == 1  # still listed, for the operator to check
    assert ledger_spent(tmp_path / "out") >= charged(sim)
