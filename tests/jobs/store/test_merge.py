"""Merging workers' job directories: committed records only, each prompt once."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import ConfigurationError, DataFileError
from provider_router._money import to_units
from provider_router.cli import main
from provider_router.jobs.store._layout import MERGE_REPORT_FILE
from provider_router.jobs.store.digest import RequestDigest
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.store.manifest import JobManifest, write_manifest
from provider_router.jobs.store.outputs import (
    encode_record,
    make_record,
    merge_outputs,
    read_outputs,
)


def _record(
    ds: str,
    prompt_id: str,
    cost: str,
    tokens: int = 10,
    *,
    model: str = "moonshotai/kimi-k2.5",
    text: str | None = None,
) -> bytes:
    messages = [{"role": "user", "content": text or f"q {prompt_id}"}]
    return encode_record(
        make_record(
            prompt_id=prompt_id,
            dataset=ds,
            messages=messages,
            text=f"answer to {prompt_id}",
            reasoning=None,
            finish_reason="stop",
            provider="Chutes",
            model=model,
            served_model=None,
            generation_id=f"gen-{prompt_id}",
            prompt_tokens=5,
            completion_tokens=tokens,
            reasoning_tokens=0,
            cached_tokens=0,
            cost=Decimal(cost),
            metadata={},
            started_at=0.0,
            finished_at=1.0,
            request_digest=RequestDigest(model, {"max_tokens": 10})(messages),
        )
    )


def _worker_dir(path: Path, done: dict[str, list[tuple[str, str]]], **record: Any) -> Path:
    journal = FileJournal.open(path)
    for ds, entries in done.items():
        for prompt_id, cost in entries:
            assert journal.claim(ds, prompt_id)
            journal.complete(
                ds,
                prompt_id,
                _record(ds, prompt_id, cost, **record),
                output_tokens=10,
                prompt_tokens=5,
                cost_units=to_units(Decimal(cost)),
            )
    journal.close("test")
    return path


def _ids(path: Path) -> list[str]:
    return [record["id"] for _, record in read_outputs(path)]


def test_each_prompt_once_first_directory_wins_and_merging_again_is_the_same(
    tmp_path: Path,
) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1"), ("p2", "0.2")], "b": [("q1", "1")]})
    w2 = _worker_dir(tmp_path / "w2", {"a": [("p3", "0.3"), ("p2", "0.25")]})
    out = tmp_path / "merged"

    report = merge_outputs([w1, w2], out)

    assert _ids(out / "a.jsonl") == ["p1", "p2", "p3"]
    assert _ids(out / "b.jsonl") == ["q1"]
    p2 = next(r for _, r in read_outputs(out / "a.jsonl") if r["id"] == "p2")
    assert p2["cost"] == "0.2"  # from w1, the first directory given
    a = report.datasets["a"]
    assert (a.records, a.duplicates, a.output_tokens) == (3, 1, 30)
    assert (a.cost, a.duplicate_cost) == (Decimal("0.6"), Decimal("0.25"))
    assert a.sources == {str(w1): 2, str(w2): 1}
    saved = json.loads((out / MERGE_REPORT_FILE).read_text())
    assert saved["datasets"]["a"]["duplicate_cost"] == "0.25"

    before = (out / "a.jsonl").read_bytes()
    merge_outputs([w1, w2], out)  # again: rewritten, not appended
    assert (out / "a.jsonl").read_bytes() == before


def test_only_records_the_journal_committed_or_paid_are_taken(tmp_path: Path) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")]})
    # A crash after the output writes but before the journal's `done` line: a whole
    # record with its generation id is a paid answer, kept (#21); a torn one is cut.
    with (w1 / "a.jsonl").open("ab") as fh:
        fh.write(_record("a", "paid", "0.5"))
        fh.write(_record("a", "torn", "0.5")[:-9])
    report = merge_outputs([w1], tmp_path / "merged")
    assert _ids(tmp_path / "merged" / "a.jsonl") == ["p1", "paid"]
    assert report.datasets["a"].cost == Decimal("0.6")


def test_bad_merges_are_refused_with_the_reason(tmp_path: Path) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")]})
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match=r"empty: not a job directory"):
        merge_outputs([w1, tmp_path / "empty"], tmp_path / "merged")
    with pytest.raises(ConfigurationError, match="is one of the directories being merged"):
        merge_outputs([w1], w1)
    with pytest.raises(ConfigurationError, match="given twice"):
        merge_outputs([w1, w1], tmp_path / "merged")
    with pytest.raises(ConfigurationError, match="at least one"):
        merge_outputs([], tmp_path / "merged")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "a.jsonl").write_text("{}\n")
    with pytest.raises(ConfigurationError, match="was not written by `provider-router merge`"):
        merge_outputs([w1], foreign)


def test_a_worker_still_running_is_not_merged(tmp_path: Path) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")]})
    running = FileJournal.open(w1)
    try:
        with pytest.raises(ConfigurationError, match="another provider-router process"):
            merge_outputs([w1], tmp_path / "merged")
    finally:
        running.close()


def test_the_merge_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")]})
    w2 = _worker_dir(tmp_path / "w2", {"a": [("p1", "0.1"), ("p2", "0.2")]})
    out = tmp_path / "merged"
    assert main(["merge", str(w1), str(w2), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "Merged into" in table
    assert "$0.30" in table
    assert main(["merge", str(w1), str(w2), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["datasets"]["a"]["records"] == 2
    assert data["datasets"]["a"]["duplicates"] == 1
    assert main(["merge", str(tmp_path / "nope"), "--out", str(out)]) == 1
    assert "not a job directory" in capsys.readouterr().err


def test_rows_of_another_model_are_never_merged_into_one_dataset(tmp_path: Path) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")]})
    w2 = _worker_dir(tmp_path / "w2", {"a": [("p2", "0.1")]}, model="moonshotai/kimi-k3")
    out = tmp_path / "merged"
    with pytest.raises(ConfigurationError, match=r"holds rows of moonshotai/kimi-k2\.5 .* and "
                       r"moonshotai/kimi-k3"):  # fmt: skip
        merge_outputs([w1, w2], out)
    assert not list(out.glob("*.jsonl")), "nothing merged, nothing left behind"


def test_one_id_answering_different_requests_is_not_taken_as_a_duplicate(tmp_path: Path) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")], "b": [("q1", "1")]})
    w2 = _worker_dir(tmp_path / "w2", {"a": [("p1", "0.1")]}, text="another question")
    out = tmp_path / "merged"
    with pytest.raises(ConfigurationError, match="prompt 'p1' of dataset 'a' answers different"):
        merge_outputs([w1, w2], out)
    assert not list(out.glob("*.jsonl"))


def test_directories_of_different_jobs_are_refused_by_their_manifests(tmp_path: Path) -> None:
    w1 = _worker_dir(tmp_path / "w1", {"a": [("p1", "0.1")]})
    w2 = _worker_dir(tmp_path / "w2", {"a": [("p2", "0.1")]})
    write_manifest(w1, JobManifest("moonshotai/kimi-k2.5", {"exclude_below": "int4"}))
    write_manifest(w2, JobManifest("moonshotai/kimi-k2.5", {}))
    with pytest.raises(ConfigurationError, match=r"are not shares of one job .*policy"):
        merge_outputs([w1, w2], tmp_path / "merged")
    write_manifest(w2, JobManifest("moonshotai/kimi-k2.5", {"exclude_below": "int4"}))
    report = merge_outputs([w1, w2], tmp_path / "merged")
    assert report.datasets["a"].records == 2
