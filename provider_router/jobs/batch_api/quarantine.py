"""Paid batch answers served by a provider the policy excludes, kept aside, never data.

The Batch API honours only ``provider.only``, and the route pins an endpoint the policy
allows; a line whose body names another provider was still paid for. As on the sync
route it is quarantined: booked with its batch, not written to the outputs, counted,
and its prompt goes again. Its answer goes once to ``DIR/quarantined.jsonl`` (one JSON
line: ``dataset``, ``id``, ``batch_id``, ``custom_id``, ``provider``, ``reason``,
``cost_usd`` as booked, and the chat body as ``answer``), fsynced before its batch is
settled; a collect cut by a kill writes it again only if its line was torn.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._exceptions import DataFileError
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.results import ResultLine
from provider_router.jobs.store._layout import JobLayout

__all__ = ["QuarantinedAnswers"]


class QuarantinedAnswers:
    """``DIR/quarantined.jsonl``: each (batch id, custom_id) written at most once."""

    def __init__(self, directory: str | Path) -> None:
        self.path = JobLayout(Path(directory)).quarantined
        self._written: set[tuple[str, str]] | None = None

    def _load(self) -> set[tuple[str, str]]:
        written: set[tuple[str, str]] = set()
        if not self.path.exists():
            return written
        data = self.path.read_bytes()
        good = 0
        lines = data.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line:
                good += 1
                continue
            try:
                entry = json.loads(line)
                written.add((str(entry["batch_id"]), str(entry["custom_id"])))
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):  # torn by a kill mid-write: written again
                    break
                raise DataFileError(self.path, f"unreadable answer ({exc})", line=number) from None
            good += len(line) + 1
        if good < len(data):
            with self.path.open("r+b") as cut:
                cut.truncate(good)
        return written

    def keep(self, intent: BatchIntent, line: ResultLine, reason: str, cost: Decimal) -> bool:
        """Write the answer unless an earlier collect did; True when written now."""
        if self._written is None:
            self._written = self._load()
        custom_id = intent.custom_id(intent.prompt_ids.index(line.prompt_id))
        key = (str(intent.batch_id), custom_id)
        if key in self._written:
            return False
        body = line.body or {}
        entry: dict[str, Any] = {
            "dataset": intent.dataset,
            "id": line.prompt_id,
            "batch_id": intent.batch_id,
            "custom_id": custom_id,
            "provider": body.get("provider"),
            "reason": reason,
            "cost_usd": str(cost),
            "answer": body,
        }
        data = json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        with self.path.open("ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self._written.add(key)
        return True
