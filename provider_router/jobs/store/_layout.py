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
    "JOB_KEYS_FILE",
    "JOURNAL_FILE",
    "LEDGER_FILE",
    "MANIFEST_FILE",
    "MERGE_REPORT_FILE",
    "NOT_IN_INPUTS_FILE",
    "NOT_OUTPUTS",
    "OUTPUT_SUFFIX",
    "QUARANTINED_FILE",
    "REPORT_FILE",
    "SET_ASIDE_DIR",
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
MANIFEST_FILE: Final = "job.json"
"""What the job is: its model, policy, and each dataset's route, generation parameters and
input files (:mod:`provider_router.jobs.store.manifest`); written atomically."""
ACCOUNT_FILE: Final = "account.json"
"""Worst cases bounded by the key's usage (:mod:`provider_router.jobs.store.account`)."""
MERGE_REPORT_FILE: Final = "merge.json"
"""What ``merge`` joined into this directory."""
VERIFY_FILE: Final = "verify.json"
"""``--verify``'s checks over the job (:mod:`provider_router.jobs.drift_history`)."""
SET_ASIDE_DIR: Final = "set_aside"
"""Rows moved out of the outputs (kept, never deleted): ``set_aside/<why>/<dataset>.jsonl``
(:mod:`provider_router.jobs.store.aside`)."""
JOB_KEYS_FILE: Final = "job_keys.json"
"""The keys ``--job-key`` made for the job's runs: hashes only, never a key
(:mod:`provider_router.jobs.store.job_keys`)."""

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

NOT_OUTPUTS: Final = frozenset(
    {JOURNAL_FILE, BATCH_JOURNAL_FILE, NOT_IN_INPUTS_FILE, QUARANTINED_FILE}
)
"""Files of the job directory named ``*.jsonl`` that are not a dataset's output."""

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

    def outputs(self) -> list[Path]:
        """Every dataset's output file in the directory, by name."""
        found = self.out.glob(f"*{OUTPUT_SUFFIX}")
        return sorted(p for p in found if p.name not in NOT_OUTPUTS and not p.name.startswith("."))

    @property
    def manifest(self) -> Path:
        return self.out / MANIFEST_FILE

    def set_aside(self, why: str, dataset: str) -> Path:
        """Where a dataset's rows moved out of its outputs for ``why`` are kept."""
        return self.out / SET_ASIDE_DIR / why / f"{dataset}{OUTPUT_SUFFIX}"

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
    def job_keys(self) -> Path:
        return self.out / JOB_KEYS_FILE

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
