"""`run --ray` resumes over an output file a killed driver left with a torn last line."""

from __future__ import annotations

from pathlib import Path

from provider_router.ray.plan_run import read_written

RECORD = (
    b'{"id":"q%d","dataset":"p","messages":[],"reasoning":null,"finish_reason":"stop",'
    b'"provider":"Chutes","model":"m","served_model":null,"generation_id":"gen-%d",'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"reasoning_tokens":0,'
    b'"cached_tokens":0},"cost":"0.001","metadata":{},"started_at":"x","finished_at":"y",'
    b'"latency_s":0.1}\n'
)


def test_a_torn_last_line_is_cut_and_the_whole_records_read(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    whole = RECORD % (1, 1) + RECORD % (2, 2)
    path.write_bytes(whole + (RECORD % (3, 3))[:40])
    assert read_written(path).ids == {"q1", "q2"}  # was: DataFileError on the torn line
    assert path.read_bytes() == whole  # the next record starts on its own line
    assert read_written(path).ids == {"q1", "q2"}  # nothing more to cut


def test_a_file_of_one_torn_line_is_emptied(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes((RECORD % (1, 1))[:70])
    assert read_written(path).ids == set()
    assert path.read_bytes() == b""
