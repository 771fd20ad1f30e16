"""The run report: ``DIR/report.html``, one self-contained page to look at after a run.

Built read-only from what the run left in its directory (``summary.json``, the
outputs, ``timeline.ndjson``, and the Batch API route's and ``run --verify``'s files),
so ``provider-router report DIR`` rebuilds it even while another process still runs
the job; a run writes it through :class:`ReportObserver`, one of the standard
observers. The page opens offline: inline SVG (:mod:`provider_router.jobs.observe._svg`),
inline CSS, no script, nothing fetched. Its charts (:data:`CHARTS`,
docs/observability.md) show spend, tokens per second, requests by provider and outcome,
latency, cost per provider, retries and 429s, and the projection against the actual.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from html import escape
from pathlib import Path
from typing import Any, Final

from provider_router._format import format_usd
from provider_router._log import get_logger
from provider_router.jobs.events import ObservedRun, RunObserver
from provider_router.jobs.finish import finish_words
from provider_router.jobs.observe import _svg
from provider_router.jobs.observe.batch_view import BatchView, read_batch_view
from provider_router.jobs.observe.batch_words import batch_table
from provider_router.jobs.observe.drift_view import DriftView, drift_section, read_drift_view
from provider_router.jobs.observe.router_view import router_section
from provider_router.jobs.observe.timeline import read_timeline
from provider_router.jobs.store._journal_file import lock_held
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.summary import RunSummary, floor_sentence, truncation_line

__all__ = [
    "CHARTS",
    "ReportObserver",
    "RunData",
    "load_run",
    "render_report",
    "write_report",
]

log = get_logger(__name__)

CHARTS: Final = (
    "spend",
    "tokens-per-second",
    "requests-by-provider",
    "latency",
    "cost-per-million",
    "retries-429s",
    "projection",
)
"""The ``data-chart`` names of the report's charts, in page order."""
_BINS: Final = 40
_TAIL_BYTES: Final = 8 << 20
"""Of each output file only the last 8 MiB is read (the latency sample): a report of a
run of millions of answers takes as long as one of a few thousand."""
_MAX_POINTS: Final = 600
"""Timeline lines drawn at most per series (a day at one line a second is 86,400)."""
_MILLION = Decimal(1_000_000)


def _dec(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class ReportRow:
    """What the report needs of one output record."""

    dataset: str
    provider: str
    cost: Decimal
    output_tokens: int
    started: float
    finished: float
    id: str = ""
    compressed: bool = False
    """OpenRouter's context compression cut its prompt (``context_compressed``)."""


@dataclass
class RunData:
    """Everything the report and ``status`` read from a run directory."""

    directory: Path
    summary: dict[str, Any] | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)
    completions: list[ReportRow] = field(default_factory=list)
    sampled: bool = False
    """Only the tail of some output file was read: ``completions`` are the latest ones."""
    batches: BatchView | None = None
    """The Batch API route's datasets (None: the job sent no batch)."""
    read_at: float = 0.0
    """Unix seconds when it was read (the batch windows' time left is counted from it)."""
    drift: DriftView | None = None
    """What ``run --verify`` checked, excluded and flagged (None: not read)."""

    def rows(self, limit: int = _MAX_POINTS, *, counted: bool = False) -> list[dict[str, Any]]:
        """The timeline thinned to at most ``limit`` evenly spaced lines (first and last kept).

        ``counted``: only lines written once the run knew its datasets (a run's very
        first line, written before it read the journal, counts no tokens yet).
        """
        rows = [r for r in self.timeline if r.get("datasets")] if counted else self.timeline
        if len(rows) <= limit:
            return rows
        step = len(rows) / (limit - 1)
        return [rows[int(i * step)] for i in range(limit - 1)] + [rows[-1]]

    @property
    def start(self) -> float:
        """The earliest moment seen (the time axis starts there)."""
        times = [c.started for c in self.completions]
        if self.timeline:
            times.append(float(self.timeline[0]["t"]))
        return min(times) if times else 0.0


def _datasets(directory: Path, summary: Mapping[str, Any] | None) -> list[str]:
    if summary is not None and isinstance(summary.get("datasets"), dict):
        return list(summary["datasets"])
    return [p.stem for p in JobLayout(directory).outputs()]


def _when(value: Any) -> float:
    """Unix seconds from an output record's ISO-8601 time (or a number)."""
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def _money_text(value: Any) -> str:
    """Money as every view shows it (:func:`format_usd`; exact figures stay in summary.json)."""
    amount = _dec(value)
    return "?" if amount is None else format_usd(amount)


def _completions(path: Path, dataset: str, data: RunData) -> Iterator[ReportRow]:
    try:
        handle = path.open("rb")
    except OSError:
        return
    with handle:
        size = handle.seek(0, 2)
        handle.seek(max(0, size - _TAIL_BYTES))
        if size > _TAIL_BYTES:
            data.sampled = True
            handle.readline()  # the rest of a line cut by the seek
        for raw in handle:
            try:
                record = json.loads(raw)
                usage = record.get("usage") or {}
                yield ReportRow(
                    dataset=dataset,
                    provider=str(record.get("provider") or "unknown"),
                    cost=Decimal(str(record.get("cost") or 0)),
                    output_tokens=int(usage.get("completion_tokens") or 0),
                    started=_when(record["started_at"]),
                    finished=_when(record["finished_at"]),
                    id=str(record.get("id") or ""),
                    compressed=record.get("context_compressed") is True,
                )
            except (ValueError, KeyError, TypeError, AttributeError, InvalidOperation):
                continue  # a torn last line of a run in progress, or a foreign one


def load_run(directory: str | Path) -> RunData:
    """Read a run directory (nothing is locked or written; a running job is fine)."""
    directory = Path(directory)
    layout = JobLayout(directory)
    data = RunData(directory)
    try:
        loaded = json.loads(layout.summary.read_text(encoding="utf-8"))
        data.summary = loaded if isinstance(loaded, dict) else None
    except (OSError, ValueError):
        data.summary = None
    data.timeline = list(read_timeline(layout.timeline))
    if data.timeline and not data.timeline[-1].get("final"):
        data.summary = None  # a run is going on: summary.json is an earlier run's
    for name in _datasets(directory, data.summary):
        data.completions.extend(_completions(layout.output(name), name, data))
    data.completions.sort(key=lambda c: c.finished)
    data.batches = read_batch_view(directory)
    data.drift = read_drift_view(directory)
    data.read_at = time.time()
    if data.batches is not None and not data.timeline and lock_held(directory) is True:
        data.summary = None  # a batch route is going on (it writes no timeline)
    return data


# --- charts --------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{value:,.0f} s" if value >= 10 or value == 0 else f"{value:.2g} s"


def _new_run(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """``after`` is the first line of another run of the job (nothing ran in between)."""
    if before.get("final"):
        return True
    if float(after.get("elapsed") or 0) < float(before.get("elapsed") or 0):
        return True  # a killed run, resumed: its clock starts again
    return before.get("pid") is not None and before.get("pid") != after.get("pid")


def _gapped(rows: Sequence[Mapping[str, Any]], t0: float, key: str) -> list[tuple[float, float]]:
    """``key`` of each line as (seconds, value), with a gap where one run ends and the next
    starts: the time between two runs of a job is drawn as nothing, never as a slope."""
    points: list[tuple[float, float]] = []
    previous: Mapping[str, Any] | None = None
    for row in rows:
        value = _dec(row.get(key))
        if previous is not None and _new_run(previous, row):
            points.append(((float(previous["t"]) + float(row["t"])) / 2 - t0, _svg.GAP))
        if value is not None:
            points.append((float(row["t"]) - t0, float(value)))
        previous = row
    return points


def _spend_chart(data: RunData) -> str:
    t0 = data.start
    rows = data.rows()
    spent = _gapped(rows, t0, "spent")
    if len(spent) < 2 and not data.sampled:  # no timeline: the answers' own costs
        spent = [(0.0, 0.0)] if data.completions else []
        total = Decimal(0)
        for c in data.completions:
            total += c.cost
            spent.append((c.finished - t0, float(total)))
    remaining: list[tuple[float, float]] = []
    budget_line: list[tuple[float, float]] = []
    previous: dict[str, Any] | None = None
    for row in rows:
        limit, used, held = (
            _dec(row.get("limit")),
            _dec(row.get("spent")),
            _dec(row.get("reserved")),
        )
        x = float(row["t"]) - t0
        if previous is not None and _new_run(previous, row):
            remaining.append(((float(previous["t"]) + float(row["t"])) / 2 - t0, _svg.GAP))
        if limit is not None and used is not None:
            remaining.append((x, float(limit - used - (held or 0))))
        if limit is not None:
            budget_line.append((x, float(limit)))  # a top-up raises it: drawn as it was
        previous = row
    if not remaining and data.summary is not None:
        budget = _dec(data.summary.get("budget_usd"))
        if budget is not None:
            remaining = [(x, float(budget) - y) for x, y in spent]
            budget_line = [(x, float(budget)) for x, _ in spent]
    series = [
        _svg.Series("budget", budget_line, _svg.PALETTE[1], step=True, dashed=True),
        _svg.Series("spent", spent, _svg.PALETTE[0], step=True),
        _svg.Series("budget left (after reservations)", remaining, _svg.PALETTE[2]),
    ]
    return _svg.line_chart(
        "spend",
        "Spend against the budget (USD)",
        series,
        x_label="seconds since start",
        money=True,
    )


def _bins(start: float, end: float) -> tuple[float, int]:
    span = max(end - start, 1e-3)
    return span / _BINS, _BINS


def _tokens_chart(data: RunData) -> str:
    columns: list[tuple[float, float, float]] = []
    rows = data.rows(_BINS + 1, counted=True)
    if len(rows) >= 2:  # the whole run, from the timeline's running totals
        t0 = data.start
        for before, after in itertools.pairwise(rows):
            if _new_run(before, after):
                continue  # nothing ran between two runs: no column there
            dt = float(after["t"]) - float(before["t"])
            made = int(after.get("output_tokens") or 0) - int(before.get("output_tokens") or 0)
            if dt > 0 and made >= 0:  # (a resumed run's first line restarts nothing)
                columns.append((float(before["t"]) - t0, float(after["t"]) - t0, made / dt))
    if not any(height > 0 for _, _, height in columns) and data.completions:
        # Also when a run was shorter than the timeline's interval (no two counted
        # lines apart): bin its completions instead.
        t0 = data.start
        end = max(c.finished for c in data.completions) - t0
        width, count = _bins(0.0, end)
        tokens = [0] * count
        for c in data.completions:
            tokens[min(int((c.finished - t0) / width), count - 1)] += c.output_tokens
        columns = [(i * width, (i + 1) * width, n / width) for i, n in enumerate(tokens)]
    return _svg.column_chart(
        "tokens-per-second",
        "Output tokens per second",
        columns,
        x_label="seconds since start",
        color=_svg.PALETTE[4],
    )


def _whole_job(data: RunData) -> bool:
    """The outputs were read whole: the provider charts can cover every run of the job,
    as the header does (else the last run's summary, or what was read)."""
    return bool(data.completions) and not data.sampled


def _provider_outcomes(data: RunData) -> dict[str, dict[str, int]]:
    outcomes: dict[str, dict[str, int]] = defaultdict(dict)
    providers = (data.summary or {}).get("providers")
    if _whole_job(data) or not (isinstance(providers, dict) and providers):
        for c in data.completions:  # every answer the job kept, from its outputs
            outcomes[c.provider]["completed"] = outcomes[c.provider].get("completed", 0) + 1
    else:
        for name, p in providers.items():
            outcomes[name]["completed"] = int(p.get("requests") or 0)
    if isinstance(providers, dict):
        for name, p in providers.items():  # failures are counted per run only
            for kind, n in (p.get("failures_by_kind") or {}).items():
                outcomes[name][f"{kind} (last run)"] = int(n)
    return outcomes


def _requests_chart(data: RunData) -> str:
    outcomes = _provider_outcomes(data)
    kinds = sorted({k for o in outcomes.values() for k in o} - {"completed"})
    colors = {"completed": _svg.PALETTE[2]}
    for index, kind in enumerate(kinds):
        colors[kind] = _svg.PALETTE[(index + 1) % len(_svg.PALETTE)]
    bars = [
        _svg.Bar(
            name,
            [(k, float(o.get(k, 0)), colors[k]) for k in ("completed", *kinds)],
            note=", ".join(f"{o[k]:,} {k}" for k in ("completed", *kinds) if o.get(k)),
        )
        for name, o in sorted(outcomes.items(), key=lambda kv: -sum(kv[1].values()))
    ]
    which = "every run of the job" if _whole_job(data) else "the last run"
    return _svg.bar_chart(
        "requests-by-provider", f"Requests by provider and outcome ({which})", bars
    )


def _latency_chart(data: RunData) -> str:
    latencies = sorted(max(c.finished - c.started, 0.0) for c in data.completions)
    columns: list[tuple[float, float, float]] = []
    if latencies:
        top = latencies[min(len(latencies) - 1, math.ceil(len(latencies) * 0.999))]
        width = max(top, 1e-3) / _BINS
        counts = [0] * _BINS
        for value in latencies:
            counts[min(int(value / width), _BINS - 1)] += 1
        columns = [(i * width, (i + 1) * width, float(n)) for i, n in enumerate(counts)]
    p50 = latencies[len(latencies) // 2] if latencies else 0.0
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    which = f"the last {len(latencies):,} answers" if data.sampled else "completed requests"
    return _svg.column_chart(
        "latency",
        f"Latency of {which} (p50 {_seconds(p50)}, p99 {_seconds(p99)})",
        columns,
        x_label="seconds per request",
        color=_svg.PALETTE[5],
    )


def _cost_chart(data: RunData) -> str:
    cost: dict[str, Decimal] = defaultdict(Decimal)
    tokens: dict[str, int] = defaultdict(int)
    providers = (data.summary or {}).get("providers")
    if _whole_job(data) or not (isinstance(providers, dict) and providers):
        for c in data.completions:  # every run's answers, exact
            cost[c.provider] += c.cost
            tokens[c.provider] += c.output_tokens
    else:
        for name, p in providers.items():
            cost[name] += _dec(p.get("cost")) or Decimal(0)
            tokens[name] += int(p.get("output_tokens") or 0)
    bars = []
    for name in sorted(cost, key=lambda n: -tokens[n]):
        if tokens[name]:
            per = cost[name] * _MILLION / tokens[name]
            bars.append(
                _svg.Bar(
                    name,
                    [("USD per million output tokens", float(per), _svg.PALETTE[3])],
                    note=f"${per:.4f} /M ({tokens[name]:,} tokens)",
                )
            )
    which = "every run of the job" if _whole_job(data) else "the last run"
    return _svg.bar_chart(
        "cost-per-million", f"Cost per million output tokens, by provider ({which})", bars
    )


def _retries_chart(data: RunData) -> str:
    t0 = data.start
    retries: list[tuple[float, float]] = []
    limited: list[tuple[float, float]] = []
    previous: dict[str, Any] | None = None
    for row in data.rows():
        if previous is not None and _new_run(previous, row):
            gap = (float(previous["t"]) + float(row["t"])) / 2 - t0
            retries.append((gap, _svg.GAP))
            limited.append((gap, _svg.GAP))
        elif previous is not None and row["t"] > previous["t"]:
            x = float(row["t"]) - t0
            for key, points in (("retries", retries), ("rate_limited", limited)):
                delta = int(row.get(key) or 0) - int(previous.get(key) or 0)
                points.append((x, float(max(delta, 0))))
        previous = row
    if not any(y > 0 for _, y in retries + limited):  # (NaN > 0 is False)
        retries, limited = [], []  # a flat zero line says less than these words
    return _svg.line_chart(
        "retries-429s",
        "Retries and 429s (per interval)",
        [
            _svg.Series("retries", retries, _svg.PALETTE[3]),
            _svg.Series("429 rate limited", limited, _svg.PALETTE[1]),
        ],
        x_label="seconds since start",
        integer=True,
        empty="no retries and no 429s: every request was answered at its first attempt",
    )


def _projection_chart(data: RunData) -> str:
    t0 = data.start
    rows = data.rows()
    projected = _gapped(rows, t0, "projected")
    spent = _gapped(rows, t0, "spent")
    actual: list[tuple[float, float]] = []
    final = _dec((data.summary or {}).get("spent_usd"))
    if final is not None and spent:
        actual = [(spent[0][0], float(final)), (spent[-1][0], float(final))]
    return _svg.line_chart(
        "projection",
        "Projected cost of the plan against the actual (USD)",
        [
            _svg.Series(
                "projected (spent + to finish at observed rates)", projected, _svg.PALETTE[4]
            ),
            _svg.Series("spent so far", spent, _svg.PALETTE[0]),
            _svg.Series("actual at the end", actual, _svg.PALETTE[1], dashed=True),
        ],
        x_label="seconds since start",
        money=True,
    )


# --- the page ------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px;
       color: #111827; background: #f9fafb; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.meta { color: #4b5563; margin: 0 0 16px; }
.grid2 { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px;
         align-items: start; }
svg.chart { width: 100%; height: auto; display: block; }
figure { margin: 0; background: #fff; border: 1px solid #e5e7eb; border-radius: 6px; padding: 8px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #e5e7eb; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.chart-title { font-size: 14px; font-weight: 600; fill: #111827; }
.tick, .legend, .label { font-size: 11px; fill: #374151; }
.empty { font-size: 13px; fill: #9ca3af; }
.grid { stroke: #f3f4f6; } .axis { stroke: #9ca3af; }
.reason { font-weight: 600; }
.problem { color: #b91c1c; }
"""


def _dataset_table(data: RunData) -> str:
    datasets = (data.summary or {}).get("datasets")
    if not isinstance(datasets, dict) and data.timeline:
        datasets = data.timeline[-1].get("datasets")
    if not isinstance(datasets, dict) or not datasets:
        return ""
    rows = []
    for name, d in datasets.items():
        target = d.get("target_output_tokens", d.get("target"))
        prompts = d.get("prompts", d.get("total"))
        done = f"{int(d.get('completed') or 0):,}" + ("" if prompts is None else f" / {prompts:,}")
        cut = _int(d.get("truncated"))
        cut_cost = d.get("truncated_cost_usd", d.get("truncated_cost"))
        rows.append(
            "<tr>"
            f"<td>{escape(name)}</td>"
            f"<td>{done}</td>"
            f"<td>{int(d.get('output_tokens') or 0):,}</td>"
            f"<td>{'-' if target is None else f'{target:,}'}</td>"
            f"<td>{escape(_money_text(d.get('cost') or '0'))}</td>"
            f'<td data-cell="truncated">'
            f"{cut:,}{f' ({escape(_money_text(cut_cost))})' if cut else ''}</td>"
            "</tr>"
        )
    return (
        "<h2>Datasets</h2><table><tr><th>dataset</th><th>done</th><th>output tokens</th>"
        "<th>target</th><th>cost</th><th>cut at max_tokens</th></tr>"
        + "".join(rows)
        + "</table>"
        + _truncation_note(datasets)
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _truncation_note(datasets: Mapping[str, Any]) -> str:
    """The sentence every view says about answers cut at ``max_tokens`` (none: "")."""
    answers = cut = 0
    cost = cut_cost = Decimal(0)
    for d in datasets.values():
        if isinstance(d, Mapping):
            answers += _int(d.get("completed"))
            cut += _int(d.get("truncated"))
            cost += _dec(d.get("cost")) or Decimal(0)
            cut_cost += _dec(d.get("truncated_cost_usd", d.get("truncated_cost"))) or Decimal(0)
    line = truncation_line(answers, cut, cost, cut_cost)
    return f'<p class="meta" data-note="truncated">{escape(line)}.</p>' if line else ""


def _headline(data: RunData) -> str:
    summary = data.summary
    if summary is None:
        last = data.timeline[-1] if data.timeline else {}
        return (
            f'<p class="meta"><span class="reason">in progress</span> (or stopped without '
            f"a summary) — spent "
            f"{escape(_money_text(last.get('spent') or '0'))} "
            f"of {escape(_money_text(last.get('limit')))}, "
            f"reserved {escape(_money_text(last.get('reserved') or '0'))}, "
            f"in flight {int(last.get('in_flight') or 0):,}, "
            f"waiting for budget {int(last.get('waiting_for_budget') or 0):,}, "
            f"{int(last.get('completed') or 0):,} completed, "
            f"{int(last.get('output_tokens') or 0):,} output tokens, to finish: "
            f"{escape(finish_words(_dec(last.get('to_finish')), None))}</p>"
        )
    tokens = sum(int(d.get("output_tokens") or 0) for d in summary.get("datasets", {}).values())
    to_finish = finish_words(
        _dec(summary.get("to_finish_usd")), _dec(summary.get("budget_to_finish_usd"))
    )
    saved = _dec(summary.get("cache_saved_usd"))
    cached = (
        f", prompt caching saved {escape(_money_text(summary.get('cache_saved_usd')))}"
        if saved is not None and saved > 0
        else ""
    )
    return (
        f'<p class="meta"><span class="reason">{escape(str(summary.get("reason")))}</span> — '
        f"spent {escape(_money_text(summary.get('spent_usd')))} "
        f"of {escape(_money_text(summary.get('budget_usd')))}{cached}, "
        f"reserved {escape(_money_text(summary.get('reserved_usd') or '0'))}, "
        f"in flight {int(summary.get('in_flight') or 0):,}, "
        f"waiting for budget {int(summary.get('waiting_for_budget') or 0):,}, "
        f"{tokens:,} output tokens, to finish: {escape(to_finish)}, "
        f"last run {float(summary.get('wall_time_s') or 0):,.1f} s"
        f"{'' if not summary.get('message') else ' — ' + escape(str(summary['message']))}</p>"
    )


def _floor_section(data: RunData) -> str:
    """The price paid against the floor, and where requests waited for an endpoint."""
    summary = data.summary or {}
    lanes = summary.get("admission")
    sentence = floor_sentence(summary.get("price_vs_floor"), lanes)
    if sentence is None:
        return ""
    rows = []
    for tag, lane in (lanes or {}).items():
        capacity = lane.get("capacity_estimate")
        rows.append(
            "<tr>"
            f"<td>{escape(str(tag))}</td>"
            f"<td>{escape(str(lane.get('provider', '')))}</td>"
            f"<td>{escape(str(lane.get('premium', '')))}</td>"
            f"<td>{int(lane.get('served') or 0):,}</td>"
            f"<td>{int(lane.get('waited_requests') or 0):,}</td>"
            f"<td>{float(lane.get('wait_s_mean') or 0):.2f} / "
            f"{float(lane.get('wait_s_p95') or 0):g} / "
            f"{float(lane.get('wait_s_max') or 0):.2f}</td>"
            f"<td>{int(lane.get('refused') or 0):,}</td>"
            f"<td>{'-' if capacity is None else escape(str(capacity))}</td>"
            f"<td>{float(lane.get('cooldown_s') or 0):.1f}</td>"
            "</tr>"
        )
    table = (
        "<h2>Where requests waited</h2><table><tr><th>endpoint</th><th>provider</th>"
        "<th>premium over the floor</th><th>served</th><th>waited</th>"
        "<th>wait s: mean / p95 bound / max</th><th>refused (429)</th>"
        "<th>capacity learned</th><th>rested s</th></tr>" + "".join(rows) + "</table>"
        if rows
        else ""
    )
    return f'<p class="meta">{escape(sentence)}</p>{table}'


def render_report(data: RunData) -> str:
    """The report page for ``data`` (a complete HTML document)."""
    charts = [
        _spend_chart(data),
        _tokens_chart(data),
        _requests_chart(data),
        _latency_chart(data),
        _cost_chart(data),
        _retries_chart(data),
        _projection_chart(data),
    ]
    figures = "\n".join(f"<figure>{chart}</figure>" for chart in charts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>provider-router run: {escape(data.directory.name)}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>Run report: {escape(str(data.directory))}</h1>"
        f"{_headline(data)}"
        f"{_floor_section(data)}"
        f'<div class="grid2">{figures}</div>'
        f"{_dataset_table(data)}"
        f"{router_section(data.summary, data.completions)}"
        f"{'' if data.batches is None else batch_table(data.batches, data.read_at)}"
        f"{'' if data.drift is None else drift_section(data.drift)}"
        "</body></html>\n"
    )


def write_report(directory: str | Path) -> Path:
    """Build ``DIR/report.html`` from what the run left there (atomically replaced)."""
    directory = Path(directory)
    page = render_report(load_run(directory))
    path = JobLayout(directory).report
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path


class ReportObserver(RunObserver):
    """Writes ``report.html`` once the run's ``summary.json`` is; a failure costs the
    page (logged), never the run."""

    async def on_end(self, run: ObservedRun, summary: RunSummary) -> None:
        try:
            write_report(run.out)
        except Exception as exc:
            log.warning("batch.report_failed", error=repr(exc))
