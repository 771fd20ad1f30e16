"""``provider-router preflight``: check the live service before spending real money.

::

    provider-router preflight --model moonshotai/kimi-k2.5 [--exclude-below int4]
        [--base-url URL] [--snapshot FILE] [--json]

Runs :func:`~provider_router.checks.preflight.preflight`: the key, the credits, the
model, the policy's verdicts and one 1-token request pinned to the top-ranked allowed
provider. ``provider-router run`` does the same first (skip with ``--no-preflight``).
Exit 0 when every check held, 1 when one did not (each failure says what).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from provider_router.catalog.fetch import Catalog
from provider_router.checks.preflight import PreflightReport, preflight
from provider_router.cli._render import make_console, print_json, print_wrapped
from provider_router.cli.endpoints import add_policy_arguments, policy_from_args
from provider_router.routing.policy import ProviderPolicy

__all__ = ["print_report", "register", "run_preflight"]

_MARKS = {True: "ok  ", False: "FAIL", None: "?   "}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="check key, credits, model, policy and one 1-token request before a run",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("--model", required=True, help="model id, e.g. moonshotai/kimi-k2.5")
    add_policy_arguments(parser)
    parser.add_argument(
        "--base-url", metavar="URL", help="API root (default: $OPENROUTER_BASE_URL)"
    )
    parser.add_argument(
        "--snapshot", metavar="FILE", help="judge and price against this snapshot's listing"
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(handler=_handle)


def run_preflight(
    model: str,
    policy: ProviderPolicy,
    *,
    base_url: str | None = None,
    snapshot: str | None = None,
    request: bool = True,
) -> PreflightReport:
    """The preflight, run to completion on a fresh event loop."""

    async def go() -> PreflightReport:
        listing = None
        if snapshot is not None:
            listing = await Catalog.load_snapshot(snapshot).endpoints(model)
        return await preflight(model, policy, base_url=base_url, listing=listing, request=request)

    return asyncio.run(go())


def print_report(report: PreflightReport, *, file: Any = None) -> None:
    """One line per check, then a verdict line."""
    console = make_console(file if file is not None else sys.stdout)
    for check in report.checks:
        # A long detail breaks at a space on a terminal, under the details above it.
        line = f"  {_MARKS[check.ok]} {check.name:<11} {check.detail}"
        print_wrapped(console, line, hang=len(line) - len(check.detail))
    if report.ok:
        print_wrapped(console, f"preflight: {report.model}: every check held")
    else:
        names = ", ".join(c.name for c in report.failures)
        print_wrapped(console, f"preflight: {report.model}: FAILED ({names})")


def _handle(args: argparse.Namespace) -> int:
    report = run_preflight(
        args.model, policy_from_args(args), base_url=args.base_url, snapshot=args.snapshot
    )
    if args.json:
        print_json(report.to_json())
    else:
        print_report(report)
    return 0 if report.ok else 1
