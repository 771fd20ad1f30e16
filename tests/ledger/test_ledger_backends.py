"""Backend-specific behaviour: files, options, the optional Redis dependency."""

from __future__ import annotations

import sqlite3
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import (
    BudgetExhausted,
    ConfigurationError,
    DataFileError,
    MissingDependencyError,
    RedisLedger,
    SQLiteLedger,
)
from provider_router._money import from_units
from tests.ledger.conftest import RedisServer

D = Decimal


def test_redis_ledger_without_the_redis_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'provider-router\[redis\]'"):
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
