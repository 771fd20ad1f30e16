"""The journal: exactly-once across crashes at any byte, torn lines, lost outputs, locks."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from _job_helpers import simulate_crash

from provider_router import ConfigurationError, DataFileError
from provider_router.jobs.store import journal as journal_module
from provider_router.jobs.store._layout import JOURNAL_FILE, JobLayout
from provider_router.jobs.store.journal import FileJournal


def record(ds: str, pid: str, text: str = "reply") -> bytes:
    return (json.dumps({"id": pid, "dataset": ds, "text": text}) + "\n").encode()


def complete(
    j: FileJournal, ds: str, pid: str, *, out: int = 10, cost: int = 1000, loc: int | None = None
) -> None:
    assert j.claim(ds, pid)
    j.complete(
        ds,
        pid,
        record(ds, pid),
        output_tokens=out,
        prompt_tokens=3,
        cost_units=cost,
        location=loc,
    )


def output_ids(directory: Path, ds: str) -> list[str]:
    path = JobLayout(directory).output(ds)
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_bytes().splitlines()]


def test_completions_survive_reopening(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "b3", "a", out=10, cost=5)
        complete(j, "b3", "b", out=20, cost=7)
        complete(j, "b4", "a", out=1, cost=1)
    with FileJournal.open(tmp_path) as j:
        assert j.is_done("b3", "a")
        assert j.is_done("b3", "b")
        assert j.is_done("b4", "a")
        assert not j.is_done("b4", "b")
        tally = j.tally("b3")
        assert (tally.completed, tally.output_tokens, tally.prompt_tokens, tally.cost_units) == (
            2,
            30,
            6,
            12,
        )
        assert j.lost == []
        assert j.repairs == []
        complete(j, "b4", "b")
    assert output_ids(tmp_path, "b3") == ["a", "b"]
    assert output_ids(tmp_path, "b4") == ["a", "b"]


def test_claim_rules(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path, autoflush=True) as j:
        assert j.claim("d", "x")
        assert not j.claim("d", "x")  # already in flight
        j.complete(
            "d",
            "x",
            record("d", "x"),
            output_tokens=1,
            prompt_tokens=1,
            cost_units=1,
        )
        assert not j.claim("d", "x")  # done
        with pytest.raises(KeyError):
            j.complete("d", "y", record("d", "y"), output_tokens=1, prompt_tokens=1, cost_units=1)
        assert j.claim("d", "y")
        with pytest.raises(ValueError, match="exactly one line"):
            j.complete("d", "y", b'{"a":\n1}\n', output_tokens=1, prompt_tokens=1, cost_units=1)
        j.release("d", "y", reason="http-400")
        assert j.claim("d", "y")  # a released prompt can be claimed again
        with pytest.raises(KeyError):
            j.release("d", "zzz", reason="x")
        assert j.tally("d").failed == 1


def test_torn_last_line_is_repaired(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "d", "a")
    with (tmp_path / JOURNAL_FILE).open("ab") as fh:
        fh.write(b'{"op":"done","ds":"d","id":"b","en')
    with FileJournal.open(tmp_path) as j:
        assert j.is_done("d", "a")
        assert not j.is_done("d", "b")
        assert any("torn last line" in note for note in j.repairs)
    # The repaired journal is valid JSONL again.
    for line in (tmp_path / JOURNAL_FILE).read_bytes().splitlines():
        json.loads(line)


def test_output_written_without_its_done_line_is_cut(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "d", "a")
    with JobLayout(tmp_path).output("d").open("ab") as fh:
        fh.write(record("d", "b"))
        fh.write(b'{"id": "c", "partial')
    with FileJournal.open(tmp_path) as j:
        assert not j.is_done("d", "b")
        assert any("uncommitted bytes" in note for note in j.repairs)
        complete(j, "d", "b")
    assert output_ids(tmp_path, "d") == ["a", "b"]


def test_claims_without_results_become_lost_requests(tmp_path: Path) -> None:
    j = FileJournal.open(tmp_path)
    complete(j, "d", "a")
    assert j.claim("d", "b")
    j.attach("d", "b", "gen-b")
    assert j.claim("d", "c")
    j.flush()
    simulate_crash(j)
    j2 = FileJournal.open(tmp_path)
    try:
        assert {(r.prompt_id, r.generation_id) for r in j2.lost} == {("b", "gen-b"), ("c", None)}
        assert j2.tally("d").lost == 2
        assert j2.claim("d", "b")  # lost prompts run again
    finally:
        j2.close()
    j3 = FileJournal.open(tmp_path)
    j3.close()
    assert j3.lost == []  # already accounted, not reported twice; b was released at close
    assert j3.tally("d").lost == 2


def test_output_shorter_than_journal_revokes_the_lost_records(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        for pid in "abcd":
            complete(j, "d", pid, out=10, cost=100)
    out = JobLayout(tmp_path).output("d")
    keep = len(record("d", "a")) + len(record("d", "b")) + 5  # c is torn, d is gone
    out.write_bytes(out.read_bytes()[:keep])
    with FileJournal.open(tmp_path) as j:
        assert [j.is_done("d", p) for p in "abcd"] == [True, True, False, False]
        assert j.tally("d").completed == 2
        assert j.tally("d").cost_units == 200
        assert any("shorter than the journal says" in note for note in j.repairs)
        complete(j, "d", "d", out=10, cost=100)
    with FileJournal.open(tmp_path) as j:
        # The revocation is durable and not repeated; d's new record counts.
        assert [j.is_done("d", p) for p in "abcd"] == [True, True, False, True]
        assert j.tally("d").completed == 3
        assert j.repairs == []
        complete(j, "d", "c", out=10, cost=100)
    assert output_ids(tmp_path, "d") == ["a", "b", "d", "c"]


def test_deleted_output_file_reruns_everything(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "d", "a")
    JobLayout(tmp_path).output("d").unlink()
    with FileJournal.open(tmp_path) as j:
        assert not j.is_done("d", "a")
        assert j.tally("d").completed == 0


def test_second_process_is_refused(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path), pytest.raises(ConfigurationError, match="another"):
        FileJournal.open(tmp_path)
    FileJournal.open(tmp_path).close()  # the lock is released on close


def test_damaged_middle_line_names_the_line(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "d", "a")
        complete(j, "d", "b")
    path = tmp_path / JOURNAL_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b"garbage\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(DataFileError, match="damaged") as info:
        FileJournal.open(tmp_path)
    assert info.value.line == 3


def test_done_twice_is_reported(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "d", "a")
    path = tmp_path / JOURNAL_FILE
    done = [ln for ln in path.read_bytes().splitlines(keepends=True) if b'"done"' in ln]
    with path.open("ab") as fh:
        fh.write(done[0])
    with pytest.raises(DataFileError, match="is done twice"):
        FileJournal.open(tmp_path)


def test_foreign_output_file_is_refused_before_spending(tmp_path: Path) -> None:
    JobLayout(tmp_path).output("d").write_text('{"id": "someone else"}\n')
    with FileJournal.open(tmp_path) as j, pytest.raises(ConfigurationError, match="never wrote"):
        j.prepare(["d"])


def test_buffered_writes_are_invisible_until_flush(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        complete(j, "d", "a")
        assert not JobLayout(tmp_path).output("d").exists() or output_ids(tmp_path, "d") == []
        j.flush()
        assert output_ids(tmp_path, "d") == ["a"]


def _ops(j: FileJournal, rng: random.Random) -> None:
    inflight: list[str] = []
    for n in range(40):
        pid = f"p{n}"
        assert j.claim("d", pid)
        inflight.append(pid)
        if rng.random() < 0.3:
            j.attach("d", pid, f"gen-{pid}")
        while inflight and rng.random() < 0.6:
            done = inflight.pop(rng.randrange(len(inflight)))
            if rng.random() < 0.15:
                j.release("d", done, reason="error")
            else:
                j.complete(
                    "d",
                    done,
                    record("d", done, "x" * rng.randrange(50)),
                    output_tokens=1,
                    prompt_tokens=1,
                    cost_units=1,
                )
        if rng.random() < 0.5:
            j.flush()


def test_a_crash_at_any_byte_leaves_a_consistent_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay every prefix of the write stream: the journal and output always agree."""
    writes: list[tuple[str, bytes]] = []
    real_write = journal_module._write_all

    def recording(fh: Any, data: bytes) -> None:
        writes.append((Path(fh.name).name, bytes(data)))
        real_write(fh, data)

    monkeypatch.setattr(journal_module, "_write_all", recording)
    live = tmp_path / "live"
    j = FileJournal.open(live)
    _ops(j, random.Random(7))
    j.flush()
    simulate_crash(j)
    stream = [(name, data[i : i + 1]) for name, data in writes for i in range(len(data))]
    rng = random.Random(11)
    boundaries = {0, len(stream)}
    position = 0
    for _, data in writes:
        position += len(data)
        boundaries |= {position - 1, position, position + 1}
    cuts = sorted(
        {c for c in boundaries if 0 <= c <= len(stream)}
        | set(rng.sample(range(len(stream)), k=min(150, len(stream))))
    )
    monkeypatch.setattr(journal_module, "_write_all", real_write)
    for cut in cuts:
        crash = tmp_path / f"cut{cut}"
        crash.mkdir()
        files: dict[str, bytearray] = {}
        for name, byte in stream[:cut]:
            files.setdefault(name, bytearray()).extend(byte)
        for name, content in files.items():
            (crash / name).write_bytes(bytes(content))
        with FileJournal.open(crash) as j2:
            ids = output_ids(crash, "d")
            assert len(ids) == len(set(ids)), f"duplicate output at cut {cut}"
            assert set(ids) == set(j2.done_ids("d")), f"output and journal disagree at cut {cut}"
            assert j2.tally("d").completed == len(ids)
            # Finishing the job after the crash completes every prompt exactly once.
            for n in range(40):
                if not j2.is_done("d", f"p{n}"):
                    complete(j2, "d", f"p{n}")
        final = output_ids(crash, "d")
        assert sorted(final) == sorted(f"p{n}" for n in range(40)), f"cut {cut}"


def test_fast_resume_needs_unchanged_inputs_and_known_locations(tmp_path: Path) -> None:
    fingerprint = [["/p.jsonl", 10, 1]]
    with FileJournal.open(tmp_path) as j:
        j.record_inputs("d", fingerprint)
        complete(j, "d", "a", loc=0)
        complete(j, "d", "b", loc=5)
    with FileJournal.open(tmp_path) as j:
        assert j.fast_resume_ok("d", fingerprint)
        assert set(j.done_locations("d")) == {0, 5}
        assert not j.fast_resume_ok("d", [["/p.jsonl", 11, 2]])
        # The files changed: locations are forgotten until re-recorded by a full read.
        j.record_inputs("d", [["/p.jsonl", 11, 2]])
        assert not j.fast_resume_ok("d", [["/p.jsonl", 11, 2]])
        j.relocate("d", "a", 7)
        j.relocate("d", "b", 9)
        with pytest.raises(KeyError):
            j.relocate("d", "zzz", 1)
    with FileJournal.open(tmp_path) as j:
        assert j.fast_resume_ok("d", [["/p.jsonl", 11, 2]])
        assert set(j.done_locations("d")) == {7, 9}


def test_completion_without_location_disables_fast_resume(tmp_path: Path) -> None:
    with FileJournal.open(tmp_path) as j:
        j.record_inputs("d", [])
        complete(j, "d", "a")
    with FileJournal.open(tmp_path) as j:
        assert not j.fast_resume_ok("d", [])
