"""The runner's batch route on the local OpenRouter: budget, exactly once, lost 202s,
kills at each step, a results 402 and the top-up resume (real loopback sockets)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _batch_api_helpers import (
    K3,
    MAX_TOKENS,
    AbsurdBill,
    FailedAfterLines,
    FakeTime,
    Job,
    Killed,
    PollEdits,
    prompts,
)
from _job_helpers import simulate_crash

from provider_router import MemoryLedger, SQLiteLedger
from provider_router._exceptions import (
    APIConnectionError,
    APIStatusError,
    ConfigurationError,
    DataFileError,
    InvalidResponseError,
    RateLimitError,
    RequestTimeout,
)
from provider_router._http.session import HttpClient
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.journal import BatchIntent, BatchJournal
from provider_router.jobs.batch_api.lost import LIST_LAG_SECONDS, LOST_GRACE_SECONDS
from provider_router.jobs.batch_api.route import BatchRouteRun
from provider_router.jobs.batch_api.submit import MAX_UNSENT_SUBMITS
from provider_router.jobs.batch_api.unmatched import prompt_digest
from provider_router.jobs.batch_api_runner import describe
from provider_router.jobs.store.digest import RequestDigest
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.prompts import Prompt


async def test_every_prompt_once_within_the_budget(job: Job) -> None:
    result = await job.go(prompts(12))
    assert result.stop is None
    assert result.submitted == 3  # 5 + 5 + 2
    assert result.collected == 3
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(12))
    assert set(job.submitted().values()) == {1}
    assert result.cost == job.sim.simulator.usage
    await job.money_agrees()
    assert job.time.sleeps, "it polled with its injected sleep"
    record = json.loads((job.directory / "ds.jsonl").read_text().splitlines()[0])
    assert record["provider"] == "Together"
    assert record["metadata"]["batch_id"].startswith("batch-")


async def test_a_rerun_of_a_finished_job_sends_nothing(job: Job) -> None:
    await job.go(prompts(6))
    again = await job.go(prompts(6))
    assert again.submitted == 0
    assert len(job.outputs()) == 6


async def test_failed_lines_go_again_and_cost_nothing(job: Job) -> None:
    job.sim.simulator.batches.faults.line_failure_rate = 0.4
    result = await job.go(prompts(10), max_attempts=3)
    counts = job.submitted()
    assert max(counts.values()) > 1, "some lines were retried"
    assert len(job.outputs()) == len(set(job.outputs()))
    assert result.lines_failed > 0
    await job.money_agrees()


async def test_a_failed_or_expired_batch_runs_again(job: Job) -> None:
    faults = job.sim.simulator.batches.faults
    faults.fail = 1
    faults.expire = 1
    result = await job.go(prompts(10))
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(10))
    assert result.stop is None
    state = await job.ledger.snapshot()
    job.sim.simulator.batches.settle_all()
    # The expired batch is counted at its worst case (nothing says what it cost).
    assert state.spent > job.sim.simulator.usage
    assert state.reserved == 0


async def test_the_budget_is_never_exceeded(job: Job) -> None:
    await job.ledger.set_limit(Decimal("0.004"))  # about 6 lines' worst case
    result = await job.go(prompts(20))
    assert result.stop is not None
    assert "budget is spent" in result.stop
    assert result.stopped_by == "budget"
    state = await job.ledger.snapshot()
    assert state.spent + state.reserved <= state.limit
    assert 0 < len(job.outputs()) < 20
    await job.money_agrees()


async def test_a_lost_202_is_found_and_never_resubmitted(job: Job) -> None:
    job.sim.simulator.batches.faults.lose_202 = 1
    result = await job.go(prompts(8))
    assert result.found_after_lost_202 == 1
    assert set(job.submitted().values()) == {1}
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(8))
    await job.money_agrees()


async def test_a_lost_202_whose_batch_is_listed_late_is_found_not_paid_twice(job: Job) -> None:
    # The list shows the new batch only after 10 minutes: its prompts wait (held), and
    # are never sent again while the submit may have made a batch.
    faults = job.sim.simulator.batches.faults
    faults.lose_202 = 1
    faults.list_lag = 600.0
    result = await job.go(prompts(5))
    assert result.found_after_lost_202 == 1
    assert result.resubmitted_lines == 0
    assert set(job.submitted().values()) == {1}, "never paid twice"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    await job.money_agrees()


class SubmitTimes(BatchApi):
    """Records the (fake) time of each submit; ``unsent`` first ones never leave."""

    unsent = 0

    def __init__(self, http: HttpClient, clock: FakeTime) -> None:
        super().__init__(http)
        self.clock, self.times = clock, []  # type: list[float]

    async def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.times.append(self.clock())
        if self.unsent > 0:
            self.unsent -= 1
            error = APIConnectionError("connect failed")
            error.request_sent = False
            raise error
        return await super().submit(*args, **kwargs)


async def test_a_submit_never_sent_is_released_at_once_and_goes_again(job: Job) -> None:
    api = SubmitTimes(job.http, job.time)
    api.unsent = 1
    result = await job.go(prompts(5), api)
    assert len(api.times) == 2
    assert api.times[1] - api.times[0] < LIST_LAG_SECONDS, "not held: it cannot have been made"
    assert result.resubmitted_lines == 0
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    assert set(job.submitted().values()) == {1}
    with BatchJournal.open(job.directory) as journal:
        assert [i.ended for i in journal if i.batch_id is None] == ["not_sent"]
    await job.money_agrees()


async def test_submits_that_never_leave_stop_the_run_after_a_few_tries(job: Job) -> None:
    api = SubmitTimes(job.http, job.time)
    api.unsent = 1000

    def guard() -> None:
        if len(job.time.sleeps) > 50:
            raise Killed  # it would have tried forever

    job.time.hook = guard
    result = await job.go(prompts(5), api)
    assert len(api.times) == MAX_UNSENT_SUBMITS
    assert result.stopped_by == "error"
    assert result.stop is not None
    assert "could not be reached" in result.stop
    assert len(job.sim.simulator.batches) == 0
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent == 0, "nothing sent, nothing held"


class HeldWhileLooking(SubmitTimes):
    """Records what the ledger holds each time the list is read for a lost 202."""

    ledger: MemoryLedger
    reserved: list[Decimal]

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        if len(self.times) == 1:
            held = (await self.ledger.snapshot()).reserved
            self.reserved = [*getattr(self, "reserved", []), held]
        return await super().list_page(created_after, after)


async def test_a_submit_sent_but_unanswered_holds_its_prompts_for_the_whole_window(
    job: Job,
) -> None:
    # Every byte sent, no answer, and no batch ever listed: only once the whole window
    # has passed can it be known that none was made; then the prompts go, once.
    job.sim.simulator.batches.faults.drop_submit = 1
    api = HeldWhileLooking(job.http, job.time)
    api.ledger = job.ledger
    result = await job.go(prompts(5), api)
    assert len(api.times) == 2
    assert api.times[1] - api.times[0] >= LOST_GRACE_SECONDS
    assert api.reserved
    assert min(api.reserved) > 0, "its worst case stayed held the whole time"
    (held,) = [e for e in result.events if "no listed batch is known to be its" in e]
    assert "5 prompts of ds" in held, "the run says why they wait, once"
    assert result.resubmitted_lines == 5
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    await job.money_agrees()


async def test_a_kill_between_an_unsent_submits_release_and_its_journal_line_holds_it(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The release is in the ledger, the journal never said "not sent": the resume cannot
    # know the submit never left, so it takes the side that cannot pay twice.
    original = BatchJournal.record_ended

    def killed(self: BatchJournal, intent: str, why: str) -> None:
        if why == "not_sent":
            raise Killed
        original(self, intent, why)

    monkeypatch.setattr(BatchJournal, "record_ended", killed)
    api = SubmitTimes(job.http, job.time)
    api.unsent = 1
    with pytest.raises(Killed):
        await job.go(prompts(5), api)
    monkeypatch.setattr(BatchJournal, "record_ended", original)
    result = await job.go(prompts(5), api)
    assert api.times[1] - api.times[0] >= LOST_GRACE_SECONDS
    assert result.resubmitted_lines == 5
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    assert set(job.submitted().values()) == {1}
    await job.money_agrees()


class KillAfterSubmit(BatchApi):
    """The submit reaches OpenRouter, then the process dies before the 202 is journaled."""

    async def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        await super().submit(*args, **kwargs)
        raise Killed


class KillBeforeSubmit(BatchApi):
    async def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise Killed


class KillOnPoll(BatchApi):
    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        raise Killed

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        raise Killed


class KillMidCollect(PollEdits):
    """Dies after the first results page was written (the outputs flushed, not committed)."""

    def edit(self, batch: dict[str, Any]) -> None:
        if batch["status"] == "completed" and not getattr(self, "armed", False):
            self.armed = True

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        if getattr(self, "die_next", False):
            raise Killed
        page = await super().results_page(batch_id, cursor, **kw)
        if getattr(self, "armed", False):
            self.armed = False
            page["data"] = page["data"][:2]
            page["has_more"] = True
            page["next_cursor"] = "bogus"
            self.die_next = True
        return page


@pytest.mark.parametrize("killer", [KillBeforeSubmit, KillAfterSubmit, KillOnPoll, KillMidCollect])
async def test_a_kill_at_each_step_then_a_resume_loses_and_repeats_nothing(
    job: Job, killer: type[BatchApi]
) -> None:
    items = prompts(7)
    with pytest.raises(Killed):
        await job.go(items, killer(job.http))
    if killer is KillMidCollect:
        assert len(job.outputs()) == 2, "the first page was written before the kill"
    job.time.t += 600  # past the lost-202 grace
    result = await job.go(items)
    assert result.stop is None
    assert sorted(job.outputs()) == sorted(p.id for p in items)
    assert set(job.submitted().values()) == {1}, "no prompt went out twice"
    await job.money_agrees()


async def test_a_results_402_stops_with_the_top_up_and_the_resume_collects(job: Job) -> None:
    items = prompts(5)

    def drain() -> None:
        job.sim.simulator.set_balance(0)
        job.time.hook = None

    job.time.hook = drain  # after the submit: the balance is gone by finalize
    stopped = await job.go(items)
    assert stopped.stop is not None
    assert "add at least $" in stopped.stop
    assert stopped.stopped_by == "credits"
    assert stopped.top_up is not None
    assert stopped.top_up > 0
    assert stopped.pending == 1
    assert job.outputs() == []
    state = await job.ledger.snapshot()
    assert state.reserved > 0, "the batch's worst case stays held"
    job.sim.simulator.top_up(stopped.top_up)
    resumed = await job.go(items)
    assert resumed.submitted == 0, "collected, not re-run"
    assert resumed.stop is None
    assert sorted(job.outputs()) == sorted(p.id for p in items)
    assert set(job.submitted().values()) == {1}
    await job.money_agrees()


async def test_request_cap_and_output_target_are_kept(job: Job) -> None:
    capped = await job.go(prompts(12), limits={"ds": (None, 4)})
    assert len(job.outputs()) == 4
    assert capped.submitted == 1


async def test_an_output_target_is_reached_in_waves(job: Job) -> None:
    # 200-token answers (the simulator's median is far above max_tokens): 700 tokens
    # need 4 lines; the first wave sends 700 / 200 -> 4, and nothing more is needed.
    result = await job.go(prompts(12), limits={"ds": (700, None)})
    assert 4 <= len(job.outputs()) <= 5
    assert result.stop is None


async def test_a_lost_202_whose_batch_failed_goes_again_once_the_grace_is_over(job: Job) -> None:
    # A failed batch shows no custom_ids; it ran nothing and cost nothing, so after the
    # grace its prompts go again (they cannot have been paid for).
    faults = job.sim.simulator.batches.faults
    faults.lose_202 = 1
    faults.fail = 1
    result = await job.go(prompts(4))
    assert result.resubmitted_lines == 4
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(4))
    counts = job.submitted()
    assert set(counts.values()) == {2}, "once in the failed batch, once in the new one"
    await job.money_agrees()


async def test_a_lost_202_whose_results_are_withheld_stops_the_run_once(job: Job) -> None:
    # The lost batch is found only through its results, and those answer 402: the run
    # must stop with the top-up (not poll on forever, the amount growing each round).
    job.sim.simulator.batches.faults.lose_202 = 1

    def drain() -> None:
        job.sim.simulator.set_balance(0)
        job.time.hook = guard

    def guard() -> None:
        if len(job.time.sleeps) > 60:
            raise Killed  # it would never have stopped

    job.time.hook = drain  # after the submit: the balance is gone by finalize
    stopped = await job.go(prompts(5))
    assert stopped.top_up is not None
    assert stopped.stop is not None
    assert "add at least $" in stopped.stop
    assert stopped.top_up <= Decimal(1), "one batch's bill, counted once"
    assert job.outputs() == []
    job.sim.simulator.top_up(stopped.top_up)
    resumed = await job.go(prompts(5))
    assert resumed.submitted == 0, "collected, not re-run"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    assert set(job.submitted().values()) == {1}
    await job.money_agrees()


async def test_the_top_up_covers_every_withheld_batch_from_one_balance(job: Job) -> None:
    # Two batches withheld, a little balance left: the balance counts once, not per batch.
    job.sim.simulator.batches.faults.slow = 1e-6  # both finished by the first poll

    def drain() -> None:
        job.sim.simulator.set_balance(Decimal("0.0001"))
        job.time.hook = None

    job.time.hook = drain
    stopped = await job.go(prompts(10))
    assert stopped.submitted == 2
    assert stopped.top_up is not None
    job.sim.simulator.top_up(stopped.top_up)
    resumed = await job.go(prompts(10))
    assert resumed.stop is None, "the top-up said was enough collects everything"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(10))
    await job.money_agrees()


class Downloads(BatchApi):
    """Counts results downloaded: in GETs of a batch, and lines of results pages. With
    ``page`` set, asks pages of that many lines; ``blip`` second pages answer a 429."""

    page: int | None = None
    blip = 0

    def __init__(self, http: HttpClient) -> None:
        super().__init__(http)
        self.in_gets = self.in_pages = self.pages = 0

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        batch = await super().get(batch_id, **kw)
        self.in_gets += len(batch.get("results") or [])
        return batch

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        if self.page is not None:
            kw["limit"] = self.page
        if cursor is not None and self.blip > 0:
            self.blip -= 1
            raise RateLimitError(429, "slow down")
        page = await super().results_page(batch_id, cursor, **kw)
        self.pages += 1
        self.in_pages += len(page["data"])
        return page


async def test_polls_read_no_results_and_each_line_is_downloaded_once(job: Job) -> None:
    # A terminal batch's GET carries all of its results (up to 5,000 long answers): the
    # polls read the list (results: null), and the results come once, page by page.
    job.sim.simulator.batches.faults.slow = 5.0  # many polls before the end
    api = Downloads(job.http)
    result = await job.go(prompts(12), api)
    assert result.stop is None
    assert len(job.time.sleeps) > 3
    assert api.in_gets == 0, "no poll downloaded results"
    assert api.in_pages == 12, "each line downloaded once"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(12))
    await job.money_agrees()


async def test_a_collect_cut_by_a_blip_goes_on_from_its_cursor(job: Job) -> None:
    api = Downloads(job.http)
    api.page, api.blip = 2, 1
    result = await job.go(prompts(5), api)
    assert result.stop is None
    assert any("429" in event or "slow down" in event for event in result.events)
    assert api.in_pages == 5, "the first page is not read again after the 429"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    await job.money_agrees()


class ResultsNotWrittenYet(BatchApi):
    """The first results page of a completed batch answers 409 (results not written)."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        if not getattr(self, "refused", False):
            self.refused = True
            raise APIStatusError(409, f"Batch {batch_id} has no results yet.")
        return await super().results_page(batch_id, cursor, **kw)


async def test_a_completed_batch_whose_results_answer_409_is_collected_later(job: Job) -> None:
    result = await job.go(prompts(5), ResultsNotWrittenYet(job.http))
    assert result.stop is None
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    await job.money_agrees()


class KillAfterPages(Downloads):
    """Pages of two lines; dies once ``pages`` pages have been read."""

    page = 2
    kill_after = 2

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        if self.pages >= self.kill_after:
            raise Killed
        return await super().results_page(batch_id, cursor, **kw)


def kept_aside(job: Job) -> list[dict[str, Any]]:
    path = job.directory / "not_in_inputs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_answers_to_prompts_no_longer_in_the_inputs_are_kept_and_counted(
    job: Job,
) -> None:
    # Submitted, killed; the inputs then lose p1 and p3. Their answers were paid: kept in
    # DIR/not_in_inputs.jsonl and counted, never dropped.
    with pytest.raises(Killed):
        await job.go(prompts(5), KillOnPoll(job.http))
    result = await job.go([p for p in prompts(5) if p.id not in ("p1", "p3")])
    assert sorted(job.outputs()) == ["p0", "p2", "p4"]
    assert result.not_in_inputs == 2
    assert result.to_json()["not_in_inputs"] == 2
    side = kept_aside(job)
    assert sorted(entry["id"] for entry in side) == ["p1", "p3"]
    for entry in side:
        assert entry["dataset"] == "ds"
        assert entry["batch_id"].startswith("batch-")
        assert entry["answer"]["choices"][0]["message"]["content"]
        assert Decimal(entry["cost_usd"]) > 0
    assert result.cost == job.sim.simulator.usage, "their cost is booked with the batch"
    await job.money_agrees()


async def test_an_answer_kept_aside_is_kept_once_across_a_kill_mid_collect(job: Job) -> None:
    with pytest.raises(Killed):
        await job.go(prompts(5), KillOnPoll(job.http))
    kept = [p for p in prompts(5) if p.id not in ("p1", "p3")]
    killer = KillAfterPages(job.http)
    killer.kill_after = 1  # p0, p1 read; p1 kept aside; then the kill
    with pytest.raises(Killed):
        await job.go(kept, killer)
    assert [entry["id"] for entry in kept_aside(job)] == ["p1"]
    result = await job.go(kept)
    assert result.not_in_inputs == 1, "only p3 is new"
    assert sorted(entry["id"] for entry in kept_aside(job)) == ["p1", "p3"]
    assert sorted(job.outputs()) == ["p0", "p2", "p4"]
    await job.money_agrees()


async def keep_aside_p1_p3(job: Job) -> None:
    """Submitted, killed; the inputs then lose p1 and p3: their answers are kept aside."""
    with pytest.raises(Killed):
        await job.go(prompts(5), KillOnPoll(job.http))
    result = await job.go([p for p in prompts(5) if p.id not in ("p1", "p3")])
    assert result.not_in_inputs == 2


async def test_a_kept_answer_whose_prompt_returns_is_written_not_sent_again(job: Job) -> None:
    await keep_aside_p1_p3(job)
    charged = job.sim.simulator.usage
    result = await job.go(prompts(5))
    assert result.reused == 2
    assert result.submitted == 0, "nothing was sent again"
    assert job.sim.simulator.usage == charged, "not paid twice"
    assert set(job.submitted().values()) == {1}
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)]
    records = {r["id"]: r for r in map(json.loads, job.output_lines())}
    kept = {entry["id"]: entry for entry in kept_aside(job)}
    for pid in ("p1", "p3"):
        assert records[pid]["cost"] == kept[pid]["cost_usd"]
        assert records[pid]["generation_id"] == kept[pid]["answer"]["id"]
        assert records[pid]["messages"][0]["content"] == f"question {pid[1:]}"
    said = "2 paid answers kept in not_in_inputs.jsonl were written"
    assert any(said in event for event in result.events)
    again = await job.go(prompts(5))
    assert (again.reused, again.submitted) == (0, 0), "written once"
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)]
    await job.money_agrees()


async def test_a_kept_answer_whose_id_returns_with_other_content_is_not_used(job: Job) -> None:
    await keep_aside_p1_p3(job)
    changed = [
        dataclasses.replace(p, messages=[{"role": "user", "content": "another question"}])
        if p.id == "p3"
        else p
        for p in prompts(5)
    ]
    result = await job.go(changed)
    assert result.reused == 1
    assert job.submitted()["p3"] == 2, "sent as a new prompt"
    assert job.submitted()["p1"] == 1
    records = {r["id"]: r for r in map(json.loads, job.output_lines())}
    assert records["p3"]["messages"][0]["content"] == "another question"
    assert records["p3"]["generation_id"] != kept_aside(job)[1]["answer"]["id"]
    assert any(
        "were not used: their prompt ids are back in the inputs of ds with different "
        "content (p3)" in e
        for e in result.events
    ), result.events
    await job.money_agrees()


def edited(items: list[Prompt], *ids: str) -> list[Prompt]:
    """``items`` with the prompts ``ids`` given another, longer text under the same id."""
    text = "an edited question, asked at much greater length than the one it replaces"
    return [
        dataclasses.replace(p, messages=[{"role": "user", "content": f"{text} ({p.id})"}])
        if p.id in ids
        else p
        for p in items
    ]


async def test_a_prompt_edited_while_its_batch_runs_gets_an_answer_to_its_new_text(
    job: Job,
) -> None:
    # Submitted, killed; p1 and p3 then get new text under the same ids while the batch
    # runs. Its answers to the old text are paid: kept aside, never written under the new.
    with pytest.raises(Killed):
        await job.go(prompts(5), KillOnPoll(job.http))
    now = edited(prompts(5), "p1", "p3")
    result = await job.go(now)
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)]
    records = {r["id"]: r for r in map(json.loads, job.output_lines())}
    first = {p.id: p for p in prompts(5)}
    asked = {p.id: p.messages[0]["content"] for p in now}
    for pid in ("p1", "p3"):
        assert records[pid]["messages"][0]["content"] == asked[pid]
        # Its usage is the new (longer) text's: the old text's answer is not under it.
        unchanged = records["p0"]["usage"]["prompt_tokens"]
        assert records[pid]["usage"]["prompt_tokens"] > unchanged, "an answer to the new text"
    assert job.submitted() == {"p0": 1, "p1": 2, "p2": 1, "p3": 2, "p4": 1}, (
        "the new texts were sent, once"
    )
    assert result.earlier_content == 2
    assert result.to_json()["earlier_content"] == 2
    kept = {entry["id"]: entry for entry in kept_aside(job)}
    assert sorted(kept) == ["p1", "p3"]
    for pid in ("p1", "p3"):
        answer = kept[pid]["answer"]
        assert records[pid]["generation_id"] != answer["id"], "not the old text's answer"
        assert records[pid]["usage"]["prompt_tokens"] > answer["usage"]["prompt_tokens"]
        assert kept[pid]["digest"] == prompt_digest(first[pid]), "kept as the old text's"
    digest = RequestDigest(job.route.model_id, {"max_tokens": MAX_TOKENS})
    assert [records[p.id]["request_digest"] for p in now] == [digest.of(p) for p in now]
    assert any("earlier content" in line for line in describe(result)), describe(result)
    await job.money_agrees()
    # Done: a resume sends nothing, and keeps nothing aside again.
    charged = job.sim.simulator.usage
    again = await job.go(now)
    assert (again.submitted, again.reused, again.earlier_content) == (0, 0, 0)
    assert job.sim.simulator.usage == charged


@pytest.mark.parametrize("torn", [False, True], ids=["outputs-written", "output-torn"])
async def test_a_kill_between_a_kept_answers_output_and_its_journal_entry_repeats_nothing(
    job: Job, monkeypatch: pytest.MonkeyPatch, torn: bool
) -> None:
    await keep_aside_p1_p3(job)
    from provider_router.jobs.store import journal as journal_module

    write_all = journal_module._write_all
    armed = [True]

    def dies_on_commit(fh: Any, data: bytes) -> None:
        if armed[0] and torn and fh.name.endswith("ds.jsonl"):
            armed[0] = False
            write_all(fh, data[: data.index(b"\n") + 10])
            raise Killed  # mid-write of the outputs: the first whole, the second torn
        if armed[0] and fh.name.endswith("journal.jsonl") and b'"op":"done"' in data:
            armed[0] = False
            raise Killed  # the outputs were written, their done entries never
        write_all(fh, data)

    monkeypatch.setattr(journal_module, "_write_all", dies_on_commit)
    killed = job.run()
    with pytest.raises(Killed):
        await killed.run({"ds": prompts(5)})
    simulate_crash(killed.journal)  # a kill -9: nothing more is written
    killed.close()
    assert not armed[0]
    result = await job.go(prompts(5))
    # Whole records carry their generation id: adopted as done on open (#21); a torn
    # one is cut and written again from the kept line (p1 whole, p3 torn).
    assert result.reused == (1 if torn else 0)
    assert result.submitted == 0
    assert sorted(job.outputs()) == [f"p{i}" for i in range(5)], "none lost, none twice"
    assert set(job.submitted().values()) == {1}
    with FileJournal.open(job.directory) as journal:
        assert journal.tally("ds").completed == 5
    await job.money_agrees()


def test_a_kept_answer_from_before_its_content_was_recorded_is_not_used(tmp_path: Path) -> None:
    from provider_router.jobs.batch_api.results import ResultLine
    from provider_router.jobs.batch_api.reuse import reuse_kept
    from provider_router.jobs.batch_api.unmatched import UnmatchedAnswers

    old = BatchIntent("b" + "2" * 12, "ds", ("p0",), 0, {}, 10, batch_id="batch-2")
    body = {"id": "gen-batch-1", "choices": [{"message": {"content": "hi"}}]}
    assert UnmatchedAnswers(tmp_path).keep(old, ResultLine("p0", body, Decimal("0.1")), Decimal(1))
    with FileJournal.open(tmp_path) as journal:
        journal.prepare(["ds"])
        reused = reuse_kept(
            journal, UnmatchedAnswers(tmp_path), "ds", prompts(2), model=K3, clock=time.time
        )
        assert (reused.written, reused.unknown) == (0, ["p0"])
        assert not journal.is_done("ds", "p0")
    assert "kept before the content of their prompts was recorded" in reused.sentences()[0]


class RepeatingPages(BatchApi):
    """A results endpoint that answers the same two lines forever (has_more, a cursor)."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, None, **kw)
        self.pages = getattr(self, "pages", 0) + 1
        if self.pages > 50:
            raise Killed  # it would have read on forever
        page["data"] = page["data"][:2]
        page["has_more"] = True
        page["next_cursor"] = "again"
        return page


async def test_results_pages_that_never_end_are_an_error_not_a_loop(job: Job) -> None:
    with pytest.raises(InvalidResponseError, match="results"):
        await job.go(prompts(5), RepeatingPages(job.http))
    assert len(job.outputs()) == 2, "the lines read were written, once"
    state = await job.ledger.snapshot()
    assert state.reserved > 0, "the batch's worst case stays held while it is not collected"


class DoubledLines(BatchApi):
    """A results page that lists every line twice."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, cursor, **kw)
        page["data"] = list(page["data"]) * 2
        return page


async def test_a_line_listed_twice_is_written_and_counted_once(job: Job) -> None:
    result = await job.go(prompts(5), DoubledLines(job.http))
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    assert result.cost == job.sim.simulator.usage, "each line's cost booked once"
    await job.money_agrees()


class CountsLater(BatchApi):
    """A list that shows a running batch's request_counts as zero (they fill in later)."""

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        page = await super().list_page(created_after, after)
        for item in page["data"]:
            if item["status"] not in ("completed", "failed", "expired", "cancelled"):
                item["request_counts"] = {"total": 0, "completed": 0, "failed": 0}
        return page


async def test_a_lost_202_whose_listing_shows_no_counts_yet_is_waited_for(job: Job) -> None:
    # A running batch whose counts are not known yet may be the lost one: its prompts wait.
    job.sim.simulator.batches.faults.lose_202 = 1
    job.sim.simulator.batches.faults.slow = 20.0  # still running well past the grace
    result = await job.go(prompts(5), CountsLater(job.http))
    assert set(job.submitted().values()) == {1}, "never sent twice"
    assert result.found_after_lost_202 == 1
    await job.money_agrees()


class NoResultsYet(BatchApi):
    """Completed batches whose results list nothing on the first asks."""

    hidden = 0

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, cursor, **kw)
        if self.hidden < 1:
            self.hidden += 1
            page["data"], page["has_more"], page["next_cursor"] = [], False, None
        return page


async def test_a_lost_202_candidate_listing_no_results_is_never_taken_as_free(job: Job) -> None:
    # A completed batch of the intent's size that shows no custom_id may be the lost one
    # (and billed): if its prompts go again, its worst case stays counted.
    job.sim.simulator.batches.faults.lose_202 = 1
    await job.go(prompts(5), NoResultsYet(job.http))
    job.sim.simulator.batches.settle_all()
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent >= job.sim.simulator.usage, "the ledger is never below what was billed"


class EndlessList(BatchApi):
    """A batch list whose every page says has_more, with the same last_id."""

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        self.pages = getattr(self, "pages", 0) + 1
        if self.pages > 50:
            raise Killed  # it would have listed on forever
        page = await super().list_page(created_after, None)
        page["has_more"], page["last_id"] = True, "batch-same"
        return page


async def test_a_batch_list_that_never_ends_is_an_error_and_sends_nothing(job: Job) -> None:
    job.sim.simulator.batches.faults.lose_202 = 1
    with pytest.raises(InvalidResponseError, match="repeat"):
        await job.go(prompts(5), EndlessList(job.http))
    assert set(job.submitted().values()) == {1}


class CostsUnreadable(PollEdits):
    """Results whose lines carry no cost, a negative one or a text one; the batch no total."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, cursor, **kw)
        for n, result in enumerate(page["data"]):
            usage = result["response"]["body"]["usage"]
            if n % 3 == 0:
                del usage["cost"]
            else:
                usage["cost"] = "-1" if n % 3 == 1 else "lots"
        return page

    def edit(self, batch: dict[str, Any]) -> None:
        if batch.get("usage"):
            batch["usage"]["cost"] = None


async def test_a_line_without_a_readable_cost_is_never_booked_free(job: Job) -> None:
    # Unknown is not free: such a line is booked at its worst case, never at 0 or less.
    result = await job.go(prompts(5), CostsUnreadable(job.http))
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5)), "answers kept"
    job.sim.simulator.batches.settle_all()
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent >= job.sim.simulator.usage > 0
    assert result.cost == state.spent
    assert any("no readable cost" in event for event in result.events)


class Vanished(BatchApi):
    """Every GET of a submitted batch answers 404 (deleted, or never this key's), and the
    list does not show it."""

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        page = await super().list_page(created_after, after)
        page["data"] = []
        return page

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        self.gets = getattr(self, "gets", 0) + 1
        if self.gets > 60:
            raise Killed  # it would have polled on forever
        return await super().get("batch-0-gone", **kw)


async def test_a_batch_that_answers_404_past_the_grace_stops_the_run_holding_it(
    job: Job,
) -> None:
    result = await job.go(prompts(5), Vanished(job.http))
    assert result.stop is not None
    assert "404" in result.stop
    assert result.stopped_by == "error"
    assert result.pending == 1
    assert set(job.submitted().values()) == {1}, "its prompts are not sent again"
    state = await job.ledger.snapshot()
    assert state.reserved > 0, "its worst case stays held"


def test_a_batch_body_is_measured_as_sent_within_the_size_limit(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Non-ASCII text is sent \\u-escaped (6 or 12 bytes a character) and tools ride in
    # every line: the size limit holds for the bytes sent, not for the text's repr.
    import provider_router.jobs.batch_api.body as batch_body_module

    monkeypatch.setattr(batch_body_module, "MAX_BATCH_BYTES", 20_000)
    monkeypatch.setattr(batch_body_module, "BODY_MARGIN", 0)
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 1500}}]
    items = [
        Prompt(f"p{i}", [{"role": "user", "content": "😀" * 100}], {}, Path("in.jsonl"), i + 1)
        for i in range(20)
    ]
    runner = job.run(dataset_params={"ds": {"max_tokens": MAX_TOKENS, "tools": tools}})
    try:
        chunk = runner.body.chunk("ds", items)
        lines = [runner.body.line("ds", "b" + "0" * 12, n, p) for n, p in enumerate(chunk)]
        sent = len(json.dumps(lines, separators=(",", ":")).encode())
        assert 0 < len(chunk) < len(items)
        assert sent <= 20_000
    finally:
        runner.journal.close()
        runner.close()


def test_a_prompt_larger_than_a_batch_is_named(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    import provider_router.jobs.batch_api.body as batch_body_module

    monkeypatch.setattr(batch_body_module, "MAX_BATCH_BYTES", 2_000)
    monkeypatch.setattr(batch_body_module, "BODY_MARGIN", 0)
    items = [Prompt("big", [{"role": "user", "content": "x" * 3000}], {}, Path("in.jsonl"), 1)]
    runner = job.run()
    try:
        named = re.escape("'big' of dataset 'ds' (in.jsonl:1)")
        with pytest.raises(ConfigurationError, match=named):
            runner.body.chunk("ds", items)
    finally:
        runner.journal.close()
        runner.close()


async def test_a_body_longer_than_its_bound_is_refused(job: Job) -> None:
    listing = await job.http.get_json("/models")
    size = len(json.dumps(listing))
    with pytest.raises(InvalidResponseError, match="longer than the 100 bytes"):
        await job.http.get_json("/models", max_bytes=100)
    assert await job.http.get_json("/models", max_bytes=size * 2) == listing


class PageSizes(BatchApi):
    """Records how many lines and bytes each results page is asked for."""

    asked: list[tuple[int, int | None]]

    async def results_page(
        self,
        batch_id: str,
        cursor: str | None,
        *,
        limit: int = 1000,
        max_bytes: int | None = None,
    ) -> dict[str, Any]:
        self.asked = [*getattr(self, "asked", []), (limit, max_bytes)]
        return await super().results_page(batch_id, cursor, limit=limit, max_bytes=max_bytes)


async def test_results_pages_are_bounded_by_the_answers_they_may_hold(job: Job) -> None:
    # max_tokens 32,000 (Together's batch cap is 32,768): a line may be megabytes, so a
    # page holds fewer lines and the bytes read are bounded (256 MiB a page), never a
    # thousand lines of any length.
    api = PageSizes(job.http)
    params = {"max_tokens": 32_000}
    await job.go(prompts(3), api, dataset_params={"ds": params})
    assert api.asked
    for limit, max_bytes in api.asked:
        assert limit < 1000
        assert max_bytes is not None
        assert max_bytes <= 256 * 1024 * 1024
    assert len(job.outputs()) == 3


async def test_a_missing_batch_journal_with_batches_held_is_refused(job: Job) -> None:
    # batches.jsonl gone while the ledger still holds batches: they may be live, and a
    # run from nothing would send their prompts (and pay) again.
    with pytest.raises(Killed):
        await job.go(prompts(5), KillAfterSubmit(job.http))
    (job.directory / "batches.jsonl").unlink()
    for _ in range(2):  # and again: the refusal leaves no empty journal behind
        with pytest.raises(DataFileError, match=r"batches\.jsonl"):
            await job.go(prompts(5))
    assert len(job.sim.simulator.batches) == 1, "nothing sent again"


class ErrorStatusLine(BatchApi):
    """The first line of each page answers status_code 500 with an error body."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, cursor, **kw)
        if page["data"] and not getattr(self, "done", False):
            self.done = True
            response = page["data"][0]["response"]
            response["status_code"] = 500
            response["body"] = {"error": {"code": 500, "message": "upstream failed"}}
        return page


async def test_a_line_answering_an_error_status_is_a_failed_line_not_an_output(job: Job) -> None:
    result = await job.go(prompts(5), ErrorStatusLine(job.http), max_attempts=2)
    assert result.lines_failed == 1
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5)), "it went again"
    records = (job.directory / "ds.jsonl").read_text().splitlines()
    assert all(json.loads(line)["messages"][-1]["content"] for line in records), "none empty"


class ToolCallLines(BatchApi):
    """Every answer asks for a tool call."""

    async def results_page(self, batch_id: str, cursor: str | None, **kw: Any) -> dict[str, Any]:
        page = await super().results_page(batch_id, cursor, **kw)
        for result in page["data"]:
            message = result["response"]["body"]["choices"][0]["message"]
            message["tool_calls"] = [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]
        return page


async def test_an_answers_tool_calls_are_kept_in_the_output(job: Job) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    params = {"max_tokens": MAX_TOKENS, "tools": tools}
    await job.go(prompts(2), ToolCallLines(job.http), dataset_params={"ds": params})
    for line in (job.directory / "ds.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["messages"][-1]["tool_calls"][0]["function"]["name"] == "f"
        assert record["tools"] == tools


@pytest.mark.parametrize("cost", [None, "0.0005"])
async def test_a_failed_batch_that_ran_lines_is_not_taken_as_free(
    job: Job, cost: str | None
) -> None:
    job.sim.simulator.batches.faults.fail = 1
    api = FailedAfterLines(job.http)
    api.cost = cost
    await job.go(prompts(5), api, max_attempts=1)
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent > 0, "a batch that says it ran lines is never booked free"
    if cost is not None:
        assert state.spent == Decimal(cost)


def test_a_batch_endpoint_without_a_fixed_price_is_refused_up_front(job: Job) -> None:
    # Refuse what you cannot price: dynamic pricing has no worst case to reserve.
    endpoint = job.route.endpoint
    dynamic = endpoint.model_copy(
        update={"pricing": endpoint.pricing.model_copy(update={"completion": None})}
    )
    journal = FileJournal.open(job.directory)
    try:
        with pytest.raises(ConfigurationError, match="no fixed price"):
            BatchRouteRun(
                api=BatchApi(job.http),
                ledger=job.ledger,
                journal=journal,
                directory=job.directory,
                route=dataclasses.replace(job.route, endpoint=dynamic),
                params={"max_tokens": MAX_TOKENS},
            )
    finally:
        journal.close()


@pytest.mark.parametrize("where", ["line", "batch"])
async def test_an_absurd_bill_is_disputed_not_booked(job: Job, where: str) -> None:
    # Never one answer's word for an absurd bill: the worst case is booked, the answers
    # kept, and the run stops sending batches.
    api = AbsurdBill(job.http)
    api.where = where
    result = await job.go(prompts(10), api)
    assert result.stop is not None
    assert result.stop.startswith("disputed cost")
    assert result.stopped_by == "error", "an error (exit 1), as on the sync route"
    state = await job.ledger.snapshot()
    assert state.reserved == 0
    assert state.spent < 1, "the $1,000,000 was not booked"
    assert len(job.outputs()) >= 5, "the answers are kept"


class OneBlip(BatchApi):
    """A batch long since submitted is missing from one list and answers one 404, then
    is there again."""

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        page = await super().list_page(created_after, after)
        if not getattr(self, "blipped", False):
            page["data"] = []
        return page

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        if not getattr(self, "blipped", False):
            self.blipped = True
            return await super().get("batch-0-gone", **kw)
        return await super().get(batch_id, **kw)


async def test_one_404_of_an_old_batch_is_waited_out(job: Job) -> None:
    with pytest.raises(Killed):
        await job.go(prompts(5), KillOnPoll(job.http))
    job.time.t += 600  # resumed long after the submit: one 404 is a blip, not the end
    result = await job.go(prompts(5), OneBlip(job.http))
    assert result.stop is None
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))
    await job.money_agrees()


class SlowUploadTimesOut(BatchApi):
    """The first submit uploads for 200 s and then times out (the server may still be
    reading it); later submits go through. Records when each submit ended."""

    def __init__(self, http: HttpClient, time: FakeTime) -> None:
        super().__init__(http)
        self.time = time
        self.ended: list[float] = []

    async def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if not self.ended:
            self.time.t += 200
            self.ended.append(self.time.t)
            raise RequestTimeout("POST /batches: no answer in 200 s")
        batch = await super().submit(*args, **kwargs)
        self.ended.append(self.time.t)
        return batch


async def test_a_lost_submit_waits_the_grace_after_it_ended_not_after_it_began(
    job: Job,
) -> None:
    api = SlowUploadTimesOut(job.http, job.time)
    await job.go(prompts(5), api)
    failed_at, resent_at = api.ended[0], api.ended[1]
    assert resent_at - failed_at >= 120, "the grace counts from when the answer was lost"
    assert sorted(job.outputs()) == sorted(f"p{i}" for i in range(5))


def test_a_torn_last_line_of_the_answers_kept_aside_is_cut_and_written_again(
    tmp_path: Path,
) -> None:
    from provider_router.jobs.batch_api.results import ResultLine
    from provider_router.jobs.batch_api.unmatched import UnmatchedAnswers

    intent = BatchIntent("b" + "1" * 12, "ds", ("p0", "p1"), 0, {}, 10, batch_id="batch-1")
    body = {"choices": [{"message": {"content": "hi"}}]}
    first = UnmatchedAnswers(tmp_path)
    assert first.keep(intent, ResultLine("p0", body, Decimal("0.1")), Decimal("0.1"))
    assert not first.keep(intent, ResultLine("p0", body, Decimal("0.1")), Decimal("0.1"))
    with first.path.open("ab") as fh:
        fh.write(b'{"dataset":"ds","id":"p1","ans')  # a kill mid-write
    again = UnmatchedAnswers(tmp_path)
    assert not again.keep(intent, ResultLine("p0", body, Decimal("0.1")), Decimal("0.1"))
    assert again.keep(intent, ResultLine("p1", body, Decimal("0.2")), Decimal("0.2"))
    lines = [json.loads(line) for line in again.path.read_text().splitlines()]
    assert [(e["id"], e["custom_id"], e["cost_usd"]) for e in lines] == [
        ("p0", intent.custom_id(0), "0.1"),
        ("p1", intent.custom_id(1), "0.2"),
    ]


async def test_a_resume_takes_its_live_batches_back_before_recovering_the_rest(
    job: Job, log_events: list[dict[str, Any]]
) -> None:
    """A resume found batches still running, held in the job's SQLite ledger by a dead
    run. Its recovery used to count them at their worst case first, and the collect then
    settled reservations already closed (``N ledger operations finished after the ledger
    closed``). Now the route takes its own batches' holds back before the recovery, which
    counts only a hold no batch journal line knows (a kill between a reserve and its
    intent), and each batch is settled once, at what it cost."""
    items = prompts(7)
    path = job.directory / "ledger.sqlite"
    first = SQLiteLedger(path, Decimal(10), clock=job.time)
    job.ledger = first  # type: ignore[assignment]
    with pytest.raises(Killed):
        await job.go(items, KillOnPoll(job.http))  # batches submitted, then the kill
    unknown = await first.reserve(Decimal("0.25"), key="batch:never-journaled")
    await first.close()  # a dead run: its reservations stay open in the file
    job.time.t += 3600  # its leases long run out
    second = SQLiteLedger(path, clock=job.time)
    job.ledger = second  # type: ignore[assignment]
    try:
        result = await job.go(items)
        assert result.stop is None
        assert sorted(job.outputs()) == sorted(p.id for p in items)
        state = await second.snapshot()
        assert state.recovered == 1  # the hold no intent knows, at its worst case
        open_ids = {r.id for r in await second.open_reservations()}
        assert unknown.id not in open_ids
        late = [e for e in log_events if e["event"] == "ledger.late_close"]
        assert late == []
        job.sim.simulator.batches.settle_all()
        charged = job.sim.simulator.usage
        assert state.reserved == 0
        assert state.spent == charged + Decimal("0.25"), "each batch at its cost, once"
    finally:
        await second.close()
