"""The runner against the local OpenRouter: completion, targets, money, stopping, resuming."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import assert_consistent, ledger_spent, read_records, write_prompts
from _polling import until

from provider_router import DataFileError, MemoryLedger
from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import StopReason
from provider_router.ledger import Reservation
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

MODEL = "moonshotai/kimi-k2.5"
Factory = Callable[..., Awaitable[SimulatorServer]]


def two_dataset_plan(tmp_path: Path, budget: str = "10", **dataset: Any) -> Plan:
    a = write_prompts(tmp_path / "a.jsonl", 60, prefix="a")
    b = write_prompts(tmp_path / "b.jsonl", 40, prefix="b")
    return Plan.model_validate(
        {
            "model": MODEL,
            "budget": budget,
            "concurrency": 16,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 1500},
            "datasets": [
                {"name": "a", "input": str(a), **dataset},
                {"name": "b", "input": str(b), **dataset},
            ],
        }
    )


def runner(plan: Plan, out: Path, sim: SimulatorServer, **kwargs: Any) -> JobRunner:
    return JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, **kwargs)


async def test_a_plan_runs_to_completion_exactly_once(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    plan = two_dataset_plan(tmp_path)
    summary = await runner(plan, out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert EXIT_CODES[summary.reason] == 0
    records = assert_consistent(out, ["a", "b"])
    assert sorted(r["id"] for r in records) == sorted(
        [f"a{n}" for n in range(60)] + [f"b{n}" for n in range(40)]
    )
    # Providers that re-quantize below int4 never served anything.
    assert {r["provider"] for r in records}.isdisjoint({"Fireworks", "BaseTen"})
    # Money agrees everywhere: outputs, ledger, summary and what OpenRouter charged.
    total = sum((Decimal(r["cost"]) for r in records), Decimal(0))
    assert total == ledger_spent(out) == summary.spent == sim.simulator.usage
    saved = json.loads((out / "summary.json").read_text())
    assert saved["reason"] == "complete"
    assert saved["datasets"]["a"]["completed"] == 60
    assert sum(p["requests"] for p in saved["providers"].values()) == 100
    record = records[0]
    assert record["messages"][-1]["role"] == "assistant"
    assert record["metadata"] == {"n": int(record["id"][1:])}
    # Running again sends nothing and skips every done line unparsed.
    again = runner(plan, out, sim)
    before = len(sim.log.chat())
    summary = await again.run()
    assert summary.reason is StopReason.COMPLETE
    assert len(sim.log.chat()) == before
    assert [d.reader.skipped for d in again._datasets] == [60, 40]


async def test_targets_stop_each_dataset_near_its_target(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=5)
    out = tmp_path / "out"
    plan = two_dataset_plan(tmp_path, target_output_tokens=4000)
    summary = await runner(plan, out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    for report in summary.datasets:
        assert report.output_tokens >= 4000
        # Overshoot is bounded by the requests in flight (16 at most, 1500 tokens each).
        assert report.output_tokens - 4000 < 16 * 1500
        assert report.completed < (60 if report.name == "a" else 40)
        assert report.to_finish == 0


async def test_request_cap(tmp_path: Path, openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory()
    out = tmp_path / "out"
    summary = await runner(two_dataset_plan(tmp_path, max_requests=7), out, sim).run()
    assert [d.completed for d in summary.datasets] == [7, 7]
    assert len(read_records(out / "a.jsonl")) == 7


async def test_budget_exhaustion_stops_cleanly_and_a_top_up_finishes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=9)
    out = tmp_path / "out"
    summary = await runner(two_dataset_plan(tmp_path, budget="0.05"), out, sim).run()
    assert summary.reason is StopReason.BUDGET
    assert EXIT_CODES[summary.reason] == 3
    assert summary.spent <= Decimal("0.05")
    assert summary.reserved == 0
    assert summary.to_finish is not None
    assert summary.to_finish > 0
    needed = summary.budget_to_finish
    assert needed is not None
    assert needed > Decimal("0.05")
    assert f"run again with a budget of ${needed}" in summary.message
    done = sum(d.completed for d in summary.datasets)
    assert 0 < done < 100
    assert all(d.run.failures == 0 for d in summary.datasets)  # unsent is not failed
    assert_consistent(out, ["a", "b"])
    # The same command with the budget the hint names continues and finishes.
    summary = await runner(two_dataset_plan(tmp_path, budget=str(needed)), out, sim).run()
    assert summary.reason is StopReason.COMPLETE, summary.message
    records = assert_consistent(out, ["a", "b"])
    assert len(records) == 100
    assert ledger_spent(out) == sim.simulator.usage


async def test_a_changed_budget_is_said_once_and_noted_in_the_journal(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=4)
    out = tmp_path / "out"
    first = await runner(two_dataset_plan(tmp_path, max_requests=2), out, sim).run()
    assert first.recovered == []
    plan = two_dataset_plan(tmp_path, budget="12.5", max_requests=4)
    again = await runner(plan, out, sim).run()
    assert again.reason is StopReason.COMPLETE
    assert again.recovered == ["budget changed from $10.00 to $12.50"]
    assert again.budget == Decimal("12.5")
    lines = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    notes = [line for line in lines if line.get("op") == "budget"]
    assert [(Decimal(n["old"]), Decimal(n["new"])) for n in notes] == [(10, Decimal("12.5"))]
    # The ledger keeps the new limit: the next run has nothing to say.
    plan = two_dataset_plan(tmp_path, budget="12.5", max_requests=6)
    assert (await runner(plan, out, sim).run()).recovered == []


async def test_credits_exhaustion_then_top_up(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=2, credits="0.06")
    out = tmp_path / "out"
    summary = await runner(two_dataset_plan(tmp_path), out, sim).run()
    assert summary.reason is StopReason.CREDITS
    assert EXIT_CODES[summary.reason] == 4
    assert "credits" in summary.message
    assert summary.to_finish is not None
    assert_consistent(out, ["a", "b"])
    sim.top_up(10)
    summary = await runner(two_dataset_plan(tmp_path), out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert len(assert_consistent(out, ["a", "b"])) == 100


async def test_bad_lines_are_skipped_and_reported(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    prompts = write_prompts(
        tmp_path / "p.jsonl", 5, extra=["{oops", '{"id": "q1", "prompt": "dup"}', '{"x": 1}']
    )
    plan = Plan.single([prompts], model=MODEL, budget=Decimal(5), max_tokens=500)
    summary = await runner(plan, tmp_path / "out", sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert len(read_records(tmp_path / "out" / "p.jsonl")) == 5
    assert summary.bad_lines == [
        f"{prompts}:6: line is not valid JSON: Expecting property name enclosed in double "
        "quotes at column 2",
        f"{prompts}:7: duplicate id 'q1': an earlier line of this dataset already has it",
        f"{prompts}:8: line has neither `messages` nor `prompt` (keys: x)",
    ]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["bad_lines"] == (
        summary.bad_lines
    )


async def test_strict_refuses_before_spending(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    prompts = write_prompts(tmp_path / "p.jsonl", 5, extra=["{oops"])
    plan = Plan.single([prompts], model=MODEL, budget=Decimal(5), max_tokens=500)
    with pytest.raises(DataFileError, match=r"p\.jsonl:6: .*--strict"):
        await runner(plan, tmp_path / "out", sim, strict=True).run()
    assert sim.simulator.usage == 0
    assert sim.log.chat() == []


async def test_stop_lets_requests_in_flight_finish_and_resume_completes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=2000, seed=4)
    out = tmp_path / "out"
    first = runner(two_dataset_plan(tmp_path), out, sim)
    task = asyncio.ensure_future(first.run())
    await until(lambda: sum(d.tally.completed for d in first._datasets) >= 10)
    first.stop()
    summary = await task
    assert summary.reason is StopReason.INTERRUPTED
    assert EXIT_CODES[summary.reason] == 130
    assert summary.reserved == 0  # everything in flight finished and settled
    assert all(d.run.failures == 0 for d in summary.datasets)
    done = sum(d.completed for d in summary.datasets)
    assert done < 100
    assert_consistent(out, ["a", "b"])
    summary = await runner(two_dataset_plan(tmp_path), out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert summary.recovered == []  # a clean stop leaves nothing to repair
    assert len(assert_consistent(out, ["a", "b"])) == 100


async def test_abandon_counts_in_flight_at_worst_case_and_resume_completes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=200, seed=6)
    out = tmp_path / "out"
    first = runner(two_dataset_plan(tmp_path), out, sim)
    task = asyncio.ensure_future(first.run())
    await until(lambda: sum(d.tally.completed for d in first._datasets) >= 3)
    first.stop()
    first.abandon()
    summary = await task
    assert summary.reason is StopReason.ABANDONED
    assert summary.reserved == 0  # abandoned requests are closed, not left open
    assert sum(d.run.failures_by_kind.get("Abandoned", 0) for d in summary.datasets) > 0
    summary = await runner(two_dataset_plan(tmp_path), out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    records = assert_consistent(out, ["a", "b"])
    assert len(records) == 100
    # Abandoned requests are charged at most at their worst case, never forgotten.
    assert ledger_spent(out) >= sum((Decimal(r["cost"]) for r in records), Decimal(0))


async def test_changed_input_files_are_read_whole_then_skipped_fast_again(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    plan = Plan.single([prompts], model=MODEL, budget=Decimal(5), max_tokens=500)
    out = tmp_path / "out"
    await runner(plan, out, sim).run()
    # New lines at the top shift every old line's location: the journal cannot skip by offset.
    old = prompts.read_text()
    prompts.write_text(json.dumps({"id": "new", "prompt": "fresh"}) + "\n" + old)
    second = runner(plan, out, sim)
    summary = await second.run()
    assert second._datasets[0].reader.skipped == 0
    assert summary.datasets[0].run.requests == 1
    third = runner(plan, out, sim)
    await third.run()
    assert third._datasets[0].reader.skipped == 11
    assert len(assert_consistent(out, ["p"])) == 11


async def test_a_foreign_output_file_is_refused(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "out"
    out.mkdir()
    (out / "p.jsonl").write_text('{"id": "not ours"}\n')
    plan = Plan.single([prompts], model=MODEL, budget=Decimal(5), max_tokens=500)
    with pytest.raises(Exception, match="never wrote"):
        await runner(plan, out, sim).run()
    assert sim.simulator.usage == 0


class _SettleFailsAfter(MemoryLedger):
    """A ledger whose settles start failing with ``error`` after ``ok`` of them."""

    def __init__(self, limit: Decimal, ok: int, error: Exception) -> None:
        super().__init__(limit)
        self.ok = ok
        self.error = error

    async def settle(self, reservation: Reservation, cost: Decimal, **kwargs: Any) -> None:
        if self.ok <= 0:
            raise self.error
        self.ok -= 1
        await super().settle(reservation, cost, **kwargs)


async def _no_wait(seconds: float) -> None:
    return None


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(RuntimeError("the ledger's store broke"), id="broken"),
        # A full disk (ENOSPC): the same stop, and the run then raises it (the CLI: exit 74).
        pytest.param(OSError(errno.ENOSPC, "No space left on device"), id="disk-full"),
    ],
)
async def test_a_ledger_that_cannot_record_stops_the_run_and_keeps_the_paid_answers(
    tmp_path: Path, openrouter_sim_factory: Factory, error: Exception
) -> None:
    sim = await openrouter_sim_factory(seed=12)
    out = tmp_path / "out"
    plan = two_dataset_plan(tmp_path)
    broken = _SettleFailsAfter(Decimal(10), ok=20, error=error)
    run = runner(plan, out, sim, ledger=broken, router_options={"sleep": _no_wait}).run()
    if isinstance(error, OSError):
        with pytest.raises(OSError, match="No space left on device; cannot write the ledger"):
            await run
        written = json.loads((out / "summary.json").read_text())
        assert written["reason"] == StopReason.ERROR.value
        assert "free some space, then run the same command again" in written["message"]
    else:
        summary = await run
        assert summary.reason is StopReason.ERROR
        assert "could not record a paid answer" in summary.message
    kept = read_records(out / "a.jsonl") + read_records(out / "b.jsonl")
    assert len(kept) == len(sim.requests)  # every answer paid for is kept
    # What the ledger could not settle it still holds: never less than was charged.
    state = await broken.snapshot()
    assert state.spent + state.reserved >= sim.simulator.usage
    summary = await runner(plan, out, sim, ledger=MemoryLedger(Decimal(10))).run()
    assert summary.reason is StopReason.COMPLETE
    ids = [r["id"] for r in read_records(out / "a.jsonl") + read_records(out / "b.jsonl")]
    assert len(ids) == len(set(ids)) == 100
    assert len(sim.requests) == 100  # no prompt was sent (and paid for) twice
