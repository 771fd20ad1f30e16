"""A job's files: any one of them lost or cut never resets the budget nor cuts paid outputs (#21).

The journal is cut at each line boundary of its first lines and at a random byte,
the ledger moved, the ledger replaced by an older copy of itself (what removing its
``-wal`` after a kill leaves): every resume either refuses, writing nothing, or
continues with each paid output kept once and no prompt paid twice.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import pytest
from _job_helpers import (
    ledger_spent,
    read_records,
    runner,
    simulate_crash,
    small_plan,
    write_prompts,
)

from provider_router import ConfigurationError, DataFileError
from provider_router.cli._exit_codes import EXIT_CODES
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._layout import JOURNAL_FILE, JobLayout
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.summary import StopReason
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]


def plan_for(tmp_path: Path, *, requests: int | None = 8) -> Plan:
    return small_plan(tmp_path, requests=requests, prompts=16)


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def paid_outputs(out: Path) -> list[dict[str, object]]:
    return read_records(JobLayout(out).output("p"))


def assert_nothing_paid_twice(out: Path, sim: SimulatorServer) -> None:
    records = paid_outputs(out)
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)), "a prompt's output appears twice"
    # Every charge the simulator made is one kept output: none was paid twice or lost.
    assert sum(Decimal(str(r["cost"])) for r in records) == sim.simulator.usage
    assert ledger_spent(out) == sim.simulator.usage


async def first_run(tmp_path: Path, sim: SimulatorServer) -> tuple[Plan, Path]:
    out = tmp_path / "out"
    summary = await runner(plan_for(tmp_path), out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert len(paid_outputs(out)) == 8
    for side in out.glob("ledger.sqlite-*"):
        side.unlink()  # closed: everything is in the main file
    return plan_for(tmp_path, requests=None), out


def cut_journal(out: Path, *, lines: int | None = None, byte: int | None = None) -> None:
    path = out / JOURNAL_FILE
    data = path.read_bytes()
    data = b"".join(data.splitlines(keepends=True)[:lines]) if byte is None else data[:byte]
    path.write_bytes(data)


def move_ledger(out: Path, where: Path) -> None:
    where.mkdir(exist_ok=True)
    for path in out.glob("ledger.sqlite*"):
        shutil.move(path, where / path.name)


LINES = list(range(11))
CUTS = [{"lines": n} for n in LINES] + [{"byte": seed} for seed in (1, 2)]


def cut(out: Path, how: dict[str, int]) -> None:
    """Cut the journal after ``lines`` lines, or at a random byte drawn from ``byte``."""
    if "lines" in how:
        cut_journal(out, lines=how["lines"])
    else:
        size = (out / JOURNAL_FILE).stat().st_size
        cut_journal(out, byte=random.Random(how["byte"]).randrange(1, size))


@pytest.mark.parametrize("how", CUTS, ids=lambda how: "-".join(map(str, *how.items())))
async def test_a_cut_journal_beside_a_moved_ledger_is_refused_writing_nothing(
    tmp_path: Path, openrouter_sim_factory: Factory, how: dict[str, int]
) -> None:
    sim = await openrouter_sim_factory(seed=21)
    plan, out = await first_run(tmp_path, sim)
    charged = sim.simulator.usage
    move_ledger(out, tmp_path / "elsewhere")
    cut(out, how)
    before = snapshot(out)
    with pytest.raises(ConfigurationError) as info:
        await runner(plan, out, sim).run()
    message = str(info.value)
    assert "restore" in message.lower()
    assert sim.simulator.usage == charged  # nothing sent on a budget reset to $0
    assert snapshot(out) == before  # no ledger created, no line appended, no output cut


@pytest.mark.parametrize("lines", LINES)
async def test_a_cut_journal_keeps_every_paid_output(
    tmp_path: Path, openrouter_sim_factory: Factory, lines: int
) -> None:
    sim = await openrouter_sim_factory(seed=23)
    plan, out = await first_run(tmp_path, sim)
    kept = paid_outputs(out)
    journal_lines = (out / JOURNAL_FILE).read_bytes().splitlines()[:lines]
    cut_journal(out, lines=lines)
    if not any(b'"op":"output"' in line for line in journal_lines):
        # The journal lost even the output file's line: refused, naming what to restore.
        before = snapshot(out)
        with pytest.raises(ConfigurationError, match="restore it"):
            await runner(plan, out, sim).run()
        assert snapshot(out) == before
        return
    summary = await runner(plan, out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    assert paid_outputs(out)[: len(kept)] == kept  # not one paid output cut
    assert len(paid_outputs(out)) == 16
    assert_nothing_paid_twice(out, sim)


async def test_an_older_copy_of_the_ledger_is_refused(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    # What removing the -wal after a kill leaves: the ledger as of its last checkpoint.
    sim = await openrouter_sim_factory(seed=24)
    plan, out = await first_run(tmp_path, sim)
    old = tmp_path / "old.sqlite"
    shutil.copy(out / "ledger.sqlite", old)
    summary = await runner(plan, out, sim).run()
    assert summary.reason is StopReason.COMPLETE
    charged = sim.simulator.usage
    for path in out.glob("ledger.sqlite*"):
        path.unlink()
    shutil.copy(old, out / "ledger.sqlite")
    before = snapshot(out)
    with pytest.raises(DataFileError, match=r"less than the .* the job's outputs cost"):
        await runner(plan_for(tmp_path, requests=None), out, sim).run()
    assert sim.simulator.usage == charged
    assert snapshot(out) == before


async def test_a_ledger_file_without_a_ledger_is_refused_and_not_created_in(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    import sqlite3

    sim = await openrouter_sim_factory(seed=25)
    plan, out = await first_run(tmp_path, sim)
    for path in out.glob("ledger.sqlite*"):
        path.unlink()
    con = sqlite3.connect(out / "ledger.sqlite")  # a database, but no ledger in it
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("CREATE TABLE other (x)")
    con.close()
    before = snapshot(out)
    with pytest.raises(DataFileError, match="holds no ledger"):
        await runner(plan, out, sim).run()
    assert snapshot(out) == before
    con = sqlite3.connect(out / "ledger.sqlite")
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master")}
    con.close()
    assert tables == {"other"}


def paid_record(ds: str, pid: str, gen: str, cost: str = "0.0001") -> bytes:
    record = {
        "id": pid,
        "dataset": ds,
        "generation_id": gen,
        "usage": {"prompt_tokens": 3, "completion_tokens": 7},
        "cost": cost,
    }
    return (json.dumps(record) + "\n").encode()


def test_a_paid_record_written_before_a_kill_is_kept_not_cut(tmp_path: Path) -> None:
    j = FileJournal.open(tmp_path)
    j.prepare(["d"])
    assert j.claim("d", "a")
    assert j.claim("d", "b")
    j.flush()
    with JobLayout(tmp_path).output("d").open("ab") as fh:
        fh.write(paid_record("d", "a", "gen-1"))  # the kill came before its done line
        fh.write(b'{"id": "b", "generation_id": "gen-2", "torn')
    simulate_crash(j)
    with FileJournal.open(tmp_path) as j:
        assert j.is_done("d", "a")
        assert not j.is_done("d", "b")
        assert [lost.prompt_id for lost in j.lost] == ["b"]  # a is done, not lost
        assert j.tally("d").cost_units == 100_000_000
        assert j.adopted == {"d": 1}
        assert any("kept 1 paid output" in note for note in j.repairs)
    with FileJournal.open(tmp_path) as j:  # the adoption is in the journal now
        assert j.is_done("d", "a")
        assert j.repairs == []
    assert read_records(JobLayout(tmp_path).output("d"))[0]["generation_id"] == "gen-1"


def test_reading_a_journal_writes_nothing_until_it_begins(tmp_path: Path) -> None:
    j = FileJournal.open(tmp_path)
    j.prepare(["d"])
    assert j.claim("d", "a")
    j.flush()
    with JobLayout(tmp_path).output("d").open("ab") as fh:
        fh.write(b'{"id": "x", "torn')
    simulate_crash(j)
    with (tmp_path / JOURNAL_FILE).open("ab") as fh:
        fh.write(b'{"op":"cla')
    before = snapshot(tmp_path)
    j = FileJournal.read(tmp_path)
    assert [lost.prompt_id for lost in j.lost] == ["a"]
    j.record_ledger("abc")  # held until begin
    j.close()
    assert snapshot(tmp_path) == before
    j = FileJournal.read(tmp_path)
    j.record_ledger("abc")
    j.begin()
    j.close()
    entries = [json.loads(line) for line in (tmp_path / JOURNAL_FILE).read_text().splitlines()]
    ops = [e["op"] for e in entries]
    assert ops[-4:] == ["run", "lost", "ledger", "stop"]
    assert JobLayout(tmp_path).output("d").read_bytes() == b""


def test_a_run_refused_for_its_key_or_policy_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provider_router.cli import main

    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    base = ["run", str(prompts), "--model", "moonshotai/kimi-k2.5", "--budget", "1"]
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    assert main([*base, "--out", str(tmp_path / "nokey")]) == 2
    assert not (tmp_path / "nokey").exists()
    monkeypatch.setenv("OPENROUTER_API_KEY", DEFAULT_TEST_KEY)
    out = tmp_path / "policy"
    argv = [*base, "--out", str(out), "--exclude-below", "int5", "--base-url", "http://127.0.0.1:9"]
    with pytest.raises(SystemExit) as stopped:  # a usage error, refused by argparse (#23)
        main(argv)
    assert stopped.value.code == 2
    assert not out.exists()


async def test_a_runner_refuses_a_bad_policy_before_any_file(tmp_path: Path) -> None:
    plan = plan_for(tmp_path).model_copy(update={"policy": {"exclude_below": "int5"}})
    out = tmp_path / "out"
    with pytest.raises(ConfigurationError, match="exclude_below"):
        await JobRunner(plan, out, base_url="http://127.0.0.1:9", api_key="k").run()
    assert not out.exists()


async def test_a_run_whose_ledger_failed_a_write_does_not_end_clean(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    from provider_router import SQLiteLedger
    from provider_router.ledger import _group_commit as b

    sim = await openrouter_sim_factory(seed=26)
    async with SQLiteLedger(tmp_path / "shared.sqlite", Decimal(10)) as ledger:
        real = ledger._execute_once
        failed: list[int] = []

        async def execute(batch: list[b.Op]) -> tuple[int, int, int]:
            if not failed and any(op.kind == b.ATTACH for op in batch):
                failed.append(len(batch))
                raise OSError(5, "Input/output error")
            return await real(batch)

        ledger._execute_once = execute  # type: ignore[method-assign]
        run = JobRunner(
            plan_for(tmp_path),
            tmp_path / "out",
            base_url=sim.url,
            api_key=DEFAULT_TEST_KEY,
            ledger=ledger,
        )
        summary = await run.run()
    assert failed
    assert summary.reason is StopReason.ERROR
    assert EXIT_CODES[summary.reason] != 0
    assert "failed 1 write(s)" in summary.message
    assert "Input/output error" in summary.message
    assert "a generation id was not recorded" in summary.message
    assert len(paid_outputs(tmp_path / "out")) == 8  # the answers are kept all the same


async def test_a_ledger_whose_deficit_open_worst_cases_hid_is_refused_after_recovery(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    import socket
    import sqlite3

    sim = await openrouter_sim_factory(seed=27)
    plan, out = await first_run(tmp_path, sim)
    charged = sim.simulator.usage
    # A ledger that lost two payments (what a lost -wal can do): one settle undone (its
    # row open again, at a large worst case, owned by a dead process), one row gone.
    con = sqlite3.connect(out / "ledger.sqlite")
    rows = con.execute(
        "SELECT id, cost FROM reservations WHERE state = 'settled' ORDER BY id LIMIT 2"
    ).fetchall()
    (reopened, cost1), (gone, cost2) = rows
    worst = 10**12  # $1: hides both costs until recovery settles the row at its real cost
    con.execute(
        "UPDATE reservations SET state = 'open', units = ?, cost = NULL, owner = ?,"
        " lease_until = 0 WHERE id = ?",
        (worst, f"{socket.gethostname()}:999999999:dead", reopened),
    )
    con.execute("DELETE FROM reservations WHERE id = ?", (gone,))
    con.execute(
        "UPDATE totals SET spent = spent - ?, reserved = reserved + ?", (cost1 + cost2, worst)
    )
    con.commit()
    con.close()
    with pytest.raises(DataFileError, match=r"less than the .* the job's outputs cost"):
        await runner(plan, out, sim).run()
    assert sim.simulator.usage == charged  # refused before any prompt was sent


def test_paid_records_after_a_torn_line_are_cut_and_said(tmp_path: Path) -> None:
    j = FileJournal.open(tmp_path)
    j.prepare(["d"])
    for pid in "abc":
        assert j.claim("d", pid)
    j.flush()
    with JobLayout(tmp_path).output("d").open("ab") as fh:
        fh.write(paid_record("d", "a", "gen-1"))
        fh.write(b'{"id": "b", "torn"\n')  # not a record: adoption stops here
        fh.write(paid_record("d", "c", "gen-3"))
    simulate_crash(j)
    with FileJournal.open(tmp_path) as j:
        assert j.is_done("d", "a")
        assert not j.is_done("d", "c")
        (note,) = [n for n in j.repairs if n.startswith("cut ")]
        assert "among them 1 record(s) with a generation id" in note
    assert [r["id"] for r in read_records(JobLayout(tmp_path).output("d"))] == ["a"]
