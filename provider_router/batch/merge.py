"""Merge the outputs of separate runs: one output per dataset, each prompt once.

Runs of one job on separate machines without Ray (each ``provider-router run``
with its own share of the prompts and its own job directory, one budget through a
shared ``--ledger redis://...``; docs/workers.md) leave one directory each. To use
the results as one, merge them (``provider-router merge DIR... --out MERGED``):

* each directory is opened the way a resume would open it, so whatever a crash
  left half-written is repaired first, and only records its journal committed are
  taken (a run that is still going holds its journal's lock, and merging it is
  refused);
* a prompt completed in two directories (the shares overlapped) is kept once: the
  record of the first directory given; what the others cost is reported as spent
  twice;
* each merged ``<dataset>.jsonl`` is written to a temporary file and renamed into
  place, and ``merge.json`` records what came from where, so merging again (say
  after a resumed run) rewrites the same result rather than appending to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Final

from provider_router._exceptions import ConfigurationError, DataFileError
from provider_router._format import decimal_str
from provider_router._money import to_decimal
from provider_router.batch.journal import JOURNAL_FILE, FileJournal, output_path
from provider_router.batch.output import read_outputs

__all__ = ["MERGE_REPORT_FILE", "DatasetMerge", "MergeReport", "merge_outputs"]

MERGE_REPORT_FILE: Final = "merge.json"


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
    if not (directory / JOURNAL_FILE).is_file():
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
    if (out / MERGE_REPORT_FILE).exists():
        return  # an earlier merge: its outputs are rewritten
    for ds in datasets:
        path = output_path(out, ds)
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
    committed = {directory: _committed_ids(directory) for directory in dirs}
    datasets = sorted({ds for done in committed.values() for ds in done})
    _check_out(out_dir, dirs, datasets)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = MergeReport(out_dir, dirs)
    for ds in datasets:
        report.datasets[ds] = _merge_dataset(ds, dirs, committed, out_dir)
    tmp = out_dir / f".{MERGE_REPORT_FILE}.tmp"
    tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    os.replace(tmp, out_dir / MERGE_REPORT_FILE)
    return report


def _merge_dataset(
    ds: str, dirs: Sequence[Path], committed: dict[Path, dict[str, frozenset[str]]], out: Path
) -> DatasetMerge:
    merged = DatasetMerge()
    seen: set[str] = set()
    final = output_path(out, ds)
    tmp = final.with_name(f".{final.name}.tmp")
    with tmp.open("wb") as fh:
        for directory in dirs:
            done = committed[directory].get(ds)
            if not done:
                continue
            taken = _copy_records(output_path(directory, ds), ds, done, seen, merged, fh)
            merged.sources[str(directory)] = taken
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return merged


def _copy_records(
    path: Path,
    ds: str,
    done: frozenset[str],
    seen: set[str],
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
        cost = to_decimal(record["cost"], what="cost")
        if prompt_id in seen:
            merged.duplicates += 1
            merged.duplicate_cost += cost
            continue
        seen.add(prompt_id)
        fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        merged.records += 1
        merged.output_tokens += record["usage"]["completion_tokens"]
        merged.cost += cost
        taken += 1
    return taken
