"""A cause said up front, and steps that do what a person expects: a pilot without a
key refused before it starts, a wrong model id with a "did you mean", ``ledger show``
of a job directory, ``export`` that keeps an existing file, the ledger's counters in
words."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import write_prompts
from _metadata_server import MetadataServer, serve
from _project_cli import run_cli

from provider_router.cli import main
from provider_router.ledger import SQLiteLedger
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

ROOT = Path(__file__).parents[2]
SNAPSHOT = ROOT / "examples" / "market.json"
Factory = Callable[..., Awaitable[SimulatorServer]]


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    with serve() as running:
        yield running


def test_a_pilot_without_a_key_is_refused_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job"
    argv = ["project", str(ROOT / "examples" / "plan.yaml"), "--pilot", "200", "--out", str(out)]
    assert main([*argv, "--snapshot", str(SNAPSHOT)]) == 2  # as `run` refuses it
    err = capsys.readouterr().err
    assert err.startswith("provider-router: error: no API key: set OPENROUTER_API_KEY")
    assert err.count("\n") == 1
    assert not out.exists()  # nothing started, nothing written


async def test_a_pilot_that_came_back_short_says_why_first(
    tmp_path: Path,
    openrouter_sim_factory: Factory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = await openrouter_sim_factory(seed=1, credits="0")
    monkeypatch.setenv("OPENROUTER_API_KEY", DEFAULT_TEST_KEY)
    write_prompts(tmp_path / "a.jsonl", 20)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: moonshotai/kimi-k2.5\nbudget: 10\n"
        "datasets:\n  - {name: a, input: a.jsonl, target_output_tokens: 1_000_000}\n"
    )
    argv = ["project", str(plan), "--pilot", "8", "--out", str(tmp_path / "job")]
    assert await run_cli([*argv, "--base-url", sim.url]) == 1
    error = capsys.readouterr().err.splitlines()[0]
    # The cause (OpenRouter's own words) first; the count of answers after it.
    assert error.startswith("provider-router: error: OpenRouter's credits ran out (402")
    assert "Insufficient credits" in error
    assert ". So the pilot completed 0 request(s)" in error


def test_a_wrong_model_id_gets_a_did_you_mean(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["endpoints", "openai/gpt4o", "--base-url", server.base_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"provider-router: error: HTTP 404: GET {server.base_url}/models/openai/gpt4o/endpoints: "
    )
    assert err.endswith(": no model 'openai/gpt4o' there; did you mean 'openai/gpt-4o'?\n")
    assert ".:" not in err
    assert err.count("\n") == 1


def test_a_wrong_model_id_in_a_snapshot_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["endpoints", "moonshotai/kimi-k2.6", "--snapshot", str(SNAPSHOT)]) == 1
    assert "did you mean 'moonshotai/kimi-k2.5'?" in capsys.readouterr().err


async def _ledger(path: Path, *, estimate: str | None) -> None:
    async with SQLiteLedger(path, Decimal(5)) as ledger:
        held = await ledger.reserve(Decimal(1), key="p0")
        await ledger.settle(
            held, Decimal("0.25"), estimate=None if estimate is None else Decimal(estimate)
        )


def test_ledger_show_of_a_job_directory_reads_its_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "b3"
    job.mkdir()
    asyncio.run(_ledger(job / "ledger.sqlite", estimate="0.25"))
    capsys.readouterr()
    assert main(["ledger", "show", str(job)]) == 0
    out = capsys.readouterr().out
    assert "limit      $5\n" in out
    assert "spent      $0.25\n" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["ledger", "show", str(empty)]) == 2
    assert "without a job ledger (ledger.sqlite)" in capsys.readouterr().err


def test_ledger_show_says_its_counters_in_words_and_leaves_out_zero_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exact, off = tmp_path / "exact.ledger", tmp_path / "off.ledger"
    asyncio.run(_ledger(exact, estimate="0.25"))
    asyncio.run(_ledger(off, estimate="0.2"))
    capsys.readouterr()
    assert main(["ledger", "show", str(exact)]) == 0
    out = capsys.readouterr().out
    assert "requests   1 charged, 0 released free\n" in out
    for jargon in ("drift", "overrun", "estimated"):
        assert jargon not in out
    assert main(["ledger", "show", str(off)]) == 0
    out = capsys.readouterr().out
    assert (
        "charged    $0.05 more than estimated from usage and listed prices ($0.2 estimated)" in out
    )
    assert "overrun" not in out


def test_export_keeps_an_existing_file_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = tmp_path / "a.jsonl"
    outputs.write_text("")
    target = tmp_path / "train.jsonl"
    target.write_text("kept\n")
    assert main(["export", str(outputs), "--to", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"provider-router: error: --to {target} exists: give --force to overwrite it, or "
        "another file\n"
    )
    assert target.read_text() == "kept\n"
    assert main(["export", str(outputs), "--to", str(target), "--force"]) == 0
    assert target.read_text() == ""
