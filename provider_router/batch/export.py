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

__all__ = ["ExportReport", "export_conversations", "to_conversation"]

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


def to_conversation(
    record: OutputRecord, *, reasoning: bool = False
) -> tuple[dict[str, Any] | None, str | None]:
    """One record as a training conversation: ``(conversation, None)`` or ``(None, reason)``."""
    conversation: list[dict[str, Any]] = []
    for message in record["messages"]:
        text = _text(message.get("content"))
        if text is None:
            return None, "non-text content"
        conversation.append({"role": message["role"], "content": text})
    if not conversation or conversation[-1]["role"] != "assistant":
        return None, "no assistant reply"
    if not conversation[-1]["content"].strip():
        return None, "empty reply"
    if reasoning and record.get("reasoning"):
        conversation[-1]["reasoning_content"] = record["reasoning"]
    return {"id": f"{record['dataset']}/{record['id']}", "conversations": conversation}, None


def export_conversations(
    sources: Sequence[str | Path],
    out: IO[str],
    *,
    reasoning: bool = False,
    finish_reasons: Iterable[str] | None = ("stop",),
) -> ExportReport:
    """Write the records of ``sources`` (output JSONL files) to ``out`` as conversations.

    Args:
        sources: output files written by a run (``<out>/<dataset>.jsonl``).
        out: a text stream to write JSONL to.
        reasoning: keep the model's reasoning as ``reasoning_content``.
        finish_reasons: keep only replies that finished for one of these reasons
            (default: ``stop``, i.e. drop truncated ones); ``None`` keeps all.

    Raises:
        DataFileError: a source line is damaged (file and line named).
    """
    keep = None if finish_reasons is None else frozenset(finish_reasons)
    report = ExportReport()
    for source in sources:
        for _, record in read_outputs(source):
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
