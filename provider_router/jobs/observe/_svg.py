"""Tiny inline-SVG charts for the run report: lines over time, bars, histograms.

No JavaScript, no fonts to fetch, no CDN: each chart is one ``<svg class="chart"
data-chart="NAME">`` whose drawing sits in ``<g class="plot">`` (what the browser
test measures), with its axes, ticks and legend. Coordinates are floats (only the
drawing is approximate: labels show the exact figures given).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Final

__all__ = ["PALETTE", "Bar", "Series", "bar_chart", "column_chart", "line_chart", "number"]

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
_W, _H = 640, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 52


@dataclass(frozen=True, slots=True)
class Series:
    """A line: ``points`` are (x, y); ``step`` draws a staircase (a running total).

    A point whose y is NaN is a gap: the line stops there and starts again after it
    (time when nothing ran, between two runs of a job)."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str
    step: bool = False
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar of a horizontal bar chart: stacked segments of (name, value, color)."""

    label: str
    segments: Sequence[tuple[str, float, str]]
    note: str = ""


def number(value: float) -> str:
    """A tick label: whole numbers with separators, small ones to two significant digits."""
    if float(value).is_integer() or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _nice_ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if integer:  # counts: never two ticks that print the same whole number
        step = max(1.0, math.ceil(step))
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _open(name: str, title: str, height: int = _H) -> list[str]:
    return [
        f'<svg class="chart" data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" role="img">',
        f"<title>{escape(title)}</title>",
        f'<text x="{_LEFT}" y="18" class="chart-title">{escape(title)}</text>',
    ]


GAP: Final = math.nan
"""The y of a :class:`Series` point that breaks its line."""


def money_ticks(ticks: Sequence[float]) -> Callable[[float], str]:
    """USD tick labels with one number of decimals per axis: ``$0.75`` beside ``$1.00``
    (cents at least; more only when the ticks' step needs them: ``$0.025``; whole
    dollars for a whole-dollar step)."""
    steps = [b - a for a, b in itertools.pairwise(ticks) if b > a]
    step = min(steps, default=1.0)
    # The fewest decimals (two at least) that print every multiple of the step exactly.
    places = next((p for p in range(2, 9) if abs(round(step, p) - step) <= step * 1e-9), 8)
    if step >= 1 and float(step).is_integer():
        places = 0  # $50, $100: whole dollars, all alike

    def label(value: float) -> str:
        return f"${value:,.{places}f}"

    return label


def _empty(parts: list[str], height: int = _H, message: str = "no data") -> str:
    parts.append(
        f'<text x="{_W / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
        f"{escape(message)}</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(parts: list[str], entries: Sequence[tuple[str, str]], y: float) -> None:
    x = _LEFT
    for name, color in entries:
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14}" y="{y}" class="legend">{escape(name)}</text>')
        x += 24 + 7 * len(name)


def line_chart(
    name: str,
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_format: Callable[[float], str] = lambda v: f"{v:,.0f}",
    x_format: Callable[[float], str] = number,
    integer: bool = False,
    money: bool = False,
    empty: str = "no data",
) -> str:
    """Lines over a shared x axis (time), with a zero-based y axis (``integer``: counts;
    ``money``: USD ticks with one number of decimals, :func:`money_ticks`)."""
    parts = _open(name, title)
    drawn = [s for s in series if any(not math.isnan(y) for _, y in s.points)]
    if not drawn:
        return _empty(parts, message=empty)
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points if not math.isnan(y)]
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x1 = x0 + 1
    y0, y1 = min(0.0, min(ys)), max(ys)
    if y1 <= y0:
        y1 = y0 + 1
    y1 *= 1.05
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return _TOP + plot_h - (y - y0) / (y1 - y0) * plot_h

    if money:
        y_format = money_ticks(_nice_ticks(y0, y1, integer=integer))
    _axes(parts, x0, x1, y0, y1, px, py, x_label, x_format, y_format, integer)
    parts.append('<g class="plot">')
    for s in drawn:
        for piece in _pieces(sorted(s.points)):
            coords: list[str] = []
            previous: float | None = None
            for x, y in piece:
                if s.step and previous is not None:
                    coords.append(f"{px(x):.1f},{py(previous):.1f}")
                coords.append(f"{px(x):.1f},{py(y):.1f}")
                previous = y
            if len(coords) == 1:  # one point: a dot, so it still shows
                cx, cy = coords[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{s.color}"/>')
                continue
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            parts.append(
                f'<polyline fill="none" stroke="{s.color}" stroke-width="2"{dash} '
                f'points="{" ".join(coords)}"/>'
            )
    parts.append("</g>")
    _legend(parts, [(s.name, s.color) for s in drawn], _H - 6)
    parts.append("</svg>")
    return "\n".join(parts)


def _pieces(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """``points`` cut at each :data:`GAP` (a NaN y), empty pieces dropped."""
    pieces: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if math.isnan(y):
            pieces.append([])
        else:
            pieces[-1].append((x, y))
    return [piece for piece in pieces if piece]


def _axes(
    parts: list[str],
    x0: float,
    x1: float,
    y0: float,
    y1: float,
    px: Callable[[float], float],
    py: Callable[[float], float],
    x_label: str,
    x_format: Callable[[float], str],
    y_format: Callable[[float], str],
    integer: bool = False,
) -> None:
    bottom = py(y0)
    parts.append('<g class="axes">')
    for tick in _nice_ticks(y0, y1, integer=integer):
        y = py(tick)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{escape(y_format(tick))}</text>"
        )
    for tick in _nice_ticks(x0, x1, 6):
        x = px(tick)
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 14:.1f}" text-anchor="middle" class="tick">'
            f"{escape(x_format(tick))}</text>"
        )
    parts.append(
        f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{bottom:.1f}" y2="{bottom:.1f}" class="axis"/>'
    )
    parts.append(
        f'<text x="{_W - _RIGHT}" y="{bottom + 28:.1f}" text-anchor="end" class="tick">'
        f"{escape(x_label)}</text>"
    )
    parts.append("</g>")


def column_chart(
    name: str,
    title: str,
    columns: Sequence[tuple[float, float, float]],
    *,
    x_label: str,
    color: str = PALETTE[0],
    y_format: Callable[[float], str] = lambda v: f"{v:,.0f}",
    x_format: Callable[[float], str] = number,
) -> str:
    """Vertical bars over a numeric axis: ``columns`` are (from, to, height) (a histogram)."""
    parts = _open(name, title)
    if not columns or not any(h > 0 for _, _, h in columns):
        return _empty(parts)
    x0, x1 = min(c[0] for c in columns), max(c[1] for c in columns)
    if x1 <= x0:
        x1 = x0 + 1
    y0, y1 = 0.0, max(h for _, _, h in columns) * 1.05
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return _TOP + plot_h - (y - y0) / (y1 - y0) * plot_h

    _axes(parts, x0, x1, y0, y1, px, py, x_label, x_format, y_format, integer=True)
    parts.append('<g class="plot">')
    for start, end, height in columns:
        if height <= 0:
            continue
        left, right = px(start), px(end)
        top = py(height)
        parts.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left - 1, 1):.1f}" '
            f'height="{max(py(0) - top, 0.5):.1f}" fill="{color}"/>'
        )
    parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(
    name: str,
    title: str,
    bars: Sequence[Bar],
    *,
    value_format: Callable[[float], str] = lambda v: f"{v:,.0f}",
) -> str:
    """Horizontal bars, one per label, each a stack of segments; a legend of segment names."""
    row = 26
    height = _TOP + row * max(len(bars), 1) + 36
    parts = _open(name, title, height)
    totals = [sum(v for _, v, _ in bar.segments) for bar in bars]
    if not bars or not any(t > 0 for t in totals):
        return _empty(parts, height)
    label_w = 150
    notes = [bar.note or value_format(total) for bar, total in zip(bars, totals, strict=True)]
    plot_w = max(_W - label_w - _RIGHT - 10 - 6.5 * max(len(n) for n in notes), 120)
    top_total = max(totals)
    parts.append('<g class="plot">')
    legend: dict[str, str] = {}
    for index, (bar, note) in enumerate(zip(bars, notes, strict=True)):
        y = _TOP + index * row
        x = float(label_w)
        for segment, value, color in bar.segments:
            if value <= 0:
                continue
            width = value / top_total * plot_w
            parts.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{max(width, 1):.1f}" height="{row - 8}" '
                f'fill="{color}"><title>{escape(f"{bar.label}: {segment} {value_format(value)}")}'
                "</title></rect>"
            )
            legend.setdefault(segment, color)
            x += width
        parts.append(
            f'<text x="{x + 6:.1f}" y="{y + row / 2 + 4}" class="tick">{escape(note)}</text>'
        )
    parts.append("</g>")
    for index, bar in enumerate(bars):
        y = _TOP + index * row
        parts.append(
            f'<text x="{label_w - 8}" y="{y + row / 2 + 4}" text-anchor="end" class="label">'
            f"{escape(bar.label)}</text>"
        )
    if len(legend) > 1:
        _legend(parts, list(legend.items()), height - 8)
    parts.append("</svg>")
    return "\n".join(parts)
