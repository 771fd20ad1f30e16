"""A failed ledger write is named with its cause and what it means for money (#21)."""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import SQLiteLedger
from provider_router.cli._logging import EventReport
from provider_router.ledger import _group_commit as b

D = Decimal


def failing(ledger: SQLiteLedger, kind: int, error: Exception) -> None:
    """Make every batch holding an op of ``kind`` fail with ``error``."""
    real = ledger._execute_once

    async def execute(batch: list[b.Op]) -> tuple[int, int, int]:
        if any(op.kind == kind for op in batch):
            raise error
        return await real(batch)

    ledger._execute_once = execute  # type: ignore[method-assign]


async def test_a_failed_settle_is_named_with_its_cause_and_meaning(
    tmp_path: Path, log_events: list[dict[str, Any]]
) -> None:
    async with SQLiteLedger(tmp_path / "l.sqlite", D(10)) as ledger:
        failing(ledger, b.SETTLE, OSError(5, "Input/output error"))
        res = await ledger.reserve(D(1), key="p")
        with pytest.raises(OSError, match="Input/output error"):
            await ledger.settle(res, D("0.5"))
        assert ledger.write_failures.uncertain
        assert ledger.write_failures.count == 1
    (event,) = [e for e in log_events if e["event"] == "ledger.write_failed"]
    assert event["error_type"] == "OSError"
    assert event["error"].startswith("OSError: [Errno 5] Input/output error: ")
    assert "a paid answer's charge was not recorded" in event["error"]


@pytest.mark.parametrize(
    ("kind", "meaning"),
    [
        (b.SNAPSHOT, None),  # a read: its caller's error alone
        (b.RESERVE, "a request was not admitted (nothing was sent for it)"),
    ],
    ids=["read", "reserve"],
)
async def test_a_failure_that_records_no_money_leaves_money_certain(
    tmp_path: Path, log_events: list[dict[str, Any]], kind: int, meaning: str | None
) -> None:
    async with SQLiteLedger(tmp_path / "l.sqlite", D(10)) as ledger:
        failing(ledger, kind, RuntimeError("store broke"))
        with pytest.raises(RuntimeError):
            await (ledger.snapshot() if kind == b.SNAPSHOT else ledger.reserve(D(1), key="p"))
        assert not ledger.write_failures.uncertain
    said = [e["error"] for e in log_events if e["event"] == "ledger.write_failed"]
    assert said == ([] if meaning is None else [f"RuntimeError: store broke: {meaning}"])


def test_the_count_line_says_the_first_cause(capsys: pytest.CaptureFixture[str]) -> None:
    report = EventReport(each=False, fmt="console")
    logger = logging.getLogger("provider_router.test_write_failures")
    logger.addHandler(report)
    try:
        for n in range(2):
            logger.error(
                "ledger.write_failed",
                extra={"error_type": "OSError", "error": f"OSError: disk {n}: a charge…"},
            )
    finally:
        logger.removeHandler(report)
    (line,) = report.report()
    assert line == (
        "provider-router: 2 ledger writes failed; the first: OSError: disk 0: a charge…"
    )


def test_a_lock_waited_out_is_said_as_such() -> None:
    from provider_router.cli._logging import describe_kind

    assert describe_kind("ledger.store_unreachable", None, 1) == (
        "the ledger's store could not be reached, or was locked by another process, 1 time "
        "(waited out and retried: nothing lost)"
    )
