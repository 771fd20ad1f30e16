"""Large limits are exact on every backend; creation is one transaction (issue #10, item 8)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import BudgetExhausted, ConfigurationError, SQLiteLedger
from provider_router._money import LEDGER_MAX_USD
from provider_router.ledger import sqlite as sqlite_module
from tests.ledger.conftest import Backend

D = Decimal
PICO = D("1E-12")


async def test_a_million_dollar_limit_is_exact_to_the_picodollar(
    backend: Backend,
) -> None:
    ledger = backend.make(D(1_000_000))
    big = await ledger.reserve(D(1_000_000) - PICO, key="almost all")
    last = await ledger.reserve(PICO, key="the last picodollar")
    with pytest.raises(BudgetExhausted):
        await ledger.reserve(PICO, key="one too many")
    state = await ledger.snapshot()
    assert (state.reserved, state.available) == (D(1_000_000), 0)
    await ledger.settle(big, D("999999.999999999998"), estimate=D("999999.5"))
    await ledger.release(last)
    state = await ledger.snapshot()
    assert state.spent == D("999999.999999999998")
    assert state.drift == D("0.499999999998")
    assert state.available == 2 * PICO


async def test_the_largest_limit_is_held_exactly_and_one_picodollar_more_is_refused(
    backend: Backend,
) -> None:
    ledger = backend.make(LEDGER_MAX_USD)
    res = await ledger.reserve(LEDGER_MAX_USD, key="everything")
    await ledger.settle(res, LEDGER_MAX_USD - PICO)
    state = await ledger.snapshot()
    assert (state.limit, state.spent, state.available) == (
        LEDGER_MAX_USD,
        LEDGER_MAX_USD - PICO,
        PICO,
    )
    with pytest.raises(ConfigurationError, match=r"largest amount a ledger holds exactly"):
        await ledger.set_limit(LEDGER_MAX_USD + PICO)
    assert (await ledger.snapshot()).limit == LEDGER_MAX_USD


@pytest.mark.parametrize("limit", [D("9999999"), LEDGER_MAX_USD + PICO, D("1E+30")])
async def test_a_limit_no_backend_can_hold_is_a_clear_error(
    backend: Backend, limit: Decimal
) -> None:
    async def make_and_use() -> None:
        await backend.make(limit).snapshot()

    with pytest.raises(ConfigurationError, match=r"limit \$.* is above the largest amount"):
        await make_and_use()


async def test_a_cost_no_backend_can_hold_is_refused_and_the_hold_stays(backend: Backend) -> None:
    ledger = backend.make(D(10))
    res = await ledger.reserve(D(1), key="k")
    with pytest.raises(ConfigurationError, match=r"cost \$9999999 is above"):
        await ledger.settle(res, D(9999999))
    state = await ledger.snapshot()
    assert (state.reserved, state.open, state.spent) == (D(1), 1, 0)


async def test_a_refused_limit_leaves_no_half_made_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with pytest.raises(ConfigurationError, match="above the largest"):
        SQLiteLedger(path, D("9999999"))
    with pytest.raises(ConfigurationError, match="is a new ledger: give it a limit"):
        SQLiteLedger(path)
    async with SQLiteLedger(path, D(5)) as ledger:
        assert (await ledger.snapshot()).limit == 5


def _kill_while_creating(path: Path) -> int:
    """Create a ledger in a child process that dies (os._exit) as the totals row is written."""
    script = textwrap.dedent(
        f"""
        import os, sqlite3
        from decimal import Decimal
        from provider_router.ledger import sqlite as mod

        real = mod._connect
        def dying(path, synchronous, *rest):
            con = real(path, synchronous, *rest)
            con.set_trace_callback(
                lambda sql: os._exit(9) if sql.startswith("INSERT INTO totals") else None
            )
            return con
        mod._connect = dying
        mod.SQLiteLedger({str(path)!r}, Decimal(10))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", script], env=env, check=False).returncode  # noqa: S603


async def test_a_kill_during_creation_leaves_a_ledger_that_can_still_be_created(
    tmp_path: Path,
) -> None:
    path = tmp_path / "l.sqlite"
    assert _kill_while_creating(path) == 9
    con = sqlite3.connect(path)
    try:
        tables = con.execute("SELECT name FROM sqlite_master").fetchall()
    finally:
        con.close()
    assert tables == []  # nothing of the schema survived the kill
    async with SQLiteLedger(path, D(10)) as ledger:
        assert (await ledger.snapshot()).limit == 10


async def test_a_ledger_wedged_by_an_older_release_is_completed(tmp_path: Path) -> None:
    # Older releases committed the schema, then the totals row: a kill between the two
    # left a file that every later open refused.
    path = tmp_path / "l.sqlite"
    con = sqlite3.connect(path)
    con.executescript(sqlite_module._SCHEMA)
    con.close()
    with pytest.raises(ConfigurationError, match="is a new ledger: give it a limit"):
        SQLiteLedger(path)
    async with SQLiteLedger(path, D(10)) as ledger:
        assert (await ledger.snapshot()).limit == 10


async def test_reopening_keeps_the_identity_and_keep_limit_keeps_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    async with SQLiteLedger(path, D(5)) as first:
        assert first.created
    async with SQLiteLedger(path, D(7), keep_limit=True) as again:
        assert (again.identity, again.created) == (first.identity, False)
        assert (await again.snapshot()).limit == 5
    with pytest.raises(ConfigurationError, match=r"has a limit of \$5.*, not \$7"):
        SQLiteLedger(path, D(7))
    async with SQLiteLedger(tmp_path / "other.sqlite", D(5)) as other:
        assert other.identity != first.identity


async def test_a_refused_limit_reads_as_money_and_names_the_way_to_keep_the_files(
    tmp_path: Path,
) -> None:
    """What a reader sees after ``ledger topup`` when code reopens with its first limit."""
    path = tmp_path / "run.ledger"
    async with SQLiteLedger(path, D(100)) as ledger:
        await ledger.set_limit(D(150))
    with pytest.raises(ConfigurationError) as refused:
        SQLiteLedger(path, D(100))
    message = str(refused.value)
    assert f"{path} has a limit of $150, not $100: " in message
    assert "keep_limit=True" in message
