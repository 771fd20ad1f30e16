"""The run report and status: what a run leaves to look at, read as a person would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest
from _job_helpers import write_prompts

from provider_router import ConfigurationError
from provider_router.cli import main
from provider_router.jobs.observe.report import CHARTS, load_run, write_report
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.observe.timeline import read_timeline
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._journal_file import lock_directory, unlock
from provider_router.jobs.store._layout import REPORT_FILE, TIMELINE_FILE
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"
DRAWN = {"rect", "polyline", "circle", "path", "line"}


class Charts(HTMLParser):
    """Each ``<svg class="chart">``: its name and the drawing elements in its plot group."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, int] = {}
        self.scripts = 0
        self.external: list[str] = []
        self._chart: str | None = None
        self._plot_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for name in ("src", "href"):
            if a.get(name):
                self.external.append(str(a[name]))
        if tag == "svg" and a.get("class") == "chart":
            self._chart = str(a["data-chart"])
            self.charts[self._chart] = 0
        elif tag == "g" and a.get("class") == "plot":
            self._plot_depth = 1
        elif self._plot_depth and tag == "g":
            self._plot_depth += 1
        elif self._plot_depth and tag in DRAWN and self._chart is not None:
            self.charts[self._chart] += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "g" and self._plot_depth:
            self._plot_depth -= 1
        elif tag == "svg":
            self._chart = None


def parse(path: Path) -> Charts:
    charts = Charts()
    charts.feed(path.read_text(encoding="utf-8"))
    return charts


async def run_cli(
    sim: SimulatorServer, out: Path, prompts: Path, *extra: str
) -> asyncio.subprocess.Process:
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_router",
        "run",
        str(prompts),
        "--out",
        str(out),
        "--model",
        MODEL,
        "--exclude-below",
        "int4",
        "--base-url",
        sim.url,
        "--progress",
        "off",
        *extra,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


async def test_a_budget_stop_at_2000_in_flight_leaves_a_report_with_every_chart(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    faults = [
        {"kind": "provider_error", "provider": "Chutes", "rate": 0.05, "no_fallback": True},
        {"kind": "rate_limit", "provider": "Chutes", "rate": 0.05, "no_fallback": True},
    ]
    sim = await openrouter_sim_factory(seed=11, faults=faults)
    prompts = write_prompts(tmp_path / "p.jsonl", 2500)
    out = tmp_path / "out"
    proc = await run_cli(
        sim, out, prompts, "--budget", "0.4", "--concurrency", "2000", "--max-tokens", "300"
    )
    _, stderr = await proc.communicate()
    assert proc.returncode == 3, stderr.decode()[-2000:]  # the budget stopped it
    report = out / REPORT_FILE
    charts = parse(report)
    assert list(charts.charts) == list(CHARTS)  # one <svg> per chart, in order
    empty = [name for name, drawn in charts.charts.items() if not drawn]
    assert not empty, f"charts without a drawing: {empty}"
    assert charts.scripts == 0  # opens offline: no script,
    assert charts.external == []  # nothing fetched
    page = report.read_text()
    assert "budget_exhausted" in page
    summary = json.loads((out / "summary.json").read_text())
    rows = list(read_timeline(out / TIMELINE_FILE))
    assert rows[0]["final"] is False
    assert rows[-1]["final"] is True
    assert Decimal(rows[-1]["spent"]) == Decimal(summary["spent_usd"])
    assert rows[-1]["rate_limited"] > 0  # the faults show up over time
    data = load_run(out)
    assert len(data.completions) == sum(d["completed"] for d in summary["datasets"].values())
    # Rebuilt by the command, the same charts.
    report.unlink()
    assert main(["report", str(out)]) == 0
    assert list(parse(report).charts) == list(CHARTS)


async def test_status_while_another_process_runs_then_finished(
    tmp_path: Path, openrouter_sim_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = await openrouter_sim_factory(seed=2, speed=40, completion_tokens=20)
    prompts = write_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "out"
    proc = await run_cli(
        sim, out, prompts, "--budget", "5", "--concurrency", "4", "--max-tokens", "50"
    )
    seen_running = False
    while proc.returncode is None:
        timeline = out / TIMELINE_FILE
        if timeline.exists() and not (out / "summary.json").exists():
            rows = list(read_timeline(timeline))
            if rows and rows[-1]["completed"] > 0:
                lines = status_lines(out, now=rows[-1]["t"] + 1)
                if "running" in lines[0]:
                    seen_running = True
                    assert lines[0].endswith("running (last update 1 s ago)")
                    assert any(line.startswith("  p: ") for line in lines)
                    break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.02)
    assert seen_running, "the run ended before status saw it"
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "finished: complete (exit code 0)" in text
    # The datasets as a table: dataset, done, output tokens, cost.
    assert re.search(r"^p +120/120 +2,400 +\$", text, re.MULTILINE), text


def test_status_and_report_of_a_directory_without_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigurationError, match="no run here"):
        status_lines(tmp_path, now=0)
    assert main(["status", str(tmp_path / "missing")]) == 2  # a bad command
    assert "no such run directory" in capsys.readouterr().err


def test_a_report_of_a_run_in_progress_tolerates_a_torn_line(tmp_path: Path) -> None:
    row = {
        "t": 100.0,
        "elapsed": 1.0,
        "limit": "5",
        "spent": "0.5",
        "reserved": "0.1",
        "completed": 3,
        "output_tokens": 90,
        "retries": 1,
        "rate_limited": 0,
        "projected": "2.5",
        "datasets": {"a": {"completed": 3, "total": 10}},
        "final": False,
    }
    later = {**row, "t": 101.0, "spent": "0.75", "retries": 2}
    (tmp_path / TIMELINE_FILE).write_text(
        json.dumps(row) + "\n" + json.dumps(later) + '\n{"t": 102, "spent'
    )
    (tmp_path / "a.jsonl").write_text(
        json.dumps(
            {
                "id": "x",
                "provider": "Chutes",
                "cost": "0.25",
                "usage": {"completion_tokens": 30},
                "started_at": "1970-01-01T00:01:40Z",
                "finished_at": "1970-01-01T00:01:40.5Z",
            }
        )
        + "\n{torn"
    )
    page = write_report(tmp_path).read_text()
    assert "in progress" in page
    charts = parse(tmp_path / REPORT_FILE)
    assert charts.charts["spend"]
    assert charts.charts["latency"]
    fd = lock_directory(tmp_path)  # as the run's process holds it
    try:
        assert status_lines(tmp_path, now=105.0)[0].endswith("running (last update 4 s ago)")
        # Quiet for an hour, but its process holds the lock: running, not "killed".
        assert status_lines(tmp_path, now=101.0 + 3600)[0].endswith(
            "running (last update 60 min ago)"
        )
    finally:
        unlock(fd)
    # The lock is free: no process runs it, however fresh its last line.
    stopped = status_lines(tmp_path, now=101.5)[0]
    assert "stopped (killed?)" in stopped
    assert "(last update 0 s ago)" in stopped
    assert "run the same command again to resume" in stopped


def test_status_names_a_run_whose_pid_is_gone_stopped_while_the_lock_is_held(
    tmp_path: Path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    row = {"t": 100.0, "limit": "5", "spent": "1", "completed": 1, "final": False}
    row |= {"pid": gone.pid, "host": socket.gethostname()}
    (tmp_path / TIMELINE_FILE).write_text(json.dumps(row) + "\n")
    fd = lock_directory(tmp_path)  # held here, but not by the pid the timeline names
    try:
        assert "stopped (killed?)" in status_lines(tmp_path, now=101.0)[0]
        # Another machine's pid says nothing here: the lock decides.
        row["host"] = "elsewhere"
        (tmp_path / TIMELINE_FILE).write_text(json.dumps(row) + "\n")
        assert "running" in status_lines(tmp_path, now=101.0)[0]
    finally:
        unlock(fd)


async def test_status_calls_a_killed_run_stopped_seconds_after_its_kill(
    tmp_path: Path, openrouter_sim_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = await openrouter_sim_factory(seed=3, speed=5, completion_tokens=20)
    prompts = write_prompts(tmp_path / "p.jsonl", 400)
    out = tmp_path / "out"
    proc = await run_cli(sim, out, prompts, "--budget", "5", "--concurrency", "2")
    while not any(r["completed"] for r in read_timeline(out / TIMELINE_FILE)):
        assert proc.returncode is None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.02)
    assert "running" in status_lines(out, now=time.time())[0]
    proc.kill()
    await proc.wait()
    assert main(["status", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "stopped (killed?)" in first, first


async def test_the_report_in_a_real_browser_loads_cleanly_and_every_chart_draws(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    """Looked at as a person would: headless Chromium, console errors, drawn charts."""
    from _browser import chromium_binary, view_page

    chromium_binary()  # skip early (before spending) where there is no browser
    sim = await openrouter_sim_factory(
        seed=4,
        faults=[{"kind": "rate_limit", "provider": "Chutes", "rate": 0.05, "no_fallback": True}],
    )
    prompts = write_prompts(tmp_path / "p.jsonl", 300)
    plan = Plan.model_validate(
        {
            "model": MODEL,
            "budget": "5",
            "concurrency": 64,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 400},
            "datasets": [{"name": "p", "input": str(prompts), "target_output_tokens": 40_000}],
        }
    )
    out = tmp_path / "out"
    await JobRunner(
        plan,
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        observers=standard_observers(timeline_interval=0.001),
    ).run()
    view = await view_page((out / REPORT_FILE).as_uri())
    # Kept for a person to look at (CI names a path to keep it).
    shot = Path(os.environ.get("PROVIDER_ROUTER_SCREENSHOT", tmp_path / "report.png"))
    await asyncio.to_thread(shot.write_bytes, view.screenshot)
    assert view.screenshot.startswith(b"\x89PNG")
    assert view.errors == []
    assert [c["name"] for c in view.charts] == list(CHARTS)
    for chart in view.charts:
        assert chart["shapes"] > 0, chart
        assert chart["width"] > 10, chart  # a non-empty drawing
        assert chart["height"] > 0, chart
        assert chart["shown"] > 300, chart  # laid out at a readable size


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_run_serves_prometheus_metrics_while_it_runs(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    sim = await openrouter_sim_factory(seed=3, speed=40, completion_tokens=20)
    prompts = write_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "out"
    port = _free_port()
    proc = await run_cli(
        sim,
        out,
        prompts,
        "--budget",
        "5",
        "--concurrency",
        "4",
        "--max-tokens",
        "50",
        "--metrics-port",
        str(port),
    )
    url = f"http://127.0.0.1:{port}/metrics"
    seen: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        while proc.returncode is None and seen.get("provider_router_requests_total", 0) == 0:
            try:
                async with session.get(url) as response:
                    text = await response.text()
            except aiohttp.ClientConnectionError:  # not listening yet
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.02)
                continue
            seen = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    seen[sample.name] = seen.get(sample.name, 0) + sample.value
    assert proc.returncode is None, "the run ended before a scrape saw a request"
    assert seen["provider_router_budget_limit_usd"] == 5
    assert seen["provider_router_limiter_window"] > 0
    assert "provider_router_request_latency_seconds_count" in seen
    assert "provider_router_output_tokens_total" in seen
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert f"Metrics: http://127.0.0.1:{port}/metrics" in stderr.decode()
    with socket.socket() as sock:  # the server went away with the run
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_a_long_run_is_read_in_bounded_time_and_drawn_in_bounded_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the outputs' tail is read; the timeline is thinned with its totals kept."""
    from provider_router.jobs.observe import report as report_module

    monkeypatch.setattr(report_module, "_TAIL_BYTES", 4096)
    record = {
        "id": "x",
        "provider": "Chutes",
        "cost": "0.001",
        "usage": {"completion_tokens": 30},
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z",
        "messages": [{"role": "user", "content": "q " * 20}],
    }
    with (tmp_path / "a.jsonl").open("w") as fh:
        for n in range(2000):
            fh.write(json.dumps({**record, "id": f"x{n}"}) + "\n")
    with (tmp_path / TIMELINE_FILE).open("w") as fh:
        for n in range(5000):
            row = {"t": 1_767_225_600 + n, "spent": str(n), "limit": "10000", "retries": n // 2}
            fh.write(json.dumps({**row, "output_tokens": 30 * n, "final": n == 4999}) + "\n")
    data = load_run(tmp_path)
    assert data.sampled
    assert 0 < len(data.completions) < 2000
    rows = data.rows()
    assert len(rows) <= 600
    assert rows[0]["t"] == 1_767_225_600
    assert rows[-1]["final"] is True
    page = write_report(tmp_path).read_text()
    assert f"Latency of the last {len(data.completions):,} answers" in page
    assert len(page) < 200_000
    charts = parse(tmp_path / REPORT_FILE)
    assert charts.charts["tokens-per-second"]
    assert charts.charts["retries-429s"]


def test_a_resumed_run_in_progress_is_not_shown_as_the_last_ones_summary(tmp_path: Path) -> None:
    """summary.json is the earlier run's while a resumed run goes on; its first line counts
    no tokens yet (it is written before the journal is read), which is no burst of tokens."""
    base = {"limit": "1", "spent": "0.1", "retries": 0, "rate_limited": 0}
    ds = {"a": {"completed": 5, "total": 10}}
    rows = [
        {**base, "t": 10.0, "output_tokens": 0, "datasets": ds, "final": False},
        {**base, "t": 11.0, "output_tokens": 500, "datasets": ds, "final": True},
        {**base, "t": 20.0, "output_tokens": 0, "datasets": {}, "final": False},  # resumed
        {**base, "t": 21.0, "output_tokens": 600, "datasets": ds, "final": False},
    ]
    (tmp_path / TIMELINE_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"reason": "budget_exhausted"}))
    data = load_run(tmp_path)
    assert data.summary is None
    assert [r["t"] for r in data.rows(counted=True)] == [10.0, 11.0, 21.0]
    page = write_report(tmp_path).read_text()
    assert "in progress" in page
    assert "budget_exhausted" not in page
