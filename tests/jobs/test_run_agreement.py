"""One run, five views: the live display, ``status``, ``report.html``, Prometheus and
``summary.json`` say the same spent, reserved, in flight, waiting for budget and to
finish, while requests wait for budget and after the budget stopped the run."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from decimal import Decimal
from html import unescape
from pathlib import Path

import pytest
from _job_helpers import write_prompts

from provider_router._format import format_usd
from provider_router.client.metrics import Metrics
from provider_router.jobs.finish import finish_words
from provider_router.jobs.observe.live import progress_lines
from provider_router.jobs.observe.report import write_report
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.status import status_lines
from provider_router.jobs.observe.timeline import TimelineWriter
from provider_router.jobs.runner import JobRunner
from provider_router.planning.plan import Plan
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

pytest.importorskip("prometheus_client")

Factory = Callable[..., Awaitable[SimulatorServer]]
MODEL = "moonshotai/kimi-k2.5"
FIELDS = ("spent", "reserved", "in_flight", "waiting", "to_finish")

_PATTERNS = {
    "spent": r"spent (\$\d+(?:,\d{3})*(?:\.\d+)?)",
    "reserved": r"reserved (\$\d+(?:,\d{3})*(?:\.\d+)?)",
    "in_flight": r"in flight (\d+(?:,\d{3})*)",
    "waiting": r"waiting for budget (\d+(?:,\d{3})*)",
    "to_finish": r"to finish:? (about \$[\d,.]+ more|nothing more|unknown)",
}


def _read(text: str, *, optional: tuple[str, ...] = ()) -> dict[str, str]:
    found = {}
    for name, pattern in _PATTERNS.items():
        match = re.search(pattern, text)
        if match is None and name in optional:
            found[name] = "0"
            continue
        assert match is not None, f"{name} is not shown in: {text}"
        found[name] = match.group(1)
    return found


def _write_line(runner: JobRunner, *, final: bool = False) -> None:
    """A timeline line now, as the run's writer writes one each second (Prometheus too)."""
    writer = TimelineWriter(runner)
    writer.write(final=final)
    writer.close()


def _display(runner: JobRunner) -> dict[str, str]:
    # The live header names waiting for budget only while some wait.
    return _read(progress_lines(runner.progress())[0], optional=("waiting",))


def _prometheus(metrics: Metrics) -> dict[str, str]:
    def value(name: str) -> float:
        sample = metrics.registry.get_sample_value(f"provider_router_{name}")
        assert sample is not None, name
        return sample

    def usd(name: str) -> str:
        return format_usd(Decimal(repr(value(name))))

    return {
        "spent": usd("spent_usd"),
        "reserved": usd("reserved_usd"),
        "in_flight": f"{int(value('in_flight')):,}",
        "waiting": f"{int(value('waiting_for_budget')):,}",
        "to_finish": finish_words(Decimal(repr(value("to_finish_usd"))), None),
    }


def _page(out: Path) -> dict[str, str]:
    page = write_report(out).read_text(encoding="utf-8")
    headline = re.search(r'<p class="meta">(.*?)</p>', page, re.S)
    assert headline is not None
    return _read(unescape(re.sub(r"<[^>]+>", "", headline.group(1))))


def _summary(out: Path) -> dict[str, str]:
    s = json.loads((out / "summary.json").read_text())
    return {
        "spent": format_usd(Decimal(s["spent_usd"])),
        "reserved": format_usd(Decimal(s["reserved_usd"])),
        "in_flight": f"{s['in_flight']:,}",
        "waiting": f"{s['waiting_for_budget']:,}",
        "to_finish": finish_words(Decimal(s["to_finish_usd"]), None),
    }


async def test_every_view_of_one_run_agrees_while_waiting_for_budget_and_at_its_stop(
    tmp_path: Path, openrouter_sim_factory: Factory
) -> None:
    sim = await openrouter_sim_factory(seed=5, speed=200, completion_tokens=200)
    prompts = write_prompts(tmp_path / "p.jsonl", 400)
    plan = Plan.model_validate(
        {
            "model": MODEL,
            "budget": "0.08",
            "concurrency": 40,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": 4000},  # a worst case that fills the budget fast
            "datasets": [{"name": "p", "input": str(prompts)}],
        }
    )
    out = tmp_path / "out"
    metrics = Metrics()
    runner = JobRunner(
        plan,
        out,
        base_url=sim.url,
        api_key=DEFAULT_TEST_KEY,
        router_options={"metrics": metrics},
        # This test writes the lines it reads.
        observers=standard_observers(timeline_interval=3600),
    )
    task = asyncio.ensure_future(runner.run())
    views: dict[str, dict[str, str]] = {}
    for _ in range(2000):
        await asyncio.sleep(0.005)
        assert not task.done(), "the run ended before requests waited for budget"
        if runner.ledger is None or runner.router is None:
            continue
        runner.ledger_state = await runner.ledger.snapshot()
        state = runner.ledger_state
        if not (state.waiting and state.settled):
            continue
        # From here to the last view nothing awaits: one instant, seen five ways.
        _write_line(runner)
        views = {
            "display": _display(runner),
            "status": _read("\n".join(status_lines(out, now=0))),
            "report": _page(out),
            "prometheus": _prometheus(metrics),
        }
        break
    assert views, "no request ever waited for budget"
    display = views["display"]
    assert int(display["waiting"]) > 0
    assert display["to_finish"].startswith("about $")
    for name, seen in views.items():
        assert seen == display, name
    summary = await task
    assert summary.reason.value == "budget_exhausted"
    _write_line(runner, final=True)  # the run's own final line, written again
    end = {
        "display": _display(runner),
        "summary.json": _summary(out),
        "status": _read("\n".join(status_lines(out, now=0))),
        "report": _page(out),
        "prometheus": _prometheus(metrics),
    }
    for name, seen in end.items():
        assert seen == end["summary.json"], name
    assert end["summary.json"]["in_flight"] == "0"
    assert end["summary.json"]["to_finish"].startswith("about $")
