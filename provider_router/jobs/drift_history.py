"""The drift history: ``DIR/verify.json``'s checks, and flagging output rows in place.

:class:`DriftHistory` is what a job's ``verify.json`` holds: the verification report
merged over every check (a failure kept for good: what ``ProviderPolicy(verified=...)``
reads) and every check (:class:`DriftCheck`) with each endpoint's last pass.
:func:`flag_rows` turns a row's ``"drift_flagged":false}`` into
``"drift_flagged":true }`` (same length: no committed offset moves). The figures the
history alone holds (:func:`verification_summary` and the per-provider counts) are
what ``summary.json``, Prometheus and every view say (docs/policy.md, "Drift").
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from provider_router import _shape
from provider_router._exceptions import ConfigurationError
from provider_router._format import decimal_str
from provider_router.catalog.verdicts import EndpointVerdict, VerificationReport

__all__ = [
    "CHECK_FIELD",
    "FLAG_FIELD",
    "DriftCheck",
    "DriftHistory",
    "excluded_by_provider",
    "flag_rows",
    "flag_rows_by_provider",
    "flagged_by_provider",
    "verification_summary",
]

CHECK_FIELD: Final = "drift_check"
FLAG_FIELD: Final = "drift_flagged"
HISTORY_VERSION: Final = 1
_CLEAN_TAIL: Final = b'"drift_flagged":false}\n'
_FLAGGED_TAIL: Final = b'"drift_flagged":true }\n'
"""Same length as :data:`_CLEAN_TAIL`: a row is flagged in place, its offsets unmoved."""
_TAILS: Final = (_CLEAN_TAIL, _FLAGGED_TAIL, b'"drift_flagged":true}\n')
"""How a row of a ``--verify`` run ends: unflagged, flagged in place, written flagged."""


@dataclass(slots=True)
class DriftCheck:
    """One verification of the job (an entry of ``verify.json``'s ``drift.checks``).

    Attributes:
        seq: its number over the job (0: the first run's check before any prompt).
        trigger: ``start`` (before a run's first prompt), ``every`` (after
            ``verify_every`` rows) or ``end`` (a run that finished its work).
        rows: rows the run had written when it started.
        endpoints: tags measured (the reference's included).
        passed, failed: tags that passed / failed it (failed: newly excluded).
        cost: USD its canaries cost (booked on the job's ledger).
        started: Unix seconds.
        flagged: rows flagged because of its failures (None: the flagging has not
            finished; a resumed run does it again).
        flagged_by: those rows per provider (empty in a history from before it was kept).
        error: why it could not be made (nothing passed or failed), else None.
    """

    seq: int
    trigger: str
    rows: int
    endpoints: tuple[str, ...]
    passed: tuple[str, ...]
    failed: tuple[str, ...]
    cost: Decimal
    started: float
    flagged: int | None = 0
    error: str | None = None
    flagged_by: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["cost"] = decimal_str(self.cost)
        for name in ("endpoints", "passed", "failed"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DriftCheck:
        """Read :meth:`to_json`'s dict back (ValueError, TypeError, KeyError: damaged)."""
        flagged = raw.get("flagged")
        cost = Decimal(str(raw.get("cost", "0")))
        started = float(raw.get("started", 0.0))
        if not cost.is_finite() or not math.isfinite(started):
            raise ValueError(f"check {raw.get('seq')!r}: cost {cost} and start {started}")
        return cls(
            seq=int(raw["seq"]),
            trigger=str(raw["trigger"]),
            rows=int(raw.get("rows", 0)),
            endpoints=tuple(str(t) for t in raw.get("endpoints", ())),
            passed=tuple(str(t) for t in raw.get("passed", ())),
            failed=tuple(str(t) for t in raw.get("failed", ())),
            cost=cost,
            started=started,
            flagged=None if flagged is None else int(flagged),
            error=None if raw.get("error") is None else str(raw["error"]),
            flagged_by={str(k): int(v) for k, v in raw.get("flagged_by", {}).items()},
        )


@dataclass(slots=True)
class DriftHistory:
    """What ``DIR/verify.json`` holds: the job's verdicts merged over its checks (a
    :class:`~provider_router.VerificationReport`, a failure kept for good) and the checks.

    Attributes:
        report: the merged report (None before the first check).
        checks: every check, oldest first.
        last_pass: per tag, the number of the last check it passed.
        failed: per tag excluded, the number of the check it failed.
    """

    report: VerificationReport | None = None
    checks: list[DriftCheck] = dataclasses.field(default_factory=list)
    last_pass: dict[str, int] = dataclasses.field(default_factory=dict)
    failed: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def seq(self) -> int:
        """The number of the newest check (-1: none yet)."""
        return self.checks[-1].seq if self.checks else -1

    @property
    def cost(self) -> Decimal:
        """USD every check of the job cost."""
        return sum((c.cost for c in self.checks), Decimal(0))

    @property
    def flagged(self) -> int:
        """Rows flagged over the job."""
        return sum(c.flagged or 0 for c in self.checks)

    def flag_floors(self, failed: Iterable[str]) -> dict[str, int]:
        """Per provider of the ``failed`` tags, the check from which its rows are flagged:
        the earliest last pass of its failed endpoints (-1: one never passed). What a
        check flags and what a resume flags again are the same rows.

        Two endpoints of one provider may have passed last at different checks; the rows
        carry the provider's name only, so every row since the earlier pass is suspect.
        """
        floors: dict[str, int] = {}
        report = self.report
        for tag in failed:
            verdict = report.verdict(tag) if report is not None else None
            if verdict is None:
                continue
            name, last = verdict.provider_name, self.last_pass.get(tag, -1)
            floors[name] = min(floors.get(name, last), last)
        return floors

    def merge(self, report: VerificationReport) -> VerificationReport:
        """``report``'s verdicts over the merged ones; an endpoint that failed stays failed."""
        verdicts: dict[str, EndpointVerdict] = {}
        if self.report is not None:
            verdicts = {v.tag: v for v in self.report.endpoints}
        for verdict in report.endpoints:
            kept = verdicts.get(verdict.tag)
            if kept is None or kept.passed is not False:
                verdicts[verdict.tag] = verdict
        cost = report.cost + (self.report.cost if self.report is not None else Decimal(0))
        self.report = dataclasses.replace(
            report, endpoints=tuple(sorted(verdicts.values(), key=lambda v: v.tag)), cost=cost
        )
        return self.report

    def to_json(self) -> dict[str, Any]:
        data = self.report.to_json() if self.report is not None else {}
        data["drift"] = {
            "version": HISTORY_VERSION,
            "checks": [c.to_json() for c in self.checks],
            "last_pass": dict(sorted(self.last_pass.items())),
            "failed": dict(sorted(self.failed.items())),
        }
        return data

    def save(self, path: Path) -> None:
        """Write it atomically (a crash never leaves half a history)."""
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> DriftHistory:
        """The history in ``path`` (empty when there is no file).

        A report without a history (``provider-router verify --report``, or an earlier
        release's ``run --verify``) keeps its failures as exclusions.

        Raises:
            ConfigurationError: the file is not a verification report (named).
        """
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from None
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str | bytes, path: Path) -> DriftHistory:
        """The history in ``text``, read from ``path`` (named in errors).

        Raises:
            ConfigurationError: it is not a verification report (named).
        """
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except RecursionError:  # nested past the parser's depth: damaged, never a crash
            message = f"{path} is not a verification report: nested too deep"
            raise ConfigurationError(message) from None
        except ValueError as exc:
            raise ConfigurationError(f"{path} is not a verification report: {exc}") from None
        history = cls(report=VerificationReport.from_json(data, where=str(path)))
        drift = data.get("drift")
        if drift is None:
            assert history.report is not None
            history.failed = dict.fromkeys(history.report.failed, -1)
            return history
        try:
            drift = _shape.obj(drift, "drift")
            if drift.get("version") != HISTORY_VERSION:
                raise ValueError(f"version {drift.get('version')!r}, expected {HISTORY_VERSION}")
            checks = _shape.items(_shape.member(drift, "checks", "drift"), "drift.checks")
            history.checks = [
                DriftCheck.from_json(_shape.obj(c, f"drift.checks[{i}]"))
                for i, c in enumerate(checks)
            ]
            history.last_pass = _numbers(drift.get("last_pass", {}), "drift.last_pass")
            history.failed = _numbers(drift.get("failed", {}), "drift.failed")
        except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
            raise ConfigurationError(f"{path}: its drift history is damaged: {exc}") from None
        return history


def _numbers(raw: object, where: str) -> dict[str, int]:
    """A ``{tag: check number}`` object of the history."""
    return {str(k): _shape.integer(v, f"{where}[{k!r}]") for k, v in _shape.obj(raw, where).items()}


def flag_rows(path: Path, size: int, since: Mapping[str, int]) -> int:
    """Flag, in the first ``size`` bytes of output file ``path``, every row of a provider
    in ``since`` whose ``drift_check`` is at least its number there; how many such rows
    are flagged now (those flagged before included: a flagging done again counts the same).

    In place and idempotent: a row's ``"drift_flagged":false}`` becomes
    ``"drift_flagged":true }``, so the file's length and every offset stay as committed.
    """
    return sum(flag_rows_by_provider(path, size, since).values())


def flag_rows_by_provider(path: Path, size: int, since: Mapping[str, int]) -> dict[str, int]:
    """:func:`flag_rows`, its count per provider."""
    flagged: dict[str, int] = {}
    # A row of one of them holds this exact text (quotes inside a JSON string are escaped,
    # so no message can fake it): most rows are passed over without being parsed.
    needles = [b'"provider":' + json.dumps(name, ensure_ascii=False).encode() for name in since]
    try:
        reader = path.open("rb")
    except FileNotFoundError:
        return {}
    with reader, open(path, "r+b", buffering=0) as writer:
        offset = 0
        for line in reader:
            end = offset + len(line)
            if end > size:
                break
            if line.endswith(_TAILS) and any(n in line for n in needles):
                record = json.loads(line)
                name = str(record.get("provider"))
                floor = since.get(name)
                check = record.get(CHECK_FIELD)
                if floor is not None and isinstance(check, int) and check >= floor:
                    if line.endswith(_CLEAN_TAIL):
                        os.pwrite(writer.fileno(), _FLAGGED_TAIL, end - len(_FLAGGED_TAIL))
                    flagged[name] = flagged.get(name, 0) + 1
            offset = end
    return flagged


# --- the history's figures: summary.json, Prometheus and every view say them ---------


def verification_summary(history: DriftHistory) -> dict[str, Any]:
    """``summary.json``'s ``verification`` figures that ``history`` alone holds: checks
    made and not made, their cost, what they excluded (check, provider, reason) and the
    rows flagged."""
    report = history.report
    excluded = {}
    for tag, seq in sorted(history.failed.items()):
        verdict = report.verdict(tag) if report is not None else None
        excluded[tag] = {
            "check": seq,
            "provider": verdict.provider_name if verdict else None,
            "reason": verdict.reason if verdict else None,
        }
    return {
        "checks": sum(1 for c in history.checks if c.error is None),
        "checks_not_made": sum(1 for c in history.checks if c.error is not None),
        "cost_usd": decimal_str(history.cost),
        "excluded": excluded,
        "flagged_rows": history.flagged,
    }


def _provider(history: DriftHistory, tag: str) -> str:
    verdict = history.report.verdict(tag) if history.report is not None else None
    return verdict.provider_name if verdict is not None else tag


def flagged_by_provider(history: DriftHistory) -> dict[str, int]:
    """Rows flagged per provider over the job (a check kept without its count per
    provider, by an earlier release: its rows under the names it failed, joined by
    `` + ``)."""
    counts: dict[str, int] = {}
    for entry in history.checks:
        each = entry.flagged_by
        if not each and entry.failed and entry.flagged:
            each = {
                " + ".join(sorted({_provider(history, t) for t in entry.failed})): entry.flagged
            }
        for name, n in each.items():
            counts[name] = counts.get(name, 0) + n
    return counts


def excluded_by_provider(history: DriftHistory) -> dict[str, int]:
    """Endpoints excluded per provider over the job."""
    counts: dict[str, int] = {}
    for tag in history.failed:
        name = _provider(history, tag)
        counts[name] = counts.get(name, 0) + 1
    return counts
