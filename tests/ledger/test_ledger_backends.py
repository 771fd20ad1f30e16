"""Backend-specific behaviour: files, options, the optional Redis dependency."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import sys
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provider_router import (
    BudgetExhausted,
    ConfigurationError,
    DataFileError,
    MemoryLedger,
    MissingDependencyError,
    RedisLedger,
    SQLiteLedger,
)
from provider_router._money import LEDGER_MAX_UNITS, from_units
from tests.ledger.conftest import RedisServer

D = Decimal
_big_names = itertools.count(1)


def test_redis_ledger_without_the_redis_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(
        MissingDependencyError, match=r"pip install 'provider-router-openrouter\[redis\]'"
    ):
        RedisLedger("redis://127.0.0.1:1/0", "x", D(1))


def test_a_file_that_is_not_a_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "notes.ledger"
    path.write_text("this is not SQLite\n" * 100)
    with pytest.raises(DataFileError, match=r"notes\.ledger: not a ledger database"):
        SQLiteLedger(path, D(1))


def test_a_database_from_a_future_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.ledger"
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(DataFileError, match="schema version 99"):
        SQLiteLedger(path, D(1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease": 0}, "lease"),
        ({"poll_interval": -1}, "poll_interval"),
        ({"synchronous": "MAYBE"}, "synchronous"),
        ({"executor": "process"}, "executor"),
    ],
)
def test_bad_sqlite_options_are_named(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SQLiteLedger(tmp_path / "x.ledger", D(1), **kwargs)  # type: ignore[arg-type]


async def test_sqlite_rows_add_up_to_the_totals(tmp_path: Path) -> None:
    async with SQLiteLedger(tmp_path / "a.ledger", D(5)) as ledger:
        a = await ledger.reserve(D("1"), key="a")
        b = await ledger.reserve(D("2"), key="b")
        await ledger.reserve(D("0.5"), key="c")
        await ledger.settle(a, D("0.123456789012"), provider="chutes", generation_id="gen-a")
        await ledger.release(b)
        state = await ledger.snapshot()
    audit = ledger.audit()
    assert audit == {"spent_units": 123456789012, "reserved_units": 500000000000, "open": 1}
    assert state.spent == D("0.123456789012")
    con = sqlite3.connect(tmp_path / "a.ledger")
    row = con.execute("SELECT state, provider, generation_id FROM reservations WHERE key = 'a'")
    assert row.fetchone() == ("settled", "chutes", "gen-a")
    con.close()


@pytest.mark.redis
@pytest.mark.parametrize("name", ["", "a{b}"])
def test_bad_redis_ledger_names_are_refused(redis_server: RedisServer, name: str) -> None:
    with pytest.raises(ConfigurationError, match="name"):
        RedisLedger(redis_server.url, name, D(1))


@pytest.mark.redis
async def test_redis_is_exact_across_2_to_the_53_units(redis_server: RedisServer) -> None:
    # Lua numbers are doubles: 2^53 + 1 is the first integer a double cannot hold.
    near = 2**53
    async with RedisLedger(redis_server.url, "beyond-doubles", D(10_000)) as ledger:
        a = await ledger.reserve(from_units(near - 1), key="a")
        b = await ledger.reserve(from_units(2), key="b")
        state = await ledger.snapshot()
        assert state.reserved == from_units(near + 1)
        await ledger.settle(a, from_units(near - 1), estimate=from_units(near + 5))
        await ledger.settle(b, from_units(3), estimate=from_units(near + 7))
        state = await ledger.snapshot()
        assert state.spent == from_units(near + 2)
        assert state.estimated == from_units(2 * near + 12)
        assert state.drift == from_units(-near - 10)
        assert state.overrun == from_units(1)
        rest = D(10_000) - from_units(near + 2)
        last = await ledger.reserve(rest, key="all the rest")
        with pytest.raises(BudgetExhausted):
            await ledger.reserve(from_units(1), key="one picodollar too many")
        await ledger.settle(last, rest - from_units(1))
        state = await ledger.snapshot()
        assert (state.spent, state.available) == (D(10_000) - from_units(1), from_units(1))


big_steps = st.lists(
    st.tuples(
        st.integers(0, LEDGER_MAX_UNITS),  # reservation, picodollars
        st.integers(0, LEDGER_MAX_UNITS),  # cost (above the reservation: an overrun)
        st.one_of(st.none(), st.integers(0, LEDGER_MAX_UNITS)),  # estimate
        st.sampled_from(["settle", "release", "keep"]),
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.redis
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(0, LEDGER_MAX_UNITS), steps=big_steps)
def test_redis_agrees_with_exact_integer_arithmetic_on_large_amounts(
    redis_server: RedisServer, limit: int, steps: list[tuple[int, int, int | None, str]]
) -> None:
    # The memory ledger computes in Python integers: the reference for the Lua limbs
    # (carries, borrows, negative drift, comparisons across 2^53 and up to the cap).
    async def run() -> None:
        name = f"big-{next(_big_names)}"
        async with (
            RedisLedger(redis_server.url, name, from_units(limit)) as redis,
            MemoryLedger(from_units(limit)) as memory,
        ):
            for units, cost, estimate, then in steps:
                outcomes = []
                for ledger in (redis, memory):
                    try:
                        res = await ledger.reserve(from_units(units), key="k")
                    except BudgetExhausted:
                        outcomes.append("refused")
                        continue
                    outcomes.append("admitted")
                    if then == "settle":
                        est = None if estimate is None else from_units(estimate)
                        await ledger.settle(res, from_units(cost), estimate=est)
                    elif then == "release":
                        await ledger.release(res)
                assert outcomes[0] == outcomes[1]
                assert await redis.snapshot() == await memory.snapshot()

    asyncio.run(run())


async def test_commits_are_spaced_by_the_commit_interval_under_load(tmp_path: Path) -> None:
    # Group commit sized by time: an idle store commits at once; the next batch waits
    # out the interval (here an hour: it is only cut short by close or a full batch).
    ledger = SQLiteLedger(tmp_path / "l.sqlite", D(10), executor="loop", commit_interval=3600)
    first = await ledger.reserve(D("0.1"), key="first")  # idle: written at once
    second = asyncio.create_task(ledger.reserve(D("0.1"), key="second"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not second.done()  # waiting for the interval, not for the store
    crowd = [asyncio.create_task(ledger.reserve(D("0.001"), key=f"c{i}")) for i in range(600)]
    # 512 ops waiting start a batch at once: no close needed (the bound only guards a hang).
    done = await asyncio.wait_for(asyncio.gather(second, *crowd), timeout=60)
    assert len(done) == 601
    late = asyncio.create_task(ledger.settle(first, D("0.05")))
    await asyncio.sleep(0)
    assert not late.done()
    await ledger.close()  # close writes what is pending at once
    assert late.done()
    assert late.exception() is None
    reopened = SQLiteLedger(tmp_path / "l.sqlite", executor="loop", commit_interval=0)
    state = await reopened.snapshot()
    await reopened.close()
    assert state.spent == D("0.05")
    assert state.open == 601


def test_a_negative_commit_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="commit_interval"):
        SQLiteLedger(tmp_path / "l.sqlite", D(1), commit_interval=-1)


async def _hold_many(ledger: SQLiteLedger, now: list[float], hold: float, times: int) -> None:
    for _ in range(times):
        now[0] += 1.0  # an idle store: every write starts at once
        res = await ledger.reserve(D("0.001"), key="held")
        now[0] += hold
        await ledger.settle(res, D("0.001"))


async def _blocked_for_a_while(ledger: SQLiteLedger, now: list[float], after: float) -> bool:
    """Whether a reserve ``after`` seconds after the last batch started waits to be written."""
    now[0] += 1.0
    await ledger.reserve(D("0.001"), key="lone")  # idle for a second: written at once
    now[0] += after
    late = asyncio.create_task(ledger.reserve(D("0.001"), key="late"))
    for _ in range(10):
        await asyncio.sleep(0)
    waited = not late.done()
    now[0] += 1.0  # let the interval run out
    await late
    return waited


@pytest.mark.parametrize(("hold", "waits"), [(0.2, False), (4.0, True)])
async def test_long_holds_stretch_the_commit_interval_but_an_idle_store_commits_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold: float, waits: bool
) -> None:
    # Requests held for seconds share commits of up to 2.5x the interval (25 ms by
    # default): 15 ms after a batch started, the next write waits. Short requests
    # keep 10 ms. Either way a write to an idle store starts at once (the "lone"
    # reserve above never waits: the fake clock does not move while it is written).
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    ledger = SQLiteLedger(tmp_path / "l.sqlite", D(10), executor="loop", synchronous="OFF")
    async with ledger:
        await _hold_many(ledger, now, hold, 30)
        assert await _blocked_for_a_while(ledger, now, 0.015) is waits
        assert await _blocked_for_a_while(ledger, now, 0.030) is False


async def test_the_loop_never_waits_for_another_process_holding_the_write_lock(
    tmp_path: Path,
) -> None:
    # Statements run on the loop with a busy timeout of 0: a batch that finds the
    # lock taken goes whole to the writer thread, which waits for the lock there.
    path = tmp_path / "l.sqlite"
    async with SQLiteLedger(path, D(10)) as ledger:
        first = await ledger.reserve(D("1"), key="before")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process takes the write lock
        blocked = asyncio.create_task(ledger.reserve(D("2"), key="while locked"))
        for _ in range(50):
            await asyncio.sleep(0)  # the loop keeps running...
        assert not blocked.done()  # ...while the reservation waits for the lock
        other.execute("COMMIT")
        other.close()
        second = await blocked
        await ledger.settle(first, D("0.5"))
        await ledger.release(second)
        state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.settled, state.released) == (D("0.5"), 0, 1, 1)


@pytest.mark.parametrize("code", [sqlite3.SQLITE_BUSY, 261, 517])  # BUSY, _RECOVERY, _SNAPSHOT
async def test_any_busy_answer_on_the_loop_sends_the_batch_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # Extended busy codes (another process recovering the WAL, a stale snapshot) mean
    # "wait for the lock" too: the batch is written by the thread, not failed.
    async with SQLiteLedger(tmp_path / "l.sqlite", D(10)) as ledger:
        store = ledger._store
        begin = store.begin
        answers = iter([code])

        def busy_once() -> None:
            for answer in answers:
                exc = sqlite3.OperationalError("database is locked")
                exc.sqlite_errorcode = answer
                raise exc
            begin()

        monkeypatch.setattr(store, "begin", busy_once)
        res = await ledger.reserve(D("1"), key="busy")
        await ledger.settle(res, D("0.25"))
        state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.open) == (D("0.25"), 0, 0)


async def test_a_cancelled_batch_task_never_lets_the_loop_share_the_connection_with_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch that runs whole in the writer thread (a scan) holds the connection's
    # transaction there; if the task awaiting it is cancelled (shutdown), the next
    # batch must wait for the thread instead of beginning on the loop beside it.
    async with SQLiteLedger(tmp_path / "l.sqlite", D(10), commit_interval=0) as ledger:
        store = ledger._store
        apply_waiting = store.apply_waiting
        inside, release = threading.Event(), threading.Event()

        def slow_scan(batch: list[Any]) -> tuple[int, int, int]:
            store.begin()
            inside.set()
            release.wait(60)
            store.rollback()
            return apply_waiting(batch)

        monkeypatch.setattr(store, "apply_waiting", slow_scan)
        scan = asyncio.create_task(ledger.open_reservations())
        await asyncio.to_thread(inside.wait, 60)
        task = ledger._batcher._task
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        monkeypatch.setattr(store, "apply_waiting", apply_waiting)
        later = asyncio.create_task(ledger.reserve(D("1"), key="after the cancel"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not later.done()  # waits for the thread's transaction to end
        release.set()
        res = await later
        scan.cancel()
        await ledger.settle(res, D("0.5"))
        state = await ledger.snapshot()
    assert (state.spent, state.reserved, state.open) == (D("0.5"), 0, 0)
