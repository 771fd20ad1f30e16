"""Answers cut at ``max_tokens``: a first-class outcome, and sent again only on request.

With a ``max_tokens`` below what the local OpenRouter's answers run to, some answers end
``finish_reason: length``: paid for, in the outputs, not whole. Every view counts them
with their cost (the live lines, ``timeline.ndjson``, ``status``, ``summary.json``, the
report, Prometheus), and ``run --max-tokens N --redo-truncated`` moves them aside (kept)
and sends only them again, with the larger cap, paying for nothing else twice.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import assert_consistent, ledger_spent, read_records, run_cli, write_prompts

from provider_router.client.metrics import Metrics
from provider_router.jobs import JobRunner, StopReason, standard_observers
from provider_router.jobs.observe.live import progress_lines
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.observe.timeline import read_timeline
from provider_router.jobs.run import run_plan
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

PROMPTS = 40
CAP = 100
SIM = {"median_completion_tokens": 100.0, "seed": 11}


def plan(tmp_path: Path, max_tokens: int = CAP, **dataset: Any) -> Plan:
    path = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    return Plan.model_validate(
        {
            "model": dataset.pop("model", "moonshotai/kimi-k2.5"),
            "budget": "10",
            "concurrency": 8,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": max_tokens},
            "datasets": [{"name": "p", "input": str(path), **dataset}],
        }
    )


def cut(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["finish_reason"] == "length"]


def sent(sim: SimulatorServer, max_tokens: int) -> int:
    return sum(1 for r in sim.requests if r.route == "chat" and r.max_tokens == max_tokens)


async def test_cut_answers_are_counted_with_their_cost_in_every_view(
    tmp_path: Path, openrouter_sim_factory: Any
) -> None:
    sim = await openrouter_sim_factory(**SIM)
    out = tmp_path / "out"
    metrics = Metrics()
    runner = JobRunner(
        plan(tmp_path),
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        observers=standard_observers(),
        router_options={"metrics": metrics},
    )
    summary = await runner.run()
    assert summary.reason is StopReason.COMPLETE
    records = read_records(out / "p.jsonl")
    truncated = cut(records)
    assert 0 < len(truncated) < PROMPTS  # the finding: some answers are cut
    assert all(r["max_tokens"] == CAP for r in records)  # each row says its cap
    cost = sum((Decimal(r["cost"]) for r in truncated), Decimal(0))
    n = len(truncated)
    # summary.json: per dataset (every run), this run, and the job.
    data = json.loads((out / "summary.json").read_text())
    dataset = data["datasets"]["p"]
    assert (dataset["truncated"], Decimal(dataset["truncated_cost_usd"])) == (n, cost)
    assert dataset["this_run"]["truncated"] == n
    assert Decimal(dataset["this_run"]["truncated_cost"]) == cost
    assert (data["truncated"], Decimal(data["truncated_cost_usd"])) == (n, cost)
    # The live lines (a snapshot of the run as the display polls it).
    [line] = [x for x in progress_lines(runner.progress()) if "dataset=p" in x]
    assert f"cut={n} (" in line
    # timeline.ndjson, which status and the report read while a run goes.
    last = list(read_timeline(out / "timeline.ndjson"))[-1]
    assert (last["truncated"], last["datasets"]["p"]["truncated"]) == (n, n)
    assert Decimal(last["truncated_cost"]) == cost
    # status, finished and while running (the timeline's last line).
    said = "\n".join(status_lines(out, now=0.0))
    assert f"{n:,} of {PROMPTS} answers" in said
    assert "were cut at max_tokens (finish_reason: length)" in said
    assert f"{n:,} cut at max_tokens" in said
    # The report.
    page = write_report(out).read_text()
    assert "<th>cut at max_tokens</th>" in page
    assert f'<td data-cell="truncated">{n:,} (' in page
    assert 'data-note="truncated"' in page
    # Prometheus.
    scraped = metrics.registry.get_sample_value
    total = sum(
        scraped("provider_router_truncated_total", {"provider": p}) or 0
        for p in {r["provider"] for r in truncated}
    )
    assert total == n
    dollars = sum(
        scraped("provider_router_truncated_cost_usd_total", {"provider": p}) or 0
        for p in {r["provider"] for r in truncated}
    )
    assert dollars == pytest.approx(float(cost))


async def test_redo_truncated_sends_only_the_cut_answers_again_with_the_larger_cap(
    tmp_path: Path, openrouter_sim_factory: Any
) -> None:
    sim = await openrouter_sim_factory(**SIM)
    out = tmp_path / "out"
    first = await run_plan(plan(tmp_path), out, base_url=sim.url, api_key=DEFAULT_TEST_KEY,
                           preflight=False)  # fmt: skip
    assert first.reason is StopReason.COMPLETE
    before = read_records(out / "p.jsonl")
    was_cut = {r["id"] for r in cut(before)}
    kept = {r["id"]: r for r in before if r["id"] not in was_cut}
    # The same cap again: they would be cut again, so nothing moves, nothing is sent.
    with pytest.raises(Exception, match="would be cut again") as refused:
        await run_plan(plan(tmp_path), out, base_url=sim.url, api_key=DEFAULT_TEST_KEY,
                       preflight=False, redo_truncated=True)  # fmt: skip
    assert type(refused.value).__name__ == "JobRefused"
    assert sent(sim, CAP) == PROMPTS
    again = await run_plan(
        plan(tmp_path, max_tokens=4 * CAP),
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        preflight=False,
        redo_truncated=True,
    )
    assert again.reason is StopReason.COMPLETE
    assert sent(sim, 4 * CAP) == len(was_cut)  # only the cut ones went again
    after = read_records(out / "p.jsonl")
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in before)  # each once
    for record in after:
        if record["id"] in was_cut:
            assert record["max_tokens"] == 4 * CAP  # the re-sent rows carry their own cap
        else:
            assert record == kept[record["id"]]  # untouched, not paid again
    aside = read_records(out / "set_aside" / "truncated" / "p.jsonl")
    assert {r["id"] for r in aside} == was_cut  # paid for: kept, never deleted
    assert all(r["finish_reason"] == "length" for r in aside)
    # Money: the ledger holds every charge, the old cut answers' included.
    assert ledger_spent(out) == sim.simulator.usage
    assert_consistent(out, ["p"])
    summary = again.summary
    assert summary is not None
    [report] = summary.datasets
    assert report.set_aside == len(was_cut)
    assert report.set_aside_cost == sum((Decimal(r["cost"]) for r in aside), Decimal(0))
    assert any("moved to" in note and "sent again with max_tokens 400" in note
               for note in summary.recovered)  # fmt: skip


async def test_the_command_line_says_how_to_redo_and_refuses_what_cannot(
    tmp_path: Path, openrouter_sim_factory: Any
) -> None:
    sim = await openrouter_sim_factory(**SIM)
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    out = tmp_path / "out"
    base = [
        "run", str(prompts), "--out", str(out), "--model", "moonshotai/kimi-k2.5",
        "--budget", "5", "--base-url", sim.url, "--progress", "off", "--no-preflight",
    ]  # fmt: skip
    code, printed, err = await run_cli(*base, "--max-tokens", str(CAP))
    assert code == 0, err
    n = len(cut(read_records(out / "p.jsonl")))
    assert f"{n} of {PROMPTS} answers" in printed  # the summary's sentence
    hint = next(line for line in err.splitlines() if line.startswith("To send the"))
    assert f"--max-tokens {2 * CAP}" in hint
    assert hint.endswith("--redo-truncated")
    requests = len(sim.requests)
    # Not on Ray: a usage error before anything is read or sent.
    code, _, err = await run_cli(*base, "--max-tokens", "400", "--redo-truncated", "--ray")
    assert code == 2
    assert "--redo-truncated runs on one machine" in err
    # A cap that would cut them again: exit 2, nothing sent, nothing moved.
    code, _, err = await run_cli(*base, "--max-tokens", "50", "--redo-truncated")
    assert code == 2
    assert "would be cut again" in err
    assert len(sim.requests) == requests
    assert len(cut(read_records(out / "p.jsonl"))) == n
    # The hint, as printed, does it.
    command = hint.split(": provider-router ", 1)[1].split(" ")
    code, _, err = await run_cli(*command)
    assert code == 0, err
    assert f"p: {n} answer(s) cut at max_tokens moved to" in err
    assert Counter(r.max_tokens for r in sim.requests if r.route == "chat")[2 * CAP] == n


async def test_redo_truncated_on_the_batch_api_route(
    tmp_path: Path, openrouter_sim_factory: Any
) -> None:
    sim = await openrouter_sim_factory(speed=float("inf"), **SIM)
    out = tmp_path / "out"
    batched = {"model": "moonshotai/kimi-k3", "route": "batch"}
    first = await run_plan(plan(tmp_path, **batched), out, base_url=sim.url,
                           api_key=DEFAULT_TEST_KEY, batch=_fast())  # fmt: skip
    assert first.reason is StopReason.COMPLETE
    was_cut = {r["id"] for r in cut(read_records(out / "p.jsonl"))}
    assert was_cut
    larger = plan(tmp_path, max_tokens=4 * CAP, **batched)
    again = await run_plan(larger, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY,
                           batch=_fast(), redo_truncated=True)  # fmt: skip
    assert again.reason is StopReason.COMPLETE
    lines = sum(len(b.submission.requests) for b in sim.simulator.batches)
    assert lines == PROMPTS + len(was_cut)  # only the cut ones went again
    after = read_records(out / "p.jsonl")
    assert sorted(r["id"] for r in after) == sorted(f"q{i}" for i in range(PROMPTS))
    assert {r["id"] for r in after if r["max_tokens"] == 4 * CAP} == was_cut
    assert again.batch is not None
    assert any("moved to" in event for event in again.batch.result.events)


def _fast() -> Any:
    from provider_router.jobs.run import BatchOptions

    return BatchOptions(poll=0.01, lost_grace=0.3)
