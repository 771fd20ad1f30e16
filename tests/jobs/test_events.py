"""A run's observers: told when it starts and ends, never imported by the runner; a run
has only those it is given."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from _job_helpers import small_plan

from provider_router.jobs.events import ObservedRun, RunObserver
from provider_router.jobs.observe.batch_summary import BatchesInSummary
from provider_router.jobs.observe.report import ReportObserver
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.timeline import TimelineObserver
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


class Recorder(RunObserver):
    """Records each moment it is told of, with what the run showed then."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.run: ObservedRun | None = None

    def _note(self, moment: str, run: ObservedRun) -> None:
        self.run = run
        completed = sum(d.completed for d in run.progress().datasets)
        self.seen.append((moment, completed))

    async def on_start(self, run: ObservedRun) -> None:
        self._note("start", run)

    async def on_dispatch_end(self, run: ObservedRun) -> None:
        self._note("dispatch_end", run)

    def on_summary(self, run: ObservedRun, summary: RunSummary) -> None:
        self._note("summary", run)
        summary.recovered.append("seen by the recorder")

    async def on_end(self, run: ObservedRun, summary: RunSummary) -> None:
        self._note("end", run)
        assert json.loads((run.out / "summary.json").read_text())["reason"] == "complete"


async def test_observers_are_told_of_the_start_and_the_end_in_order(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    recorder = Recorder()
    runner = JobRunner(
        small_plan(tmp_path), out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, observers=[recorder]
    )
    summary = await runner.run()
    assert summary.reason is StopReason.COMPLETE
    assert recorder.run is runner
    assert recorder.seen == [("start", 0), ("dispatch_end", 6), ("summary", 6), ("end", 6)]
    # What an observer adds to the summary before it is written is in summary.json.
    assert "seen by the recorder" in json.loads((out / "summary.json").read_text())["recovered"]


async def test_a_run_without_observers_writes_its_outputs_and_summary_only(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    plan = small_plan(tmp_path)
    runner = JobRunner(plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, observers=())
    assert (await runner.run()).reason is StopReason.COMPLETE
    assert (out / "summary.json").is_file()
    assert (out / "p.jsonl").is_file()
    assert not (out / "timeline.ndjson").exists()
    assert not (out / "report.html").exists()


async def test_a_bare_runner_has_no_observers_and_writes_its_outputs_and_summary_only(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    runner = JobRunner(small_plan(tmp_path), out, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    assert runner.observers == ()
    assert (await runner.run()).reason is StopReason.COMPLETE
    assert {p.name for p in out.iterdir()} & {"timeline.ndjson", "report.html"} == set()
    assert (out / "summary.json").is_file()


async def test_a_run_with_the_standard_observers_writes_its_timeline_and_report(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    out = tmp_path / "out"
    await JobRunner(
        small_plan(tmp_path),
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        observers=standard_observers(),
    ).run()
    assert {"summary.json", "timeline.ndjson", "report.html"} <= {p.name for p in out.iterdir()}


def test_the_standard_observers_are_the_timeline_the_batches_and_the_report() -> None:
    observers = standard_observers(timeline_interval=0.25)
    assert [type(o) for o in observers] == [TimelineObserver, BatchesInSummary, ReportObserver]
    timeline = observers[0]
    assert isinstance(timeline, TimelineObserver)
    assert timeline.interval == 0.25
    assert standard_observers()[0] is not timeline  # each run its own
