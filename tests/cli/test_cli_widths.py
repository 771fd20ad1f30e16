"""Every table of the command line fits 80, 100 and 120 columns, and a pipe.

On a terminal (``Console(force_terminal=True)``) and piped (plain) alike: no line
wider than the page, no name or number cut (``DeepIn…``, ``150/1…``), each row's
figures on the row's own line, long reasons under their row.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import re
from decimal import Decimal
from pathlib import Path

import pytest
from rich.console import Console

from provider_router.catalog.records import ModelEndpoints
from provider_router.catalog.verdicts import EndpointVerdict, Estimate, VerificationReport
from provider_router.cli._options import load_listing
from provider_router.cli._project_render import render_projection
from provider_router.cli.endpoints import build_report, render_report
from provider_router.cli.observe import print_status
from provider_router.cli.verify import print_verification
from provider_router.jobs.counter import Counter
from provider_router.jobs.observe.live import progress_table
from provider_router.jobs.observe.status import DatasetStatus, RunStatus
from provider_router.jobs.observe.summary_view import render_summary
from provider_router.jobs.snapshots import DatasetProgress, RunProgress
from provider_router.jobs.summary import DatasetReport, RunSummary, StopReason
from provider_router.planning.projection import project
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload

SNAPSHOT = Path(__file__).parents[2] / "examples" / "market.json"
WIDTHS = [80, 100, 120]
BOX = set("┏┳┓┃┡╇┩│├┼┤└┴┘━─")


def listing() -> ModelEndpoints:
    return asyncio.run(load_listing("moonshotai/kimi-k2.5", snapshot=str(SNAPSHOT)))


def shown(draw: object, width: int, *, terminal: bool, sentences: int = 0) -> list[str]:
    """What ``draw(console)`` printed on a console ``width`` wide, a terminal or a pipe
    (whose first ``sentences`` lines may be longer: a log line is kept whole)."""
    out = io.StringIO()
    console = Console(
        file=out, width=width, force_terminal=terminal, color_system=None, highlight=False
    )
    draw(console)  # type: ignore[operator]
    lines = out.getvalue().splitlines()
    assert "…" not in "\n".join(lines), "a cell was cut"
    narrow = lines if terminal else lines[sentences:]
    assert max(len(line) for line in narrow) <= width, "a line passes the width"
    if not terminal:
        assert not BOX & set("".join(lines)), "box characters in piped output"
    return lines


def row_of(lines: list[str], name: str) -> str:
    """The line of the row named ``name`` (its first or second cell); when the table is
    stacked (too narrow for columns), the row's block."""
    for at, line in enumerate(lines):
        cells = [c for c in re.split(r"\s{2,}|\s*[│┃]\s*", line.strip()) if c]
        if name not in cells[:2]:
            continue
        block = list(itertools.takewhile(lambda b: b.startswith("   "), lines[at + 1 :]))
        if len(cells) == 1 and block and ": " in block[0]:  # stacked: header: value
            return " ".join([line, *block])
        return line
    raise AssertionError(f"no row for {name!r}")


def assert_in(row: str, *parts: str) -> None:
    for part in parts:
        assert part in row, f"{part!r} not on its row: {row!r}"


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_endpoints_table(width: int, terminal: bool) -> None:
    report = build_report(
        listing(), ProviderPolicy("int4"), Workload(prompt_tokens=200, completion_tokens=2000)
    )
    lines = shown(lambda c: render_report(report, c), width, terminal=terminal)
    # 11 endpoints: a row each, a reason under each, a header and a caption.
    assert len(lines) <= 45, f"{len(lines)} lines"
    for endpoint in report.listing.endpoints:
        row = row_of(lines, endpoint.provider_name)
        assert ("allowed" in row) != ("rejected" in row)
    chutes = row_of(lines, "Chutes")
    assert_in(chutes, "$0.45", "$4.54")  # prices and cost on the row
    text = " ".join(" ".join(line.strip(" │") for line in lines).split())
    assert "quantization nvfp4 is below the int4 floor" in text  # reasons whole, below


def summary(prompts: int = 1000, name: str = "conversations-long-name") -> RunSummary:
    run = Counter(requests=150, output_tokens=1_234_567, cost=Decimal("2.7161"))
    report = DatasetReport(
        name=name,
        prompts=prompts,
        completed=150,
        output_tokens=1_234_567,
        cost=Decimal("2.7161"),
        target_output_tokens=10_000_000,
        max_requests=None,
        bad_lines=0,
        lost=0,
        run=run,
    )
    report.to_finish = Decimal("19.28")
    return RunSummary(
        reason=StopReason.BUDGET,
        datasets=[report],
        providers={"DeepInfra": run, "Moonshot AI": Counter(requests=3)},
        provider_health={},
        budget=Decimal(3),
        spent=Decimal("2.7161"),
        reserved=Decimal(0),
        to_finish=Decimal("19.28"),
        wall_time=1234.5,
        bad_lines=[],
        recovered=[],
        message="the budget of $3.00 is used up",
    )


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_runs_final_tables(width: int, terminal: bool) -> None:
    lines = shown(lambda c: render_summary(summary(), c), width, terminal=terminal)
    row = row_of(lines, "conversations-long-name")
    assert_in(row, "150/1,000", "1,234,567", "$2.72", "$19.28")
    assert "$2.72" in row_of(lines, "DeepInfra")
    assert row_of(lines, "Moonshot AI")


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_live_table(width: int, terminal: bool) -> None:
    dataset = DatasetProgress(
        name="conversations-long-name",
        completed=150,
        total=1000,
        output_tokens=1_234_567,
        target_output_tokens=10_000_000,
        in_flight=256,
        cost=Decimal("2.7161"),
        run=Counter(requests=150, output_tokens=1_234_567, cost=Decimal("2.7161")),
        finished=False,
    )
    snapshot = RunProgress(
        datasets=(dataset,),
        elapsed=61.0,
        ledger=None,
        in_flight=256,
        stopping=None,
        failures_by_kind={},
        retries=0,
        rate_limited=0,
        errors=0,
        waiting_for_budget=0,
    )
    lines = shown(lambda c: c.print(progress_table(snapshot)), width, terminal=terminal)
    row = row_of(lines, "conversations-long-name")
    assert_in(row, "150/1,000", "1,234,567/10,000,000", "$2.72")


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_projection_tables(width: int, terminal: bool) -> None:
    demands = [DatasetDemand(f"dataset-{i}", target_output_tokens=10_000_000) for i in range(1, 7)]
    projection = project(
        demands,
        listing(),
        ProviderPolicy("int4"),
        WorkloadEstimate(Decimal(200), Decimal(2000)),
        budget=Decimal(100),
    )

    lines = shown(
        lambda c: render_projection(projection, file=io.StringIO(), console=c),
        width,
        terminal=terminal,
    )
    assert "$134.70" in row_of(lines, "total")
    assert "Chutes (cheapest)" in " ".join(lines)


def verification() -> VerificationReport:
    estimate = Estimate(0.504, 0.441, 0.567, 8)
    failed = EndpointVerdict(
        tag="deepinfra/fp4",
        provider_name="DeepInfra",
        passed=False,
        reasons=(
            "greedy agreement 0.504 (95% CI 0.441–0.567, n=8) is below 0.900 (0.9 × the "
            "reference's self-agreement 1.000)",
        ),
        agreement=estimate,
        prompt_token_ratio=Estimate(1.0, 1.0, 1.0, 8),
        divergence=Estimate(0.2345, 0.2, 0.3, 8),
        accepted=1,
        judged=8,
    )
    passed = EndpointVerdict(
        tag="moonshotai/int4",
        provider_name="Moonshot AI",
        passed=True,
        agreement=Estimate(1.0, 0.9, 1.0, 8),
        tool_validity=Estimate(1.0, 0.9, 1.0, 8),
        prompt_token_ratio=Estimate(1.0, 1.0, 1.0, 8),
        unmeasured=("top-k divergence: not measured: Moonshot AI lists no logprobs",),
        accepted=8,
        judged=8,
    )
    return VerificationReport(
        model="moonshotai/kimi-k2.5",
        reference="moonshotai/int4",
        self_agreement=Estimate(1.0, 0.9, 1.0, 8),
        endpoints=(failed, passed),
        cost=Decimal("0.0312"),
    )


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_verify_table(width: int, terminal: bool) -> None:
    lines = shown(lambda c: print_verification(verification(), c), width, terminal=terminal)
    failed = row_of(lines, "deepinfra/fp4")
    assert_in(failed, "FAIL", "0.50", "1/8")
    assert "8/8" in row_of(lines, "moonshotai/int4")
    text = " ".join(" ".join(line.strip(" │") for line in lines).split())
    assert "is below 0.900 (0.9 × the reference's self-agreement 1.000)" in text


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_status(width: int, terminal: bool) -> None:
    status = RunStatus(
        head=[
            "/home/someone/jobs/runs/b3-conversations: running (last update 2 s ago)",
            "spent $27.16 of $100.00, reserved $3.20, in flight 2,000, waiting for budget "
            "0, elapsed 1.2 h",
        ],
        datasets=[DatasetStatus("conversations-long-name", "150/1,000", "1,234,567", "$2.72")],
        tail=[],
    )
    lines = shown(lambda c: print_status(status, c), width, terminal=terminal, sentences=2)
    assert "150/1,000" in row_of(lines, "conversations-long-name")
    words = " ".join(" ".join(lines).split())
    assert "in flight 2,000, waiting for budget 0" in words  # wrapped at spaces, not cut
