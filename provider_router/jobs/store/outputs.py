"""The output record: one JSON line per completed prompt (format in docs/output.md).

``messages`` is the input conversation plus the assistant's reply, ready to train on;
reasoning is kept apart in ``reasoning``, tool calls in the assistant message's
``tool_calls`` (and a request's ``tools`` in the record's), and ``cost`` is
OpenRouter's authoritative charge as an exact decimal string. Building a record is on
the per-request path, so it is a plain dict and one ``json`` encode, no model
validation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, NotRequired, TypedDict

from provider_router._exceptions import ConfigurationError, DataFileError
from provider_router._format import decimal_str
from provider_router._money import to_decimal
from provider_router._types import JSONObject, Message
from provider_router.jobs.store._layout import JOURNAL_FILE, MERGE_REPORT_FILE, JobLayout
from provider_router.jobs.store.journal import FileJournal
from provider_router.jobs.store.manifest import JobManifest, read_manifest

__all__ = [
    "COMPLETE_FINISHES",
    "TRUNCATED_FINISH",
    "DatasetMerge",
    "ExportReport",
    "MergeReport",
    "OutputRecord",
    "OutputUsage",
    "encode_record",
    "export_conversations",
    "make_record",
    "merge_outputs",
    "read_outputs",
    "to_conversation",
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
    request_digest: str | None
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
    max_tokens: NotRequired[int]
    tools: NotRequired[list[JSONObject]]
    floor_cost: NotRequired[str]
    waited_s: NotRequired[float]
    refusals: NotRequired[int]
    endpoint: NotRequired[str | None]
    router_metadata: NotRequired[JSONObject]
    context_compressed: NotRequired[bool]
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
    request_digest: str | None = None,
    max_tokens: int | None = None,
    floor_cost: Decimal | None = None,
    waited_s: float = 0.0,
    refusals: int = 0,
    endpoint: str | None = None,
    trace: Mapping[str, Any] | None = None,
) -> OutputRecord:
    """Assemble one output record (times are Unix seconds; ``request_digest``: the
    digest of the request it answers, :mod:`~provider_router.jobs.store.digest`;
    ``max_tokens``: the completion cap the request was sent with, so an answer cut at it
    says at what). ``floor_cost`` (the answer's tokens at the floor's prices),
    ``waited_s``, ``refusals`` and ``endpoint`` are the Router's admission figures,
    written when ``floor_cost`` is known; ``trace`` adds OpenRouter's routing trace
    (``router_metadata``, ``context_compressed``) after the rest."""
    reply: Message = {"role": "assistant", "content": text or ""}
    if tool_calls:
        reply["tool_calls"] = list(tool_calls)
    record: OutputRecord = {
        "id": prompt_id,
        "dataset": dataset,
        # Third, before any text of the prompt's: a resume reads it without parsing the row.
        "request_digest": request_digest,
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
    if max_tokens is not None:
        record["max_tokens"] = max_tokens
    if tools:
        record["tools"] = list(tools)
    if floor_cost is not None:
        record["floor_cost"] = decimal_str(floor_cost)
        record["waited_s"] = round(waited_s, 3)
        record["refusals"] = refusals
        record["endpoint"] = endpoint
    if trace:
        record.update(trace)  # type: ignore[typeddict-item]
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


@dataclass
class DatasetMerge:
    """What went into one merged dataset.

    Attributes:
        records: records in the merged output (distinct prompt ids).
        duplicates: records left out because an earlier directory had the same id.
        output_tokens: completion tokens of the merged records.
        cost: the summed cost of the merged records (USD, exact).
        duplicate_cost: what the left-out duplicates cost (USD): money spent twice.
        sources: records taken from each job directory.
    """

    records: int = 0
    duplicates: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    duplicate_cost: Decimal = Decimal(0)
    sources: dict[str, int] = field(default_factory=dict)


@dataclass
class MergeReport:
    """The result of :func:`merge_outputs`, also written to ``merge.json``."""

    out: Path
    inputs: list[Path]
    datasets: dict[str, DatasetMerge] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (money as exact decimal strings)."""
        return {
            "out": str(self.out),
            "inputs": [str(p) for p in self.inputs],
            "datasets": {
                name: {
                    "records": d.records,
                    "duplicates": d.duplicates,
                    "output_tokens": d.output_tokens,
                    "cost": decimal_str(d.cost),
                    "duplicate_cost": decimal_str(d.duplicate_cost),
                    "sources": d.sources,
                }
                for name, d in self.datasets.items()
            },
        }


def _committed_ids(directory: Path) -> dict[str, frozenset[str]]:
    """Open a job directory like a resume (repairing a crash); its done ids per dataset."""
    if not JobLayout(directory).journal.is_file():
        raise DataFileError(directory, f"not a job directory: it has no {JOURNAL_FILE}")
    journal = FileJournal.open(directory)
    try:
        return {ds: frozenset(journal.done_ids(ds)) for ds in journal.datasets()}
    finally:
        journal.close("merge")


def _check_out(out: Path, inputs: Sequence[Path], datasets: Sequence[str]) -> None:
    resolved = out.resolve()
    if any(resolved == p.resolve() for p in inputs):
        raise ConfigurationError(f"--out {out} is one of the directories being merged")
    layout = JobLayout(out)
    if layout.merge_report.exists():
        return  # an earlier merge: its outputs are rewritten
    for ds in datasets:
        path = layout.output(ds)
        if path.exists():
            raise ConfigurationError(
                f"{path} exists and was not written by `provider-router merge`; "
                "move it away or choose another --out"
            )


def merge_outputs(inputs: Sequence[str | Path], out: str | Path) -> MergeReport:
    """Merge the job directories ``inputs`` into ``out`` (see the module docstring).

    Raises:
        ConfigurationError: no inputs, ``out`` is an input, ``out`` holds outputs
            that no merge wrote, or a run still holds its journal.
        DataFileError: a directory is not a job directory, or an output line is
            damaged (file and line named).
    """
    dirs = [Path(p) for p in inputs]
    if not dirs:
        raise ConfigurationError("give at least one job directory to merge")
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise ConfigurationError("a directory is given twice")
    out_dir = Path(out)
    _check_same_job(dirs)
    committed = {directory: _committed_ids(directory) for directory in dirs}
    datasets = sorted({ds for done in committed.values() for ds in done})
    _check_out(out_dir, dirs, datasets)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = MergeReport(out_dir, dirs)
    written: list[tuple[Path, Path]] = []
    try:
        for ds in datasets:
            report.datasets[ds], tmp, final = _merge_dataset(ds, dirs, committed, out_dir)
            written.append((tmp, final))
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in written:  # every dataset merged: only then is any output replaced
        os.replace(tmp, final)
    tmp = out_dir / f".{MERGE_REPORT_FILE}.tmp"
    tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    os.replace(tmp, JobLayout(out_dir).merge_report)
    return report


def _check_same_job(dirs: Sequence[Path]) -> None:
    """Refuse to merge directories whose manifests say different jobs: their rows answer
    another model, policy or generation parameters (docs/workers.md, "Merging")."""
    first: tuple[Path, JobManifest] | None = None
    for directory in dirs:
        try:
            manifest = read_manifest(directory)
        except DataFileError as exc:
            raise ConfigurationError(str(exc)) from None
        if manifest is None:
            continue  # a directory from before manifests: its rows say their model
        if first is None:
            first = (directory, manifest)
            continue
        where, other = first
        said = _job_difference(other, manifest)
        if said:
            raise ConfigurationError(
                f"{where} and {directory} are not shares of one job ({said}): their rows "
                "answer different requests; nothing was merged"
            )


def _job_difference(a: JobManifest, b: JobManifest) -> str | None:
    if a.model != b.model:
        return f"model {a.model} and {b.model}"
    if dict(a.policy) != dict(b.policy):
        return f"policy {json.dumps(dict(a.policy))} and {json.dumps(dict(b.policy))}"
    for name in sorted(set(a.datasets) & set(b.datasets)):
        if dict(a.datasets[name].generation) != dict(b.datasets[name].generation):
            return f"dataset {name}'s generation parameters differ"
    return None


def _asked(record: OutputRecord) -> str:
    """What a record answers: its request digest, or (a record from before digests) its
    model, messages and tools."""
    digest = record.get("request_digest")
    if isinstance(digest, str):
        return digest
    asked = {
        "model": record.get("model"),
        "messages": record["messages"][:-1],
        "tools": record.get("tools") or None,
    }
    return json.dumps(asked, sort_keys=True, ensure_ascii=False)


def _merge_dataset(
    ds: str, dirs: Sequence[Path], committed: dict[Path, dict[str, frozenset[str]]], out: Path
) -> tuple[DatasetMerge, Path, Path]:
    merged = DatasetMerge()
    seen: dict[str, tuple[str, Path]] = {}
    models: dict[str, Path] = {}
    final = JobLayout(out).output(ds)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        with tmp.open("wb") as fh:
            for directory in dirs:
                done = committed[directory].get(ds)
                if not done:
                    continue
                taken = _copy_records(
                    JobLayout(directory).output(ds), ds, done, seen, models, merged, fh
                )
                merged.sources[str(directory)] = taken
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return merged, tmp, final


def _copy_records(
    path: Path,
    ds: str,
    done: frozenset[str],
    seen: dict[str, tuple[str, Path]],
    models: dict[str, Path],
    merged: DatasetMerge,
    fh: IO[bytes],
) -> int:
    taken = 0
    for lineno, record in read_outputs(path):
        prompt_id = record["id"]
        if record["dataset"] != ds:
            raise DataFileError(
                path,
                f"record of dataset {record['dataset']!r} in the output of {ds!r}",
                line=lineno,
            )
        if prompt_id not in done:
            continue  # never committed by its journal
        models.setdefault(str(record.get("model")), path)
        if len(models) > 1:
            named = " and ".join(f"{m} ({p})" for m, p in models.items())
            raise ConfigurationError(
                f"dataset {ds!r} holds rows of {named}: one dataset answers one model, so "
                "they are not merged; merge each model's directories apart"
            )
        cost = to_decimal(record["cost"], what="cost")
        asked = _asked(record)
        earlier = seen.get(prompt_id)
        if earlier is not None:
            if earlier[0] != asked:
                raise ConfigurationError(
                    f"prompt {prompt_id!r} of dataset {ds!r} answers different requests in "
                    f"{earlier[1]} and {path} (its content or parameters differ): not merged"
                )
            merged.duplicates += 1
            merged.duplicate_cost += cost
            continue
        seen[prompt_id] = (asked, path)
        fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        merged.records += 1
        merged.output_tokens += record["usage"]["completion_tokens"]
        merged.cost += cost
        taken += 1
    return taken


COMPLETE_FINISHES = ("stop", "tool_calls")
"""Finish reasons of replies that ended on their own: text, or tool calls to run."""
TRUNCATED_FINISH = "length"
"""The finish reason of a reply cut at ``max_tokens``: paid for, not whole."""


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
        flagged: keep flagged rows: ``run --verify``'s (``drift_flagged``: served by a
            provider that failed a later check since it last passed one) and those whose
            prompt OpenRouter's context compression cut (``context_compressed``: the
            model answered a prompt other than the one recorded); default: they are
            left out and counted.

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
            if not flagged and record.get("context_compressed") is True:
                report.skip("context_compressed")
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
