"""The job directory: the name of every file a job keeps there, defined once.

A job directory (``provider-router run --out DIR``, ``JobRunner(plan, DIR)``) holds the
outputs (``<dataset>.jsonl``), the journal and the ledger (the truth of what was done
and paid), what the Batch API route and ``--verify`` keep, and what the run leaves for
its operator. Every module that reads or writes one of them asks :class:`JobLayout` for
its path (or names the constant, where only the name is said). Files written atomically
go through a temporary name beside them; SQLite keeps its ``-wal`` and ``-shm`` files
beside the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "ACCOUNT_FILE",
    "BATCHES_REPORT_FILE",
    "BATCH_JOURNAL_FILE",
    "BATCH_STATUS_FILE",
    "JOURNAL_FILE",
    "LEDGER_FILE",
    "MERGE_REPORT_FILE",
    "NOT_IN_INPUTS_FILE",
    "OUTPUT_SUFFIX",
    "QUARANTINED_FILE",
    "REPORT_FILE",
    "SUMMARY_FILE",
    "TIMELINE_FILE",
    "VERIFY_FILE",
    "JobLayout",
]

# The truth of the job: what was done (exactly once) and what it cost.
OUTPUT_SUFFIX: Final = ".jsonl"
"""A dataset's output records are ``<dataset>.jsonl``."""
JOURNAL_FILE: Final = "journal.jsonl"
LEDGER_FILE: Final = "ledger.sqlite"
ACCOUNT_FILE: Final = "account.json"
"""Worst cases bounded by the key's usage (:mod:`provider_router.jobs.store.account`)."""
MERGE_REPORT_FILE: Final = "merge.json"
"""What ``merge`` joined into this directory."""
VERIFY_FILE: Final = "verify.json"
"""``--verify``'s checks over the job (:mod:`provider_router.jobs.drift_history`)."""

# The Batch API route.
BATCH_JOURNAL_FILE: Final = "batches.jsonl"
"""Every batch, from the intent to send it to its collection."""
BATCH_STATUS_FILE: Final = "batch_status.json"
"""What the route last saw of each batch (status, provider, expiry)."""
BATCHES_REPORT_FILE: Final = "batches.json"
"""What the last run of the route did."""
NOT_IN_INPUTS_FILE: Final = "not_in_inputs.jsonl"
"""Paid answers to prompts no longer in the inputs, kept aside."""
QUARANTINED_FILE: Final = "quarantined.jsonl"
"""Paid batch answers served by a provider the policy excludes, kept aside (not data)."""

# What a run leaves for its operator.
SUMMARY_FILE: Final = "summary.json"
TIMELINE_FILE: Final = "timeline.ndjson"
REPORT_FILE: Final = "report.html"


@dataclass(frozen=True, slots=True)
class JobLayout:
    """Where each file of the job directory ``out`` is.

    Example::

        layout = JobLayout(Path("runs/b3"))
        layout.summary          # runs/b3/summary.json
        layout.output("train")  # runs/b3/train.jsonl
    """

    out: Path

    def output(self, dataset: str) -> Path:
        """Where a dataset's output records go."""
        return self.out / f"{dataset}{OUTPUT_SUFFIX}"

    @property
    def journal(self) -> Path:
        return self.out / JOURNAL_FILE

    @property
    def ledger(self) -> Path:
        return self.out / LEDGER_FILE

    @property
    def account(self) -> Path:
        return self.out / ACCOUNT_FILE

    @property
    def merge_report(self) -> Path:
        return self.out / MERGE_REPORT_FILE

    @property
    def verify(self) -> Path:
        return self.out / VERIFY_FILE

    @property
    def batch_journal(self) -> Path:
        return self.out / BATCH_JOURNAL_FILE

    @property
    def batch_status(self) -> Path:
        return self.out / BATCH_STATUS_FILE

    @property
    def batches_report(self) -> Path:
        return self.out / BATCHES_REPORT_FILE

    @property
    def not_in_inputs(self) -> Path:
        return self.out / NOT_IN_INPUTS_FILE

    @property
    def quarantined(self) -> Path:
        return self.out / QUARANTINED_FILE

    @property
    def summary(self) -> Path:
        return self.out / SUMMARY_FILE

    @property
    def timeline(self) -> Path:
        return self.out / TIMELINE_FILE

    @property
    def report(self) -> Path:
        return self.out / REPORT_FILE
