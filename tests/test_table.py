"""Tables that fit their width (provider_router/_table.py): nothing cut, ever."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from provider_router._table import Column, FitTable, wrap_words

BOX = set("┏┳┓┃┡╇┩│├┼┤└┴┘━─")
REASON = (
    "quantization declared 'unknown': assumed int4, the native precision of "
    "moonshotai/kimi-k2.5; meets the int4 floor; status -2 means degraded"
)


def market() -> FitTable:
    table = FitTable(
        Column("#", "right", key=True),
        Column("provider", key=True),
        Column("tag", drop=1),
        Column("prompt $/M", "right", drop=2),
        Column("uptime", "right", drop=0),
        Column("verdict"),
        Column("$/1k ok req", "right"),
        Column("reason", below=True),
        title="moonshotai/kimi-k2.5: 3 endpoints, 2 allowed",
    )
    table.add_row("1", "DeepInfra", "deepinfra/int4", "$0.50", "99.6%", "allowed", "$4.92", REASON)
    table.add_row("2", "Moonshot AI", "moonshotai", "$0.60", "99.9%", "allowed", "$5.13", "ok")
    table.add_row("", "Fireworks", "fireworks", "$0.60", "99.7%", "rejected", "", "nvfp4")
    return table


def printed(table: FitTable, width: int, *, terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=terminal, color_system=None)
    console.print(table)
    return out.getvalue()


@pytest.mark.parametrize("width", [30, 40, 60, 80, 100, 120])
@pytest.mark.parametrize("terminal", [True, False])
def test_no_cell_is_cut_and_no_line_passes_the_width(width: int, terminal: bool) -> None:
    text = printed(market(), width, terminal=terminal)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for name in ("DeepInfra", "Moonshot AI", "Fireworks", "$4.92", "$5.13", "rejected"):
        assert name in text  # whole, on one line
    assert " ".join(text.split()).count("moonshotai/kimi-k2.5;") == 1  # the reason, whole


def test_a_wide_table_keeps_every_column_and_the_reason_in_its_row() -> None:
    text = printed(market(), 300, terminal=False)
    row = next(line for line in text.splitlines() if "DeepInfra" in line)
    assert row.split()[:4] == ["1", "DeepInfra", "deepinfra/int4", "$0.50"]
    assert row.endswith(REASON)


def test_a_long_reason_goes_under_its_row_before_any_column_is_dropped() -> None:
    text = printed(market(), 100, terminal=False)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "DeepInfra" in line)
    assert "deepinfra/int4" in lines[at]
    assert "99.6%" in lines[at]
    assert lines[at + 1].startswith("   quantization declared 'unknown'")
    assert "not shown" not in text


def test_columns_drop_in_their_order_and_are_named_under_the_table() -> None:
    text = printed(market(), 60, terminal=False)
    assert "uptime" not in text.splitlines()[1]  # drop=0 goes first
    assert "not shown at 60 columns: uptime" in text or "not shown at 60 columns: tag" in text
    header = next(line for line in text.splitlines() if "provider" in line)
    assert "verdict" in header  # never dropped


def test_too_narrow_for_any_table_each_row_is_a_block() -> None:
    text = printed(market(), 30, terminal=False)
    lines = text.splitlines()
    at = lines.index("1 DeepInfra")
    assert "   verdict: allowed" in lines[at + 1 : at + 6]


def test_piped_it_is_plain_and_one_row_per_line() -> None:
    text = printed(market(), 100, terminal=False)
    assert not BOX & set(text)
    rows = [line for line in text.splitlines() if line.endswith(("$4.92", "$5.13", "rejected"))]
    assert [row.split()[:2] for row in rows] == [
        ["1", "DeepInfra"],
        ["2", "Moonshot"],
        ["Fireworks", "fireworks"],
    ]


def test_on_a_terminal_it_draws_boxes_and_the_reason_spans_the_row() -> None:
    text = printed(market(), 100, terminal=True)
    lines = text.splitlines()
    assert lines[1].startswith("┏")
    assert lines[-1].startswith("└")
    widths = {len(line) for line in lines[1:]}
    assert len(widths) == 1  # every line of the box as wide as the others
    at = next(i for i, line in enumerate(lines) if "DeepInfra" in line)
    assert lines[at + 1].startswith("│    quantization declared")
    assert lines[at + 1].endswith("│")


def test_a_row_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cells for 8 columns"):
        market().add_row("1", "x")


def test_wrap_words_never_cuts_a_word() -> None:
    assert wrap_words("a bb ccc https://openrouter.ai/settings/credits d", 10) == [
        "a bb ccc",
        "https://openrouter.ai/settings/credits",
        "d",
    ]
