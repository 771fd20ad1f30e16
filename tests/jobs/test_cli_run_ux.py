"""`provider-router run` as a user lives it: quiet stderr, hints that work, clean errors.

Each test drives the real command (a subprocess, or ``main``) against the local
OpenRouter over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import assert_consistent, run_cli, write_prompts

from provider_router.cli import main
from provider_router.jobs.observe.report import CHARTS
from provider_router.jobs.store._layout import REPORT_FILE
from provider_router.testing import SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"
CANONICAL = re.compile(r"^-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$")


def resume_argv(stderr: str) -> list[str]:
    """The ``To resume:`` command, as arguments after ``provider-router``."""
    line = next(x for x in stderr.splitlines() if x.startswith("To resume: "))
    words = shlex.split(line.removeprefix("To resume: "))
    assert words[0] == "provider-router"
    return words[1:]


def numeric_strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in numeric_strings(v)]
    if isinstance(value, list):
        return [x for v in value for x in numeric_strings(v)]
    if isinstance(value, str) and re.fullmatch(r"-?[0-9][0-9.Ee+-]*", value):
        return [value]
    return []


@pytest.mark.slow
async def test_budget_stop_at_2000_in_flight_is_quiet_and_the_resume_command_finishes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=5)
    prompts = write_prompts(tmp_path / "p.jsonl", 3000)
    out = tmp_path / "out"
    argv = [
        "run", str(prompts), "--out", str(out), "--model", MODEL, "--budget", "0.40",
        "--max-tokens", "400", "--concurrency", "2000", "--base-url", sim.url,
        "--progress", "off",
    ]  # fmt: skip
    code, _, err = await run_cli(*argv)
    assert code == 3, err[-3000:]
    lines = err.splitlines()
    assert len(lines) < 20, err[-3000:]
    # One sentence per kind of event, with its count, instead of one line per request;
    # plain text on a non-terminal stderr too (no JSON unless asked).
    assert not [x for x in lines if x.startswith("{")], err[-3000:]
    counted = [x for x in lines if re.fullmatch(r"provider-router: [0-9,]+ .*", x)]
    assert any(re.search(r": [0-9,]+ prompts not sent: budget exhausted$", c) for c in counted)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "budget_exhausted"
    # The report beside it: one drawn <svg> per chart (tests/jobs/observe/test_report.py).
    charts = re.findall(r'<svg class="chart" data-chart="([^"]+)"', (out / REPORT_FILE).read_text())
    assert charts == list(CHARTS)
    for text in numeric_strings(summary):
        assert CANONICAL.match(text), text
    needed = Decimal(summary["budget_to_finish_usd"])
    resume = resume_argv(err)
    assert resume[resume.index("--budget") + 1] == summary["budget_to_finish_usd"]
    assert needed > Decimal("0.40")
    # Run exactly what was printed: it finishes the plan.
    code, _, err = await run_cli(*resume)
    assert code == 0, err[-3000:]
    records = assert_consistent(out, ["p"])
    assert len(records) == 3000
    assert all(CANONICAL.match(r["cost"]) for r in records)
    assert "To resume" not in err


async def test_log_level_debug_still_gives_every_event(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=2)
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    argv = [
        "--log-level", "debug", "--log-format", "json", "run", str(prompts),
        "--out", str(tmp_path / "out"), "--model", MODEL, "--budget", "5",
        "--max-tokens", "100", "--base-url", sim.url, "--progress", "off",
    ]  # fmt: skip
    code, _, err = await run_cli(*argv)
    assert code == 0, err[-3000:]
    events = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    done = [e for e in events if e["event"] == "route.done"]
    assert len(done) == 12
    assert {e["key"] for e in done} == {f"p/q{n}" for n in range(12)}


async def test_a_rejected_key_names_the_variable(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    prompts = write_prompts(tmp_path / "p.jsonl", 5)
    out = tmp_path / "out"
    argv = [
        "run", str(prompts), "--out", str(out), "--model", MODEL, "--budget", "1",
        "--max-tokens", "100", "--base-url", sim.url, "--progress", "off",
    ]  # fmt: skip
    code, _, err = await run_cli(*argv, key="sk-or-v1-wrong")
    assert code == 1
    # The preflight refuses first, naming where the key goes, and sends nothing.
    assert "FAIL key" in err
    assert "OPENROUTER_API_KEY" in err
    assert "sk-or-v1-wrong" not in err
    assert not [r for r in sim.requests if r.route == "chat"]
    # Without the preflight, the run's own stop says the same.
    code, _, err = await run_cli(*argv, "--no-preflight", key="sk-or-v1-wrong")
    assert code == 1
    assert "OPENROUTER_API_KEY" in json.loads((out / "summary.json").read_text())["message"]
    assert "sk-or-v1-wrong" not in err
    # No key at all: refused before anything starts, naming where the key goes.
    code, _, err = await run_cli(*argv, key=None)
    assert code == 2
    assert err.count("\n") == 1
    assert "OPENROUTER_API_KEY" in err


async def test_missing_and_all_bad_prompt_files_are_errors(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    common = ["--model", MODEL, "--budget", "1", "--max-tokens", "100", "--base-url", sim.url]
    missing = tmp_path / "missing.jsonl"
    code, _, err = await run_cli("run", str(missing), "--out", str(tmp_path / "o1"), *common)
    assert code == 2
    assert f"prompt file {missing}" in err
    assert "does not exist" in err
    assert "complete" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\nnot json\n{"prompt": ""}\n')
    code, _, err = await run_cli("run", str(bad), "--out", str(tmp_path / "o2"), *common)
    assert code == 2, err
    assert "no usable prompt in dataset 'bad'" in err


@pytest.mark.parametrize("case", ["huge-prompt", "huge-max-tokens"])
async def test_what_cannot_be_afforded_never_reads_as_about_nothing_more(
    tmp_path: Path, openrouter_sim_factory: Factory, case: str
) -> None:
    sim = await openrouter_sim_factory(seed=3)
    max_tokens = "99999999999" if case == "huge-max-tokens" else "200"
    extra = (
        # 3 MB: within every context even at 32 bytes a token (#24 refuses what cannot
        # fit before pricing it), but beyond what $1 reserves even at the cheapest
        # endpoint's prices (where admission reserves).
        [json.dumps({"id": "huge", "prompt": "word " * 600_000})] if case == "huge-prompt" else []
    )
    prompts = write_prompts(tmp_path / "p.jsonl", 10, extra=extra)
    out = tmp_path / "out"
    argv = [
        "run", str(prompts), "--out", str(out), "--model", MODEL, "--budget", "1",
        "--max-tokens", max_tokens, "--base-url", sim.url, "--progress", "off",
    ]  # fmt: skip
    code, stdout, err = await run_cli(*argv)
    summary = json.loads((out / "summary.json").read_text())
    text = stdout + err + summary["message"]
    assert not re.search(r"about \$0(\.0+)? more", text), text[-2000:]
    assert code == 3, text[-2000:]
    if case == "huge-prompt":
        assert "one request alone reserves up to $" in summary["message"]
        assert Decimal(summary["budget_to_finish_usd"]) > 1
    else:
        # Nothing answered: the cost per token, so what finishes, is unknown; the ten
        # prompts are still to do (never "nothing more"), and one needs more than $1.
        assert summary["to_finish_usd"] is None
        assert summary["datasets"]["p"]["prompts"] == 10
        assert "one request reserves up to $" in summary["message"]
    resume = shlex.split(err.split("To resume: ")[1].splitlines()[0])
    assert Decimal(resume[resume.index("--budget") + 1]) > 1


async def test_unusable_out_and_ledger_are_one_line_errors(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory()
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    common = [str(prompts), "--model", MODEL, "--budget", "1", "--base-url", sim.url]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = await run_cli("run", *common, "--out", str(a_file))
    assert (code, err.count("\n")) == (2, 1), err
    assert "is a file, not a directory" in err
    code, _, err = await run_cli("run", *common, "--out", str(a_file / "sub"))
    assert (code, err.count("\n")) == (2, 1), err
    assert "cannot create the directory" in err
    code, _, err = await run_cli(
        "run", *common, "--out", str(tmp_path / "o"), "--ledger", "redis://127.0.0.1:1/0",
        "--ledger-name", "x",
    )  # fmt: skip
    assert code == 69, err
    assert err.count("\n") == 1, err
    assert "cannot reach the Redis ledger" in err
    assert "Traceback" not in err


def test_the_retired_workers_share_says_what_to_use_instead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "o"
    code = main(
        ["run", str(prompts), "--out", str(out), "--model", MODEL, "--budget", "1",
         "--ledger", "redis://127.0.0.1:1/0", "--workers-share", "b3"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--workers-share was removed with the Redis-streams fleet" in err
    assert "--ray" in err
    assert not out.exists()  # refused before anything is made


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_out_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code = main(["run", str(prompts), "--out", str(locked), "--model", MODEL, "--budget", "1"])
    assert code == 2
    assert "is not writable" in capsys.readouterr().err


async def test_ledger_show_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    from provider_router import SQLiteLedger

    path = tmp_path / "run.ledger"
    async with SQLiteLedger(path, Decimal("10")):
        pass
    read, write = os.pipe()
    os.close(read)  # `| head` that has already left
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provider_router", "ledger", "show", str(path),
        stdout=write, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    os.close(write)
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert err.decode() == ""


async def test_add_budget_raises_the_jobs_own_limit_and_finishes(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=6)
    prompts = write_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "out"
    common = [
        "run", str(prompts), "--out", str(out), "--model", MODEL, "--max-tokens", "300",
        "--concurrency", "16", "--base-url", sim.url, "--progress", "off",
    ]  # fmt: skip
    code, _, err = await run_cli(*common, "--budget", "0.05")
    assert code == 3, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    more = Decimal(summary["budget_to_finish_usd"]) - Decimal("0.05")
    code, _, err = await run_cli(*common, "--budget", "1", "--add-budget", "1")
    assert code == 2
    assert "not both" in err
    code, _, err = await run_cli(*common, "--add-budget", str(more))
    assert code == 0, err[-2000:]
    assert len(assert_consistent(out, ["p"])) == 120
    code, shown, _ = await run_cli("ledger", "show", str(out / "ledger.sqlite"), "--json")
    assert code == 0
    assert Decimal(json.loads(shown)["limit"]) == Decimal("0.05") + more
