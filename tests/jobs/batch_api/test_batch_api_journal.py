"""The batch route's journal: replayed after a kill, a torn last line dropped, anything
else unreadable refused with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from provider_router._exceptions import DataFileError
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.store._layout import BATCH_JOURNAL_FILE

RES = {"id": "r1", "units": 10, "key": "batch:ds", "owner": "h:1:x"}


def test_replay_walks_intent_submitted_collected(tmp_path: Path) -> None:
    journal = BatchJournal.open(tmp_path)
    journal.record_intent("bx", "ds", ["a", "b"], 100, RES, 10)
    assert journal.live_ids("ds") == {"a", "b"}
    journal.record_submitted("bx", "batch-1")
    journal.record_collected("bx", 7, ["b"])
    journal.record_settled("bx")
    journal.close()
    with BatchJournal.open(tmp_path) as again:
        (intent,) = again
    assert intent.batch_id == "batch-1"
    assert intent.collected
    assert intent.settled
    assert intent.cost_units == 7
    assert intent.retryable_ids == ("b",)
    assert not intent.live
    assert intent.prompt_for("bx-1") == "b"
    assert intent.prompt_for("bx-2") is None
    assert intent.prompt_for("by-0") is None
    assert intent.custom_id(0) == "bx-0"


def test_an_ended_batch_frees_all_its_prompts(tmp_path: Path) -> None:
    journal = BatchJournal.open(tmp_path)
    journal.record_intent("bx", "ds", ["a", "b"], 100, RES, 10)
    journal.record_ended("bx", "expired")
    assert journal.live_ids("ds") == set()
    (intent,) = journal
    assert intent.retryable_ids == ("a", "b")
    journal.close()


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    journal = BatchJournal.open(tmp_path)
    journal.record_intent("bx", "ds", ["a"], 100, RES, 10)
    journal.close()
    path = tmp_path / BATCH_JOURNAL_FILE
    with path.open("ab") as fh:
        fh.write(b'{"op":"submitted","intent":"bx","bat')
    with BatchJournal.open(tmp_path) as again:
        (intent,) = again
    assert intent.batch_id is None, "the torn 202 record was not taken"
    assert path.read_bytes().endswith(b"}\n")


def test_a_bad_line_before_the_end_is_refused(tmp_path: Path) -> None:
    path = tmp_path / BATCH_JOURNAL_FILE
    path.write_bytes(b'{"op":"nonsense"}\n{"op":"ended","intent":"bx","why":"x"}\n')
    with pytest.raises(DataFileError, match=r"batches.jsonl:1"):
        BatchJournal.open(tmp_path)
