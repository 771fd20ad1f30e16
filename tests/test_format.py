"""Money, prices and percentages as people read them; exact exponent-free JSON strings."""

from __future__ import annotations

import asyncio
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider_router import SQLiteLedger
from provider_router._exceptions import BudgetExhausted
from provider_router._format import decimal_str, format_percent, format_price, format_usd
from provider_router.cli import main

D = Decimal
CANONICAL = re.compile(r"^-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (D("1.5E+2"), "150"),
        (D("5E+1"), "50"),
        (D("0E-12"), "0"),
        (D("-0"), "0"),
        (D("5.000000000000"), "5"),
        (D("0.000000000001"), "0.000000000001"),
        (D("1E-13"), "0.0000000000001"),
        (
            D("123456789012345678901234567890.123456789012"),
            "123456789012345678901234567890.123456789012",
        ),
    ],
)
def test_decimal_str_is_exact_and_has_no_exponent(value: Decimal, expected: str) -> None:
    assert decimal_str(value) == expected


@given(
    st.decimals(
        allow_nan=False, allow_infinity=False, places=12, min_value=-(10**9), max_value=10**9
    )
)
def test_decimal_str_round_trips_exactly(value: Decimal) -> None:
    text = decimal_str(value)
    assert CANONICAL.match(text), text
    assert D(text) == value


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (None, "-"),
        (D("0E-12"), "$0.00"),
        (D("5.000000000000"), "$5.00"),
        (D("1234.565"), "$1,234.56"),
        (D("0.0042"), "$0.0042"),
        (D("0.004249"), "$0.0042"),
        (D("1E-13"), "$0.00000000000010"),
        (D("-0.25"), "-$0.25"),
        (D("1.5E+2"), "$150.00"),
        # Past the default 28 digits of precision: a damaged file's figure, still a line.
        (D("1E+26"), "$100,000,000,000,000,000,000,000,000.00"),
        (D("Infinity"), "$Infinity"),
    ],
)
def test_format_usd_reads_as_cents_and_never_hides_a_small_amount(
    amount: Decimal | None, expected: str
) -> None:
    assert format_usd(amount) == expected


@pytest.mark.parametrize(
    ("per_token", "expected"),
    [
        (D("0.0000022"), "$2.20/M"),
        (D("0.0000000375"), "$0.0375/M"),
        (D("1E-13"), "$0.0000001/M"),
        (D("1.23456E-13"), "$0.000000123/M"),
        (D(0), "$0.00/M"),
        (None, "-"),
    ],
)
def test_format_price_keeps_significant_digits(per_token: Decimal | None, expected: str) -> None:
    assert format_price(per_token) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (99.971, "99.97%"),
        (99.9999, "99.9999%"),
        (100.0, "100.0%"),
        (99.84, "99.8%"),
        (0.04, "0.04%"),
        (0, "0.0%"),
        (None, "-"),
    ],
)
def test_format_percent_never_rounds_to_a_different_reading(
    value: float | None, expected: str
) -> None:
    assert format_percent(value) == expected


def test_budget_exhausted_message_has_no_exponent() -> None:
    exc = BudgetExhausted(
        requested=D("0.0043"), spent=D("5.000000000000"), reserved=D("0E-12"), limit=D("5")
    )
    assert "$0E-12" not in str(exc)
    assert "reserved $0.00" in str(exc)
    assert "limit $5.00" in str(exc)
    assert "$5.000000000000" not in str(exc)


def _money_strings(value: object, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _money_strings(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _money_strings(v, f"{path}[{i}]")]
    if isinstance(value, str) and re.fullmatch(r"-?[0-9][0-9.Ee+-]*", value):
        return [(path, value)]
    return []


def assert_canonical_money(document: object) -> None:
    """Every numeric string in ``document`` is exact canonical decimal text."""
    found = _money_strings(document)
    assert found
    for where, text in found:
        assert CANONICAL.match(text), f"{where}: {text!r}"


def test_ledger_show_json_writes_canonical_decimals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.ledger"

    async def make() -> None:
        async with SQLiteLedger(path, D("100")) as ledger:
            done = await ledger.reserve(D("1"), key="p0")
            await ledger.settle(done, D("0.250000000000"), estimate=D("0.2"))
            await ledger.set_limit(D("1.5E+2"))

    asyncio.run(make())
    capsys.readouterr()
    assert main(["ledger", "show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["limit"] == "150"
    assert shown["reserved"] == "0"
    assert shown["spent"] == "0.25"
    assert_canonical_money(shown)
    assert main(["ledger", "topup", str(path), "--add", "50"]) == 0
    assert capsys.readouterr().out == "limit $200, available $199.75\n"
    assert main(["ledger", "show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["limit"] == "200"


def test_endpoints_table_shows_a_tiny_price_and_a_near_perfect_uptime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundled = Path(__file__).parent.parent / "provider_router/data/kimi-k2.5.endpoints.json"
    listing = json.loads(bundled.read_text())
    chutes = listing["data"]["endpoints"][0]
    chutes["pricing"]["prompt"] = "0.0000000000001"  # $1e-13 per token
    chutes["uptime_last_30m"] = 99.971
    market = tmp_path / "market.json"
    market.write_text(json.dumps(listing))
    assert main(["endpoints", "moonshotai/kimi-k2.5", "--snapshot", str(market)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "Chutes" in line)
    assert "$0.0000001" in row
    assert "$0.0000 " not in row
    assert "99.97%" in row
    assert "100.0%" not in row


def test_project_json_writes_canonical_decimals(capsys: pytest.CaptureFixture[str]) -> None:
    examples = Path(__file__).parent.parent / "examples"
    argv = ["project", str(examples / "plan.yaml"), "--snapshot", str(examples / "market.json")]
    assert main([*argv, "--completion-tokens", "600", "--budget", "0.000001", "--json"]) == 0
    assert_canonical_money(json.loads(capsys.readouterr().out))
