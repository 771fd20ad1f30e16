"""The job directory's file names, each defined once, are the names runs have always used."""

from __future__ import annotations

from pathlib import Path

import pytest

from provider_router.jobs.store._layout import JobLayout

OUT = Path("runs/b3")


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ("journal", "journal.jsonl"),
        ("ledger", "ledger.sqlite"),
        ("account", "account.json"),
        ("merge_report", "merge.json"),
        ("verify", "verify.json"),
        ("batch_journal", "batches.jsonl"),
        ("batch_status", "batch_status.json"),
        ("batches_report", "batches.json"),
        ("not_in_inputs", "not_in_inputs.jsonl"),
        ("quarantined", "quarantined.jsonl"),
        ("summary", "summary.json"),
        ("timeline", "timeline.ndjson"),
        ("report", "report.html"),
        ("manifest", "job.json"),
        ("job_keys", "job_keys.json"),
    ],
)
def test_each_file_keeps_its_name(where: str, name: str) -> None:
    assert getattr(JobLayout(OUT), where) == OUT / name


def test_a_datasets_outputs_are_its_name_dot_jsonl() -> None:
    assert JobLayout(OUT).output("train") == OUT / "train.jsonl"


def test_no_two_files_share_a_name() -> None:
    layout = JobLayout(OUT)
    names = [
        getattr(layout, attr)
        for attr in dir(JobLayout)
        if isinstance(getattr(JobLayout, attr), property)
    ]
    assert (
        len(names) == len(set(names)) == 15
    )  # job.json, job_keys.json and quarantined.jsonl joined


def test_files_named_like_outputs_that_are_not_a_datasets_are_not_listed_as_outputs(
    tmp_path: Path,
) -> None:
    for name in ("a.jsonl", "journal.jsonl", "batches.jsonl", "not_in_inputs.jsonl",
                 "quarantined.jsonl", ".a.jsonl.tmp", "summary.json"):  # fmt: skip
        (tmp_path / name).write_text("")
    assert JobLayout(tmp_path).outputs() == [tmp_path / "a.jsonl"]
