"""The output record: one JSON line per completed prompt (format in docs/output.md).

```json
{"id": "q-17", "dataset": "b3",
 "messages": [{"role": "user", "content": "…"}, {"role": "assistant", "content": "…"}],
 "reasoning": "…", "finish_reason": "stop",
 "provider": "Chutes", "model": "moonshotai/kimi-k2.5", "served_model": "moonshotai/kimi-k2.5-0127",
 "generation_id": "gen-…",
 "usage": {"prompt_tokens": 21, "completion_tokens": 202, "reasoning_tokens": 166,
           "total_tokens": 223, "cached_tokens": 0},
 "cost": "0.00045364",
 "metadata": {"source": "magicoder"},
 "started_at": "2026-04-27T20:11:25.041Z", "finished_at": "2026-04-27T20:11:31.774Z",
 "latency_s": 6.733}
```

``messages`` is the input conversation plus the assistant's reply, ready to
train on; reasoning is kept apart in ``reasoning``. A reply that calls tools
carries them in the assistant message's ``tool_calls`` (OpenAI format, arguments
as the JSON text the model wrote), and a request sent with ``tools`` keeps them
in the record's ``tools``, so the conversation can be rendered as it was. ``cost`` is OpenRouter's
authoritative charge as an exact decimal string.

Building a record is on the per-request path, so it is a plain dict and one
``json`` encode, no model validation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from provider_router._exceptions import DataFileError
from provider_router._format import decimal_str
from provider_router._types import JSONObject, Message

__all__ = [
    "OutputRecord",
    "OutputUsage",
    "encode_record",
    "make_record",
    "read_outputs",
]

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_REQUIRED = ("id", "dataset", "messages", "finish_reason", "usage", "cost")


class OutputUsage(TypedDict):
    """Token counts of one completion (reasoning tokens are inside completion tokens)."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    total_tokens: int
    cached_tokens: int


class OutputRecord(TypedDict):
    """One line of a dataset's output file (see the module docstring)."""

    id: str
    dataset: str
    messages: list[Message]
    reasoning: str | None
    finish_reason: str | None
    provider: str | None
    model: str
    served_model: str | None
    generation_id: str | None
    usage: OutputUsage
    cost: str
    metadata: JSONObject
    started_at: str
    finished_at: str
    latency_s: float
    tools: NotRequired[list[JSONObject]]
    drift_check: NotRequired[int]
    drift_flagged: NotRequired[bool]


_second: list[Any] = [None, ""]
"""The last whole second formatted (``[second, "YYYY-MM-DDTHH:MM:SS"]``): records
finishing in the same second share it, so most records format only milliseconds."""


def _iso(ts: float) -> str:
    # As datetime.fromtimestamp(ts).isoformat(timespec="milliseconds"): microseconds
    # rounded, then milliseconds truncated.
    frac, whole = math.modf(ts)
    micro = round(frac * 1e6)
    second = int(whole)
    if micro >= 1_000_000:
        second += 1
        micro -= 1_000_000
    elif micro < 0:
        second -= 1
        micro += 1_000_000
    milli = micro // 1000
    if _second[0] != second:
        _second[1] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second[0] = second
    return f"{_second[1]}.{milli:03d}Z"


def make_record(
    *,
    prompt_id: str,
    dataset: str,
    messages: Sequence[Message],
    text: str | None,
    reasoning: str | None,
    finish_reason: str | None,
    provider: str | None,
    model: str,
    served_model: str | None,
    generation_id: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    cached_tokens: int,
    cost: Decimal,
    metadata: Mapping[str, Any],
    started_at: float,
    finished_at: float,
    tool_calls: Sequence[JSONObject] = (),
    tools: Sequence[JSONObject] | None = None,
) -> OutputRecord:
    """Assemble one output record (times are Unix seconds)."""
    reply: Message = {"role": "assistant", "content": text or ""}
    if tool_calls:
        reply["tool_calls"] = list(tool_calls)
    record: OutputRecord = {
        "id": prompt_id,
        "dataset": dataset,
        "messages": [*messages, reply],
        "reasoning": reasoning or None,
        "finish_reason": finish_reason,
        "provider": provider,
        "model": model,
        "served_model": served_model,
        "generation_id": generation_id,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "reasoning_tokens": reasoning_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "cached_tokens": cached_tokens,
        },
        "cost": decimal_str(cost),
        "metadata": dict(metadata),
        "started_at": _iso(started_at),
        "finished_at": _iso(finished_at),
        "latency_s": round(finished_at - started_at, 3),
    }
    if tools:
        record["tools"] = list(tools)
    return record


def encode_record(record: OutputRecord) -> bytes:
    """One output line: compact JSON, UTF-8, ending in a newline."""
    return (_encode(record) + "\n").encode()


def read_outputs(path: str | Path) -> Iterator[tuple[int, OutputRecord]]:
    """Yield ``(line number, record)`` for every line of an output file.

    Raises:
        DataFileError: a line is not JSON or lacks a required field (file and line named).
    """
    path = Path(path)
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise DataFileError(path, f"cannot read output file: {exc.strerror or exc}") from None
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as exc:
                raise DataFileError(path, f"not a JSON output record: {exc}", line=lineno) from None
            if not isinstance(record, dict):
                raise DataFileError(path, "an output record must be an object", line=lineno)
            missing = [key for key in _REQUIRED if key not in record]
            if missing:
                raise DataFileError(path, f"output record lacks {', '.join(missing)}", line=lineno)
            yield lineno, record  # type: ignore[misc]
