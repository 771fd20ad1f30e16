"""`provider-router run` as a process: SIGKILL at seeded moments, Ctrl-C, exit codes, export."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import assert_consistent, ledger_rows, ledger_spent, read_records, write_prompts

from provider_router._money import from_units
from provider_router.cli import build_parser, main
from provider_router.jobs.store.journal import FileJournal
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
SIZES = {"a": 30, "b": 25}
KILL_POINTS = 20


def make_plan(tmp_path: Path, budget: str = "20") -> Path:
    for name, size in SIZES.items():
        write_prompts(tmp_path / f"{name}.jsonl", size, prefix=name)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: moonshotai/kimi-k2.5\n"
        f"budget: {budget}\n"
        "concurrency: 8\n"
        "policy: {exclude_below: int4}\n"
        "generation: {max_tokens: 400}\n"
        "datasets:\n" + "".join(f"  - {{name: {n}, input: {n}.jsonl}}\n" for n in SIZES)
    )
    return plan


async def start(
    plan: Path, out: Path, sim: SimulatorServer, *extra: str
) -> asyncio.subprocess.Process:
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY, "PYTHONUNBUFFERED": "1"}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_router",
        "--log-level",
        "error",
        "run",
        "--plan",
        str(plan),
        "--out",
        str(out),
        "--base-url",
        sim.url,
        "--progress",
        "off",
        *extra,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


def completed(out: Path) -> int:
    total = 0
    for name in SIZES:
        path = out / f"{name}.jsonl"
        if path.exists():
            total += path.read_bytes().count(b"\n")
    return total


async def wait_for_records(proc: asyncio.subprocess.Process, out: Path, count: int) -> bool:
    """Wait until ``count`` records are on disk; False if the process ended first."""
    while completed(out) < count:
        if proc.returncode is not None:
            return False
        await asyncio.sleep(0.003)
    return True


@pytest.mark.slow
async def test_sigkill_at_seeded_moments_then_resume_is_exactly_once(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=400, seed=21)
    plan = make_plan(tmp_path)
    out = tmp_path / "out"
    rng = random.Random(2024)
    total = sum(SIZES.values())
    kills = 0
    for point in range(KILL_POINTS):
        proc = await start(plan, out, sim)
        if point % 5 == 0:
            # Some kills land at a random instant: start-up, recovery, the first requests.
            await asyncio.sleep(rng.uniform(0.0, 1.2))
        else:
            # The rest land after a random number of further completions.
            await wait_for_records(proc, out, min(completed(out) + rng.randint(1, 4), total))
        if proc.returncode is None:
            proc.kill()
            kills += 1
        await proc.wait()
    assert kills >= KILL_POINTS - 2, "the job finished before most kill points"
    proc = await start(plan, out, sim)
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    records = assert_consistent(out, SIZES)
    assert sorted(r["id"] for r in records) == sorted(
        f"{name}{n}" for name, size in SIZES.items() for n in range(size)
    )
    # The journal agrees with the outputs, to the picodollar.
    with FileJournal.open(out) as journal:
        for name in SIZES:
            tally = journal.tally(name)
            found = read_records(out / f"{name}.jsonl")
            assert tally.completed == len(found)
            assert from_units(tally.cost_units) == sum(Decimal(r["cost"]) for r in found)
        assert journal.lost == []
        # The kills did cut requests in flight (so recovery was exercised, not skipped).
        assert sum(journal.tally(name).lost for name in SIZES) > 0
    # Money is never forgotten: the ledger holds everything OpenRouter charged; it holds
    # more only for requests cut off by a kill whose cost it could not learn (worst case).
    spent = ledger_spent(out)
    worst = sum(
        (from_units(r["units"]) for r in ledger_rows(out) if r["state"] == "recovered"),
        Decimal(0),
    )
    assert sim.simulator.usage <= spent <= sim.simulator.usage + worst
    assert spent <= Decimal(20)


async def test_ctrl_c_lets_in_flight_finish_then_resume(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(speed=300, seed=8)
    plan = make_plan(tmp_path)
    out = tmp_path / "out"
    proc = await start(plan, out, sim)
    assert await wait_for_records(proc, out, 5)
    proc.send_signal(signal.SIGINT)
    _, stderr = await proc.communicate()
    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert "letting those in flight finish" in stderr.decode()
    assert "To resume: provider-router --log-level error run --plan" in stderr.decode()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "interrupted"
    assert summary["reserved_usd"] in ("0", "0E-12")
    assert_consistent(out, SIZES)
    assert [r for r in ledger_rows(out) if r["state"] == "recovered"] == []
    proc = await start(plan, out, sim)
    await proc.communicate()
    assert proc.returncode == 0
    assert len(assert_consistent(out, SIZES)) == sum(SIZES.values())


async def test_exit_codes_for_money(tmp_path: Path, openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(seed=1, credits="0.02")
    plan = make_plan(tmp_path)
    out = tmp_path / "out"
    proc = await start(plan, out, sim, "--budget", "0.01")
    _, stderr = await proc.communicate()
    assert proc.returncode == 3, stderr.decode()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "run again with a budget of $" in summary["message"]
    resume = shlex.split(stderr.decode().split("To resume: ")[1].splitlines()[0])
    assert Decimal(resume[resume.index("--budget") + 1]) == Decimal(summary["budget_to_finish_usd"])
    assert Decimal(summary["budget_to_finish_usd"]) > Decimal("0.01")
    proc = await start(plan, out, sim, "--budget", "5")
    _, stderr = await proc.communicate()
    assert proc.returncode == 4, stderr.decode()[-2000:]
    assert json.loads((out / "summary.json").read_text())["reason"] == "credits_exhausted"
    sim.top_up(5)
    proc = await start(plan, out, sim, "--budget", "5")
    await proc.communicate()
    assert proc.returncode == 0
    assert len(assert_consistent(out, SIZES)) == sum(SIZES.values())


def test_run_flags_read_amounts_and_counts_as_people_write_them() -> None:
    counts = ["--concurrency", "2,000", "--target-output-tokens", "10M", "--max-requests", "250k"]
    args = build_parser().parse_args(
        ["run", "p.jsonl", "--out", "o", "--budget", "$100", "--max-tokens", "8k", *counts]
    )
    assert args.budget == Decimal(100)
    assert (args.max_tokens, args.concurrency) == (8_000, 2_000)
    assert (args.target_output_tokens, args.max_requests) == (10_000_000, 250_000)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--budget", "0", "argument --budget: a budget must be more than $0, got '0'"),
        ("--budget", "ten", "argument --budget: not an amount in USD: 'ten'"),
        ("--concurrency", "0", "argument --concurrency: must be at least 1, got '0'"),
        ("--max-tokens", "2.5", "argument --max-tokens: '2.5' is not a whole number of tokens"),
    ],
)
def test_run_rejects_bad_amounts_and_counts(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "p.jsonl", "--out", "o", flag, value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_flag_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each a bad command: exit 2."""
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    assert (
        main(["run", str(prompts), "--out", str(tmp_path / "o"), "--budget", "1"]) == 2
    )  # a bad command
    assert "--model is required" in capsys.readouterr().err
    assert (
        main(["run", "--out", str(tmp_path / "o"), "--model", "m/x", "--budget", "1"]) == 2
    )  # a bad command
    assert "PROMPTS.jsonl" in capsys.readouterr().err
    assert (
        main(["run", str(prompts), "--out", str(tmp_path / "o"), "--model", "m/x"]) == 2
    )  # a bad command
    assert "--budget USD is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", str(prompts), "--out", "o", "--model", "m/x", "--budget", "-1"])
    assert "argument --budget: a budget must be more than $0, got '-1'" in capsys.readouterr().err
    bad_plan = tmp_path / "plan.yaml"
    bad_plan.write_text("model: m/x\ndatasets:\n  - {name: a, input: p.jsonl, max_requests: -1}\n")
    assert (
        main(["run", "--plan", str(bad_plan), "--out", str(tmp_path / "o")]) == 2
    )  # a bad command
    assert f"{bad_plan}:3: invalid plan" in capsys.readouterr().err


async def test_export_command(tmp_path: Path, openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(seed=4)
    plan = make_plan(tmp_path)
    out = tmp_path / "out"
    proc = await start(plan, out, sim)
    await proc.communicate()
    assert proc.returncode == 0
    target = tmp_path / "train.jsonl"
    assert main(["export", str(out), "--to", str(target), "--all-finishes"]) == 0
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(rows) == sum(SIZES.values())
    assert {r["id"].split("/")[0] for r in rows} == set(SIZES)
    assert all(r["conversations"][-1]["role"] == "assistant" for r in rows)
    assert main(["export", str(tmp_path / "nowhere"), "--to", str(target)]) == 2
