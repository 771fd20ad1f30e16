"""``provider-router project`` end to end against the local OpenRouter (real loopback sockets)."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from pathlib import Path

import pytest
from _project_cli import MODEL, REFERENCE, run_cli

from provider_router import SQLiteLedger
from provider_router.cli import main
from provider_router.cli._options import parse_count
from provider_router.jobs.runner import JobRunner
from provider_router.planning.plan import load_plan
from provider_router.testing.server import SimulatorServer

BUNDLED_SNAPSHOT = Path(__file__).parents[2] / "provider_router/data/kimi-k2.5.endpoints.json"


def write_prompts(path: Path, count: int, *, start: int = 0) -> Path:
    lines = [
        json.dumps({"id": f"p{i}", "prompt": "Write a function that sorts a list. " * (1 + i % 5)})
        for i in range(start, start + count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_plan(tmp_path: Path, *, prompts: int = 60, extra: str = "") -> Path:
    write_prompts(tmp_path / "a.jsonl", prompts)
    write_prompts(tmp_path / "b.jsonl", prompts, start=1000)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {MODEL}\n"
        "budget: 100\n"
        "policy: {exclude_below: int4}\n"
        "generation: {max_tokens: 4096}\n"
        "datasets:\n"
        "  - {name: b3, input: a.jsonl, target_output_tokens: 10_000_000}\n"
        "  - {name: b4, input: b.jsonl, target_output_tokens: 10_000_000}\n" + extra
    )
    return plan


async def test_reference_check_from_flags_against_the_simulator(
    openrouter_sim: SimulatorServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await run_cli([*REFERENCE, "--base-url", openrouter_sim.url, "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cheapest"]["provider"] == "Chutes"
    total = data["total"]["expected"]
    assert Decimal(total["cost_cheapest"]) == Decimal("134.70")
    assert total["requests"] == 30_000
    fit = next(f for f in data["budget"] if f["basis"] == "cheapest")
    assert fit["fits"] is False
    assert 7_000_000 < fit["uniform_target"] < 8_000_000
    assert round(fit["uniform_target"] / 1e6, 1) == 7.4
    assert data["pilot"] is None
    # Fireworks (NVFP4) and BaseTen (FP4) are never in the mix.
    assert not {"Fireworks", "BaseTen"} & {s["provider"] for s in data["mix"]}


async def test_the_table_says_it_exceeds_and_what_fits(
    openrouter_sim: SimulatorServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_BASE_URL", openrouter_sim.url)
    assert await run_cli(REFERENCE) == 0
    out = capsys.readouterr().out
    assert "$134.70" in out
    assert "EXCEEDS the $100.00 budget" in out
    assert "largest uniform target per dataset that fits: 7.42M" in out
    assert "Chutes (cheapest)" in out
    assert "Fireworks" not in out


def test_a_bundled_snapshot_needs_no_network(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*REFERENCE, "--snapshot", str(BUNDLED_SNAPSHOT), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == MODEL
    assert data["total"]["expected"]["completion_tokens"] == 60_000_000


async def test_a_plan_file_with_a_pilot_that_is_the_jobs_first_requests(
    openrouter_sim: SimulatorServer,
    openrouter_api_key: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", openrouter_api_key)
    plan = write_plan(tmp_path)
    out = tmp_path / "job"
    before = openrouter_sim.balance
    argv = ["project", str(plan), "--pilot", "40", "--out", str(out)]
    assert await run_cli([*argv, "--base-url", openrouter_sim.url, "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    pilot = data["pilot"]
    assert pilot["requests"] == 40
    assert pilot["failures"] == 0
    paid = before - openrouter_sim.balance
    assert Decimal(pilot["cost"]) == paid  # what the pilot really spent
    # On a market with room the pilot paid the floor, and says so.
    assert Decimal(pilot["floor_cost"]) == paid
    assert Decimal(pilot["price_vs_floor"]) == 1
    chats = [r for r in openrouter_sim.requests if r.route == "chat"]
    assert len(chats) == 40
    length = pilot["completion_tokens"]
    assert length["mean_low"] < length["mean"] < length["mean_high"]
    workload = data["workload"]
    assert "pilot of 40 requests" in workload["source"]
    assert Decimal(workload["completion_tokens"]["low"]) < Decimal(
        workload["completion_tokens"]["high"]
    )
    # Each dataset has 60 prompts, so neither reaches 10M output tokens.
    assert [d["limited_by"] for d in data["datasets"]] == ["prompts", "prompts"]
    assert data["total"]["expected"]["requests"] == 120
    # Booked on the job's ledger, under the plan's budget ($100), its answers kept.
    assert "booked on the job's ledger" in captured.err
    async with SQLiteLedger(out / "ledger.sqlite") as ledger:
        state = await ledger.snapshot()
    assert state.limit == 100
    assert state.spent == paid
    kept = {name: (out / f"{name}.jsonl").read_text().count("\n") for name in ("b3", "b4")}
    assert kept == {"b3": 20, "b4": 20}
    # The run on the same directory sends only the rest: every prompt once.
    runner = JobRunner(load_plan(plan), out, base_url=openrouter_sim.url)
    assert (await runner.run()).spent > paid
    chats = [r for r in openrouter_sim.requests if r.route == "chat"]
    assert len(chats) == 120
    for name in ("b3", "b4"):
        ids = [json.loads(line)["id"] for line in (out / f"{name}.jsonl").read_text().splitlines()]
        assert len(ids) == len(set(ids)) == 60


async def test_a_pilots_job_directory_has_its_report_and_timeline_as_a_run_leaves_them(
    openrouter_sim: SimulatorServer,
    openrouter_api_key: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", openrouter_api_key)
    plan = write_plan(tmp_path, prompts=4)
    out = tmp_path / "job"
    argv = ["project", str(plan), "--pilot", "4", "--out", str(out)]
    assert await run_cli([*argv, "--base-url", openrouter_sim.url, "--json"]) == 0
    assert {"summary.json", "timeline.ndjson", "report.html"} <= {p.name for p in out.iterdir()}


async def test_a_pilot_needs_the_job_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path)
    assert await run_cli(["project", str(plan), "--pilot", "4"]) == 2
    assert "--pilot needs --out DIR" in capsys.readouterr().err


async def test_a_plan_file_with_given_lengths_estimates_prompts_from_its_files(
    openrouter_sim: SimulatorServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path, prompts=10)
    argv = [
        "project",
        str(plan),
        "--completion-tokens",
        "1000",
        "--base-url",
        openrouter_sim.url,
        "--json",
    ]
    assert await run_cli(argv) == 0
    data = json.loads(capsys.readouterr().out)
    first = data["datasets"][0]["expected"]
    # "Write a function that sorts a list. " is 36 characters: 9 tokens per repeat,
    # 1..5 repeats, +4 per message +3 priming; 10 prompts cycle through 1..5 twice.
    assert first["requests"] == 10
    assert first["prompt_tokens"] == 10 * (3 + 4) + 2 * 9 * (1 + 2 + 3 + 4 + 5)
    assert len(openrouter_sim.requests) == 0  # no pilot, nothing sent


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["project"], "give a PLAN file, or --model M"),
        (["project", "--model", MODEL, "--datasets", "2"], "--target-output-tokens N"),
        (
            ["project", "--model", MODEL, "--target-output-tokens", "1M", "--prompt-tokens", "5"],
            "give --completion-tokens N",
        ),
        (
            ["project", "--model", MODEL, "--target-output-tokens", "1M", "--pilot", "5"],
            "--pilot needs a PLAN file",
        ),
    ],
)
def test_incomplete_commands_say_what_is_missing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--snapshot", str(BUNDLED_SNAPSHOT)]) == 2  # a bad command
    assert message in capsys.readouterr().err


def test_a_plan_without_lengths_asks_for_them_or_a_pilot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path)
    assert main(["project", str(plan), "--snapshot", str(BUNDLED_SNAPSHOT)]) == 2
    assert "or --pilot N to measure them" in capsys.readouterr().err


def test_a_bad_plan_file_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path, extra="  - {name: b5, input: a.jsonl, max_requests: -3}\n")
    assert main(["project", str(plan), "--snapshot", str(BUNDLED_SNAPSHOT)]) == 2
    assert f"{plan}:8" in capsys.readouterr().err


def test_a_policy_that_rejects_everything_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*REFERENCE, "--exclude-below", "fp32", "--snapshot", str(BUNDLED_SNAPSHOT)]
    assert main(argv) == 1
    assert "the policy allows none of the" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2000", 2000),
        ("10M", 10_000_000),
        ("7.5m", 7_500_000),
        ("250k", 250_000),
        ("1_000", 1000),
        ("2,000", 2000),
        ("1G", 10**9),
    ],
)
def test_counts_read_like_people_write_them(text: str, value: int) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "ten", "1.5", "-3", "5X", "1.2345k"])
def test_bad_counts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count(text)


@pytest.mark.parametrize(
    ("flag", "value"), [("--budget", "0"), ("--budget", "lots"), ("--target-output-tokens", "x")]
)
def test_bad_flags_are_usage_errors(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["project", "--model", MODEL, flag, value])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_the_example_plans_chat_dataset_is_projected_at_its_own_max_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    examples = Path(__file__).parents[2] / "examples"
    argv = ["project", str(examples / "plan.yaml"), "--completion-tokens", "600"]
    assert main([*argv, "--snapshot", str(examples / "market.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    chat = next(d for d in data["datasets"] if d["name"] == "chat")
    code = next(d for d in data["datasets"] if d["name"] == "code")
    assert chat["expected"]["completion_tokens_per_response"] == "256"  # its cap, not 600
    assert code["expected"]["completion_tokens_per_response"] == "600"


async def test_a_pilot_says_the_share_its_max_tokens_would_cut(
    openrouter_sim: SimulatorServer,
    openrouter_api_key: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``max_tokens`` below what many answers run to, the pilot counts the answers it
    cut (``finish_reason: length``) and says the share, with its interval, in the text and
    the JSON: what the chosen cap would cut of the whole job."""
    monkeypatch.setenv("OPENROUTER_API_KEY", openrouter_api_key)
    plan = write_plan(tmp_path)
    plan.write_text(plan.read_text().replace("max_tokens: 4096", "max_tokens: 300"))
    out = tmp_path / "job"
    argv = ["project", str(plan), "--pilot", "40", "--out", str(out)]
    assert await run_cli([*argv, "--base-url", openrouter_sim.url]) == 0
    text = capsys.readouterr().out
    records = [
        json.loads(line)
        for name in ("b3", "b4")
        for line in (out / f"{name}.jsonl").read_text().splitlines()
    ]
    cut = sum(1 for r in records if r["finish_reason"] == "length")
    assert 0 < cut < 40
    assert f"pilot: {cut} of 40 answers ({cut / 40:.0%}, 95% CI " in text
    assert "were cut at max_tokens 300 (finish_reason: length)" in text
    assert f"the job would cut about {cut / 40:.0%} of its answers" in text
    assert await run_cli([*argv, "--pilot", "2", "--base-url", openrouter_sim.url, "--json"]) == 0
    pilot = json.loads(capsys.readouterr().out)["pilot"]
    assert pilot["max_tokens"] == [300]
    assert 0 <= pilot["truncated"] <= pilot["requests"]
    share = pilot["truncated_share"]
    assert share["low"] <= share["value"] <= share["high"]


def test_the_capacity_limited_cost_follows_max_premium_from_flag_or_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Full cheap endpoints spill within ``max_premium``: the projection prices that
    case at the cheapest cost × (1 + the cap); the flag wins over the plan file, and a
    plan's ``max_premium: null`` (no cap) prices it at the dearest allowed endpoint."""
    snapshot = ["--snapshot", str(BUNDLED_SNAPSHOT), "--json"]

    def capacity(argv: list[str]) -> dict[str, str]:
        assert main([*argv, *snapshot]) == 0
        data = json.loads(capsys.readouterr().out)
        cheapest = Decimal(data["total"]["expected"]["cost_cheapest"])
        limited = data["capacity_limited"]
        limited["ratio"] = str(Decimal(limited["expected"]) / cheapest)
        return limited  # type: ignore[no-any-return]

    default = capacity(REFERENCE)
    assert default["max_premium"] == "0.02"
    assert Decimal(default["ratio"]) == Decimal("1.02")
    flagged = capacity([*REFERENCE, "--max-premium", "0.05"])
    assert flagged["max_premium"] == "0.05"
    assert Decimal(flagged["ratio"]) == Decimal("1.05")
    plan = write_plan(tmp_path, extra="max_premium: null\n")
    lengths = ["--prompt-tokens", "200", "--completion-tokens", "2000"]
    uncapped = capacity(["project", str(plan), *lengths])
    assert uncapped["max_premium"] is None
    assert Decimal(uncapped["ratio"]) > Decimal("1.25"), "the dearest allowed endpoint's price"
    overridden = capacity(["project", str(plan), *lengths, "--max-premium", "0"])
    assert overridden["max_premium"] == "0"
    assert Decimal(overridden["ratio"]) == 1


@pytest.mark.parametrize("value", ["-0.01", "lots", "nan"])
@pytest.mark.parametrize("command", ["project", "run"])
def test_a_bad_max_premium_is_a_usage_error(
    command: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = (
        REFERENCE
        if command == "project"
        else ["run", str(write_prompts(tmp_path / "p.jsonl", 2)), "--out", str(tmp_path / "o")]
    )
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--model", MODEL, "--budget", "1", "--max-premium", value])
    assert exc.value.code == 2
    assert "--max-premium" in capsys.readouterr().err
