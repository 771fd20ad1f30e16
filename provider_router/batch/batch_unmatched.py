"""Paid batch answers whose prompt is no longer in the inputs, kept in a side file.

A batch submitted before the inputs changed (a prompt removed or its id edited, then
the job resumed) still answers that prompt, and the answer was billed: it is never
thrown away. It cannot go to the dataset's output (there is no prompt to write it
with), so it goes, once, to ``DIR/not_in_inputs.jsonl``: one JSON line per answer with
its dataset, prompt id, batch, ``custom_id``, the cost booked and the answer's whole
chat body. Each line is fsynced before its batch is settled; a torn last line (a kill
mid-write) is cut on open, and the answer is written again by the next collect.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import DataFileError
from provider_router.batch.batch_journal import BatchIntent
from provider_router.batch.batch_results import ResultLine

__all__ = ["NOT_IN_INPUTS_FILE", "UnmatchedAnswers"]

NOT_IN_INPUTS_FILE: Final = "not_in_inputs.jsonl"


class UnmatchedAnswers:
    """``DIR/not_in_inputs.jsonl``: each (dataset, prompt id) written at most once."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / NOT_IN_INPUTS_FILE
        self._written: set[tuple[str, str]] = set()
        self.loaded = False

    def _load(self) -> None:
        """Read what earlier runs wrote (only once this run first needs it)."""
        self.loaded = True
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = 0
        lines = data.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line:
                good += 1
                continue
            try:
                entry = json.loads(line)
                self._written.add((str(entry["dataset"]), str(entry["id"])))
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):  # torn by a kill mid-write: written again
                    break
                raise DataFileError(self.path, f"unreadable answer ({exc})", line=number) from None
            good += len(line) + 1
        if good < len(data):
            with self.path.open("r+b") as cut:
                cut.truncate(good)

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
            "cost_usd": str(cost),
            "answer": line.body,
        }
        data = json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        with self.path.open("ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self._written.add(key)
        return True
