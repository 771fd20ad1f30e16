"""Output records and the EAGLE-3 / SpecForge conversation export."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import DataFileError
from provider_router.jobs.store.outputs import (
    encode_record,
    export_conversations,
    make_record,
    read_outputs,
    to_conversation,
)


def sample(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "prompt_id": "q1",
        "dataset": "b3",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "text": "Hello — hi!",
        "reasoning": "The user greets.",
        "finish_reason": "stop",
        "provider": "Chutes",
        "model": "moonshotai/kimi-k2.5",
        "served_model": "moonshotai/kimi-k2.5-0127",
        "generation_id": "gen-1",
        "prompt_tokens": 21,
        "completion_tokens": 202,
        "reasoning_tokens": 166,
        "cached_tokens": 0,
        "cost": Decimal("0.00045364"),
        "metadata": {"source": "magicoder"},
        "started_at": 1777319885.041,
        "finished_at": 1777319891.774,
    }
    fields.update(overrides)
    return fields


def test_record_shape_and_exact_cost() -> None:
    record = make_record(**sample())
    line = encode_record(record)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    decoded = json.loads(line)
    assert decoded["messages"][-1] == {"role": "assistant", "content": "Hello — hi!"}
    assert decoded["messages"][:2] == sample()["messages"]
    assert decoded["reasoning"] == "The user greets."
    assert decoded["cost"] == "0.00045364"  # a string: exact, never a float
    assert decoded["usage"] == {
        "prompt_tokens": 21,
        "completion_tokens": 202,
        "reasoning_tokens": 166,
        "total_tokens": 223,
        "cached_tokens": 0,
    }
    assert decoded["started_at"] == "2026-04-27T19:58:05.041Z"
    assert decoded["latency_s"] == 6.733
    assert "Hello — hi!" in line.decode()  # UTF-8, not \\u escapes


@pytest.mark.parametrize(
    "ts",
    [
        0.0,
        1777319885.041,
        1777319885.0009999,  # microseconds round down, milliseconds truncate
        1777319885.9999996,  # microseconds round up into the next second
        1777319886.0,
        1777319885.5,
        1777319885.0004,
    ],
)
def test_timestamps_match_datetime_isoformat(ts: float) -> None:
    # The per-second cache must format exactly as datetime does, in any order of calls.
    expected = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    for previous in (ts - 1.0, ts, ts + 0.9):
        make_record(**sample(started_at=previous, finished_at=previous))
        record = make_record(**sample(started_at=ts, finished_at=ts))
        assert record["started_at"] == expected.replace("+00:00", "Z")
        assert record["finished_at"] == record["started_at"]


def test_text_with_newlines_stays_one_line() -> None:
    line = encode_record(make_record(**sample(text="a\nb\r\nc")))
    assert line.count(b"\n") == 1
    assert json.loads(line)["messages"][-1]["content"] == "a\nb\r\nc"


def test_read_outputs_reports_damaged_lines(tmp_path: Path) -> None:
    path = tmp_path / "b3.jsonl"
    path.write_bytes(encode_record(make_record(**sample())) + b'{"id": "x"}\n')
    reader = read_outputs(path)
    assert next(reader)[0] == 1
    with pytest.raises(DataFileError, match="lacks dataset, messages") as info:
        next(reader)
    assert info.value.line == 2
    path.write_text("nope\n")
    with pytest.raises(DataFileError, match="not a JSON output record"):
        list(read_outputs(path))
    with pytest.raises(DataFileError, match="cannot read"):
        list(read_outputs(tmp_path / "missing.jsonl"))


def test_conversation_export(tmp_path: Path) -> None:
    path = tmp_path / "b3.jsonl"
    records = [
        make_record(**sample()),
        make_record(**sample(prompt_id="q2", finish_reason="length")),
        make_record(**sample(prompt_id="q3", text="   ")),
        make_record(
            **sample(
                prompt_id="q4",
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ],
            )
        ),
        make_record(
            **sample(
                prompt_id="q5",
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            )
        ),
    ]
    path.write_bytes(b"".join(encode_record(r) for r in records))
    out = io.StringIO()
    report = export_conversations([path], out, reasoning=True)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["id"] for r in rows] == ["b3/q1", "b3/q4"]
    assert rows[0]["conversations"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello — hi!", "reasoning_content": "The user greets."},
    ]
    assert rows[1]["conversations"][0] == {"role": "user", "content": "ab"}
    assert report.written == 2
    assert report.skipped == {
        "finish_reason length": 1,
        "empty reply": 1,
        "non-text content": 1,
    }
    # Keeping every finish reason, without reasoning.
    out = io.StringIO()
    report = export_conversations([path], out, finish_reasons=None)
    assert report.written == 3
    assert all("reasoning_content" not in json.dumps(r) for r in out.getvalue().splitlines())


def test_to_conversation_needs_an_assistant_reply() -> None:
    record = make_record(**sample())
    record["messages"] = record["messages"][:-1]
    conversation, reason = to_conversation(record)
    assert conversation is None
    assert reason == "no assistant reply"
