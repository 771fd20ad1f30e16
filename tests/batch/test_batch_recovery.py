"""What a run says it repaired of earlier runs (``summary.recovered``), step by step."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from _batch_helpers import simulate_crash

from provider_router import MemoryLedger
from provider_router.batch.journal import JOURNAL_FILE, FileJournal
from provider_router.batch.recovery import apply_budget, journal_repairs

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
