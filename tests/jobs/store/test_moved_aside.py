"""Moving output records aside: out of the output, kept in moved_aside.jsonl, exactly once
across a kill at each step (the journal commits the swap)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import simulate_crash

from provider_router.jobs.store import journal as journal_module
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.aside import AsideFile
from provider_router.jobs.store.journal import FileJournal


class Killed(BaseException):
    """A kill -9 at a chosen point."""


def record(pid: str, cost: str = "0.001") -> bytes:
    row = {
        "id": pid,
        "dataset": "d",
        "request_digest": "0" * 32,
        "messages": [
            {"role": "user", "content": f"q {pid}"},
            {"role": "assistant", "content": "a"},
        ],
        "generation_id": f"gen-{pid}",
        "usage": {"prompt_tokens": 3, "completion_tokens": 7},
        "cost": cost,
    }
    return (json.dumps(row, separators=(",", ":")) + "\n").encode()


def job(directory: Path, ids: list[str]) -> None:
    with FileJournal.open(directory) as j:
        for n, pid in enumerate(ids):
            assert j.claim("d", pid)
            j.complete(
                "d", pid, record(pid), output_tokens=7, prompt_tokens=3, cost_units=10**9,
                location=n * 100,
            )  # fmt: skip


def output_ids(directory: Path) -> list[str]:
    path = JobLayout(directory).output("d")
    return [json.loads(line)["id"] for line in path.read_bytes().splitlines()]


def aside_ids(directory: Path) -> list[str]:
    path = JobLayout(directory).moved_aside
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_bytes().splitlines()]


def test_records_moved_aside_leave_the_output_and_their_prompts_are_not_done(
    tmp_path: Path,
) -> None:
    job(tmp_path, ["a", "b", "c", "d", "e"])
    with FileJournal.open(tmp_path) as j:
        moved = j.move_aside("d", ["b", "d", "zz"], "its prompt changed under its id")
        assert moved is not None
        assert moved.ids == ["b", "d"]
        assert not j.is_done("d", "b")
        assert j.is_done("d", "c")
        assert j.tally("d").completed == 3
        assert j.tally("d").cost_units == 3 * 10**9
        assert j.claim("d", "b")  # sent again
        j.complete("d", "b", record("b", "0.002"), output_tokens=7, prompt_tokens=3, cost_units=5)
    assert output_ids(tmp_path) == ["a", "c", "e", "b"]
    assert aside_ids(tmp_path) == ["b", "d"]
    kept = json.loads(JobLayout(tmp_path).moved_aside.read_bytes().splitlines()[0])
    assert kept["moved_aside"]["why"] == "its prompt changed under its id"
    assert kept["cost"] == "0.001", "the record as it was, whole"
    with FileJournal.open(tmp_path) as j:
        assert sorted(j.done_ids("d")) == ["a", "b", "c", "e"]
        assert j.tally("d").completed == 4
        assert j.tally("d").cost_units == 3 * 10**9 + 5
        assert not j.repairs


@pytest.mark.parametrize("at", ["before-the-entry", "before-the-swap"])
def test_a_kill_during_a_move_aside_leaves_the_job_whole_and_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    job(tmp_path, ["a", "b", "c"])
    j = FileJournal.open(tmp_path)
    if at == "before-the-entry":
        real_sync = j.sync

        def dies_on_sync() -> None:
            raise Killed

        monkeypatch.setattr(j, "sync", dies_on_sync)
    else:

        def dies_on_replace(*args: Any) -> None:
            raise Killed

        monkeypatch.setattr(journal_module.os, "replace", dies_on_replace)
    with pytest.raises(Killed):
        j.move_aside("d", ["b"], "its prompt changed under its id")
    simulate_crash(j)
    monkeypatch.undo()
    assert aside_ids(tmp_path) == ["b"], "kept before anything else"
    with FileJournal.open(tmp_path) as j:
        if at == "before-the-entry":
            del real_sync
            # Never journaled: the job as it was (the stray rewrite deleted).
            assert j.is_done("d", "b")
            assert output_ids(tmp_path) == ["a", "b", "c"]
            j.move_aside("d", ["b"], "its prompt changed under its id")  # the next try
        else:
            # Journaled: rolled forward on open.
            assert not j.is_done("d", "b")
            assert any("finished moving records of d aside" in r for r in j.repairs)
        assert output_ids(tmp_path) == ["a", "c"]
    assert aside_ids(tmp_path) == ["b"], "written once"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".aside")]
    with FileJournal.open(tmp_path) as j:
        assert sorted(j.done_ids("d")) == ["a", "c"]
        assert not j.repairs


def test_an_output_cut_after_a_move_aside_revokes_only_what_was_lost(tmp_path: Path) -> None:
    job(tmp_path, ["a", "b", "c", "d"])
    with FileJournal.open(tmp_path) as j:
        j.move_aside("d", ["a"], "its prompt changed under its id")
    path = JobLayout(tmp_path).output("d")
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1])  # "d" is lost
    with FileJournal.open(tmp_path) as j:
        assert sorted(j.done_ids("d")) == ["b", "c"], "only the lost record runs again"


def test_the_side_file_takes_a_record_once_and_mends_a_torn_last_line(tmp_path: Path) -> None:
    aside = AsideFile(tmp_path)
    assert aside.keep([record("a"), record("b")], "why", now=0) == 2
    with aside.path.open("ab") as fh:
        fh.write(b'{"id":"tor')  # a kill mid-write
    assert aside.keep([record("a"), record("c")], "why", now=0) == 1
    lines = aside.path.read_bytes().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b", "c"]
    assert json.loads(lines[0])["moved_aside"] == {"at": "1970-01-01T00:00:00.000Z", "why": "why"}
