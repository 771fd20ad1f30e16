"""The option types the sub-commands share (provider_router/cli/_options.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from decimal import Decimal

import pytest

from provider_router.cli._options import (
    add_market_arguments,
    budget_usd,
    non_negative_usd,
    positive_count,
    positive_usd,
    usd,
)


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (usd, "5", Decimal(5)),
        (usd, "$5", Decimal(5)),
        (usd, " $0.25 ", Decimal("0.25")),
        (usd, "-3", Decimal(-3)),
        (non_negative_usd, "0", Decimal(0)),
        (non_negative_usd, "$150", Decimal(150)),
        (budget_usd, "$100", Decimal(100)),
        (budget_usd, "0.000001", Decimal("0.000001")),
        (positive_count, "1", 1),
        (positive_count, "10M", 10_000_000),
    ],
)
def test_good_values(parse: Callable[[str], object], text: str, value: object) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (usd, "lots", "not an amount in USD: 'lots'"),
        (usd, "inf", "not an amount in USD: 'inf'"),
        (usd, "NaN", "not an amount in USD: 'NaN'"),
        (usd, "", "not an amount in USD: ''"),
        (non_negative_usd, "-5", "not a non-negative amount in USD: '-5'"),
        (non_negative_usd, "$-5", "not a non-negative amount in USD: '$-5'"),
        (budget_usd, "0", "a budget must be more than $0, got '0'"),
        (budget_usd, "-1", "a budget must be more than $0, got '-1'"),
        (budget_usd, "ten", "not an amount in USD: 'ten'"),
        (positive_count, "0", "must be at least 1, got '0'"),
        (positive_count, "-1", "not a token count: '-1'"),
    ],
)
def test_bad_values_name_what_was_wrong(
    parse: Callable[[str], object], text: str, message: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse(text)
    assert str(exc.value).startswith(message)


def test_market_flags_go_into_the_given_group() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_market_arguments(parser.add_mutually_exclusive_group())
    args = parser.parse_args(["--snapshot", "market.json"])
    assert (args.base_url, args.snapshot) == (None, "market.json")
    with pytest.raises(argparse.ArgumentError, match="not allowed with argument"):
        parser.parse_args(["--snapshot", "market.json", "--base-url", "http://127.0.0.1:1"])


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1E+999999999", "no exponent"),
        ("1e-30", "no exponent"),
        ("5e2", "no exponent"),
        ("$$5", "one dollar sign"),
        ("５", "ASCII digits"),
        ("٣", "ASCII digits"),
        ("1.2.3", "digits"),
        ("0.0000000000001", "finer than a picodollar"),
        ("4000000.01", "above the largest amount a ledger holds exactly ($4,000,000)"),
        ("99999999999999999999", "above the largest amount a ledger holds exactly"),
    ],
)
def test_one_strict_amount_parser_for_every_usd_flag(text: str, why: str) -> None:
    """No exponent, one dollar sign, ASCII digits, a picodollar at most fine and a
    ledger's largest amount at most: every USD flag reads amounts the same way."""
    for parse in (usd, non_negative_usd, budget_usd, positive_usd):
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            parse(text)
        assert why in str(exc.value), (parse, text, str(exc.value))
        assert repr(text) in str(exc.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,000", Decimal(1000)),
        ("$1,000.50", Decimal("1000.50")),
        ("0.000000000001", Decimal("0.000000000001")),
        ("4000000", Decimal(4_000_000)),
        ("  $ 5 ", None),
    ],
)
def test_amounts_as_people_write_them(text: str, value: Decimal | None) -> None:
    if value is None:
        with pytest.raises(argparse.ArgumentTypeError):
            usd(text)
        return
    assert usd(text) == value


def test_an_addition_must_add_something() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be more than \$0, got '0'"):
        positive_usd("0")
