"""The progress display's numbers: ETA in time and money, plain log lines, the summary table."""

from __future__ import annotations

import io
from decimal import Decimal

from rich.console import Console

from provider_router.batch.progress import dataset_eta, progress_lines, progress_table
from provider_router.batch.run_progress import DatasetProgress, RunProgress
from provider_router.batch.summary import Counter, DatasetReport, money_to_finish


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
    assert dataset_eta(progress(run=Counter()), elapsed=10.0) == (None, None)


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
    )
    lines = progress_lines(snapshot)
    assert "retries 5, errors 4, 429s 3" in lines[0]
    assert "failed: RequestTimeout 2" in lines[0]
    assert "dataset=b3, done=300/1,000, output tokens=150,000/250,000" in lines[1]
    assert "ETA time / money=20s / $0.22" in lines[1]
    console = Console(file=io.StringIO(), width=200)
    console.print(progress_table(snapshot))
    assert "b3" in console.file.getvalue()  # type: ignore[attr-defined]


def test_money_to_finish() -> None:
    report = DatasetReport(
        name="b3",
        prompts=1000,
        completed=100,
        output_tokens=50_000,
        cost=Decimal("0.11"),
        target_output_tokens=None,
        max_requests=None,
        bad_lines=0,
        lost=0,
        run=Counter(),
    )
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
