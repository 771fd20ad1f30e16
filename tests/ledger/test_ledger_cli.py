"""``provider-router ledger show|topup`` against real SQLite and Redis ledgers."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path

import pytest

from provider_router import RedisLedger, SQLiteLedger
from provider_router.cli import main
from tests.ledger.conftest import RedisServer

D = Decimal


async def _ledger_with_history(path: Path) -> None:
    async with SQLiteLedger(path, D("100")) as ledger:
        done = await ledger.reserve(D("1"), key="p0")
        await ledger.settle(done, D("0.25"), estimate=D("0.2"))
        held = await ledger.reserve(D("2"), key="p1")
        await ledger.attach(held, "gen-p1")


def test_show_prints_totals_and_open_reservations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.ledger"
    asyncio.run(_ledger_with_history(path))
    capsys.readouterr()  # the set-up's own log lines
    assert main(["ledger", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "limit      $100\n" in out
    assert "spent      $0.25\n" in out
    assert "reserved   $2  (1 open)" in out
    assert "available  $97.75" in out
    charged = "charged    $0.05 more than estimated from usage and listed prices ($0.2 estimated)"
    assert charged in out
    assert "key=p1  generation=gen-p1" in out

    assert main(["ledger", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["spent"], data["available"], data["open"]) == ("0.25", "97.75", 1)
    assert data["open_reservations"][0]["generation_id"] == "gen-p1"


def test_topup_sets_or_adds_to_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.ledger"
    asyncio.run(_ledger_with_history(path))
    capsys.readouterr()  # the set-up's own log lines
    assert main(["ledger", "topup", str(path), "--add", "50"]) == 0
    assert capsys.readouterr().out == "limit $150, available $147.75\n"
    assert main(["ledger", "topup", str(path), "--limit", "10"]) == 0
    assert capsys.readouterr().out == "limit $10, available $7.75\n"


def test_topup_below_what_is_spent_is_refused_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.ledger"
    asyncio.run(_ledger_with_history(path))  # $0.25 spent, $2 reserved
    capsys.readouterr()
    assert main(["ledger", "topup", str(path), "--limit", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--limit $0.10 is below the $0.25 already spent" in err
    assert "at least $0.25" in err
    assert main(["ledger", "show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["limit"] == "100"  # unchanged
    # At what is spent (or above) it is a real choice: stop spending more.
    assert main(["ledger", "topup", str(path), "--limit", "0.25"]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ledger", "show", "missing.ledger"], "no ledger file at missing.ledger"),
        (["ledger", "show", "redis://127.0.0.1:1/0"], "needs --name"),
        (["ledger", "show", "x.ledger", "--name", "n"], "--name is for Redis"),
    ],
)
def test_bad_targets_are_explained(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2  # a bad command
    assert message in capsys.readouterr().err


def test_a_bad_amount_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["ledger", "topup", "x.ledger", "--limit", "-5"])
    assert info.value.code == 2
    assert "not a non-negative amount in USD: '-5'" in capsys.readouterr().err


@pytest.mark.redis
def test_show_reads_a_redis_ledger(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async def make() -> None:
        async with RedisLedger(redis_server.url, "cli-show", D("5")) as ledger:
            await ledger.reserve(D("1.5"), key="p")

    asyncio.run(make())
    capsys.readouterr()
    assert main(["ledger", "show", redis_server.url, "--name", "cli-show"]) == 0
    assert "reserved   $1.5  (1 open)" in capsys.readouterr().out


@pytest.mark.redis
def test_show_of_a_redis_ledger_never_created_logs_no_failed_write(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["ledger", "show", redis_server.url, "--name", "never-made"]) == 1
    err = capsys.readouterr().err
    assert "is new: give it a limit" in err
    assert "write_failed" not in err
    assert "write(s) failed" not in err


@pytest.mark.parametrize(
    ("flag", "amount", "message"),
    [
        ("--limit", "1E+999999999", "no exponent"),
        ("--add", "1e-30", "no exponent"),
        ("--add", "$$5", "one dollar sign"),
        ("--limit", "５", "ASCII digits"),
        ("--add", "0", "must be more than $0"),
        ("--add", "0.0000000000001", "finer than a picodollar"),
    ],
)
def test_topup_refuses_amounts_it_cannot_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, amount: str, message: str
) -> None:
    """One line naming the flag and what is wrong (never a decimal.Overflow traceback),
    exit 2, and the ledger unchanged."""
    path = tmp_path / "run.ledger"
    asyncio.run(_ledger_with_history(path))
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["ledger", "topup", str(path), flag, amount])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err
    assert message in err
    assert "Traceback" not in err
    assert main(["ledger", "show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["limit"] == "100"


def test_topup_past_the_largest_limit_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.ledger"
    asyncio.run(_ledger_with_history(path))  # limit $100
    capsys.readouterr()
    assert main(["ledger", "topup", str(path), "--add", "3999950"]) == 2
    assert "above the largest amount a ledger holds exactly ($4,000,000)" in (
        capsys.readouterr().err
    )
