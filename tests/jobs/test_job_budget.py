"""The budget is the job's, and "to finish" is one true number.

A ``--budget`` below what the job spent is refused as ``ledger topup`` refuses it; a
limit an operator set with ``ledger topup`` stands until a raise is explicit; every
``To resume:`` line carries the amount that really resumes; after a stop, "to finish",
the resume command, ``status``, ``summary.json`` and the report agree, and the printed
command finishes the job, with or without targets. Against the local OpenRouter, the
real command (a subprocess) where a user would type it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sqlite3
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from html import unescape
from pathlib import Path

import pytest
from _job_helpers import assert_consistent, ledger_spent, read_records, run_cli, write_prompts

from provider_router import JobRefused, SQLiteLedger
from provider_router._format import decimal_str, format_usd
from provider_router._money import from_units
from provider_router.cli.run import resume_command
from provider_router.jobs import StopReason, run_plan
from provider_router.jobs.budget import choose_limit
from provider_router.jobs.finish import Resume, finish_words, resume_budget
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.observe.status import status_lines
from provider_router.ledger import LedgerState
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"
D = Decimal


def resume_argv(stderr: str) -> list[str]:
    """The ``To resume:`` command, as arguments after ``provider-router``."""
    line = next(x for x in stderr.splitlines() if x.startswith("To resume: "))
    words = shlex.split(line.removeprefix("To resume: "))
    assert words[0] == "provider-router", line
    return words[1:]


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def limit_of(out: Path) -> Decimal:
    """The job ledger's limit, read from its file."""
    con = sqlite3.connect(out / "ledger.sqlite")
    try:
        (units,) = con.execute("SELECT limit_units FROM totals").fetchone()
    finally:
        con.close()
    return from_units(units)


def job_argv(prompts: Path, out: Path, sim: SimulatorServer, budget: str, *extra: str) -> list[str]:
    return [
        "run", str(prompts), "--out", str(out), "--model", MODEL, "--budget", budget,
        "--exclude-below", "int4", "--base-url", sim.url, "--progress", "off", *extra,
    ]  # fmt: skip


def _report_to_finish(out: Path) -> str:
    page = write_report(out).read_text(encoding="utf-8")
    headline = re.search(r'<p class="meta">(.*?)</p>', page, re.S)
    assert headline is not None
    text = unescape(re.sub(r"<[^>]+>", "", headline.group(1)))
    found = re.search(
        r"to finish: (about \$[\d,.]+ more \(a budget of \$[\d,.]+\)|nothing more)", text
    )
    assert found is not None, text
    return found.group(1)


# --- one true number for what is left ---------------------------------------------------


@pytest.mark.parametrize("target", [None, 40_000], ids=["no-target", "target"])
async def test_after_a_budget_stop_every_view_agrees_and_the_printed_command_finishes(
    tmp_path: Path, openrouter_sim_factory: Factory, target: int | None
) -> None:
    sim = await openrouter_sim_factory(seed=5)
    prompts = write_prompts(tmp_path / "p.jsonl", 150)
    out = tmp_path / "out"
    extra = () if target is None else ("--target-output-tokens", str(target))
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.05", *extra))
    assert code == 3, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    p = summary["datasets"]["p"]
    done = len(read_records(out / "p.jsonl"))
    assert p["completed"] == done < 150
    # Every prompt of the file counts, sent in this run (and refused) or never read.
    assert p["prompts"] == 150
    assert p["finished"] is False
    to_finish = Decimal(summary["to_finish_usd"])
    per_prompt = Decimal(p["cost"]) / done
    if target is None:
        # The prompts left, at the observed cost per prompt (to the cent).
        assert abs(to_finish - (150 - done) * per_prompt) <= Decimal("0.01"), to_finish
    assert to_finish > 0
    needed = Decimal(summary["budget_to_finish_usd"])
    words = finish_words(to_finish, needed)
    # The message, the resume command, status and the report say the same amounts.
    assert f"run again with a budget of {format_usd(needed)} to resume" in summary["message"]
    again = resume_argv(err)
    assert Decimal(option(again, "--budget")) == needed
    assert f"to finish: {words}" in status_lines(out, now=time.time())
    assert _report_to_finish(out) == words
    # The printed command, as printed, finishes the job.
    code, _, err = await run_cli(*again)
    assert code == 0, err[-2000:]
    finished = json.loads((out / "summary.json").read_text())
    assert finished["reason"] == "complete"
    assert finished["to_finish_usd"] == "0"
    records = assert_consistent(out, ["p"])
    if target is None:
        assert len(records) == 150
    else:
        assert sum(r["usage"]["completion_tokens"] for r in records) >= target
    assert Decimal(finished["spent_usd"]) <= needed


async def test_a_pilots_prompts_are_not_the_whole_job(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    """A run that sent a few ids only (a pilot) leaves every other prompt to do."""
    from provider_router.jobs.runner import JobRunner

    sim = await openrouter_sim_factory(seed=2)
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    plan = Plan.single(
        [str(prompts)], model=MODEL, budget=D(5), exclude_below="int4", max_tokens=300
    )
    runner = JobRunner(
        plan, tmp_path / "out", base_url=sim.url, api_key=DEFAULT_TEST_KEY,
        only={"p": {"q0", "q1", "q2"}},
    )  # fmt: skip
    summary = await runner.run()
    (report,) = summary.datasets
    assert (report.completed, report.prompts, report.finished) == (3, 40, False)
    assert summary.to_finish is not None
    assert summary.to_finish > 0


# --- a budget below what was spent ------------------------------------------------------


async def test_a_budget_below_what_the_job_spent_is_refused_and_changes_nothing(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=7)
    prompts = write_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "out"
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.03", "--max-tokens", "400"))
    assert code == 3, err[-2000:]
    spent = ledger_spent(out)
    assert spent > D("0.01")
    journal = (out / "journal.jsonl").read_bytes()
    usage = sim.simulator.usage
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.01", "--max-tokens", "400"))
    assert code == 2, err[-2000:]
    assert "--budget $0.01 is below the" in err
    assert "this job already spent" in err
    assert "a settle overran" not in err
    assert limit_of(out) == D("0.03"), "the limit is as it was"
    assert (out / "journal.jsonl").read_bytes() == journal
    assert sim.simulator.usage == usage, "nothing was sent"


# --- a limit set with `ledger topup` stands ----------------------------------------------


async def test_a_limit_an_operator_set_with_topup_stands_until_a_raise_is_explicit(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=8)
    prompts = write_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "out"
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.03"))
    assert code == 3, err[-2000:]
    # The operator stops the job where it is (what `ledger topup`'s own error suggests).
    spent = ledger_spent(out)
    code, _, err = await run_cli(
        "ledger", "topup", str(out / "ledger.sqlite"), "--limit", str(spent)
    )
    assert code == 0, err
    journal = (out / "journal.jsonl").read_bytes()
    usage = sim.simulator.usage
    for budget in ("0.03", "0.2"):  # the job's old command, and a higher budget
        code, _, err = await run_cli(*job_argv(prompts, out, sim, budget))
        assert code == 2, err[-2000:]
        assert "set outside this job's runs (by `provider-router ledger topup`)" in err
        assert f"--budget {budget} --raise-budget" in err
        assert "leave the job stopped there" in err
        assert limit_of(out) == spent
        assert (out / "journal.jsonl").read_bytes() == journal
        assert sim.simulator.usage == usage, "nothing was sent"
    # An explicit raise is taken, and said.
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.2", "--raise-budget"))
    assert code == 0, err[-2000:]
    assert "raised to $0.20 (--budget)" in err
    assert len(assert_consistent(out, ["p"])) == 60


async def test_a_top_up_of_the_ledger_counts_when_the_old_command_runs_again(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=9)
    prompts = write_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "out"
    argv = job_argv(prompts, out, sim, "0.03")
    code, _, err = await run_cli(*argv)
    assert code == 3, err[-2000:]
    code, _, err = await run_cli("ledger", "topup", str(out / "ledger.sqlite"), "--add", "1")
    assert code == 0, err
    code, _, err = await run_cli(*argv)
    assert code == 0, err[-2000:]
    assert "it stands (--budget $0.03 does not lower it)" in err
    assert limit_of(out) == D("1.03")
    assert len(assert_consistent(out, ["p"])) == 60


async def test_a_topup_that_stops_a_running_job_is_named_and_its_resume_line_raises_it(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=3, speed=50)
    prompts = write_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "out"
    plan = Plan.single(
        [str(prompts)], model=MODEL, budget=D(1), exclude_below="int4", max_tokens=400,
        concurrency=4,
    )  # fmt: skip
    run = asyncio.ensure_future(
        run_plan(plan, out, api_key=DEFAULT_TEST_KEY, base_url=sim.url, preflight=False)
    )
    stopped_at = D(0)
    while not run.done():
        await asyncio.sleep(0.01)
        if (out / "ledger.sqlite").exists() and len(read_records(out / "p.jsonl")) >= 10:
            # `provider-router ledger topup --limit <spent + reserved>`, while it runs.
            async with SQLiteLedger(out / "ledger.sqlite") as other:
                state = await other.snapshot()
                stopped_at = state.spent + state.reserved
                await other.set_limit(stopped_at)
            break
    outcome = await run
    summary = outcome.summary
    assert summary is not None
    assert stopped_at > 0, "the run ended before the operator stopped it"
    assert summary.reason is StopReason.BUDGET
    assert summary.budget == stopped_at, "the summary names the limit in force"
    assert summary.limit_outside
    assert "it was changed during the run (by `provider-router ledger topup`)" in summary.message
    assert "and --raise-budget" in summary.message
    resume = resume_budget(summary)
    assert resume.raise_limit
    assert resume.budget == summary.budget_to_finish
    line = resume_command(["run", "--plan", "x.yaml", "--out", str(out)], resume)
    assert line.endswith(f"--budget {decimal_str(resume.budget)} --raise-budget")
    # The line's amount and flag resume it to the end.
    plan = plan.with_overrides(budget=resume.budget)
    with pytest.raises(JobRefused, match="--raise-budget"):
        await run_plan(plan, out, api_key=DEFAULT_TEST_KEY, base_url=sim.url, preflight=False)
    outcome = await run_plan(
        plan, out, api_key=DEFAULT_TEST_KEY, base_url=sim.url, preflight=False, raise_budget=True
    )
    assert outcome.reason is StopReason.COMPLETE
    assert len(assert_consistent(out, ["p"])) == 120


async def test_the_resume_line_after_add_budget_carries_the_budget_not_another_add(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=1, credits="0.04")
    prompts = write_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "out"
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.02"))
    assert code == 3, err[-2000:]
    argv = job_argv(prompts, out, sim, "0.02")
    argv[argv.index("--budget") : argv.index("--budget") + 2] = ["--add-budget", "5"]
    code, _, err = await run_cli(*argv)
    assert code == 4, err[-2000:]  # OpenRouter's credits ran out first
    again = resume_argv(err)
    assert "--add-budget" not in again, "running it again would add $5 more"
    assert Decimal(option(again, "--budget")) == D("5.02") == limit_of(out)
    sim.top_up(5)
    code, _, err = await run_cli(*again)
    assert code == 0, err[-2000:]
    assert limit_of(out) == D("5.02")
    assert len(assert_consistent(out, ["p"])) == 60


async def test_after_a_credits_stop_the_printed_command_finishes_the_job(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    """Once the credits are topped up, the command as printed does not stop again on a
    budget that could never finish the plan: it carries the budget that does."""
    sim = await openrouter_sim_factory(seed=4, credits="0.05")
    prompts = write_prompts(tmp_path / "p.jsonl", 150)
    out = tmp_path / "out"
    code, _, err = await run_cli(*job_argv(prompts, out, sim, "0.08"))
    assert code == 4, err[-2000:]  # OpenRouter's credits ran out first
    summary = json.loads((out / "summary.json").read_text())
    needed = Decimal(summary["budget_to_finish_usd"])
    assert needed > D("0.08"), "the old budget would stop the resume again"
    assert f"then run again with a budget of {format_usd(needed)} to resume" in (summary["message"])
    again = resume_argv(err)
    assert Decimal(option(again, "--budget")) == needed
    sim.top_up(5)
    code, _, err = await run_cli(*again)
    assert code == 0, err[-2000:]
    assert len(assert_consistent(out, ["p"])) == 150


# --- the rules, as a table --------------------------------------------------------------


def _state(limit: str, spent: str, reserved: str = "0") -> LedgerState:
    zero = D(0)
    return LedgerState(D(limit), D(spent), D(reserved), 0, 0, 0, 0, zero, zero, zero)


@pytest.mark.parametrize(
    ("given", "limit", "spent", "last", "raise_limit", "budget", "set_limit"),
    [
        ("5", "5", "1", "5", False, "5", False),  # the same budget: a plain resume
        ("8", "5", "1", "5", False, "8", True),  # the job's own limit: a top-up
        ("3", "5", "1", "5", False, "3", True),  # ... or a cut
        ("8", "5", "1", None, False, "8", True),  # an older journal: the limit is the job's
        ("5", "9", "1", "5", False, "9", False),  # a top-up by `ledger topup` stands
        ("7", "9", "1", "5", False, "7", True),  # a lower budget is taken, and said
        ("8", "2", "2", "5", True, "8", True),  # an explicit raise of the operator's stop
        ("1", "2", "1", "5", False, "1", True),  # at what was spent: stops new requests
    ],
)
def test_what_a_budget_does_to_the_jobs_own_ledger(
    given: str,
    limit: str,
    spent: str,
    last: str | None,
    raise_limit: bool,
    budget: str,
    set_limit: bool,
) -> None:
    choice = choose_limit(
        D(given), _state(limit, spent), None if last is None else D(last), raise_limit=raise_limit
    )
    assert (choice.budget, choice.set_limit) == (D(budget), set_limit)
    assert (choice.note is None) == (not set_limit and D(budget) == D(limit) == D(given))


@pytest.mark.parametrize(
    ("given", "limit", "spent", "last", "refusal"),
    [
        ("0.5", "5", "1", "5", r"--budget \$0.50 is below the \$1 this job already spent"),
        ("5", "2", "2", "5", r"would raise it.*--budget 5 --raise-budget.*stopped there"),
        ("8", "6", "1", "5", r"would raise it.*--budget 8 --raise-budget.*with --budget 6;"),
    ],
)
def test_what_a_budget_may_not_do_is_refused(
    given: str, limit: str, spent: str, last: str, refusal: str
) -> None:
    with pytest.raises(JobRefused, match=refusal):
        choose_limit(D(given), _state(limit, spent), D(last))


def test_resume_command_replaces_the_budget_and_any_add_budget() -> None:
    argv = ["run", "p.jsonl", "--out", "o", "--add-budget", "5", "--model", "m/x"]
    line = resume_command(argv, Resume(D("5.02"), raise_limit=True))
    assert shlex.split(line) == [
        "provider-router", "run", "p.jsonl", "--out", "o", "--model", "m/x",
        "--budget", "5.02", "--raise-budget",
    ]  # fmt: skip
    assert resume_command(["run", "--budget=1", "--out", "o"], D("2")) == (
        "provider-router run --budget=2 --out o"
    )
