"""Answers cut at ``max_tokens``: counted over every run, and moved aside whole across a crash.

The journal counts each completion cut at ``max_tokens`` (its ``cut`` column; rows an
earlier release wrote are counted once, from the outputs). ``FileJournal.set_aside``
moves chosen rows out of a dataset's outputs into ``set_aside/<why>/<dataset>.jsonl``
(kept, never deleted): they are no longer done, their cost stays counted as spent, and
a crash at any step leaves either the move whole or nothing of it.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import simulate_crash

from provider_router._money import to_units
from provider_router.jobs.store import aside as aside_module
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.store.outputs import encode_record, make_record

DS = "p"


def answer(pid: str, finish: str, cost: str = "0.001", out: int = 50) -> bytes:
    return encode_record(
        make_record(
            prompt_id=pid,
            dataset=DS,
            messages=[{"role": "user", "content": f"question {pid}"}],
            text=f"answer {pid}",
            reasoning=None,
            finish_reason=finish,
            provider="Chutes",
            model="m",
            served_model="m",
            generation_id=f"gen-{pid}",
            prompt_tokens=7,
            completion_tokens=out,
            reasoning_tokens=0,
            cached_tokens=0,
            cost=Decimal(cost),
            metadata={},
            started_at=1.0,
            finished_at=2.0,
            max_tokens=50,
        )
    )


def complete(j: FileJournal, pid: str, finish: str, cost: str = "0.001", loc: int = 0) -> None:
    assert j.claim(DS, pid)
    j.complete(
        DS,
        pid,
        answer(pid, finish, cost),
        output_tokens=50,
        prompt_tokens=7,
        cost_units=to_units(Decimal(cost)),
        location=loc,
        truncated=finish == "length",
    )


def job(directory: Path) -> None:
    """Six answers, three of them cut at max_tokens (q1, q3, q5)."""
    with FileJournal.open(directory) as j:
        for n in range(6):
            complete(j, f"q{n}", "length" if n % 2 else "stop", cost=f"0.00{n + 1}", loc=n)


def ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_bytes().splitlines()]


def cut(record: dict[str, Any]) -> bool:
    return bool(record["finish_reason"] == "length")


def test_cut_answers_are_counted_over_every_run(tmp_path: Path) -> None:
    job(tmp_path)
    with FileJournal.open(tmp_path) as j:
        tally = j.tally(DS)
        assert (tally.completed, tally.truncated) == (6, 3)
        assert tally.truncated_units == to_units(Decimal("0.012"))  # 0.002 + 0.004 + 0.006


def test_rows_an_earlier_release_wrote_are_counted_once_from_the_outputs(tmp_path: Path) -> None:
    job(tmp_path)
    journal = JobLayout(tmp_path).journal
    lines = []
    for raw in journal.read_bytes().splitlines():
        entry = json.loads(raw)
        if entry["op"] == "done":
            del entry["cut"]  # as an earlier release wrote it
        lines.append(json.dumps(entry))
    journal.write_text("\n".join(lines) + "\n")
    for _ in range(2):
        with FileJournal.open(tmp_path) as j:
            assert j.tally(DS).truncated == 3
    counted = [json.loads(x) for x in journal.read_bytes().splitlines()]
    assert [e["ids"] for e in counted if e["op"] == "cut"] == [["q1", "q3", "q5"]]  # once


def test_set_aside_moves_the_rows_out_keeps_them_and_they_run_again(tmp_path: Path) -> None:
    job(tmp_path)
    layout = JobLayout(tmp_path)
    kept_file = layout.set_aside("truncated", DS)
    with FileJournal.open(tmp_path) as j:
        spent_before = j.committed_cost
        move = j.set_aside(DS, cut, why="truncated")
        assert move.ids == ["q1", "q3", "q5"]
        assert ids(layout.output(DS)) == ["q0", "q2", "q4"]
        assert ids(kept_file) == ["q1", "q3", "q5"]
        assert not j.is_done(DS, "q1")
        tally = j.tally(DS)
        assert (tally.completed, tally.truncated, tally.set_aside) == (3, 0, 3)
        assert j.committed_cost == spent_before  # still spent: in the ledger
        complete(j, "q1", "stop", cost="0.01")  # sent again: its new answer takes its place
    with FileJournal.open(tmp_path) as j:
        assert j.is_done(DS, "q1")
        assert not j.is_done(DS, "q3")
        tally = j.tally(DS)
        assert (tally.completed, tally.truncated, tally.set_aside) == (4, 0, 3)
        assert not j.fast_resume_ok(DS, [])  # the inputs are read whole once more
        # A second move appends: nothing set aside is ever lost.
        complete(j, "q3", "length")
        j.set_aside(DS, cut, why="truncated")
    assert ids(layout.output(DS)) == ["q0", "q2", "q4", "q1"]
    assert ids(kept_file) == ["q1", "q3", "q5", "q3"]


def test_a_crash_after_the_move_is_committed_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job(tmp_path)
    layout = JobLayout(tmp_path)

    def killed(renames: Any) -> None:
        raise SystemExit("killed after the journal entry, before the renames")

    monkeypatch.setattr("provider_router.jobs.store.journal.finish_move", killed)
    j = FileJournal.open(tmp_path)
    with pytest.raises(SystemExit):
        j.set_aside(DS, cut, why="truncated")
    simulate_crash(j)
    monkeypatch.undo()
    assert ids(layout.output(DS)) == [f"q{n}" for n in range(6)]  # not renamed yet
    with FileJournal.open(tmp_path) as again:
        assert ids(layout.output(DS)) == ["q0", "q2", "q4"]
        assert ids(layout.set_aside("truncated", DS)) == ["q1", "q3", "q5"]
        assert [again.is_done(DS, f"q{n}") for n in range(6)] == [True, False] * 3
        complete(again, "q5", "stop")
    assert ids(layout.output(DS)) == ["q0", "q2", "q4", "q5"]
    assert not [p for p in tmp_path.rglob("*") if ".aside-" in p.name]


def test_a_crash_before_the_move_is_committed_leaves_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job(tmp_path)
    layout = JobLayout(tmp_path)
    staged = aside_module.stage_move

    def killed(*args: Any) -> Any:
        staged(*args)
        raise SystemExit("killed before the journal entry")

    monkeypatch.setattr("provider_router.jobs.store.journal.stage_move", killed)
    j = FileJournal.open(tmp_path)
    with pytest.raises(SystemExit):
        j.set_aside(DS, cut, why="truncated")
    simulate_crash(j)
    monkeypatch.undo()
    assert [p for p in tmp_path.rglob("*") if ".aside-" in p.name]
    with FileJournal.open(tmp_path) as again:
        assert all(again.is_done(DS, f"q{n}") for n in range(6))
        assert again.tally(DS).set_aside == 0
    assert ids(layout.output(DS)) == [f"q{n}" for n in range(6)]
    assert not layout.set_aside("truncated", DS).exists()
    assert not [p for p in tmp_path.rglob("*") if ".aside-" in p.name]


def test_an_output_cut_short_after_a_move_revokes_by_the_new_offsets(tmp_path: Path) -> None:
    job(tmp_path)
    layout = JobLayout(tmp_path)
    with FileJournal.open(tmp_path) as j:
        j.set_aside(DS, cut, why="truncated")
    data = layout.output(DS).read_bytes()
    first = data.index(b"\n") + 1
    layout.output(DS).write_bytes(data[:first])  # the disk lost q2 and q4
    with FileJournal.open(tmp_path) as j:
        assert [j.is_done(DS, f"q{n}") for n in (0, 2, 4)] == [True, False, False]
        assert j.tally(DS).completed == 1
