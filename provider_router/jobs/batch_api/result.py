"""What one run of the batch route did, and why it stopped: the figures its progress
lines, metrics and ``DIR/batches.json`` show (money as exact strings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

__all__ = ["BatchRouteResult"]


@dataclass(slots=True)
class BatchRouteResult:
    """What one run of the batch route did, and why it stopped."""

    submitted: int = 0
    collected: int = 0
    lines_done: int = 0
    lines_failed: int = 0
    cost: Decimal = Decimal(0)
    pending: int = 0
    """Batches still live (running, or withheld for credits) when the run ended."""
    stop: str | None = None
    """None: every dataset's batches are done; else one plain sentence."""
    stopped_by: str | None = None
    """Why it stopped: ``budget`` (the ledger), ``credits`` (OpenRouter's balance) or
    ``error`` (a disputed bill, a batch that vanished)."""
    top_up: Decimal | None = None
    """USD to add before a resume can collect (after a results 402)."""
    found_after_lost_202: int = 0
    resubmitted_lines: int = 0
    not_in_inputs: int = 0
    """Paid answers to prompts no longer in the inputs, written to
    ``DIR/not_in_inputs.jsonl`` by this run."""
    earlier_content: int = 0
    """Paid answers to an earlier content of prompts still in the inputs (edited while
    their batch ran), written to ``DIR/not_in_inputs.jsonl`` by this run: never under the
    new text, which is sent as a new prompt."""
    reused: int = 0
    """Kept answers written to the outputs by this run, their prompts back in the inputs
    (not sent or paid again)."""
    in_progress: int = 0
    """Batches submitted and not yet collected (at the last poll)."""
    events: list[str] = field(default_factory=list)
    gave_up: dict[str, int] = field(default_factory=dict)
    """Per dataset, prompts that failed in every batch they may go in (``max_attempts``):
    not written, and never sent as a batch again."""
    refused: dict[str, int] = field(default_factory=dict)
    """Per dataset, prompts never put in a batch because each would fail its whole batch
    (beyond the pinned endpoint's context, a parameter out of range): ``route: auto``
    sends them sync, ``route: batch`` leaves them failed."""
    quarantined: int = 0
    """Paid lines served by a provider the policy excludes: kept aside in
    ``DIR/quarantined.jsonl``, never written as data, their prompts sent again."""

    def counts(self) -> dict[str, int]:
        """The figures progress lines, metrics and ``batches.json`` show."""
        return {
            "submitted": self.submitted,
            "in_progress": self.in_progress,
            "collected": self.collected,
            "pending": self.pending,
            "lines_done": self.lines_done,
            "lines_failed": self.lines_failed,
        }

    def to_json(self) -> dict[str, Any]:
        """``DIR/batches.json``: this run's batch route (money as exact strings)."""
        return {
            **self.counts(),
            "cost_usd": str(self.cost),
            "found_after_lost_202": self.found_after_lost_202,
            "not_in_inputs": self.not_in_inputs,
            "earlier_content": self.earlier_content,
            "reused": self.reused,
            "stop": self.stop,
            "stopped_by": self.stopped_by,
            "gave_up": dict(self.gave_up),
            "refused": dict(self.refused),
            "quarantined": self.quarantined,
            "top_up_usd": None if self.top_up is None else str(self.top_up),
            "events": list(self.events),
        }
