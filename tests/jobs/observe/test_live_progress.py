"""The progress display's numbers: ETA in time and money, plain log lines, the summary table."""

from __future__ import annotations

import io
from decimal import Decimal

from rich.console import Console

from provider_router.jobs.counter import Counter
from provider_router.jobs.finish import (
    budget_to_finish,
    finish_hint,
    money_to_finish,
    plan_to_finish,
)
from provider_router.jobs.observe.live import dataset_eta, progress_lines, progress_table
from provider_router.jobs.observe.summary_view import render_summary
from provider_router.jobs.snapshots import DatasetProgress, RunProgress
from provider_router.jobs.summary import DatasetReport, RunSummary, StopReason


def progress(**overrides: object) -> DatasetProgress:
    run = Counter(requests=100, output_tokens=50_000, cost=Decimal("0.11"))
    fields: dict[str, object] = {
        "name": "b3",
        "completed": 300,
        "total": 1000,
        "output_tokens": 150_000,
        "target_output_tokens": 250_000,
        "in_flight": 20,
        "cost": Decimal("0.33"),
        "run": run,
        "finished": False,
    }
    fields.update(overrides)
    return DatasetProgress(**fields)  # type: ignore[arg-type]


def test_eta_uses_this_runs_rates_and_the_nearer_limit() -> None:
    # 100,000 tokens left to the target at 5,000 tok/s (50,000 in 10 s): 20 s, $0.22.
    seconds, money = dataset_eta(progress(), elapsed=10.0)
    assert seconds == 20.0
    assert money == Decimal("0.22")
    # Without a target: 700 prompts × 500 tokens = 350,000 tokens: 70 s.
    seconds, _ = dataset_eta(progress(target_output_tokens=None), elapsed=10.0)
    assert seconds == 70.0
    assert dataset_eta(progress(finished=True), elapsed=10.0) == (0.0, Decimal(0))
    # No answer in this run: no time, but the money of every run so far still counts.
    assert dataset_eta(progress(run=Counter()), elapsed=10.0) == (None, Decimal("0.22"))


def test_plain_lines_and_table() -> None:
    snapshot = RunProgress(
        datasets=(progress(),),
        elapsed=10.0,
        ledger=None,
        in_flight=20,
        stopping=None,
        failures_by_kind={"RequestTimeout": 2},
        retries=5,
        rate_limited=3,
        errors=4,
        waiting_for_budget=5,
    )
    lines = progress_lines(snapshot)
    assert "in flight 20 | waiting for budget 5" in lines[0]  # apart, never one number
    assert "started=20" in lines[1]  # the dataset's requests, sent or waiting
    assert "retries 5, errors 4, 429s 3" in lines[0]
    assert "failed: RequestTimeout 2" in lines[0]
    assert "dataset=b3, done=300/1,000, output tokens=150,000/250,000" in lines[1]
    assert "ETA time / money=20s / $0.22" in lines[1]
    console = Console(file=io.StringIO(), width=200)
    console.print(progress_table(snapshot))
    assert "b3" in console.file.getvalue()  # type: ignore[attr-defined]


def dataset_report(completed: int, output_tokens: int, cost: str) -> DatasetReport:
    """A dataset of 1,000 prompts, no target, at the end of a run."""
    return DatasetReport(
        name="b3",
        prompts=1000,
        completed=completed,
        output_tokens=output_tokens,
        cost=Decimal(cost),
        target_output_tokens=None,
        max_requests=None,
        bad_lines=0,
        lost=0,
        run=Counter(),
    )


def test_money_to_finish() -> None:
    report = dataset_report(100, 50_000, "0.11")
    # 900 prompts × 500 tokens × $0.0000022 per token.
    assert money_to_finish(report, None) == Decimal("0.99")
    report.target_output_tokens = 60_000
    assert money_to_finish(report, None) == Decimal("0.02")
    report.output_tokens = 60_000
    assert money_to_finish(report, None) == 0
    empty = DatasetReport(
        name="b4",
        prompts=10,
        completed=0,
        output_tokens=0,
        cost=Decimal(0),
        target_output_tokens=1000,
        max_requests=None,
        bad_lines=0,
        lost=0,
        run=Counter(),
    )
    assert money_to_finish(empty, None) is None
    assert money_to_finish(empty, Decimal("0.000002")) == Decimal("0.00")


def test_to_finish_is_one_pair_of_numbers_in_the_message_the_table_and_the_json() -> None:
    """What more must be spent, and the budget that allows it: the same everywhere."""
    report = dataset_report(400, 200_000, "0.44")
    each, to_finish = plan_to_finish([report])
    assert each == [Decimal("0.66")] == [to_finish]  # 600 × 500 tokens × $0.0000022
    spent, budget, largest = Decimal("0.45"), Decimal("0.50"), Decimal("0.05")
    needed = budget_to_finish(spent, to_finish, largest)
    assert needed == Decimal("1.33")  # 0.45 + 0.66 × 1.25 + 0.05, up to the cent
    hint = finish_hint(StopReason.BUDGET, budget, spent, to_finish, needed, largest)
    assert "about $0.66 more finishes the plan" in hint
    assert "a budget of $1.33" in hint
    report.to_finish = to_finish
    summary = RunSummary(
        reason=StopReason.BUDGET,
        datasets=[report],
        providers={},
        provider_health={},
        budget=budget,
        spent=spent,
        reserved=Decimal(0),
        to_finish=to_finish,
        budget_to_finish=needed,
        wall_time=1.0,
        bad_lines=[],
        recovered=[],
        message=hint.lstrip("; "),
    )
    console = Console(file=io.StringIO(), width=300)
    render_summary(summary, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "to finish the plan: about $0.66 more (a budget of $1.33)" in text
    assert summary.to_json()["to_finish_usd"] == "0.66"
    assert summary.to_json()["budget_to_finish_usd"] == "1.33"
    credits = finish_hint(StopReason.CREDITS, budget, spent, to_finish, needed, largest)
    assert "about $0.66 more finishes the plan" in credits
