"""A quick text view of a run directory: ``provider-router status DIR``.

Reads only what the run writes for others (``timeline.ndjson``, ``summary.json``,
for the Batch API route its ``batches.jsonl`` and ``batch_status.json``:
:mod:`provider_router.jobs.observe.batch_view`, and for ``run --verify`` its ``verify.json``
and the journal's exclusions: :mod:`provider_router.jobs.observe.drift_view`, each read
bounded), never the outputs or the ledger, and
holds no lock: it works while another process is running the job, as often as you
like, and on a job whose batch route was killed. Whether that process still
lives is told by the job's lock and the pid the timeline names, never by how old
a file is: the OS drops the lock when the process dies, however it dies.
"""

from __future__ import annotations

import json
import os
import socket
from collections import deque
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from provider_router._exceptions import ConfigurationError
from provider_router._format import format_usd
from provider_router.jobs.finish import finish_words
from provider_router.jobs.observe.batch_view import read_batch_view
from provider_router.jobs.observe.batch_words import batch_sentences
from provider_router.jobs.observe.drift_view import drift_status_lines, read_drift_view
from provider_router.jobs.observe.router_view import router_status_lines
from provider_router.jobs.observe.timeline import read_timeline
from provider_router.jobs.store._journal_file import lock_held
from provider_router.jobs.store._layout import (
    BATCH_JOURNAL_FILE,
    SUMMARY_FILE,
    TIMELINE_FILE,
    JobLayout,
)
from provider_router.jobs.summary import truncation_line

__all__ = ["DatasetStatus", "RunStatus", "run_status", "status_lines"]

_STALE_SECONDS = 120.0
"""A running job writes its timeline every second; this long without a line is suspicious
(said only where neither the lock nor the pid can tell: another machine's file system)."""


def _usd(value: Any) -> str:
    """Money as every view shows it (:func:`format_usd`); ``?`` for what is not a number."""
    try:
        return format_usd(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return "?"


def _decimal(value: Any) -> Decimal | None:
    try:
        return None if value is None else Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _summary(directory: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(JobLayout(directory).summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, run by someone else
        return True
    return True


def _process_alive(directory: Path, row: dict[str, Any] | None) -> bool | None:
    """Whether a process is running the job in ``directory`` (None: cannot be told).

    A pid of this machine that no longer exists settles it; otherwise the job's
    lock decides (a live pid may since belong to another program).
    """
    pid = (row or {}).get("pid")
    here = (row or {}).get("host") == socket.gethostname()
    if here and isinstance(pid, int) and pid > 0 and not _pid_alive(pid):
        return False
    return lock_held(directory)


@dataclass(frozen=True, slots=True)
class DatasetStatus:
    """One dataset's line of a run's status, as its figures (text as shown)."""

    name: str
    done: str  # completed, or completed/total
    output_tokens: str  # output tokens, or output tokens/target
    cost: str
    cut: str = ""  # answers cut at max_tokens ("" for none)
    cut_cost: str = ""  # what they cost

    def line(self) -> str:
        cut = f", {self.cut} cut at max_tokens ({self.cut_cost})" if self.cut else ""
        return (
            f"  {self.name}: {self.done} done, {self.output_tokens} output tokens, {self.cost}{cut}"
        )


@dataclass(frozen=True, slots=True)
class RunStatus:
    """A run's status: sentences, its datasets' figures, then more sentences."""

    head: list[str]
    datasets: list[DatasetStatus]
    tail: list[str]

    def lines(self) -> list[str]:
        return [*self.head, *(d.line() for d in self.datasets), *self.tail]


def status_lines(directory: str | Path, *, now: float) -> list[str]:
    """The status of the run in ``directory`` as lines of text (:func:`run_status`).

    Raises:
        ConfigurationError: ``directory`` holds no run (no timeline, no summary).
    """
    return run_status(directory, now=now).lines()


def run_status(directory: str | Path, *, now: float) -> RunStatus:
    """The status of the run in ``directory``: whether it runs, its money and counts,
    each dataset's figures, and what its Batch API route and verification say.

    Raises:
        ConfigurationError: ``directory`` holds no run (no timeline, no summary).
    """
    directory = Path(directory)
    last_rows = deque(read_timeline(JobLayout(directory).timeline), maxlen=1)
    row = last_rows[0] if last_rows else None
    summary = _summary(directory)
    batches = read_batch_view(directory)
    if row is None and summary is None and batches is None:
        raise ConfigurationError(
            f"{directory}: no run here (neither {TIMELINE_FILE}, {SUMMARY_FILE} nor "
            f"{BATCH_JOURNAL_FILE}); give the --out directory of a run"
        )
    # A batch route writes no timeline: while it runs, its lock says so.
    finished = (
        summary is not None
        and (row is None or row.get("final", False))
        and (row is not None or lock_held(directory) is not True)
    )
    lines = []
    if finished and summary is not None:
        # The exit code is the command's: a run from Python (run_plan) has none.
        code = summary.get("exit_code")
        said = "" if code is None else f" (exit code {code})"
        lines.append(f"{directory}: finished: {summary.get('reason')}{said}")
        if summary.get("message"):
            lines.append(f"  {summary['message']}")
    else:
        age = max(now - (float(row["t"]) if row is not None else _batch_update(directory)), 0.0)
        alive = _process_alive(directory, row)
        if alive is False:
            lines.append(
                f"{directory}: stopped (killed?): no process is running it and it wrote no "
                f"summary (last update {_age(age)} ago); run the same command again to resume"
            )
        else:
            stale = "; no update for a while: it may have been killed (run it again to resume)"
            lines.append(
                f"{directory}: running (last update {_age(age)} ago)"
                + (stale if alive is None and age > _STALE_SECONDS else "")
            )
    if row is not None:
        lines.append(
            f"spent {_usd(row.get('spent') or 0)} of {_usd(row.get('limit'))}, "
            f"reserved {_usd(row.get('reserved') or 0)}, in flight {row.get('in_flight', 0):,}, "
            f"waiting for budget {row.get('waiting_for_budget', 0):,}, "
            f"elapsed {_age(float(row.get('elapsed') or 0))}"
        )
        lines.append(
            f"completed {row.get('completed', 0):,}, output tokens {row.get('output_tokens', 0):,}"
            f", failures {row.get('failures', 0):,}, retries {row.get('retries', 0):,}, "
            f"429s {row.get('rate_limited', 0):,}"
            + ("" if row.get("projected") is None else f", projected {_usd(row['projected'])}")
        )
        if not finished:
            lines += _cut_line(row.get("datasets"))
        if "to_finish" in row and not finished:
            lines.append(f"to finish: {finish_words(_decimal(row['to_finish']), None)}")
    elif summary is not None:
        lines.append(f"spent {_usd(summary.get('spent_usd'))} of {_usd(summary.get('budget_usd'))}")
    if finished and summary is not None and "to_finish_usd" in summary:
        needed = _decimal(summary.get("budget_to_finish_usd"))
        lines.append(f"to finish: {finish_words(_decimal(summary['to_finish_usd']), needed)}")
    datasets = (row or {}).get("datasets") or {}
    if finished and summary is not None and isinstance(summary.get("datasets"), dict):
        datasets = {
            name: {
                "completed": d.get("completed"),
                "total": d.get("prompts"),
                "output_tokens": d.get("output_tokens"),
                "target": d.get("target_output_tokens"),
                "cost": d.get("cost"),
                "truncated": d.get("truncated"),
                "truncated_cost": d.get("truncated_cost_usd"),
            }
            for name, d in summary["datasets"].items()
        }
        lines += _cut_line(datasets)
    rows = []
    for name, d in datasets.items():
        total = d.get("total")
        target = d.get("target")
        rows.append(
            DatasetStatus(
                name,
                f"{int(d.get('completed') or 0):,}" + ("" if total is None else f"/{total:,}"),
                f"{int(d.get('output_tokens') or 0):,}"
                + ("" if target is None else f"/{target:,}"),
                _usd(d.get("cost") or 0),
                f"{_count(d.get('truncated')):,}" if _count(d.get("truncated")) else "",
                _usd(d.get("truncated_cost")) if _count(d.get("truncated")) else "",
            )
        )
    tail = []
    if batches is not None:
        tail.extend(batch_sentences(batches, now))
    tail.extend(drift_status_lines(read_drift_view(directory)))
    tail.extend(router_status_lines(summary if finished else None, None if finished else row))
    return RunStatus(lines, rows, tail)


def _count(value: Any) -> int:
    """A count a file says, 0 for what is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _cut_line(datasets: Any) -> list[str]:
    """The sentence about answers cut at ``max_tokens`` over the job's datasets (none: [])."""
    if not isinstance(datasets, dict):
        return []
    answers = truncated = 0
    cost = cut_cost = Decimal(0)
    for d in datasets.values():
        if not isinstance(d, dict):
            continue
        answers += _count(d.get("completed"))
        truncated += _count(d.get("truncated"))
        cost += _decimal(d.get("cost")) or Decimal(0)
        cut_cost += _decimal(d.get("truncated_cost")) or Decimal(0)
    line = truncation_line(answers, truncated, cost, cut_cost)
    return [line] if line else []


def _batch_update(directory: Path) -> float:
    """When the batch route last wrote (its journal, or what it saw of its batches)."""
    layout = JobLayout(directory)
    times = []
    for path in (layout.batch_journal, layout.batch_status):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)
