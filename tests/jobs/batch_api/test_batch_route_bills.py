"""The batch route's bills and lost 202s under hostile or odd answers, on the local
OpenRouter over real sockets: a failed batch that ran lines, an absurd or unreadable
failed bill, a dispute across a resume, a lost 202's candidate of another dataset or
whose results are gone, and a progress callback that raises."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from _batch_api_helpers import (
    AbsurdBill,
    FailedAfterLines,
    Job,
    Killed,
    PollEdits,
    prompts,
)

from provider_router._money import from_units
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.batch_api.lost import LOST_GRACE_SECONDS
from provider_router.jobs.batch_api.results import read_cost
from provider_router.jobs.store.journal import FileJournal
from provider_router.testing.batch_api.state import BatchFaults
from provider_router.testing.chat.synth import Lengths


def _guard(job: Job, rounds: int = 400) -> None:
    def stop() -> None:
        if len(job.time.sleeps) > rounds:
            raise Killed  # it would have polled on for ever

    job.time.hook = stop


async def test_a_lost_202_whose_batch_failed_after_running_lines_keeps_its_cost(
    job: Job,
) -> None:
    # Its batch failed after running (and billing) half its lines: past the grace its
    # worst case stays booked (never released at $0), though its prompts go again.
    job.sim.simulator.batches.faults = BatchFaults(lose_202=1, fail_late=1)
    assert (await job.go(prompts(4))).resubmitted_lines == 4
    failed, _ = job.sim.simulator.batches
    assert failed.late_failure is not None
    assert failed.paid, "the failed batch was billed"
    assert failed.cost > 0
    job.sim.simulator.batches.settle_all()
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent >= job.sim.simulator.usage, "the ledger is never below what was billed"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(4))


async def test_a_failed_batch_that_billed_lines_is_booked_at_its_bill(job: Job) -> None:
    job.sim.simulator.batches.faults.fail_late = 1
    # The route books a failed batch's reported cost: to the picodollar what was billed.
    result = await job.go(prompts(4))
    assert result.stop is None
    failed, _ = job.sim.simulator.batches
    assert failed.late_failure is not None
    assert failed.cost > 0
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(4))
    assert set(job.submitted().values()) == {2}, "its prompts went again, once"
    await job.money_agrees()


async def test_an_absurd_failed_batch_bill_is_disputed_not_booked(job: Job) -> None:
    job.sim.simulator.batches.faults.fail = 1
    api = FailedAfterLines(job.http)
    api.cost = "5000"
    result = await job.go(prompts(5), api, max_attempts=1)
    assert result.stop is not None
    assert result.stop.startswith("disputed cost")
    assert "$5000" in result.stop
    assert result.stopped_by == "error"
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert 0 < state.spent < 1, "its worst case is booked, not the $5,000"


@pytest.mark.parametrize("cost", ["1e999999999", "-1e999999999", "1e7", "NaN"])
async def test_an_unreadable_failed_batch_bill_counts_its_worst_case(job: Job, cost: str) -> None:
    # A hostile number is unreadable (never a decimal.Overflow on every poll), and
    # unknown is not free.
    job.sim.simulator.batches.faults.fail = 1
    api = FailedAfterLines(job.http)
    api.cost = cost
    result = await job.go(prompts(5), api, max_attempts=1)
    assert result.stop is None
    with BatchJournal.open(job.directory) as batches:
        (intent,) = list(batches)
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent == from_units(intent.worst_units)


def test_read_cost_is_bounded() -> None:
    assert read_cost("0.25") == Decimal("0.25")
    assert read_cost(1_000_000) == Decimal(1_000_000)
    for hostile in ("1e999999999", 10**400, "1000000.01", "9" * 100, "-1", "inf", True):
        assert read_cost(hostile) is None, hostile


class BatchBill(PollEdits):
    """The batch's usage.cost says $1,000,000."""

    def edit(self, batch: dict[str, Any]) -> None:
        if batch.get("usage"):
            batch["usage"]["cost"] = 1_000_000


async def test_a_dispute_is_journaled_and_a_resume_sends_no_batch(job: Job) -> None:
    stopped = await job.go(prompts(5), BatchBill(job.http))
    assert stopped.stop is not None
    assert stopped.stop.startswith("disputed cost")
    sent = len(job.sim.simulator.batches)
    resumed = await job.go(prompts(10))
    assert resumed.stop is not None
    assert resumed.stop.startswith("disputed cost"), "the dispute outlives the run"
    assert "1000000" in resumed.stop
    assert resumed.stopped_by == "error"
    assert len(job.sim.simulator.batches) == sent, "no batch sent while it is on record"
    assert len(job.outputs()) == 5, "the disputed batch's answers are kept"
    journal = FileJournal.read(job.directory)
    try:
        (entry,) = journal.disputes
    finally:
        journal.close()
    assert entry["reported"] == "1000000"
    assert from_units(entry["booked"]) < 1
    # The operator checked the bill: its booked worst case stands, batches go again.
    accepted = await job.go(prompts(10), accept_disputed=True)
    assert accepted.stop is None
    assert any("disputed bill accepted as checked" in e for e in accepted.events)
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(10))
    assert (await job.go(prompts(11))).stop is None, "checked once, for good"


async def test_a_lost_202_candidate_of_another_dataset_with_longer_lines_is_passed_over(
    job: Job,
) -> None:
    # Another dataset's batch (max_tokens 4,000, long answers) of the same size is
    # listed beside the lost one: its first line is longer than this dataset's bound,
    # which must not end the run (on every resume); it is simply not the intent's.
    other = [
        {
            "custom_id": f"other-{n}",
            "body": {"messages": [{"role": "user", "content": f"o{n}"}], "max_tokens": 40_000},
        }
        for n in range(5)
    ]
    # Its lines ~30,000 tokens each (this dataset's: capped at their max_tokens of 200);
    # done at once, while the lost one stays out of the list a while (read first).
    job.sim.simulator.lengths = Lengths(fixed=30_000)
    faults = job.sim.simulator.batches.faults
    faults.slow = 1e-6
    await BatchApi(job.http).submit(job.route.model_id, other, job.route.provider_object())
    faults.slow, faults.list_lag, faults.lose_202 = 1.0, 600.0, 1
    _guard(job)
    result = await job.go(prompts(5))
    assert result.stop is None
    assert result.found_after_lost_202 == 1
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    assert len(job.sim.simulator.batches) == 2, "the other batch and the lost one: no resend"


class ResultsGone(BatchApi):
    """Every batch's results answer 404 (deleted after 30 days, another key)."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        return await super().results_page("batch-results-gone", cursor, **kw)


async def test_a_lost_202_candidate_whose_results_are_gone_stops_after_the_grace(
    job: Job,
) -> None:
    # It cannot be told whether the candidate is the intent's: held through the grace,
    # then a stop naming it (never a poll for ever, never a send on a guess).
    job.sim.simulator.batches.faults.lose_202 = 1
    _guard(job)
    result = await job.go(prompts(5), ResultsGone(job.http))
    assert result.stopped_by == "error"
    assert result.stop is not None
    assert "cannot be told whether that batch is its own" in result.stop
    assert "its prompts are not sent again" in result.stop
    assert job.time.t - job.time.sleeps[0] >= LOST_GRACE_SECONDS - 1_000
    assert set(job.submitted().values()) == {1}, "never sent twice"
    assert (await job.ledger.snapshot()).reserved > 0, "its worst case stays held"


async def test_a_progress_callback_that_raises_ends_no_run(job: Job) -> None:
    calls: list[int] = []

    def progress(_result: object) -> None:
        calls.append(1)
        raise OverflowError("int too large to convert to float")

    result = await job.go(prompts(10), progress=progress)
    assert len(calls) > 1, "called each round still"
    assert result.stop is None
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(10))


async def test_a_disputed_line_is_journaled_with_its_generation(job: Job) -> None:
    stopped = await job.go(prompts(5), AbsurdBill(job.http))
    assert stopped.stop is not None
    assert stopped.stop.startswith("disputed cost")
    journal = FileJournal.read(job.directory)
    try:
        (entry,) = journal.disputes
    finally:
        journal.close()
    assert entry["key"].startswith("ds/p")
    assert str(entry["gen"]).startswith("gen-batch-"), "its generation, to check"
    assert entry["reported"] == "1000000"
    with BatchJournal.open(job.directory) as batches:
        assert batches.disputed is not None
