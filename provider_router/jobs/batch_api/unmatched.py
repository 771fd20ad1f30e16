"""Paid batch answers whose prompt is no longer in the inputs, kept in a side file.

A batch submitted before the inputs changed (a prompt removed or its id edited, then
the job resumed) still answers that prompt, and the answer was billed: it is never
thrown away. With no prompt to write it with, it goes once to
``DIR/not_in_inputs.jsonl`` (format in docs/output.md), with the digest of the prompt's
content as the batch sent it (:func:`prompt_digest`), fsynced before its batch is
settled; a torn last line is cut on open and written again by the next collect. When
the prompt comes back with the same id and content, a run writes the kept answer to
the outputs instead of sending it again (:mod:`.reuse`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, TypeVar

from provider_router._exceptions import DataFileError
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.results import ResultLine
from provider_router.jobs.store._layout import JobLayout
from provider_router.planning.prompts import Prompt

__all__ = ["UnmatchedAnswers", "prompt_digest", "read_kept"]

K = TypeVar("K")

_ENCODE: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def prompt_digest(prompt: Prompt) -> str:
    """What a prompt asks, as one digest: its messages and its line's request fields
    (``tools``, ``tool_choice``); key order and whitespace do not matter."""
    canonical = _ENCODE({"messages": prompt.messages, "request": prompt.request_fields})
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def read_kept(path: Path, key: Callable[[dict[str, Any]], K]) -> list[tuple[K, int, int]]:
    """Each answer of the append-only side file ``path``: its ``key`` and where its line
    is (offset, length). A torn last line (a kill mid-write) is cut from the file: its
    answer is written again by the collect that comes back to it.

    Raises:
        DataFileError: a line before the last is not a kept answer.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    found: list[tuple[K, int, int]] = []
    good = 0
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line:
            good += 1
            continue
        try:
            found.append((key(json.loads(line)), good, len(line)))
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # torn by a kill mid-write: written again
                break
            raise DataFileError(path, f"unreadable answer ({exc})", line=number) from None
        good += len(line) + 1
    if good < len(data):
        with path.open("r+b") as cut:
            cut.truncate(good)
    return found


class UnmatchedAnswers:
    """``DIR/not_in_inputs.jsonl``: each (dataset, prompt id) written at most once."""

    def __init__(self, directory: str | Path) -> None:
        self.path = JobLayout(Path(directory)).not_in_inputs
        self._written: dict[tuple[str, str], tuple[int, int]] = {}
        """Each answer kept: where its line is in the file (offset, length)."""
        self.loaded = False

    def _load(self) -> None:
        """Read what earlier runs wrote (only once this run first needs it)."""
        self.loaded = True
        for key, offset, length in read_kept(
            self.path, lambda entry: (str(entry["dataset"]), str(entry["id"]))
        ):
            self._written.setdefault(key, (offset, length))

    def keep(self, intent: BatchIntent, line: ResultLine, cost: Decimal) -> bool:
        """Write the answer unless an earlier collect did; True when written now."""
        if not self.loaded:
            self._load()
        key = (intent.dataset, line.prompt_id)
        if key in self._written:
            return False
        entry: dict[str, Any] = {
            "dataset": intent.dataset,
            "id": line.prompt_id,
            "batch_id": intent.batch_id,
            "custom_id": intent.custom_id(intent.prompt_ids.index(line.prompt_id)),
            "digest": intent.digest_for(line.prompt_id),
            "after": intent.created_after,
            "cost_usd": str(cost),
            "answer": line.body,
        }
        data = json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        with self.path.open("ab") as fh:
            offset = fh.tell()
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self._written[key] = (offset, len(data) - 1)
        return True

    def kept_ids(self, dataset: str) -> set[str]:
        """The prompt ids of ``dataset`` whose answers are kept here."""
        if not self.loaded:
            self._load()
        return {pid for ds, pid in self._written if ds == dataset}

    def entry(self, dataset: str, prompt_id: str) -> dict[str, Any]:
        """The kept line of one answer (read from the file: answers are not held in memory).

        Raises:
            KeyError: no answer of that prompt is kept.
        """
        if not self.loaded:
            self._load()
        offset, length = self._written[(dataset, prompt_id)]
        with self.path.open("rb") as fh:
            fh.seek(offset)
            line = fh.read(length)
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise DataFileError(self.path, f"unreadable answer ({exc})") from None
        if not isinstance(entry, dict):
            raise DataFileError(self.path, "unreadable answer (not an object)")
        return entry
