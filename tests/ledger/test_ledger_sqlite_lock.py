"""A ledger another process has locked: waited out, then named as locked, never "damaged" (#21)."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import LedgerUnavailableError, SQLiteLedger
from provider_router.jobs.store import job_ledger
from provider_router.jobs.store.journal import FileJournal
from provider_router.ledger._sqlite_lock import is_locked, lock_holders

HOLDER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
con.execute("COMMIT")
print("released", flush=True)
sys.stdin.readline()
"""


class Holder:
    """Another process holding ``BEGIN EXCLUSIVE`` on a ledger file until released."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and script
            [sys.executable, "-c", HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"
        self.held = True

    def release(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "released"
        self.held = False

    def stop(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.sqlite"
    SQLiteLedger(path, Decimal(10), executor="loop")._store.con.close()
    return path


@pytest.fixture
def holder(ledger_file: Path) -> Iterator[Holder]:
    held = Holder(ledger_file)
    try:
        yield held
    finally:
        held.stop()


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_locked_ledger_is_told_apart_from_a_damaged_one(
    ledger_file: Path, holder: Holder
) -> None:
    (found,) = lock_holders(ledger_file)
    assert found.startswith(f"pid {holder.proc.pid} (python")
    with pytest.raises(LedgerUnavailableError) as info:
        SQLiteLedger(ledger_file, busy_timeout=0)
    message = str(info.value)
    assert "is locked by another process" in message
    assert f"pid {holder.proc.pid}" in message
    assert "not damaged" in message
    assert "Wait for that process" in message
    assert is_locked(info.value.__cause__)  # type: ignore[arg-type]


@pytest.mark.parametrize("executor", ["thread", "loop"])
async def test_a_lock_taken_mid_run_is_waited_out(ledger_file: Path, executor: str) -> None:
    time = FakeTime()
    ledger = SQLiteLedger(
        ledger_file,
        busy_timeout=0.001,
        lock_window=60,
        sleep=time.sleep,
        monotonic=time.monotonic,
        executor=executor,  # type: ignore[arg-type]
    )
    held = Holder(ledger_file)
    try:
        real_sleep = time.sleep

        async def sleep_then_release(seconds: float) -> None:
            await real_sleep(seconds)
            if held.held and time.now >= 40:  # a 40 s lock
                held.release()

        time.sleep = sleep_then_release  # type: ignore[method-assign]
        ledger._lock_wait._sleep = sleep_then_release
        reservation = await ledger.reserve(Decimal("0.5"), key="k")
        await ledger.settle(reservation, Decimal("0.25"))
        state = await ledger.snapshot()
    finally:
        held.stop()
        await ledger.close()
    assert state.spent == Decimal("0.25")
    assert 40 <= time.now < 60


async def test_a_lock_held_past_the_window_fails_naming_the_lock(ledger_file: Path) -> None:
    time = FakeTime()
    ledger = SQLiteLedger(
        ledger_file, busy_timeout=0.001, lock_window=5, sleep=time.sleep, monotonic=time.monotonic
    )
    holder = Holder(ledger_file)
    try:
        with pytest.raises(LedgerUnavailableError) as info:
            await ledger.snapshot()
    finally:
        holder.stop()
        await ledger.close()
    message = str(info.value)
    assert "is locked by another process" in message
    assert f"pid {holder.proc.pid}" in message
    assert "for 5 s" in message
    assert "damaged" not in message.replace("not damaged", "")


async def test_a_job_whose_ledger_is_locked_is_told_to_wait_not_to_start_over(
    tmp_path: Path, ledger_file: Path, holder: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_ledger, "SQLiteLedger", functools.partial(SQLiteLedger, busy_timeout=0))
    journal = FileJournal.open(tmp_path)
    assert journal.claim("d", "a")  # money was spent: the ledger must be this one
    journal.close()
    journal = FileJournal.read(tmp_path)
    try:
        with pytest.raises(LedgerUnavailableError) as info:
            await job_ledger.open_job_ledger(ledger_file, Decimal(10), journal, None)
    finally:
        journal.close()
    message = str(info.value)
    assert "is locked by another process" in message
    assert "start the job over" not in message
    assert "is damaged" not in message
