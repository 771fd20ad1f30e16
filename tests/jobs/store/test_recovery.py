"""What a run says it repaired of earlier runs (``summary.recovered``), step by step."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from _job_helpers import simulate_crash

from provider_router import MemoryLedger, Router, SQLiteLedger
from provider_router.jobs.store._layout import JOURNAL_FILE
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.store.recovery import apply_budget, journal_repairs, reconcile_crashed
from provider_router.testing import DEFAULT_TEST_KEY

LOST = (
    "{} request(s) were in flight when the last run died; "
    "their prompts run again and their cost is reconciled by the ledger"
)


def _notes(directory: Path) -> list[dict[str, str]]:
    lines = (directory / JOURNAL_FILE).read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if entry.get("op") == "budget"]


def test_a_clean_journal_has_nothing_to_say(tmp_path: Path) -> None:
    FileJournal.open(tmp_path).close()
    with FileJournal.open(tmp_path) as journal:
        assert journal_repairs(journal) == []


def test_requests_in_flight_at_a_crash_are_said_after_the_repairs(tmp_path: Path) -> None:
    journal = FileJournal.open(tmp_path)
    assert journal.claim("d", "a")
    assert journal.claim("d", "b")
    journal.flush()
    simulate_crash(journal)
    with (tmp_path / JOURNAL_FILE).open("ab") as fh:
        fh.write(b'{"op":"claim","ds":"d","id":"c","en')  # torn by the kill
    with FileJournal.open(tmp_path) as journal:
        notes = journal_repairs(journal)
        assert notes[:-1] == journal.repairs
        assert any("torn last line" in note for note in notes[:-1])
        assert notes[-1] == LOST.format(2)
        journal.repairs.append("changed afterwards")
        assert "changed afterwards" not in notes  # a copy, not the journal's own list


async def test_the_same_budget_changes_nothing(tmp_path: Path) -> None:
    ledger = MemoryLedger(Decimal("5"))
    with FileJournal.open(tmp_path) as journal:
        assert await apply_budget(ledger, Decimal("5.00"), journal) == []
    assert (await ledger.snapshot()).limit == 5
    assert _notes(tmp_path) == []


async def test_a_changed_budget_becomes_the_limit_and_is_noted(tmp_path: Path) -> None:
    ledger = MemoryLedger(Decimal("5"))
    with FileJournal.open(tmp_path) as journal:
        notes = await apply_budget(ledger, Decimal("2.5"), journal)
    assert notes == ["budget changed from $5.00 to $2.50"]
    assert (await ledger.snapshot()).limit == Decimal("2.5")
    assert [(Decimal(n["old"]), Decimal(n["new"])) for n in _notes(tmp_path)] == [
        (5, Decimal("2.5"))
    ]
    # Without a journal (a ledger checked on its own) the change is still said.
    assert await apply_budget(ledger, Decimal("3"), None) == ["budget changed from $2.50 to $3.00"]


async def test_a_paid_answer_the_ledger_missed_is_settled_at_its_journaled_cost(
    tmp_path: Path, openrouter_sim_factory: Any
) -> None:
    # A full disk under the ledger: the answers of p/q1 and p/q2 were paid and journaled,
    # their settles (and attaches) failed. p/q2 also has an earlier attempt held, its
    # outcome unknown: which reservation is whose is unknown, so both stay worst cases.
    path = tmp_path / "ledger.sqlite"
    first = SQLiteLedger(path, Decimal(5), lease=1.0)
    held = [
        await first.reserve(Decimal("0.01"), key=key) for key in ("p/q1", "p/q2", "p/q2", "p/q3")
    ]
    await first._close_store()  # the process dies with the reservations open
    with FileJournal.open(tmp_path) as journal:
        journal.note_unsettled("p/q1", Decimal("0.0012"))
        journal.note_unsettled("p/q2", Decimal("0.0007"))
    sim = await openrouter_sim_factory()
    later = SQLiteLedger(path, clock=lambda: time.time() + 60)  # the leases ran out
    try:
        with FileJournal.open(tmp_path) as journal:
            assert journal.unsettled == {"p/q1": 1_200_000_000, "p/q2": 700_000_000}
            async with Router(
                "moonshotai/kimi-k2.5", base_url=sim.url, api_key=DEFAULT_TEST_KEY
            ) as router:
                report, notes = await reconcile_crashed(later, router, journal)
            assert journal.unsettled == {}
        assert [r.key for r in report.reconciled] == ["p/q1"]
        assert report.reconciled_cost == Decimal("0.0012")
        assert sorted(r.key for r in report.worst_case) == ["p/q2", "p/q2", "p/q3"]
        state = await later.snapshot()
        assert state.spent == Decimal("0.0012") + 3 * held[1].amount
        assert state.reserved == 0
        assert notes == [
            "ledger: 1 crashed request(s) reconciled ($0.0012), 3 counted at worst case ($0.03)"
        ]
    finally:
        await later.close()
    with FileJournal.open(tmp_path) as journal:  # used once: never applied again
        assert journal.unsettled == {}
