"""The SQLite ledger's per-request path: its writer thread and its schema.

What each test pins down: a commit crosses to the writer thread once per batch,
never once per request; the thread answers with the job's result or its error and
the loop never shares the connection with a job still running; ledgers no longer
keep an index of their open rows (older files lose it on open and read the same),
and the lease renewal that used it still extends exactly this owner's open rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import gc
import pickle
import sqlite3
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import ConfigurationError, Reservation, SQLiteLedger
from provider_router.ledger._writer import WriterThread
from tests.ledger.conftest import Backend
from tests.ledger.test_ledger_units import PAIRS, assert_booked_as_own_conversion

D = Decimal
_OLD_INDEX = (
    "CREATE INDEX IF NOT EXISTS reservations_open ON reservations (owner) WHERE state = 'open'"
)


def _indexes(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")]
    finally:
        con.close()


async def test_a_batch_of_many_requests_crosses_to_the_writer_thread_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Statements run on the loop; only the commit (its fsync) goes to the thread,
    # one job for the whole batch however many requests share it.
    ledger = SQLiteLedger(tmp_path / "l.sqlite", D(10), commit_interval=3600)
    async with ledger:
        writer = ledger._writer
        assert writer is not None
        jobs: list[str] = []
        run = writer.run

        def counted(fn: Any, *args: Any) -> Any:
            jobs.append(fn.__name__)
            return run(fn, *args)

        monkeypatch.setattr(writer, "run", counted)
        first = await ledger.reserve(D("0.01"), key="first")  # an idle store: at once
        assert jobs == ["commit"]
        crowd = [asyncio.create_task(ledger.reserve(D("0.01"), key=f"r{i}")) for i in range(40)]
        settle = asyncio.create_task(ledger.settle(first, D("0.005")))
        await ledger._batcher.drain()  # the hour-long interval cut short: one batch
        held = await asyncio.gather(*crowd)
        await settle
        assert jobs == ["commit", "commit"]
    audit = ledger.audit()
    assert audit == {"spent_units": 5_000_000_000, "reserved_units": 40 * 10**10, "open": 40}
    assert len({res.id for res in held}) == 40


async def test_the_writer_thread_answers_with_the_result_or_the_error() -> None:
    writer = WriterThread("test-writer")
    try:
        assert await writer.run(sum, (1, 2, 3)) == 6
        assert await writer.run(threading.current_thread) is not threading.current_thread()
        with pytest.raises(ZeroDivisionError):
            await writer.run(divmod, 1, 0)
        assert await writer.run(len, "after an error") == 14  # the thread lives on
        assert not writer.busy
    finally:
        writer.stop()


async def test_a_cancelled_caller_leaves_the_writer_busy_until_its_job_ends() -> None:
    # The loop must not use the connection while the thread still does: a job
    # outlives the task that awaited it, and idle() waits for the job itself.
    writer = WriterThread("test-writer")
    inside, release = threading.Event(), threading.Event()

    def slow() -> str:
        inside.set()
        release.wait(60)
        return "done"

    async def commit() -> str:
        return await writer.run(slow)

    try:
        caller = asyncio.create_task(commit())
        await asyncio.to_thread(inside.wait, 60)
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        assert writer.busy
        idle = asyncio.create_task(writer.idle())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not idle.done()
        release.set()
        await idle
        assert not writer.busy
        assert await writer.run(str.upper, "next") == "NEXT"
    finally:
        release.set()
        writer.stop()


async def test_stop_ends_the_thread_and_a_dropped_writer_does_not_leak_one() -> None:
    writer = WriterThread("test-writer-stop")
    await writer.run(int)
    thread = writer._thread
    assert thread is not None
    assert thread.is_alive()
    writer.stop()
    assert not thread.is_alive()

    dropped = WriterThread("test-writer-dropped")
    await dropped.run(int)
    orphan = dropped._thread
    assert orphan is not None
    assert orphan.is_alive()
    del dropped
    gc.collect()
    await asyncio.to_thread(orphan.join, 60)
    assert not orphan.is_alive()


async def test_a_new_ledger_keeps_no_index_of_open_rows(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    async with SQLiteLedger(path, D(10)) as ledger:
        await ledger.reserve(D("1"), key="a")
    assert _indexes(path) == []


async def test_a_ledger_from_before_loses_the_index_on_open_and_reads_the_same(
    tmp_path: Path,
) -> None:
    # The file of an older release (with the partial index of open rows): reopened,
    # the index is gone and its open rows are listed, renewed and recovered as before.
    path = tmp_path / "old.sqlite"
    old = SQLiteLedger(path, D(10), lease=60.0, executor="loop")
    kept = await old.reserve(D("2"), key="kept open")
    done = await old.reserve(D("1"), key="settled")
    await old.settle(done, D("0.25"))
    await old._close_store()  # the process dies with "kept open" open
    con = sqlite3.connect(path)
    con.execute(_OLD_INDEX)
    con.close()
    assert _indexes(path) == ["reservations_open"]

    now = [10.0**10]  # far past the old lease: the reservation is an orphan
    async with SQLiteLedger(path, clock=lambda: now[0]) as reopened:
        assert _indexes(path) == []
        assert [r.id for r in await reopened.open_reservations()] == [kept.id]
        report = await reopened.recover()
        state = await reopened.snapshot()
    assert [r.id for r in report.worst_case] == [kept.id]
    assert (state.spent, state.reserved, state.open) == (D("2.25"), 0, 0)
    assert reopened.audit() == {"spent_units": 2_250_000_000_000, "reserved_units": 0, "open": 0}


async def test_the_lease_renewal_extends_exactly_this_owners_open_rows(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    now = [1000.0]
    other = SQLiteLedger(path, D(10), lease=30.0, clock=lambda: now[0], executor="loop")
    theirs = await other.reserve(D("1"), key="theirs")
    async with SQLiteLedger(path, lease=30.0, clock=lambda: now[0]) as ledger:
        mine = await ledger.reserve(D("1"), key="mine")
        closed = await ledger.reserve(D("1"), key="closed")
        await ledger.settle(closed, D("0.5"))
        now[0] = 1010.0
        ledger._renew()
        await ledger._batcher.drain()
        con = sqlite3.connect(path)
        leases = dict(con.execute("SELECT key, lease_until FROM reservations").fetchall())
        con.close()
        await ledger.release(mine)
    await other.release(theirs)
    await other.close()
    assert leases == {"mine": 1040.0, "closed": 1030.0, "theirs": 1030.0}


@pytest.mark.parametrize(("cost", "estimate"), PAIRS)
async def test_an_estimate_equal_to_the_cost_books_what_its_own_conversion_gives(
    tmp_path: Path, cost: Decimal, estimate: Decimal
) -> None:
    # The durable ledgers' settle reuses the cost's units for an equal estimate, as
    # MemoryLedger's does: what it books is what converting each amount gives.
    async with SQLiteLedger(tmp_path / "l.sqlite", D(4_000_000), executor="loop") as ledger:
        held = await ledger.reserve(D("0.5"), key="k")
        await ledger.settle(held, cost, estimate=estimate)
        state = await ledger.snapshot()
    assert_booked_as_own_conversion(state, cost, estimate)


@pytest.mark.parametrize(
    ("estimate", "message"),
    [(D("-0.1"), "negative"), (D("NaN"), "finite"), (True, "Decimal"), (0.5, "Decimal")],
)
async def test_a_bad_estimate_is_still_refused_by_the_sqlite_ledger_and_the_hold_stays(
    tmp_path: Path, estimate: object, message: str
) -> None:
    async with SQLiteLedger(tmp_path / "l.sqlite", D(1), executor="loop") as ledger:
        held = await ledger.reserve(D("0.5"), key="k")
        with pytest.raises(ConfigurationError, match=message):
            await ledger.settle(held, D(1), estimate=estimate)  # type: ignore[arg-type]
        state = await ledger.snapshot()
    assert (state.open, state.reserved, state.spent) == (1, D("0.5"), 0)


class _CountingConnection(sqlite3.Connection):
    """A connection that records what runs through its own shortcuts (one cursor each)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursors = 0
        self.statements: list[str] = []

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        self.cursors += 1
        return super().cursor(*args, **kwargs)

    def execute(self, sql: str, *args: Any) -> Any:
        self.statements.append(sql)
        return super().execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self.statements.append(sql)
        return super().executemany(sql, *args)


async def test_every_statement_of_a_batch_goes_through_the_stores_one_cursor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``con.execute`` builds a cursor (and a weak reference the connection keeps)
    # per statement; the store reuses one cursor for the whole life of the ledger.
    connect = sqlite3.connect
    opened: list[_CountingConnection] = []

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        con = connect(*args, factory=_CountingConnection, **kwargs)
        opened.append(con)
        return con

    monkeypatch.setattr(sqlite3, "connect", counting)
    ledger = SQLiteLedger(tmp_path / "l.sqlite", D(10), commit_interval=0)
    monkeypatch.setattr(sqlite3, "connect", connect)
    (con,) = opened
    con.cursors, con.statements = 0, []
    async with ledger:
        held = [await ledger.reserve(D("1"), key=f"r{i}") for i in range(3)]
        await ledger.attach(held[0], "gen-1")
        await ledger.settle(held[0], D("0.25"), estimate=D("0.3"), provider="p")
        await ledger.release(held[1])
        with pytest.raises(ConfigurationError, match="not open"):
            await ledger.settle(held[0], D("0.25"))
        await ledger.set_limit(D(11))
        state = await ledger.snapshot()
        assert [r.id for r in await ledger.open_reservations()] == [held[2].id]
        assert (con.cursors, con.statements) == (0, [])
    assert (state.spent, state.reserved, state.open, state.limit) == (D("0.25"), 1, 1, 11)
    assert ledger.audit() == {"spent_units": 250_000_000_000, "reserved_units": 10**12, "open": 1}


async def test_a_batch_ending_in_a_read_leaves_no_statement_holding_the_wal(
    tmp_path: Path,
) -> None:
    # The shared cursor's last statement may be a SELECT (a second settle of a closed
    # row reads it and changes nothing); it is read to its end, so once the batch is
    # committed no read snapshot is left open: another connection can truncate the WAL.
    path = tmp_path / "l.sqlite"
    async with SQLiteLedger(path, D(10), commit_interval=0) as ledger:
        held = await ledger.reserve(D("1"), key="k")
        await ledger.settle(held, D("0.5"))
        with pytest.raises(ConfigurationError, match="not open"):
            await ledger.settle(held, D("0.5"))
        other = sqlite3.connect(path)
        try:
            busy, wal_frames, done = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            other.close()
        assert (busy, wal_frames, done) == (0, 0, 0)
        again = await ledger.reserve(D("2"), key="after")
        await ledger.release(again)
        state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.open) == (D("0.5"), 0, 0)


async def test_every_ledgers_reservation_is_a_plain_reservation(backend: Backend) -> None:
    # A batch builds its admitted Reservations as MemoryLedger does (a writable twin
    # made a Reservation by __class__ assignment): the same object in every respect
    # as one built through the frozen dataclass's __init__.
    ledger = backend.make(D(10))
    held = await ledger.reserve(D("0.25"), key="k-1")
    plain = Reservation(held.id, 250_000_000_000, "k-1", None, held.owner)
    assert type(held) is Reservation
    assert held == plain
    assert held.owner
    assert held.amount == D("0.25")
    assert hash(held) == hash(plain)
    assert repr(held) == repr(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.units = 1  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(held)) == held  # noqa: S301 (our own bytes)
    assert copy.copy(held) == held
    assert dataclasses.replace(held, generation_id="g") == dataclasses.replace(
        plain, generation_id="g"
    )
    assert not hasattr(held, "__dict__")
    await ledger.settle(held, D("0.1"))
    assert (await ledger.snapshot()).spent == D("0.1")
