"""Export output records as EAGLE-3 training conversations (SpecForge's format).

SpecForge-style trainers read JSONL with a string ``id`` and a ``conversations``
list of ``{"role", "content"}`` messages ending in the assistant turn it learns
to produce; reasoning models' thinking goes in the assistant message's
``reasoning_content``:

```json
{"id": "b3/q-17", "conversations": [
  {"role": "user", "content": "Write a function…"},
  {"role": "assistant", "content": "def f(…", "reasoning_content": "The user wants…"}]}
```

Tool use follows SpecForge's reader (``specforge/utils.py``
``safe_conversations_generator``, ``specforge/data/parse.py``
``Parser._sanitize_message``, ``specforge/data/preprocessing.py``
``build_eagle3_dataset``): an assistant turn keeps its ``tool_calls`` (``id``,
``type``, ``function.name``, ``function.arguments`` as the model's JSON text), a
``role: "tool"`` turn its ``tool_call_id``, and the request's tool definitions go in
a top-level ``tools`` holding their JSON text (the form both of SpecForge's
readers accept) for the chat template to render:

```json
{"id": "b5/q-3", "tools": "[{\"type\":\"function\",…}]", "conversations": [
  {"role": "user", "content": "Weather in Florence?"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "functions.weather:0",
   "type": "function", "function": {"name": "weather", "arguments": "{\"city\": …}"}}]}]}
```

Ids are prefixed with the dataset name so several datasets merge into one file
without collisions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from provider_router.batch.output import OutputRecord, read_outputs

__all__ = ["COMPLETE_FINISHES", "ExportReport", "export_conversations", "to_conversation"]

COMPLETE_FINISHES = ("stop", "tool_calls")
"""Finish reasons of replies that ended on their own: text, or tool calls to run."""

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass
class ExportReport:
    """What an export wrote and what it left out, and why.

    Attributes:
        written: conversations written.
        skipped: records left out, counted by reason.
    """

    written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        """Count one record left out for ``reason``."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _text(content: Any) -> str | None:
    """Plain text of a message's content; None when it has non-text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return None
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    return None


def _tool_calls(raw: Any) -> list[dict[str, Any]] | None:
    """A message's ``tool_calls`` in the standard fields SpecForge keeps; None when malformed."""
    if not isinstance(raw, list):
        return None
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return None
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": str(call.get("id", "")),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return calls


def _turn(message: dict[str, Any]) -> dict[str, Any] | str:
    """One message as a conversation turn, or why it cannot be one."""
    calls = message.get("tool_calls")
    content = message.get("content")
    text = "" if content is None and calls else _text(content)
    if text is None:
        return "non-text content"
    turn: dict[str, Any] = {"role": message["role"], "content": text}
    if calls:
        parsed = _tool_calls(calls)
        if parsed is None:
            return "malformed tool_calls"
        turn["tool_calls"] = parsed
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            turn[key] = message[key]
    return turn


def to_conversation(
    record: OutputRecord, *, reasoning: bool = False
) -> tuple[dict[str, Any] | None, str | None]:
    """One record as a training conversation: ``(conversation, None)`` or ``(None, reason)``."""
    conversation: list[dict[str, Any]] = []
    for message in record["messages"]:
        turn = _turn(message)
        if isinstance(turn, str):
            return None, turn
        conversation.append(turn)
    if not conversation or conversation[-1]["role"] != "assistant":
        return None, "no assistant reply"
    last = conversation[-1]
    if not last["content"].strip() and not last.get("tool_calls"):
        return None, "empty reply"
    if reasoning and record.get("reasoning"):
        last["reasoning_content"] = record["reasoning"]
    exported: dict[str, Any] = {"id": f"{record['dataset']}/{record['id']}"}
    tools = record.get("tools")
    if tools:
        exported["tools"] = _encode(tools)
    exported["conversations"] = conversation
    return exported, None


def export_conversations(
    sources: Sequence[str | Path],
    out: IO[str],
    *,
    reasoning: bool = False,
    finish_reasons: Iterable[str] | None = COMPLETE_FINISHES,
    flagged: bool = False,
) -> ExportReport:
    """Write the records of ``sources`` (output JSONL files) to ``out`` as conversations.

    Args:
        sources: output files written by a run (``<out>/<dataset>.jsonl``).
        out: a text stream to write JSONL to.
        reasoning: keep the model's reasoning as ``reasoning_content``.
        finish_reasons: keep only replies that finished for one of these reasons
            (default: ``stop`` and ``tool_calls``, i.e. drop truncated ones);
            ``None`` keeps all.
        flagged: keep rows ``run --verify`` flagged (``drift_flagged``: served by a
            provider that failed a later check since it last passed one); default: they
            are left out and counted.

    Raises:
        DataFileError: a source line is damaged (file and line named).
    """
    keep = None if finish_reasons is None else frozenset(finish_reasons)
    report = ExportReport()
    for source in sources:
        for _, record in read_outputs(source):
            if not flagged and record.get("drift_flagged") is True:
                report.skip("drift_flagged")
                continue
            if keep is not None and record.get("finish_reason") not in keep:
                report.skip(f"finish_reason {record.get('finish_reason')}")
                continue
            conversation, reason = to_conversation(record, reasoning=reasoning)
            if conversation is None:
                report.skip(reason or "unusable")
                continue
            out.write(_encode(conversation) + "\n")
            report.written += 1
    return report
