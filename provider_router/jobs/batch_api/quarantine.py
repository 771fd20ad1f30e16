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

from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.batch_api.results import ResultLine
from provider_router.jobs.batch_api.unmatched import read_kept
from provider_router.jobs.store._layout import JobLayout

__all__ = ["QuarantinedAnswers"]


class QuarantinedAnswers:
    """``DIR/quarantined.jsonl``: each (batch id, custom_id) written at most once."""

    def __init__(self, directory: str | Path) -> None:
        self.path = JobLayout(Path(directory)).quarantined
        self._written: set[tuple[str, str]] | None = None

    def _load(self) -> set[tuple[str, str]]:
        kept = read_kept(self.path, lambda e: (str(e["batch_id"]), str(e["custom_id"])))
        return {key for key, _, _ in kept}

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
