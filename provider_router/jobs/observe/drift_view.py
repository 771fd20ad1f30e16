"""What ``run --verify`` did, as the operator sees it: ``status``, ``report.html``, the CLI.

Built from ``DIR/verify.json`` (:class:`~provider_router.jobs.drift_history.DriftHistory`)
and the journal's ``verify`` entries, both read bounded and without a lock, so it works
while the job runs and on a job whose run is dead; a file too large, cut or damaged is
a sentence saying so (:attr:`DriftView.problems`), never a crash.
``summary.json``'s ``verification`` block is
:func:`~provider_router.jobs.drift_history.verification_summary`;
:func:`verification_lines` are the sentences ``run --verify`` ends with;
:func:`drift_status_lines` and :func:`drift_section` say the same in ``status`` and the
report. A history that counts flagged rows per check only (an earlier release wrote it
so) shows the rows of providers failed together under their names joined.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any, Final

from provider_router._exceptions import ConfigurationError
from provider_router._format import format_usd
from provider_router.catalog.verdicts import EndpointVerdict
from provider_router.jobs.drift_history import (
    DriftCheck,
    DriftHistory,
    flagged_by_provider,
    verification_summary,
)
from provider_router.jobs.store._layout import JobLayout

__all__ = [
    "JOURNAL_LINE_LIMIT",
    "JOURNAL_SCAN_LIMIT",
    "SHOWN_CHECKS",
    "VERIFY_READ_LIMIT",
    "DriftView",
    "drift_section",
    "drift_status_lines",
    "read_drift_view",
    "verification_lines",
]

VERIFY_READ_LIMIT: Final = 16 << 20
"""Bytes of ``verify.json`` read at most: a history of 100,000 checks is about 30 MiB,
a real job's (a check every 1,000 rows) well under 1 MiB."""
JOURNAL_SCAN_LIMIT: Final = 256 << 20
"""Bytes of ``journal.jsonl`` scanned at most for its ``verify`` entries (a second or so)."""
JOURNAL_LINE_LIMIT: Final = 1 << 20
"""Bytes of one journal line read at most; a longer one is passed over."""
SHOWN_CHECKS: Final = 8
"""Checks listed one by one (the newest); the others are counted."""
_VERIFY_NOTE: Final = b'verify"'
"""In every ``verify`` entry (its ``"op":"verify"``): the other lines are passed over
without being parsed. Starting with a letter rare in the journal, not a quote, it is
searched at memory speed."""
_CHUNK: Final = 1 << 20
"""Bytes of the journal read at once."""


def verification_lines(verification: Mapping[str, Any], out: Path) -> list[str]:
    """``run --verify``'s last sentences: the checks, what they excluded, the rows flagged
    (``verification``: :func:`verification_summary`'s figures)."""
    checks = verification["checks"]
    lines = [
        f"Verification: {checks} check{'' if checks == 1 else 's'} of the providers against "
        f"the model's reference, ${verification['cost_usd']} from the budget "
        f"({JobLayout(out).verify})."
    ]
    for tag, excluded in verification["excluded"].items():
        when = f"at check {excluded['check']}" if excluded["check"] >= 0 else "by its report"
        lines.append(
            f"Excluded {excluded['provider'] or tag} ({tag}) {when}: "
            f"{excluded['reason']}; it serves nothing more of this job."
        )
    flagged = verification["flagged_rows"]
    if flagged:
        lines.append(
            f"{flagged:,} row{' is' if flagged == 1 else 's are'} flagged: served by a provider "
            "since its last passing check, before it failed one (drift_flagged: true in the "
            "outputs; provider-router export leaves them out)."
        )
    elif not verification["excluded"]:
        lines.append("No row is flagged: every provider passed every check.")
    return lines


@dataclass
class DriftView:
    """What a job directory says of its verification (:func:`read_drift_view`).

    Attributes:
        directory: the job directory.
        history: ``verify.json``'s history (None: missing, too large or damaged).
        journaled: per endpoint tag the journal records excluded, the check's number.
        problems: sentences on what could not be read, and why.
    """

    directory: Path
    history: DriftHistory | None = None
    journaled: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing of a verification here (a run without ``--verify``)."""
        return self.history is None and not self.journaled and not self.problems

    def check(self, seq: int) -> DriftCheck | None:
        """The check numbered ``seq`` (None: not in the history)."""
        for entry in self.history.checks if self.history is not None else ():
            if entry.seq == seq:
                return entry
        return None

    def flagged_by_provider(self) -> dict[str, int]:
        """Rows flagged per provider (:func:`flagged_by_provider`)."""
        return {} if self.history is None else flagged_by_provider(self.history)


def read_drift_view(directory: str | Path) -> DriftView:
    """Read ``DIR/verify.json`` and the journal's exclusions, bounded; never raises."""
    view = DriftView(Path(directory))
    path = JobLayout(view.directory).verify
    try:
        with path.open("rb") as handle:
            raw = handle.read(VERIFY_READ_LIMIT + 1)
    except FileNotFoundError:
        raw = None
    except OSError as exc:
        raw = None
        view.problems.append(f"{path} cannot be read: {exc.strerror or exc}")
    if raw is not None and len(raw) > VERIFY_READ_LIMIT:
        view.problems.append(
            f"{path} is over {_size(VERIFY_READ_LIMIT)}, more than any verification "
            "history: not read (is it the job's?)"
        )
    elif raw is not None:
        try:
            view.history = DriftHistory.parse(raw, path)
        except ConfigurationError as exc:
            view.problems.append(f"{exc} (damaged: restore it before resuming the job)")
    _read_journal(view)
    if view.journaled and view.history is not None:
        lapsed = sorted(set(view.journaled) - set(view.history.failed))
        if lapsed:
            view.problems.append(
                f"the journal records {', '.join(lapsed)} excluded but {path} does not: "
                "a resume is refused until the verify.json that excludes them is restored"
            )
    elif view.journaled and not any(str(path) in p for p in view.problems):
        view.problems.append(
            f"the journal records {', '.join(sorted(view.journaled))} excluded but {path} is "
            "missing: a resume is refused until it is restored"
        )
    return view


def _read_journal(view: DriftView) -> None:
    """The journal's ``verify`` entries into ``view.journaled`` (bounded).

    Read in chunks searched for :data:`_VERIFY_NOTE` at memory speed: only the lines
    holding it are parsed, so a job without ``--verify`` pays a fraction of a second for
    the largest journal searched."""
    path = JobLayout(view.directory).journal
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    except OSError as exc:
        view.problems.append(f"{path} cannot be read: {exc.strerror or exc}")
        return
    read = 0
    carry = b""  # the start of a line the last chunk cut
    skipping = False  # inside a line over JOURNAL_LINE_LIMIT: passed over to its end
    with handle:
        while read < JOURNAL_SCAN_LIMIT:
            chunk = handle.read(min(_CHUNK, JOURNAL_SCAN_LIMIT - read))
            if not chunk:
                return  # what is left in carry is a torn last line: not an entry
            read += len(chunk)
            if skipping:
                end = chunk.find(b"\n")
                if end < 0:
                    continue
                chunk, skipping = chunk[end + 1 :], False
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            _scan_lines(view, data, cut)
            carry = data[cut:]
            if len(carry) > JOURNAL_LINE_LIMIT:
                carry, skipping = b"", True
        if handle.read(1):
            size = _size(JOURNAL_SCAN_LIMIT)
            view.problems.append(
                f"{path} is over {size}: only its first {size} were searched for exclusions"
            )


def _scan_lines(view: DriftView, data: bytes, end: int) -> None:
    """The ``verify`` entries among the whole lines of ``data[:end]``."""
    position = data.find(_VERIFY_NOTE, 0, end)
    while position >= 0:
        start = data.rfind(b"\n", 0, position) + 1
        stop = data.find(b"\n", position, end)
        if stop - start > JOURNAL_LINE_LIMIT:  # passed over, as one cut by a chunk is
            position = data.find(_VERIFY_NOTE, stop + 1, end)
            continue
        try:
            entry = json.loads(data[start:stop])
            if isinstance(entry, dict) and entry.get("op") == "verify":
                for tag in entry["failed"]:
                    view.journaled.setdefault(str(tag), int(entry.get("check", -1)))
        except (ValueError, KeyError, TypeError, RecursionError):
            pass  # not one of ours: the journal's own reader judges it
        position = data.find(_VERIFY_NOTE, stop + 1, end)


# --- words ---------------------------------------------------------------------------


def _size(limit: int) -> str:
    return f"{limit >> 20:,} MiB" if limit >= 1 << 20 else f"{limit:,} bytes"


def _when(started: float) -> str:
    try:
        if started > 0:
            return datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # a time no clock gives: said as unknown
        pass
    return "at an unknown time"


def _check_words(entry: DriftCheck) -> str:
    what = {"start": "before the run", "every": "during the run", "end": "at the run's end"}
    text = (
        f"check {entry.seq} {what.get(entry.trigger, entry.trigger)} ({_when(entry.started)}, "
        f"after {entry.rows:,} rows of its run): "
    )
    if entry.error is not None:
        return text + f"could not be made: {entry.error}"
    measured = len(entry.endpoints)
    text += f"{measured} endpoint{'' if measured == 1 else 's'} measured, "
    text += f"{len(entry.passed)} passed"
    if entry.failed:
        text += f", failed: {', '.join(entry.failed)}"
    return text + f", {format_usd(entry.cost)}"


def _pass_rate(verdict: EndpointVerdict) -> str:
    rate = verdict.pass_rate
    if rate is None:
        return "pass rate not measured"
    return f"pass rate {verdict.accepted}/{verdict.judged} (95% CI {rate.low:.3f}–{rate.high:.3f})"


def _endpoint_words(view: DriftView, verdict: EndpointVerdict) -> tuple[str, str]:
    """(status, last pass) of one endpoint, in words."""
    history = view.history
    assert history is not None
    failed = history.failed.get(verdict.tag)
    last = history.last_pass.get(verdict.tag)
    last_check = None if last is None else view.check(last)
    if last_check is None:
        passed = "never passed a check" if last is None else f"last passed check {last}"
    else:
        passed = f"last passed check {last} ({_when(last_check.started)})"
    if failed is not None:
        when = f"at check {failed}" if failed >= 0 else "by its report"
        return f"excluded {when}: {verdict.reason}", passed
    if verdict.passed is None:
        return f"could not be told: {verdict.reason}", passed
    return "allowed", passed


def _verdicts(view: DriftView) -> Iterable[EndpointVerdict]:
    history = view.history
    if history is None or history.report is None:
        return ()
    return (v for v in history.report.endpoints if v.tag != history.report.reference)


def drift_status_lines(view: DriftView) -> list[str]:
    """``provider-router status``'s lines on the verification (none without one)."""
    if view.empty:
        return []
    lines = [f"verification: {p}" for p in view.problems]
    history = view.history
    if history is None:
        return lines
    lines[:0] = verification_lines(verification_summary(history), view.directory)
    checks = history.checks
    if len(checks) > SHOWN_CHECKS:
        lines.append(f"  ({len(checks) - SHOWN_CHECKS:,} earlier checks not listed)")
    lines.extend(f"  {_check_words(c)}" for c in checks[-SHOWN_CHECKS:])
    flagged = view.flagged_by_provider()
    for verdict in _verdicts(view):
        status, passed = _endpoint_words(view, verdict)
        rows = flagged.get(verdict.provider_name)
        text = f"  {verdict.provider_name} ({verdict.tag}): {status}; {passed}; "
        text += _pass_rate(verdict)
        if rows:
            text += f"; {rows:,} row{'' if rows == 1 else 's'} flagged"
        lines.append(text)
    names = {v.provider_name for v in _verdicts(view)}
    for name, rows in flagged.items():
        if name not in names and rows:
            lines.append(f"  {name}: {rows:,} row{'' if rows == 1 else 's'} flagged")
    return lines


def drift_section(view: DriftView) -> str:
    """The report page's ``Verification`` section (empty without one)."""
    if view.empty:
        return ""
    parts = ['<section data-section="verification"><h2>Verification</h2>']
    parts.extend(f'<p class="problem">{escape(p)}</p>' for p in view.problems)
    history = view.history
    if history is None:
        return "".join(parts) + "</section>"
    summary = verification_lines(verification_summary(history), view.directory)
    parts.extend(f"<p>{escape(line)}</p>" for line in summary)
    flagged = view.flagged_by_provider()
    rows = []
    for verdict in _verdicts(view):
        status, passed = _endpoint_words(view, verdict)
        rows.append(
            "<tr>"
            f"<td>{escape(verdict.provider_name)}</td><td>{escape(verdict.tag)}</td>"
            f"<td>{escape(status)}</td><td>{escape(passed)}</td>"
            f"<td>{escape(_pass_rate(verdict))}</td>"
            f"<td>{flagged.get(verdict.provider_name, 0):,}</td>"
            "</tr>"
        )
    if rows:
        parts.append(
            "<table><tr><th>provider</th><th>endpoint</th><th>status</th><th>last pass</th>"
            "<th>pass rate</th><th>rows flagged</th></tr>" + "".join(rows) + "</table>"
        )
    checks = history.checks[-SHOWN_CHECKS:]
    if len(history.checks) > len(checks):
        parts.append(f"<p>{len(history.checks) - len(checks):,} earlier checks not listed.</p>")
    parts.append("<ul>" + "".join(f"<li>{escape(_check_words(c))}</li>" for c in checks) + "</ul>")
    return "".join(parts) + "</section>"
