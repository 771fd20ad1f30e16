"""The budget survives its files: a lost, damaged or foreign ledger is refused (issue #10, 5, 8)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from _job_helpers import ledger_spent, runner, small_plan, write_prompts

from provider_router import DataFileError
from provider_router.jobs.summary import StopReason
from provider_router.ledger import sqlite as sqlite_module
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
ADVICE = "Restore the job's own ledger"


async def first_run(tmp_path: Path, sim: SimulatorServer) -> tuple[Plan, Path]:
    plan = small_plan(tmp_path)
    out = tmp_path / "out"
    summary = await runner(plan, out, sim).run()
    assert summary.spent > 0
    assert ledger_spent(out) == sim.simulator.usage
    return plan, out


def remove_ledger(out: Path) -> None:
    for path in out.glob("ledger.sqlite*"):
        path.unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (remove_ledger, "is missing or empty"),
        (lambda out: (out / "ledger.sqlite").write_bytes(b""), "is missing or empty"),
        (
            lambda out: (out / "ledger.sqlite").write_bytes(
                (out / "ledger.sqlite").read_bytes()[:50]
            ),
            "is damaged",
        ),
    ],
    ids=["deleted", "emptied", "truncated"],
)
async def test_a_lost_ledger_is_refused_instead_of_restarting_at_zero(
    tmp_path: Path, openrouter_sim_factory: Factory, damage: Callable[[Path], object], message: str
) -> None:
    sim = await openrouter_sim_factory(seed=4)
    plan, out = await first_run(tmp_path, sim)
    charged = sim.simulator.usage
    for wal in out.glob("ledger.sqlite-*"):
        wal.unlink()  # the run closed the ledger: everything is in the main file
    damage(out)
    with pytest.raises(DataFileError, match=message) as info:
        await runner(plan, out, sim).run()
    assert ADVICE in str(info.value)
    assert str(out / "ledger.sqlite") in str(info.value)
    assert sim.simulator.usage == charged  # nothing was sent on a budget reset to $0


async def test_a_foreign_ledger_is_refused(tmp_path: Path, openrouter_sim_factory: Factory) -> None:
    sim = await openrouter_sim_factory(seed=5)
    plan, out = await first_run(tmp_path, sim)
    other = tmp_path / "other"
    other.mkdir()
    summary = await runner(small_plan(other, requests=1), other / "out", sim).run()
    assert summary.reason is StopReason.COMPLETE
    charged = sim.simulator.usage
    remove_ledger(out)
    shutil.copy(other / "out" / "ledger.sqlite", out / "ledger.sqlite")
    with pytest.raises(DataFileError, match="is not this job's ledger") as info:
        await runner(plan, out, sim).run()
    assert ADVICE in str(info.value)
    assert sim.simulator.usage == charged


async def test_the_journal_records_the_ledger_and_a_resume_uses_it(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=6)
    _, out = await first_run(tmp_path, sim)
    entries = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    recorded = [e["id"] for e in entries if e["op"] == "ledger"]
    assert len(recorded) == 1
    summary = await runner(small_plan(tmp_path, requests=None), out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert ledger_spent(out) == sim.simulator.usage
    entries = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert [e["id"] for e in entries if e["op"] == "ledger"] == recorded  # recorded once


async def test_a_job_that_never_sent_anything_may_lose_its_ledger(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=7)
    plan = small_plan(tmp_path, prompts=0)
    out = tmp_path / "out"
    await runner(plan, out, sim).run()
    assert sim.simulator.usage == 0
    remove_ledger(out)
    entries = (out / "journal.jsonl").read_text()
    # The journal recorded a ledger, so even an idle job refuses to lose it...
    assert '"op":"ledger"' in entries
    with pytest.raises(DataFileError, match="is missing or empty"):
        await runner(plan, out, sim).run()
    # ...but a journal without any claim or ledger (an older release's, or empty) starts fresh.
    (out / "journal.jsonl").write_text(
        "".join(line + "\n" for line in entries.splitlines() if '"op":"ledger"' not in line)
    )
    summary = await runner(plan, out, sim).run()
    assert summary.spent == 0


async def cli_run(prompts: Path, out: Path, sim: SimulatorServer, budget: str) -> tuple[int, str]:
    """``provider-router run`` as a process (the command a user repeats)."""
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_router",
        "--log-level",
        "error",
        "run",
        str(prompts),
        "--out",
        str(out),
        "--model",
        "moonshotai/kimi-k2.5",
        "--budget",
        budget,
        "--max-tokens",
        "100",
        "--max-requests",
        "2",
        "--base-url",
        sim.url,
        "--progress",
        "off",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_the_cli_refuses_a_deleted_ledger_and_a_budget_no_ledger_holds(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=8)
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    out = tmp_path / "out"
    # A budget no ledger can hold exactly is a clear error, and leaves nothing behind
    # that would make the next run fail.
    code, err = await cli_run(prompts, out, sim, "9999999")
    assert code == 2, err  # a bad command: refused before anything is sent
    # (the flag's own reader refuses it: every USD flag reads amounts one strict way)
    assert "--budget: '9999999' is above the largest amount a ledger holds exactly" in err
    assert "Traceback" not in err
    code, err = await cli_run(prompts, out, sim, "5")
    assert code == 0, err
    charged = sim.simulator.usage
    assert charged > 0
    # The same command after the ledger was deleted: refused, nothing spent again.
    remove_ledger(out)
    code, err = await cli_run(prompts, out, sim, "5")
    assert code == 1, err
    assert "ledger.sqlite: is missing or empty" in err
    assert ADVICE in err
    assert "Traceback" not in err
    assert sim.simulator.usage == charged
    assert not (out / "ledger.sqlite").exists()


async def test_a_ledger_left_without_totals_does_not_wedge_the_job(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # What a kill between schema and totals (or `--budget 9999999`) left behind in
    # older releases: every later run failed with "is a new ledger: give it a limit".
    sim = await openrouter_sim_factory(seed=9)
    out = tmp_path / "out"
    out.mkdir()
    con = sqlite3.connect(out / "ledger.sqlite")
    con.executescript(sqlite_module._SCHEMA)
    con.close()
    summary = await runner(small_plan(tmp_path), out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert ledger_spent(out) == sim.simulator.usage > 0
