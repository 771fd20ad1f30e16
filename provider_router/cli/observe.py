"""``provider-router report DIR`` and ``provider-router status DIR``: look at a run.

::

    provider-router report runs/b3        # (re)build runs/b3/report.html
    provider-router status runs/b3        # a few lines: running or finished, spend, datasets

Both only read what the run wrote (``summary.json``, the outputs, ``timeline.ndjson``,
and a Batch API route's ``batches.jsonl`` and ``batch_status.json``): they work while
another process is running the job. See docs/observability.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from provider_router._table import Column, FitTable
from provider_router.cli._errors import UsageError
from provider_router.cli._render import make_console, print_wrapped
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.observe.status import RunStatus, run_status
from provider_router.jobs.store._layout import BATCH_JOURNAL_FILE, SUMMARY_FILE, TIMELINE_FILE

__all__ = ["print_status", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = subparsers.add_parser(
        "report",
        help="build DIR/report.html: charts of a run (also while it runs)",
        description=(
            "Write DIR/report.html, a self-contained page (opens offline) with spend and "
            "budget over time, tokens/s, requests by provider and outcome, latency, cost per "
            "million output tokens, retries and 429s, and the projection against the actual."
        ),
    )
    report.add_argument("directory", metavar="DIR", help="a run's --out directory")
    report.set_defaults(handler=_report)
    status = subparsers.add_parser(
        "status",
        help="a quick text view of a run in progress or finished",
        description=(
            "Print whether the run in DIR is running or finished, its spend, counts and "
            "datasets. Reads only; safe while another process runs the job."
        ),
    )
    status.add_argument("directory", metavar="DIR", help="a run's --out directory")
    status.set_defaults(handler=_status)


def _run_dir(value: str) -> Path:
    """A directory a run wrote to: one with its timeline or its summary (else exit 2)."""
    path = Path(value)
    if not path.is_dir():
        raise UsageError(f"{path}: no such run directory (give a run's --out)")
    if not any((path / n).is_file() for n in (TIMELINE_FILE, SUMMARY_FILE, BATCH_JOURNAL_FILE)):
        raise UsageError(
            f"{path}: no run here (neither {TIMELINE_FILE}, {SUMMARY_FILE} nor "
            f"{BATCH_JOURNAL_FILE}); give the --out directory of a run"
        )
    return path


def _report(args: argparse.Namespace) -> int:
    path = write_report(_run_dir(args.directory))
    print(path)
    return 0


def _status(args: argparse.Namespace) -> int:
    print_status(run_status(_run_dir(args.directory), now=time.time()), make_console())
    return 0


def print_status(status: RunStatus, console: Console) -> None:
    """A run's status: its sentences wrapped to ``console``, its datasets as a table."""
    for line in status.head:
        print_wrapped(console, line)
    if status.datasets:
        table = FitTable(
            Column("dataset", key=True),
            Column("done", "right"),
            Column("output tokens", "right"),
            Column("cost", "right"),
            *(
                [Column("cut at max_tokens", "right")]
                if any(d.cut for d in status.datasets)
                else []
            ),
        )
        cut = any(d.cut for d in status.datasets)
        for d in status.datasets:
            table.add_row(
                d.name,
                d.done,
                d.output_tokens,
                d.cost,
                *([f"{d.cut} ({d.cut_cost})" if d.cut else "0"] if cut else []),
            )
        console.print(table)
    for line in status.tail:
        print_wrapped(console, line)
