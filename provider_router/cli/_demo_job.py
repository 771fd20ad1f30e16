"""Steps 2 to 5 of ``provider-router demo``: project, then run the reference job.

A scaled-down version of the reference scenario: six datasets (B3 … B8) of
synthetic prompts, each with an output-token target, Kimi K2.5 under
``exclude_below="int4"``. The local OpenRouter runs in-process with simulated
time (a minute of generation takes a few milliseconds) and a credit balance
that covers about half the plan, so the run stops when the credits run out;
the demo tops the balance up and runs the same plan again, which resumes and
completes without redoing or losing anything. The job directory stays (``runs/demo``
unless ``--out`` says otherwise) with its report, to be opened afterwards; the next
demo replaces it, and any other non-empty directory is refused.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Final, TextIO, cast

from rich.console import Console

from provider_router._exceptions import ConfigurationError
from provider_router._format import format_usd
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli._errors import UsageError
from provider_router.cli._exit_codes import exit_code
from provider_router.cli._logging import report_events
from provider_router.cli._project_render import render_projection
from provider_router.jobs.observe.live import show_progress
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.observe.summary_view import render_summary
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._journal_file import lock_directory, unlock
from provider_router.jobs.store._layout import REPORT_FILE
from provider_router.jobs.summary import RunSummary, StopReason
from provider_router.planning.plan import Plan
from provider_router.planning.projection import project
from provider_router.planning.workload import WorkloadEstimate
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

__all__ = [
    "DEMO_DATASETS",
    "DEMO_MARKER",
    "DEMO_OUT",
    "DEMO_SPEED",
    "demo_plan",
    "prepare_directory",
    "run_reference_job",
]

DEMO_OUT: Final = Path("runs/demo")
"""Where the demo leaves its job, relative to where it runs (``make demo``: the clone)."""
DEMO_MARKER: Final = ".provider-router-demo"
"""The file that marks a directory as a demo's: the next demo may replace it."""
_PROMPTS_DIR: Final = "prompts"
DEMO_DATASETS: Final = ("B3", "B4", "B5", "B6", "B7", "B8")
_PROMPTS_PER_DATASET: Final = 120
_TARGET_OUTPUT_TOKENS: Final = 30_000
_MAX_TOKENS: Final = 2048
_CONCURRENCY: Final = 64
_BUDGET: Final = Decimal(5)
DEMO_SPEED: Final = 1500.0
"""Simulated time runs this much faster: a minute of generation takes 40 ms."""
_SOURCES: Final = ("magicoder", "opencodeinstruct")


def _write_prompts(directory: Path) -> list[Path]:
    paths = []
    for index, name in enumerate(DEMO_DATASETS):
        path = directory / f"{name.lower()}.jsonl"
        with path.open("w") as fh:
            for n in range(_PROMPTS_PER_DATASET):
                line = {
                    "id": f"{name.lower()}-{n:04d}",
                    "prompt": f"Write a Python function for task {n} of set {name}, with tests.",
                    "source": _SOURCES[index % len(_SOURCES)],
                }
                fh.write(json.dumps(line) + "\n")
        paths.append(path)
    return paths


def prepare_directory(out: Path) -> None:
    """Make ``out`` an empty demo directory: new, empty, or a previous demo's.

    Raises:
        UsageError: ``out`` is a file, holds something that is not a demo's, or
            another demo is running in it.
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give the demo a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / DEMO_MARKER).is_file():
            raise UsageError(
                f"--out {out} is not empty and not a previous demo's directory: "
                "give the demo a new or empty one"
            )
        # Held while emptying it, so a demo still running there is not pulled from
        # under its feet; the directory itself stays (the lock is on it).
        try:
            fd = lock_directory(out)
        except ConfigurationError:
            raise UsageError(f"another demo is running in {out}: wait for it") from None
        try:
            for child in out.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        finally:
            unlock(fd)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text(
        "Written by `provider-router demo`: the next demo replaces this directory.\n"
    )


def demo_plan(directory: Path) -> Plan:
    """The scaled-down reference plan over prompt files written into ``directory``."""
    paths = _write_prompts(directory)
    return Plan.model_validate(
        {
            "model": "moonshotai/kimi-k2.5",
            "budget": _BUDGET,
            "concurrency": _CONCURRENCY,
            "policy": {"exclude_below": "int4"},
            "generation": {"max_tokens": _MAX_TOKENS},
            "datasets": [
                {"name": name, "input": str(path), "target_output_tokens": _TARGET_OUTPUT_TOKENS}
                for name, path in zip(DEMO_DATASETS, paths, strict=True)
            ],
        }
    )


def _projected_cost(console: Console, plan: Plan, market: ModelEndpoints) -> Decimal:
    """Step 2: the projection of the plan on the market the run will use."""
    console.rule("2. What the plan will cost")
    workload = WorkloadEstimate(
        prompt_tokens=Decimal(20), completion_tokens=Decimal(400), source="demo guess"
    )
    projection = project(plan, market, None, workload)
    render_projection(projection, file=cast(TextIO, console.file))
    return projection.total.cost().expected


async def _run(
    console: Console, sim: SimulatorServer, plan: Plan, out: Path, credits: Decimal
) -> list[RunSummary]:
    summaries = []
    for attempt in (1, 2):
        runner = JobRunner(
            plan, out, base_url=sim.url, api_key=DEFAULT_TEST_KEY, observers=standard_observers()
        )
        display = asyncio.ensure_future(show_progress(runner, console, "auto", interval=1.0))
        try:
            summary = await runner.run()
        finally:
            display.cancel()
            await asyncio.gather(display, return_exceptions=True)
        summaries.append(summary)
        render_summary(summary, console)
        report_events()  # this run's events, counted by kind, under its own tables
        if summary.reason is not StopReason.CREDITS or attempt == 2:
            break
        top_up = (summary.to_finish or credits) * 2
        console.rule(f"4. Top up ${top_up:.2f} and run the same plan again: it resumes")
        sim.top_up(top_up)
    return summaries


async def run_reference_job(
    console: Console, sim: SimulatorServer, market: ModelEndpoints, out: Path
) -> int:
    """Steps 2–5 on the running local OpenRouter ``sim``, whose listing is ``market``.

    Projects the plan, sets the credits to about half of it, runs out of credits,
    tops up, resumes to completion and summarises. The job (and its prompts, in
    ``out/prompts``) stays in ``out``, made ready by :func:`prepare_directory`.
    """
    prompts = out / _PROMPTS_DIR
    prompts.mkdir(exist_ok=True)
    plan = demo_plan(prompts.resolve())
    projected = _projected_cost(console, plan, market)
    credits = (projected / 2).quantize(Decimal("0.01"))
    sim.set_balance(credits)
    console.rule(
        f"3. Run {len(plan.datasets)} datasets on the local OpenRouter with ${credits} of "
        "credits (about half the plan)"
    )
    summaries = await _run(console, sim, plan, out, credits)
    final = summaries[-1]
    console.rule("5. Done")
    stops = " → ".join(s.reason.value for s in summaries)
    console.print(
        f"Runs: {stops}. Spent {format_usd(final.spent)} in total "
        f"(projected {format_usd(projected)})."
    )
    _show_where(console, out)
    return 0 if final.reason is StopReason.COMPLETE else exit_code(final.reason)


def _show_where(console: Console, out: Path) -> None:
    """Where the job is and how to look at it: paths whole, never wrapped or cut."""
    report = (out / REPORT_FILE).resolve()
    lines = [
        f"The demo's job stays in {out}/: the outputs {DEMO_DATASETS[0]}.jsonl … "
        f"{DEMO_DATASETS[-1]}.jsonl, summary.json, its ledger (the next demo replaces it; "
        "`provider-router demo --out DIR` keeps one elsewhere).",
        "Open its report in a browser (xdg-open on Linux, open on macOS):",
        f"  {report.as_uri()}",
        f"Look at it again: provider-router status {out} · "
        f"provider-router export {out} --to train.jsonl",
    ]
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
