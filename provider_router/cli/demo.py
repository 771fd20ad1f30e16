"""``provider-router demo``: the router's first decisions on a bundled market, offline.

Loads the Kimi K2.5 market snapshot shipped in ``provider_router/data``, judges
every endpoint under ``ProviderPolicy(exclude_below="int4")``, and ranks the
survivors for a typical dataset-generation request. No network, no key.
Later steps of the full job hang off :func:`run_demo` one function each:
the projection of a scaled-down reference plan (six datasets), and the run
itself on the local OpenRouter (in-process, simulated time) with a small credit
balance: it stops when the credits run out, the balance is topped up, and the
same run resumes and completes, exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
from importlib import resources
from pathlib import Path
from typing import Final

from rich.console import Console

from provider_router.catalog import Catalog
from provider_router.cli._demo_job import run_reference_job
from provider_router.cli._render import make_console
from provider_router.cli.endpoints import (
    DEFAULT_COMPLETION_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    build_report,
    render_report,
)
from provider_router.policy import ProviderPolicy
from provider_router.ranking import Workload
from provider_router.records import ModelEndpoints

__all__ = ["DEMO_MODEL", "bundled_snapshot", "load_demo_market", "register", "run_demo"]

DEMO_MODEL: Final = "moonshotai/kimi-k2.5"
_SNAPSHOT: Final = "kimi-k2.5.endpoints.json"


def bundled_snapshot() -> Path:
    """Path of the bundled Kimi K2.5 endpoints listing (OpenRouter's wire format)."""
    return Path(str(resources.files("provider_router") / "data" / _SNAPSHOT))


def load_demo_market() -> ModelEndpoints:
    """The bundled listing, parsed through an offline :class:`Catalog`."""
    return asyncio.run(Catalog.load_snapshot(bundled_snapshot()).endpoints(DEMO_MODEL))


def show_endpoints(console: Console, market: ModelEndpoints) -> None:
    """Step 1: every endpoint, the int4 policy's verdict and the ranking."""
    console.rule("1. Endpoints of moonshotai/kimi-k2.5 under ProviderPolicy(exclude_below='int4')")
    workload = Workload(
        prompt_tokens=DEFAULT_PROMPT_TOKENS, completion_tokens=DEFAULT_COMPLETION_TOKENS
    )
    report = build_report(market, ProviderPolicy(exclude_below="int4"), workload)
    render_report(report, console)


def run_demo(console: Console, *, out: Path | None = None, job: bool = True) -> int:
    """Run every demo step in order; returns the exit code.

    Args:
        console: where to print.
        out: the job directory of the simulated run (default: a temporary one).
        job: also project and run the scaled-down reference job (steps 2 and 3).
    """
    market = load_demo_market()
    console.print(
        f"Market snapshot: {bundled_snapshot().name} ({len(market.endpoints)} endpoints, "
        "offline: no network, no key)"
    )
    show_endpoints(console, market)
    if not job:
        return 0
    return run_reference_job(console, market, out)


def _handle(args: argparse.Namespace) -> int:
    return run_demo(make_console(), out=args.out, job=not args.endpoints_only)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the whole job on a local OpenRouter: endpoints, projection, run, top-up, resume",
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="keep the demo run's outputs here")
    parser.add_argument(
        "--endpoints-only", action="store_true", help="only show the endpoint verdicts"
    )
    parser.set_defaults(handler=_handle)
