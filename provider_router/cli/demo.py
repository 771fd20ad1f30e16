"""``provider-router demo``: the whole job on the local OpenRouter, offline.

Starts the local OpenRouter in-process with its default Kimi K2.5 market, reads
the model's endpoints from it through a :class:`Catalog` (as a real run reads
OpenRouter's), judges every endpoint under ``ProviderPolicy(exclude_below="int4")``
and ranks the survivors for a typical dataset-generation request. Then, one
function per step: the projection of a scaled-down reference plan (six datasets),
and the run itself (simulated time) with a small credit balance: it stops when the
credits run out, the balance is topped up, and the same run resumes and completes,
exactly once. No network, no key; the job directory and its report stay, at the path
the demo prints.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Final

from rich.console import Console

from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli._demo_job import (
    DEMO_OUT,
    DEMO_SPEED,
    prepare_directory,
    run_reference_job,
)
from provider_router.cli._render import make_console
from provider_router.cli.endpoints import (
    DEFAULT_COMPLETION_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    build_report,
    render_report,
)
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

__all__ = ["DEMO_MODEL", "register", "run_demo"]

DEMO_MODEL: Final = "moonshotai/kimi-k2.5"


def show_endpoints(console: Console, market: ModelEndpoints) -> None:
    """Step 1: every endpoint, the int4 policy's verdict and the ranking."""
    console.rule("1. Endpoints of moonshotai/kimi-k2.5 under ProviderPolicy(exclude_below='int4')")
    workload = Workload(
        prompt_tokens=DEFAULT_PROMPT_TOKENS, completion_tokens=DEFAULT_COMPLETION_TOKENS
    )
    report = build_report(market, ProviderPolicy(exclude_below="int4"), workload)
    render_report(report, console)


def run_demo(console: Console, *, out: Path = DEMO_OUT, job: bool = True) -> int:
    """Run every demo step in order; returns the exit code.

    Args:
        console: where to print.
        out: the job directory of the simulated run: new, empty, or a previous
            demo's (replaced).
        job: also project and run the scaled-down reference job (steps 2 to 5).

    Raises:
        UsageError: ``out`` cannot be the demo's (see :func:`prepare_directory`).
    """
    if job:
        prepare_directory(out)
    return asyncio.run(_demo(console, out=out, job=job))


async def _demo(console: Console, *, out: Path, job: bool) -> int:
    # The credits are set once the projection says what the plan costs.
    async with SimulatorServer(speed=DEMO_SPEED, seed=7, api_keys=[DEFAULT_TEST_KEY]) as sim:
        async with Catalog(base_url=sim.url, api_key=DEFAULT_TEST_KEY) as catalog:
            market = await catalog.endpoints(DEMO_MODEL)
        console.print(
            f"Local OpenRouter at {sim.url}: the default Kimi K2.5 market "
            f"({len(market.endpoints)} endpoints), in-process; no network, no key"
        )
        show_endpoints(console, market)
        if not job:
            return 0
        return await run_reference_job(console, sim, market, out)


def _handle(args: argparse.Namespace) -> int:
    return run_demo(make_console(), out=args.out, job=not args.endpoints_only)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the whole job on a local OpenRouter: endpoints, projection, run, top-up, resume",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEMO_OUT,
        metavar="DIR",
        help="the demo's job directory, kept with its report; a previous demo's is replaced",
    )
    parser.add_argument(
        "--endpoints-only", action="store_true", help="only show the endpoint verdicts"
    )
    parser.set_defaults(handler=_handle)
