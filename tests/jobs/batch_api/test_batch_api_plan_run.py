"""A plan's batch route in the job directory (its own ledger.sqlite), in process, on the
local OpenRouter: the ledger sampled into the timeline and the gauges while it runs, and
kept answers written by a later sync run instead of sent again (real loopback sockets)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import ledger_rows, ledger_spent, read_records, small_plan

from provider_router.client.metrics import Metrics
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api_runner import batch_datasets, run_plan_batches
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.timeline import read_timeline
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._layout import TIMELINE_FILE
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
K3 = "moonshotai/kimi-k3"
QUICK = {"poll_initial": 0.01, "lost_grace": 0.0}


class Killed(BaseException):
    """A kill at the first poll (BaseException: nothing in the route catches it)."""


class KillOnPoll(BatchApi):
    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        raise Killed

    async def get(self, batch_id: str, **kw: Any) -> dict[str, Any]:
        raise Killed


def plan(tmp_path: Path, prompts: int, *, route: str = "batch") -> Plan:
    """Dataset ``p`` of ``prompts`` prompts ``q<n>`` on Kimi K3 (written now), budget $10."""
    return small_plan(tmp_path, requests=None, prompts=prompts, model=K3, route=route)


async def run_batches(the_plan: Plan, out: Path, sim: SimulatorServer, **options: Any) -> Any:
    batches = await batch_datasets(the_plan, base_url=sim.url, api_key=DEFAULT_TEST_KEY)
    return await run_plan_batches(
        the_plan, out, batches, base_url=sim.url, api_key=DEFAULT_TEST_KEY, **QUICK, **options
    )


async def test_a_batch_only_run_samples_the_ledger_into_the_timeline_and_the_gauges(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    out = tmp_path / "out"
    metrics = Metrics()
    gauge: list[float | None] = []

    def watch(_result: object) -> None:  # what a scrape sees between two rounds
        gauge.append(metrics.registry.get_sample_value("provider_router_spent_usd"))

    result = await run_batches(
        plan(tmp_path, 6),
        out,
        sim,
        metrics=metrics,
        observers=standard_observers(timeline_interval=3600.0),
        progress=watch,
    )
    assert result.lines_done == 6
    spent = ledger_spent(out)
    assert spent == sim.simulator.usage > 0
    rows = list(read_timeline(out / TIMELINE_FILE))
    assert rows, "the batch route writes the timeline"
    assert rows[-1]["final"]
    assert all(row["spent"] is not None for row in rows), "every line has the ledger's money"
    assert Decimal(rows[-1]["spent"]) == spent
    assert Decimal(rows[-1]["limit"]) == Decimal(10)
    assert rows[-1]["completed"] == 6
    assert rows[-1]["datasets"]["p"]["total"] == 6
    during = [row for row in rows if not row["final"]]
    assert any(Decimal(row["spent"]) == spent for row in during), "sampled after a collect"
    assert any(row["in_flight"] == 6 for row in during), "the live batch's lines in flight"
    assert any(value == float(spent) for value in gauge), "the gauge moved while it ran"
    assert metrics.registry.get_sample_value("provider_router_spent_usd") == float(spent)
    assert metrics.registry.get_sample_value("provider_router_reserved_usd") == 0


async def test_a_sync_run_writes_a_kept_answer_whose_prompt_returns_and_sends_it_not(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    batched = plan(tmp_path, 5)
    inputs = tmp_path / "p.jsonl"
    full = inputs.read_text()
    out = tmp_path / "out"
    with pytest.raises(Killed):  # submitted, then killed before its results came
        await run_batches(batched, out, sim, api_factory=KillOnPoll)
    # The inputs lose q1 and q3 (one changed, one removed); their paid answers are kept.
    lines = full.splitlines()
    inputs.write_text("\n".join(line for n, line in enumerate(lines) if n not in (1, 3)) + "\n")
    result = await run_batches(batched, out, sim)
    assert result.not_in_inputs == 2
    kept = {e["id"]: e for e in read_records(out / "not_in_inputs.jsonl")}
    # q1 comes back as it was; q3 comes back with other content: it is a new prompt.
    lines[3] = json.dumps({"id": "q3", "prompt": "another question", "n": 3})
    inputs.write_text("\n".join(lines) + "\n")
    charged = sim.simulator.usage
    # The job's own plan (its route is part of it), through the sync runner.
    summary = await JobRunner(batched, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY).run()
    records = {r["id"]: r for r in read_records(out / "p.jsonl")}
    assert sorted(records) == [f"q{n}" for n in range(5)]
    assert records["q1"]["generation_id"] == kept["q1"]["answer"]["id"]
    assert records["q1"]["cost"] == kept["q1"]["cost_usd"]
    assert records["q3"]["generation_id"] != kept["q3"]["answer"]["id"]
    keys = {row["key"] for row in ledger_rows(out)}
    assert "p/q3" in keys, "q3 (other content) was sent"
    assert "p/q1" not in keys, "q1 was not sent again"
    assert sim.simulator.usage - charged == Decimal(records["q3"]["cost"]), "only q3 was paid"
    assert ledger_spent(out) == sim.simulator.usage
    said = " ".join(summary.recovered)
    assert "1 paid answers kept in not_in_inputs.jsonl were written to the outputs of p" in said
    assert "back in the inputs of p with different content (q3)" in said
    assert summary.datasets[0].completed == 5


async def test_done_prompts_edited_under_their_ids_go_in_a_new_batch_their_old_rows_aside(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), seed=5)
    batched = plan(tmp_path, 6)
    out = tmp_path / "out"
    first = await run_batches(batched, out, sim)
    assert first.lines_done == 6
    before = {r["id"]: r for r in read_records(out / "p.jsonl")}
    inputs = tmp_path / "p.jsonl"
    lines = inputs.read_text().splitlines()
    for n in (2, 5):
        lines[n] = json.dumps({"id": f"q{n}", "prompt": f"question {n}, edited at length"})
    inputs.write_text("\n".join(lines) + "\n")

    result = await run_batches(batched, out, sim)

    assert (result.submitted, result.lines_done) == (1, 2), "the two edited prompts, once"
    rows = {r["id"]: r for r in read_records(out / "p.jsonl")}
    assert len(rows) == len(read_records(out / "p.jsonl")) == 6
    for n in (2, 5):
        assert rows[f"q{n}"]["messages"][0]["content"] == f"question {n}, edited at length"
        assert rows[f"q{n}"]["request_digest"] != before[f"q{n}"]["request_digest"]
    assert {r["id"] for r in read_records(out / "set_aside" / "edited" / "p.jsonl")} == {"q2", "q5"}
    assert any("2 answers of dataset p no longer answer its inputs" in e for e in result.events)
    assert ledger_spent(out) == sim.simulator.usage
