"""report.html of a job with two runs, as a person reads it: the time between the runs is
drawn as nothing, the budget is a line, money ticks read alike, the provider charts cover
the job as the header does, and a job without retries says so instead of an empty plot.
Looked at through headless Chromium as well."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

from provider_router.jobs.observe._svg import PALETTE
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.store._layout import REPORT_FILE, TIMELINE_FILE

GAP = (110.0, 140.0)  # run 1 ends at t=110, run 2 starts at t=140: 30 s when nothing ran


def _row(
    t: float, start: float, pid: int, spent: float, tokens: int, **extra: Any
) -> dict[str, Any]:
    return {
        "t": t,
        "elapsed": t - start,
        "limit": "1",
        "spent": f"{spent:.4f}",
        "reserved": "0.01",
        "completed": tokens // 100,
        "output_tokens": tokens,
        "retries": 0,
        "rate_limited": 0,
        "in_flight": 2,
        "waiting_for_budget": 0,
        "projected": f"{spent + 0.3:.4f}",
        "to_finish": "0.3",
        "datasets": {"a": {"completed": tokens // 100, "total": 100}},
        "pid": pid,
        "host": "h",
        "final": False,
        **extra,
    }


def _job(directory: Path) -> None:
    rows = [_row(100 + i, 100, 11, 0.049 * i, 1500 * i) for i in range(11)]
    rows[-1]["final"] = True
    rows += [_row(140 + i, 140, 22, 0.49 + 0.013 * i, 15_000 + 1500 * i) for i in range(11)]
    rows[-1]["final"] = True
    (directory / TIMELINE_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = []
    for i in range(20):  # ten answers in each run, from two providers
        t = 101 + i * 0.5 if i < 10 else 141 + (i - 10) * 0.5
        records.append(
            {
                "id": f"p{i}",
                "provider": "Chutes" if i % 2 else "DeepInfra",
                "cost": "0.031",
                "usage": {"completion_tokens": 1500},
                "started_at": t - 0.4,
                "finished_at": t,
            }
        )
    (directory / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        "reason": "complete",
        "exit_code": 0,
        "message": "",
        "budget_usd": "1",
        "spent_usd": "0.62",
        "reserved_usd": "0",
        "to_finish_usd": "0",
        "budget_to_finish_usd": "0.62",
        "in_flight": 0,
        "waiting_for_budget": 0,
        "wall_time_s": 10,
        "datasets": {"a": {"prompts": 100, "completed": 20, "output_tokens": 30_000}},
        # The last run's own counters: only half of the job's answers.
        "providers": {
            "Chutes": {"requests": 5, "output_tokens": 7500, "cost": "0.155"},
            "DeepInfra": {"requests": 5, "output_tokens": 7500, "cost": "0.155"},
        },
    }
    (directory / "summary.json").write_text(json.dumps(summary))


def _chart(page: str, name: str) -> str:
    match = re.search(rf'<svg class="chart" data-chart="{name}".*?</svg>', page, re.S)
    assert match is not None, name
    return match.group(0)


def test_the_time_between_two_runs_is_drawn_as_nothing(tmp_path: Path) -> None:
    _job(tmp_path)
    page = write_report(tmp_path).read_text()
    spend, projection = _chart(page, "spend"), _chart(page, "projection")
    spent_lines = re.findall(rf'<polyline[^>]*stroke="{PALETTE[0]}"', spend)
    assert len(spent_lines) == 2  # one line per run, nothing across the pause
    projected_lines = re.findall(rf'<polyline[^>]*stroke="{PALETTE[4]}"', projection)
    assert len(projected_lines) == 2
    tokens = _chart(page, "tokens-per-second")
    plot = tokens[tokens.index('<g class="plot">') :]
    widths = [float(w) for w in re.findall(r'<rect[^>]*width="([0-9.]+)"', plot)]
    starts = [float(x) for x in re.findall(r'<rect x="([0-9.]+)"', plot)]
    # The axis spans 0..50 s; the 30 s pause (11..39 s) holds no column, and no column is
    # as wide as the pause.
    width = float(re.findall(r'viewBox="0 0 ([0-9.]+)', tokens)[0])
    px_per_s = (width - 64 - 16) / 50
    assert widths
    assert max(widths) < 5 * px_per_s
    inside = [x for x in starts if 64 + 11 * px_per_s < x < 64 + 39 * px_per_s]
    assert inside == []


def test_the_budget_is_a_line_and_money_ticks_read_alike(tmp_path: Path) -> None:
    _job(tmp_path)
    page = write_report(tmp_path).read_text()
    for name in ("spend", "projection"):
        svg = _chart(page, name)
        ticks = re.findall(r'class="tick">\$([0-9.,]+)<', svg)
        assert len(ticks) >= 3, (name, ticks)
        decimals = {len(t.partition(".")[2]) for t in ticks}
        assert len(decimals) == 1, (name, ticks)  # never $0.750 beside $1.00
    spend = _chart(page, "spend")
    assert ">budget<" in spend
    assert re.search(rf'<polyline[^>]*stroke="{PALETTE[1]}"[^>]*stroke-dasharray', spend)


def test_the_provider_charts_cover_every_run_and_no_retries_is_said(tmp_path: Path) -> None:
    _job(tmp_path)
    page = write_report(tmp_path).read_text()
    requests = _chart(page, "requests-by-provider")
    assert "every run of the job" in requests
    assert ">10 completed<" in requests  # each provider: both runs' answers, not 5
    assert "every run of the job" in _chart(page, "cost-per-million")
    retries = _chart(page, "retries-429s")
    assert "no retries and no 429s" in retries
    assert "<polyline" not in retries


async def test_the_two_run_report_in_a_real_browser(tmp_path: Path) -> None:
    from _browser import chromium_binary, view_page

    chromium_binary()
    _job(tmp_path)
    write_report(tmp_path)
    view = await view_page((tmp_path / REPORT_FILE).as_uri())
    shot = Path(os.environ.get("PROVIDER_ROUTER_SCREENSHOT_GAPS", tmp_path / "report.png"))
    await asyncio.to_thread(shot.write_bytes, view.screenshot)
    assert view.screenshot.startswith(b"\x89PNG")
    assert view.errors == []
    drawn = {c["name"]: c["shapes"] for c in view.charts}
    assert drawn["retries-429s"] == 0  # said in words instead
    assert all(n > 0 for name, n in drawn.items() if name != "retries-429s"), drawn
