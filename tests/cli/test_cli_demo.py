"""`provider-router demo` runs the whole job offline: endpoints, projection, run, top-up, resume."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from provider_router.cli import main
from provider_router.cli._demo_job import DEMO_DATASETS, DEMO_MARKER
from provider_router.jobs.observe.report import CHARTS
from provider_router.jobs.store._layout import REPORT_FILE


def test_demo_runs_out_of_credits_tops_up_and_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert main(["--log-format", "console", "demo", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    # No raw log line lands in the middle of a table: the 402 is counted, said once at the end.
    assert "route.credits_exhausted" not in captured.err
    assert not [line for line in captured.err.splitlines() if line.startswith("{")]
    assert "OpenRouter's credits ran out (402)" in captured.err
    for step in ("1. Endpoints", "2. What the plan will cost", "3. Run 6 datasets", "4. Top up"):
        assert step in text
    assert "rejected" in text  # the endpoint verdicts
    assert "credits_exhausted → complete" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "complete"
    for name in DEMO_DATASETS:
        dataset = summary["datasets"][name]
        assert dataset["finished"]
        assert dataset["output_tokens"] >= dataset["target_output_tokens"]
        ids = [json.loads(line)["id"] for line in (out / f"{name}.jsonl").read_text().splitlines()]
        assert len(ids) == len(set(ids)) == dataset["completed"]


def _run_demo_here(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["demo", *args]) == 0
    return capsys.readouterr().out


def _printed_report(text: str) -> str:
    uris = re.findall(r"^\s*(file://\S+)$", text, flags=re.MULTILINE)
    assert len(uris) == 1, text[-2000:]
    return uris[0]


def test_the_demo_keeps_its_job_in_runs_demo_and_prints_the_report_to_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run twice where a reader runs ``make demo``: the second replaces the first."""
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "runs" / "demo"
    for _ in range(2):
        text = _run_demo_here(capsys)
        # The whole story each time, not a resume of the last demo's finished job.
        assert "credits_exhausted → complete" in text
        assert _printed_report(text) == (job / REPORT_FILE).as_uri()
        assert "demo --out DIR" in text
        assert "provider-router status runs/demo" in text
        summary = json.loads((job / "summary.json").read_text())
        assert summary["reason"] == "complete"
        assert (job / REPORT_FILE).is_file()
        assert (job / DEMO_MARKER).is_file()
    # One demo's journal (its two runs: stopped, resumed), nothing of the first demo's.
    journal = [json.loads(line) for line in (job / "journal.jsonl").read_text().splitlines()]
    assert [entry["op"] for entry in journal].count("run") == 2


def test_the_demo_refuses_a_directory_that_is_not_a_demos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine\n")
    assert main(["demo", "--out", str(mine)]) == 2
    assert "not empty and not a previous demo's directory" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]
    assert main(["demo", "--out", str(mine / "keep.txt")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_the_demo_report_opens_in_a_browser_and_shows_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed path, opened as a person opens it: headless Chromium."""
    from _browser import chromium_binary, view_page

    chromium_binary()  # skip early where there is no browser
    monkeypatch.chdir(tmp_path)
    uri = _printed_report(_run_demo_here(capsys))
    view = asyncio.run(view_page(uri))
    assert view.errors == []
    assert [c["name"] for c in view.charts] == list(CHARTS)
    drawn = {c["name"] for c in view.charts if c["shapes"] > 0 and c["shown"] > 300}
    # Every chart draws, but the retries' (the demo has none, and says so in words).
    assert drawn == set(CHARTS) - {"retries-429s"}, view.charts
    assert "no retries and no 429s" in view.text
    assert "Run report: runs/demo" in view.text
    assert "complete" in view.text
    for name in DEMO_DATASETS:
        assert name in view.text
