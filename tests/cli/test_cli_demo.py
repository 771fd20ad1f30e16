"""`provider-router demo` runs the whole job offline: endpoints, projection, run, top-up, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provider_router.cli import main
from provider_router.cli._demo_job import DEMO_DATASETS


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
