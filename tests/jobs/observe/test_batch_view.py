"""The batch route as an operator sees it (#25): batches by state per dataset, lines,
money held and booked, providers and the 24 h window, the same in the live lines,
Prometheus, ``status`` (also of a killed run: read from the batch journal),
``summary.json`` and ``report.html``; on the local OpenRouter over real sockets."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from html import unescape
from pathlib import Path

import pytest
from _batch_api_helpers import Job, Killed, prompts
from _job_helpers import ledger_spent, run_cli, write_prompts
from _wire_server import Serve, answer, wire_fixture

from provider_router._format import format_usd
from provider_router._http.session import HttpClient
from provider_router._money import from_units
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.result import BatchRouteResult
from provider_router.jobs.observe.batch_summary import write_batch_summary
from provider_router.jobs.observe.batch_view import (
    MAX_TEXT,
    STATES,
    BatchView,
    JournalReader,
    Sighting,
    build_view,
    read_batch_view,
)
from provider_router.jobs.observe.batch_watch import BatchWatch
from provider_router.jobs.observe.batch_words import batch_sentences
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.store._layout import BATCH_JOURNAL_FILE, BATCH_STATUS_FILE
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.compare import BATCH_WINDOW_SECONDS
from provider_router.planning.plan import Plan
from provider_router.testing import SimulatorServer

__all__ = ["wire_fixture"]  # a fixture: the raw server

Factory = Callable[..., Awaitable[SimulatorServer]]
DAY = int(BATCH_WINDOW_SECONDS)


def _watched(job: Job) -> tuple[BatchWatch, list[BatchView]]:
    watch = BatchWatch(job.directory, pinned="Together", clock=job.time)
    return watch, []


async def test_the_live_view_follows_each_batch_from_submit_to_collected(job: Job) -> None:
    watch, views = _watched(job)
    rounds: list[float] = []

    def progress(_result: object) -> None:
        views.append(watch.update())
        rounds.append(job.time())

    runner = job.run(watch.api(job.http), progress=progress)
    try:
        result = await runner.run({"ds": prompts(12)})
    finally:
        runner.journal.close()
        runner.close()
    assert result.stop is None
    first, last = views[0], views[-1]
    # Just after the submits: three batches of five lines at most, as their 202s said.
    ds = first.dataset("ds")
    assert ds is not None
    assert ds.submitted == 3
    assert ds.states["validating"] == 3
    assert ds.lines_in_batches == 12
    worst = sum((from_units(i.worst_units) for i in runner.batches), Decimal(0))
    assert ds.held == worst > 0
    assert ds.booked == 0
    assert ds.providers == {"Together": 3}
    assert ds.window_left(rounds[0]) == pytest.approx(DAY, abs=5)
    seen_states = {s for v in views for s, n in v.datasets[0].states.items() if n}
    assert "in_progress" in seen_states, "a poll saw them run"
    assert seen_states <= {"validating", "in_progress", "finalizing", "collecting", "completed"}
    # At the end: every batch collected, the money booked is the ledger's, none held.
    end = last.dataset("ds")
    assert end is not None
    assert end.states["completed"] == 3
    assert end.live == 0
    assert end.lines_done == 12
    assert end.lines_failed == 0
    assert end.held == 0
    await job.money_agrees()
    assert end.booked == (await job.ledger.snapshot()).spent == job.sim.simulator.usage
    assert end.window_ends is None
    # What was seen is kept beside the journal, for status and the report.
    saved = json.loads((job.directory / BATCH_STATUS_FILE).read_text())
    assert saved["pinned"] == "Together"
    assert {b["status"] for b in saved["batches"].values()} == {"completed"}


async def test_status_of_a_killed_batch_run_reads_its_journal(job: Job) -> None:
    watch, _ = _watched(job)

    def die(_result: object) -> None:
        watch.update()
        raise Killed  # kill -9 after the first round: batches live at OpenRouter

    with pytest.raises(Killed):
        await job.go(prompts(7), watch.api(job.http), progress=die)
    # No timeline, no summary: before #25's view, status said "no run here".
    now = job.time() + 3600
    lines = status_lines(job.directory, now=now)
    text = "\n".join(lines)
    assert "stopped (killed?)" in text
    reserved = (await job.ledger.snapshot()).reserved
    assert reserved > 0
    assert (
        "batches of ds: 2 submitted (2 validating); 0 lines done, 0 failed, 7 in batches; "
        f"{format_usd(reserved)} held, $0.00 booked; at Together; the oldest live batch's "
        "24 h window ends in 22 h 59 min." in lines
    ), text
    # report.html says the same (its window counted from when it is built)
    (page,) = _page_sentences(job.directory)
    assert page.split("; the oldest")[0] == lines[-1].split("; the oldest")[0]
    assert "; the oldest live batch's 24 h window ends in " in page
    code, shown, err = await run_cli("status", str(job.directory))
    assert code == 0, err
    assert "batches of ds: 2 submitted (2 validating)" in shown
    # Without what the watch saw, the journal alone still tells the batches and money.
    (job.directory / BATCH_STATUS_FILE).unlink()
    alone = read_batch_view(job.directory)
    assert alone is not None
    assert alone.datasets[0].submitted == 2
    assert alone.datasets[0].held == reserved
    assert alone.datasets[0].providers == {"unknown": 2}


async def test_a_withheld_batch_shows_as_collecting_until_the_top_up(job: Job) -> None:
    watch, views = _watched(job)

    def drain() -> None:
        job.sim.simulator.set_balance(0)
        job.time.hook = None

    job.time.hook = drain
    stopped = await job.go(
        prompts(4), watch.api(job.http), progress=lambda _: views.append(watch.update())
    )
    assert stopped.stopped_by == "credits"
    ds = views[-1].datasets[0]
    assert ds.states["collecting"] == 1, "completed at OpenRouter, its results withheld"
    assert ds.held > 0
    assert ds.booked == 0


@pytest.mark.parametrize(
    ("journal", "seen", "state"),
    [
        ({}, None, "submitting"),
        ({"batch_id": "b1"}, None, "validating"),
        ({"batch_id": "b1"}, "in_progress", "in_progress"),
        ({"batch_id": "b1"}, "finalizing", "finalizing"),
        ({"batch_id": "b1"}, "cancelling", "in_progress"),
        ({"batch_id": "b1"}, "completed", "collecting"),
        ({"batch_id": "b1"}, "failed", "failed"),
        ({"batch_id": "b1"}, "some_new_state", "in_progress"),
        ({"batch_id": "b1", "collected": True}, "completed", "completed"),
        ({"batch_id": "b1", "ended": "failed"}, "failed", "failed"),
        ({"batch_id": "b1", "ended": "expired"}, None, "expired"),
        ({"batch_id": "b1", "ended": "cancelled"}, None, "cancelled"),
        ({"ended": "refused"}, None, "not_created"),
        ({"ended": "not_created"}, None, "not_created"),
    ],
)
def test_each_batch_is_counted_in_one_state(
    journal: dict[str, object], seen: str | None, state: str
) -> None:
    intent = BatchIntent("i1", "ds", ("a", "b"), 1000, {}, 5_000_000_000, **journal)  # type: ignore[arg-type]
    sightings = {} if seen is None else {"b1": Sighting(seen, "Together", 1000 + DAY)}
    view = build_view([intent], sightings, pinned="Pinned")
    d = view.datasets[0]
    assert [s for s in STATES if d.states[s]] == [state]
    taken = state not in ("submitting", "not_created")
    assert d.submitted == int(taken)
    assert d.providers == ({"Together" if seen else "Pinned": 1} if taken else {})


@pytest.mark.parametrize(
    ("ended", "sighting", "booked"),
    [
        ("expired", None, Decimal("0.005")),  # nothing says what it cost: its worst case
        ("cancelled", None, Decimal("0.005")),
        ("failed", Sighting("failed", completed=0), Decimal(0)),  # ran nothing: free
        ("failed", Sighting("failed", completed=2), Decimal("0.005")),  # ran lines, no cost
        ("failed", Sighting("failed", cost="0.001"), Decimal("0.001")),
        ("not_created", None, Decimal(0)),
    ],
)
def test_an_ended_batch_is_booked_as_the_route_books_it(
    ended: str, sighting: Sighting | None, booked: Decimal
) -> None:
    intent = BatchIntent(
        "i1", "ds", ("a", "b"), 1000, {}, 5_000_000_000, batch_id="b1", ended=ended, settled=True
    )
    view = build_view([intent], {} if sighting is None else {"b1": sighting})
    assert view.datasets[0].booked == booked
    assert view.datasets[0].held == 0


def test_the_oldest_live_batch_sets_the_window() -> None:
    old = BatchIntent("i1", "ds", ("a",), 1000, {}, 1, batch_id="b1")
    young = BatchIntent("i2", "ds", ("b",), 500, {}, 1, batch_id="b2")
    done = BatchIntent("i0", "ds", ("c",), 10, {}, 1, batch_id="b0", collected=True)
    # b2 is older, but its upstream grants 96 h: leeway, not a promise (24 h counts).
    later = {"b2": Sighting("in_progress", expires_at=500 + 4 * DAY)}
    view = build_view([done, young, old], later)
    assert view.datasets[0].window_ends == 500 + DAY, "from the journal's time"
    sooner = {"b1": Sighting("in_progress", expires_at=400 + DAY)}
    assert build_view([done, young, old], sooner).datasets[0].window_ends == 400 + DAY
    (line,) = batch_sentences(view, now=500 + DAY - 90)
    assert line.endswith("the oldest live batch's 24 h window ends in 1 min.")
    (late,) = batch_sentences(view, now=500 + DAY + 7200)
    assert "is 2 h 00 min past its 24 h window" in late


def test_the_journal_is_read_as_it_grows_and_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / BATCH_JOURNAL_FILE
    intent = {"op": "intent", "intent": "i1", "ds": "ds", "ids": ["a", "b"], "after": 1,
              "res": {}, "worst": 7}  # fmt: skip
    path.write_text(json.dumps(intent) + "\n" + '{"op": "submitted", "intent": "i1", "ba')
    reader = JournalReader(tmp_path)
    assert reader.read()["i1"].batch_id is None, "a torn last line waits for the rest"
    with path.open("a") as fh:
        fh.write('tch": "b1"}\n')
    assert reader.read()["i1"].batch_id == "b1"
    # Cut (a run drops a torn line) and written again: read from the start.
    path.write_text(json.dumps(intent) + "\n")
    assert reader.read()["i1"].batch_id is None
    with path.open("a") as fh:
        fh.write("not json\n" + json.dumps({"op": "collected", "intent": "i1", "cost": 7,
                                            "failed": []}) + "\n")  # fmt: skip
    view = read_batch_view(tmp_path)
    assert view is not None
    assert view.datasets[0].states["submitting"] == 1
    assert view.problems == (
        f"{path} line 2 is unreadable (Expecting value: line 1 column 1 (char 0)): the "
        "batch figures stop before it",
    )
    assert batch_sentences(view, 0)[-1] == view.problems[0]


def test_an_unreadable_status_file_is_nothing_seen(tmp_path: Path) -> None:
    (tmp_path / BATCH_JOURNAL_FILE).write_text(
        json.dumps({"op": "intent", "intent": "i1", "ds": "ds", "ids": ["a"], "after": 1,
                    "res": {}, "worst": 7}) + "\n"
        + json.dumps({"op": "submitted", "intent": "i1", "batch": "b1"}) + "\n"
    )  # fmt: skip
    for text in ("{", "[]", '{"batches": {"b1": "x"}}', '{"batches": {"b1": {"status": 3}}}'):
        (tmp_path / BATCH_STATUS_FILE).write_text(text)
        view = read_batch_view(tmp_path)
        assert view is not None
        assert view.datasets[0].states["validating"] == 1, text


SIZES = {"a": 14, "b": 9}


def _plan(tmp_path: Path) -> Path:
    for name, size in SIZES.items():
        write_prompts(tmp_path / f"{name}.jsonl", size, prefix=name)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: moonshotai/kimi-k3\nbudget: 20\npolicy: {exclude_below: int4}\n"
        "generation: {max_tokens: 300}\ndatasets:\n"
        + "".join(f"  - {{name: {n}, input: {n}.jsonl, route: batch}}\n" for n in SIZES)
    )
    return plan


async def _run_plan(
    tmp_path: Path, sim: SimulatorServer, *, progress: str = "off", edit: tuple[str, str] = ("", "")
) -> tuple[int, str, str, Path]:
    """``provider-router run`` of :func:`_plan` with ``edit`` (text, its replacement):
    (exit code, stdout, stderr, the job directory)."""
    plan = _plan(tmp_path)
    if edit[0]:
        plan.write_text(plan.read_text().replace(*edit))
    out = tmp_path / "out"
    argv = ["run", "--plan", str(plan), "--out", str(out), "--base-url", sim.url,
            "--batch-poll", "0.02", "--progress", progress]  # fmt: skip
    code, stdout, err = await run_cli(*argv)
    return code, stdout, err, out


def _page_sentences(out: Path) -> list[str]:
    page = write_report(out).read_text(encoding="utf-8")
    return [unescape(s) for s in re.findall(r'<p class="batch">(.*?)</p>', page)]


async def test_a_batch_run_says_the_same_in_summary_report_status_and_its_lines(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=3)
    code, _, err, out = await _run_plan(tmp_path, sim, progress="plain")
    assert code == 0, err[-2000:]
    sim.simulator.batches.settle_all()
    # summary.json (before #25's view a batch-only run wrote none)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "complete"
    assert summary["datasets"]["a"]["completed"] == 14
    assert summary["to_finish_usd"] == "0"
    batches = summary["batches"]["datasets"]
    assert batches["a"]["submitted"] == 1
    assert batches["a"]["states"]["completed"] == 1
    assert batches["b"]["lines_done"] == 9
    assert batches["a"]["providers"] == {"Together": 1}
    booked = sum(Decimal(b["booked_usd"]) for b in batches.values())
    assert booked == ledger_spent(out) == sim.simulator.usage
    assert all(Decimal(b["held_usd"]) == 0 for b in batches.values())
    # One sentence per dataset, the same words everywhere.
    expected = [
        f"batches of {name}: 1 submitted (1 completed); {size} lines done, 0 failed, 0 in "
        f"batches; $0.00 held, {format_usd(Decimal(batches[name]['booked_usd']))} booked; "
        "at Together."
        for name, size in SIZES.items()
    ]
    # The live lines: a dataset's sentence each time its figures changed, the last one
    # what every view says at the end.
    last = {line.split(":")[0]: line for line in err.splitlines() if line.startswith("batches of")}
    assert list(last.values()) == expected, "the live lines"
    code, status, _ = await run_cli("status", str(out))
    assert code == 0
    assert status.splitlines()[0].endswith("finished: complete (exit code 0)")
    assert [line for line in status.splitlines() if line.startswith("batches of")] == expected
    assert _page_sentences(out) == expected
    page = (out / "report.html").read_text(encoding="utf-8")
    table = re.search(r'<table data-table="batches">(.*?)</table>', page, re.S)
    assert table is not None
    heads = re.findall(r"<th>(.*?)</th>", table.group(1))
    assert heads[:3] == ["dataset", "submitted", "completed"], "only states some batch is in"
    assert "<td>Together (1)</td>" in table.group(1)
    # Each batch: where it went, in summary.json and the report.
    each = summary["batches"]["batches"]
    assert [(b["dataset"], b["state"], b["provider"], b["lines"]) for b in each] == [
        ("a", "completed", "Together", 14),
        ("b", "completed", "Together", 9),
    ]
    assert all(b["batch_id"] in page for b in each)
    assert "<summary>Each batch (2)</summary>" in page
    assert (out / "report.html").is_file(), "written at the end of the run"


async def test_the_sync_runners_summary_after_the_batch_route_keeps_its_batches(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # route: auto, every batch line failing: both batches of each dataset fail every
    # line, and the sync runner then writes them; its summary.json keeps the batches.
    sim = await openrouter_sim_factory(speed=float("inf"), seed=3)
    sim.simulator.batches.faults.line_failure_rate = 1.0
    code, stdout, err, out = await _run_plan(tmp_path, sim, edit=("route: batch", "route: auto"))
    assert code == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["datasets"]["a"]["completed"] == 14, "the sync runner's summary"
    a = summary["batches"]["datasets"]["a"]
    assert a["states"]["completed"] == 2
    assert a["lines_done"] == 0
    assert a["lines_failed"] == 28, "each line failed in both batches it went in"
    assert Decimal(a["booked_usd"]) == 0, "failed lines are free"
    assert "batches of a: 2 submitted (2 completed); 0 lines done, 28 failed" in stdout


async def test_a_batch_run_stopped_by_the_budget_says_so_with_its_exit_code(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=3)
    code, _, err, out = await _run_plan(tmp_path, sim, edit=("budget: 20", "budget: 0.002"))
    # With --progress off, the end of the run still says each dataset's sentence.
    said = [line for line in err.splitlines() if line.startswith("batches of ")]
    status = [line for line in status_lines(out, now=time.time()) if line.startswith("batches")]
    assert said == status
    assert said, "a batch went out before the budget stopped the route"
    assert f"Summary: {out / 'summary.json'}" in err
    summary = json.loads((out / "summary.json").read_text())
    assert code == summary["exit_code"] == 3, err[-2000:]
    assert summary["reason"] == "budget_exhausted"
    assert summary["message"].startswith("batch route stopped: the budget is spent")
    lines_done = sum(b["lines_done"] for b in summary["batches"]["datasets"].values())
    assert 0 < lines_done < sum(SIZES.values())
    assert Decimal(summary["spent_usd"]) == sum(
        Decimal(b["booked_usd"]) for b in summary["batches"]["datasets"].values()
    )
    code, status, _ = await run_cli("status", str(out))
    assert "finished: budget_exhausted (exit code 3)" in status


async def test_status_says_running_while_a_batch_route_holds_the_job(tmp_path: Path) -> None:
    # An earlier run's summary, and a resumed batch route at work (it writes no timeline).
    (tmp_path / "summary.json").write_text(json.dumps({"reason": "credits_exhausted",
                                                       "exit_code": 4}))  # fmt: skip
    (tmp_path / BATCH_JOURNAL_FILE).write_text("")
    journal = FileJournal.open(tmp_path)
    try:
        first = status_lines(tmp_path, now=time.time())[0]
    finally:
        journal.close()
    assert f"{tmp_path}: running" in first
    assert status_lines(tmp_path, now=time.time())[0].endswith(
        "finished: credits_exhausted (exit code 4)"
    )


async def test_a_summary_that_cannot_be_written_costs_the_file_not_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # No ledger in the directory: the summary cannot read the money.
    (tmp_path / "p.jsonl").write_text("")
    plan = Plan.model_validate(
        {"model": "moonshotai/kimi-k3", "budget": "1", "datasets": [
            {"name": "p", "input": str(tmp_path / "p.jsonl"), "route": "batch"}]}
    )  # fmt: skip
    caplog.set_level(logging.WARNING, logger="provider_router")
    written = await write_batch_summary(plan, tmp_path, ["p"], BatchRouteResult(), wall_time=0)
    assert written is None
    assert [r.getMessage() for r in caplog.records] == ["batch.summary_failed"]
    assert not (tmp_path / "summary.json").exists()


def test_what_the_watch_cannot_save_costs_the_views_detail_not_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="provider_router")
    (tmp_path / (BATCH_STATUS_FILE + ".tmp")).mkdir()  # where the file is written first
    watch = BatchWatch(tmp_path, pinned="Together", clock=lambda: 5.0)
    watch.seen({"id": "b1", "status": "in_progress", "provider": "Together"})
    for _ in range(3):
        assert watch.update().datasets == ()  # no journal yet: nothing to count
    assert [r.getMessage() for r in caplog.records] == ["batch.status_write_failed"]
    assert watch.sightings["b1"].status == "in_progress", "still seen in this run"


def test_the_live_lines_say_a_dataset_again_only_when_its_figures_change(
    tmp_path: Path,
) -> None:
    journal = tmp_path / BATCH_JOURNAL_FILE
    entries = [
        {"op": "intent", "intent": i, "ds": ds, "ids": [f"{ds}{i}"], "after": 0, "res": {},
         "worst": 10**9}
        for i, ds in (("i1", "a"), ("i2", "b"))
    ]  # fmt: skip
    journal.write_text("".join(json.dumps(e) + "\n" for e in entries))
    clock = [100.0]
    watch = BatchWatch(tmp_path, pinned="Together", clock=lambda: clock[0])
    shown = io.StringIO()
    report = watch.reporter(lambda line: print(line, file=shown), None)
    report(None)
    clock[0] += 120  # the window's minutes change, the figures do not: nothing said
    report(None)
    with journal.open("a") as fh:
        fh.write(json.dumps({"op": "submitted", "intent": "i2", "batch": "x2"}) + "\n")
    report(None)
    said = [line.split(";")[0] for line in shown.getvalue().splitlines()]
    assert said == [
        "batches of a: 0 submitted (1 submitting)",
        "batches of b: 0 submitted (1 submitting)",
        "batches of b: 1 submitted (1 validating)",
    ]


async def test_a_poll_through_the_batch_list_is_seen_and_the_keys_other_batches_are_not(
    job: Job,
) -> None:
    watch, _ = _watched(job)
    api = watch.api(job.http)

    def die(_result: object) -> None:
        raise Killed

    with pytest.raises(Killed):
        await job.go(prompts(3), api, progress=die)
    # Another job's batch on the same key, then a while for both to run.
    other = await BatchWatch(job.directory / "elsewhere").api(job.http).submit(
        "moonshotai/kimi-k3",
        [{"custom_id": "x-0", "body": {"messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 5}}],
        job.route.provider_object(),
    )  # fmt: skip
    job.time.t += 120
    await api.list_page(int(job.time()) - 3600, None)
    assert other["id"] not in watch.sightings, "not this job's batch"
    (mine,) = [i.batch_id for i in JournalReader(job.directory).read().values()]
    assert mine is not None
    assert watch.sightings[mine].status == "in_progress", "seen through the list"


async def test_a_hostile_batch_answer_is_kept_bounded_under_the_id_asked_for(
    tmp_path: Path, wire: Serve
) -> None:
    # Each poll of b1 answers another id and a megabyte of provider name.
    def hostile(n: int) -> bytes:
        body = {"id": f"batch-other-{n}", "status": "in_progress", "provider": "P" * 1_000_000}
        return json.dumps({**body, "usage": {"cost": 10**400}}).encode()

    server = await wire(*[[answer(hostile(n))] for n in range(3)])
    watch = BatchWatch(tmp_path, clock=lambda: 1.0)
    async with HttpClient(server.url, "sk-or-test") as http:
        api = watch.api(http)
        for _ in range(3):
            await api.get("b1", max_bytes=2_000_000)
    assert list(watch.sightings) == ["b1"], "one sighting, under the id asked for"
    seen = watch.sightings["b1"]
    assert seen.provider == "P" * MAX_TEXT
    assert seen.cost is not None
    assert len(seen.cost) <= MAX_TEXT
    watch.update()
    assert (tmp_path / BATCH_STATUS_FILE).stat().st_size < 2_000


def test_a_journal_cut_and_grown_past_the_last_read_is_read_again(tmp_path: Path) -> None:
    # A viewer read a line the run then cut (a resume drops a torn or unsettled last
    # line), and the run appended more than it cut before the next read.
    path = tmp_path / BATCH_JOURNAL_FILE
    intent = {"op": "intent", "intent": "i1", "ds": "ds", "ids": ["a", "b"], "after": 1,
              "res": {}, "worst": 7}  # fmt: skip
    torn = '{"op": "submitted", "intent": "i1", "batch": "b-torn"'
    path.write_text(json.dumps(intent) + "\n" + torn + "}\n")
    reader = JournalReader(tmp_path)
    assert reader.read()["i1"].batch_id == "b-torn"
    # The run rewrote the journal: the same first line, then other, longer lines.
    regrown = [{"op": "submitted", "intent": "i1", "batch": "b-real-one"},
               {"op": "collected", "intent": "i1", "cost": 7, "failed": []}]  # fmt: skip
    path.write_text(json.dumps(intent) + "\n" + "".join(json.dumps(e) + "\n" for e in regrown))
    assert path.stat().st_size > len(json.dumps(intent)) + 1 + len(torn) + 2
    intents = reader.read()
    assert reader.problem is None
    assert intents["i1"].batch_id == "b-real-one"
    assert intents["i1"].collected


async def test_unbounded_numbers_from_the_server_never_crash_a_view(
    tmp_path: Path, wire: Serve
) -> None:
    # expires_at and the counts beyond any float, a cost beyond any Decimal context:
    # left out or unreadable (the failed batch counts its worst case), never a crash.
    body = {"id": "b1", "status": "failed", "expires_at": 10**400,
            "request_counts": {"total": 2, "completed": -(10**400), "failed": 10**400},
            "usage": {"cost": "1e999999999"}}  # fmt: skip
    server = await wire([answer(json.dumps(body).encode())])
    intent = {"op": "intent", "intent": "i1", "ds": "ds", "ids": ["a", "b"], "after": 1,
              "res": {}, "worst": 7_000_000}  # fmt: skip
    (tmp_path / BATCH_JOURNAL_FILE).write_text(
        json.dumps(intent) + "\n" + json.dumps({"op": "submitted", "intent": "i1", "batch": "b1"})
        + "\n"
    )  # fmt: skip
    watch = BatchWatch(tmp_path, clock=lambda: 100.0)
    async with HttpClient(server.url, "sk-or-test") as http:
        await watch.api(http).get("b1", max_bytes=2_000_000)
    watch.update()
    view = read_batch_view(tmp_path)
    assert view is not None
    (row,) = view.batches
    assert row.window_ends == 1 + DAY, "an absurd expires_at is left out"
    assert row.booked == from_units(7_000_000), "an unreadable bill counts its worst case"
    assert view.to_json(100.0)["datasets"]["ds"]["window_left_s"] is None  # failed: not live
    assert batch_sentences(view, 100.0)
