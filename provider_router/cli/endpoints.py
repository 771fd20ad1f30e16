"""``provider-router endpoints MODEL``: every endpoint, the policy's verdict, and the ranking.

::

    provider-router endpoints moonshotai/kimi-k2.5 [--exclude-below int4] [--json]
        [--base-url URL | --snapshot FILE] [--save-snapshot FILE]
        [--verified REPORT [--per-accepted-sample]]

The listing comes from ``--snapshot FILE`` (offline), else ``--base-url`` /
``$OPENROUTER_BASE_URL``, else OpenRouter. The table shows each endpoint's provider,
tag, quantization, prices, uptime, status, the verdict with its reason and, for allowed
endpoints, the rank and the expected cost of 1,000 requests of the workload;
``--verified`` adds each one's pass rate (docs/policy.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from provider_router._exceptions import ConfigurationError
from provider_router._table import Column, FitTable
from provider_router.catalog.records import EndpointHealth, ModelEndpoints, Quantization
from provider_router.catalog.verdicts import VerificationReport
from provider_router.cli._options import PRECISIONS, add_market_arguments, load_listing
from provider_router.cli._render import (
    format_per_million,
    format_percent,
    format_usd,
    make_console,
    print_json,
)
from provider_router.routing.policy import Decision, Decisions, ProviderPolicy
from provider_router.routing.ranking import RankedEndpoint, Workload, rank

__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "EndpointReport",
    "add_policy_arguments",
    "add_verified_arguments",
    "apply_verified",
    "build_report",
    "load_listing",
    "policy_from_args",
    "register",
    "render_report",
    "report_json",
]

DEFAULT_PROMPT_TOKENS: Final = 200
DEFAULT_COMPLETION_TOKENS: Final = 2000


def _count(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a token count must be ≥ 0, got {value}")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a percentage must be 0..100, got {text!r}")
    return value


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ProviderPolicy`` flags, shared by every command that filters endpoints."""
    parser.add_argument(
        "--exclude-below",
        choices=PRECISIONS,
        metavar="PRECISION",
        help=f"reject endpoints below this precision: {', '.join(PRECISIONS)} (default: no floor)",
    )
    parser.add_argument(
        "--unknown",
        choices=["assume_native", "reject", "accept"],
        default="assume_native",
        help="how to judge undeclared quantization (default: assume the model's native precision)",
    )
    parser.add_argument(
        "--unrecognized",
        choices=["reject", "accept"],
        default="reject",
        help="a quantization string that names no bit width, under a floor (default: reject)",
    )
    parser.add_argument(
        "--exclude-provider",
        action="append",
        default=[],
        metavar="NAME",
        help="reject a provider by name, slug or tag (repeatable; default: none)",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="allow only these providers (repeatable; default: every provider)",
    )
    parser.add_argument(
        "--min-uptime",
        type=_percent,
        metavar="PCT",
        help="reject endpoints below this uptime (default: no minimum)",
    )
    parser.add_argument(
        "--allow-down", action="store_true", help="keep endpoints whose status means down"
    )


def policy_from_args(args: argparse.Namespace) -> ProviderPolicy:
    """The policy the policy flags describe."""
    health = {EndpointHealth.OK, EndpointHealth.DEGRADED, EndpointHealth.UNKNOWN}
    if args.allow_down:
        health.add(EndpointHealth.DOWN)
    return ProviderPolicy(
        args.exclude_below,
        unknown=args.unknown,
        unrecognized=args.unrecognized,
        exclude_providers=args.exclude_provider,
        only=args.only,
        min_uptime=args.min_uptime,
        allowed_health=health,
    )


def add_verified_arguments(parser: argparse.ArgumentParser) -> None:
    """``--verified REPORT`` and ``--per-accepted-sample``, for commands that rank."""
    parser.add_argument(
        "--verified",
        metavar="REPORT",
        help="a verify --report file: reject what failed it, show each pass rate",
    )
    parser.add_argument(
        "--per-accepted-sample",
        action="store_true",
        help="rank by cost per accepted sample (price ÷ pass rate; needs --verified)",
    )


def apply_verified(policy: ProviderPolicy, args: argparse.Namespace, model: str) -> ProviderPolicy:
    """``policy`` with ``--verified``'s report (and ``--per-accepted-sample``) applied.

    Raises:
        ConfigurationError: ``--per-accepted-sample`` without a report, a report that
            cannot be read, or one of another model.
    """
    if args.verified is None:
        if args.per_accepted_sample:
            raise ConfigurationError(
                "--per-accepted-sample needs --verified REPORT (the pass rates it ranks by)"
            )
        return policy
    report = VerificationReport.load(args.verified)
    if report.model != model:
        raise ConfigurationError(
            f"{args.verified} verified {report.model}, not {model}: its pass rates do not apply"
        )
    return dataclasses.replace(
        policy, verified=report, rank_per_accepted_sample=args.per_accepted_sample
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "endpoints",
        help="list a model's endpoints with verdicts, prices and ranking",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("model", help="model id, e.g. moonshotai/kimi-k2.5")
    add_policy_arguments(parser)
    parser.add_argument(
        "--prompt-tokens", type=_count, default=DEFAULT_PROMPT_TOKENS, metavar="N",
        help=f"prompt tokens per request (default {DEFAULT_PROMPT_TOKENS})",
    )  # fmt: skip
    parser.add_argument(
        "--completion-tokens", type=_count, default=DEFAULT_COMPLETION_TOKENS, metavar="N",
        help=f"output tokens per request (default {DEFAULT_COMPLETION_TOKENS})",
    )  # fmt: skip
    add_market_arguments(parser.add_mutually_exclusive_group())
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_verified_arguments(parser)
    parser.add_argument(
        "--save-snapshot",
        metavar="FILE",
        help="also write the listing to FILE, for --snapshot FILE later (offline, reproducible)",
    )
    parser.set_defaults(handler=_handle)


@dataclass(frozen=True, slots=True)
class EndpointReport:
    """Everything the endpoints command shows, computed once for table and JSON alike."""

    listing: ModelEndpoints
    policy: ProviderPolicy
    workload: Workload
    decisions: Decisions
    ranked: tuple[RankedEndpoint, ...]

    def rows(self) -> list[tuple[Decision, RankedEndpoint | None]]:
        """Allowed endpoints by rank, then rejected ones in listing order."""
        by_endpoint = {id(r.endpoint): r for r in self.ranked}
        allowed = [(d, by_endpoint[id(d.endpoint)]) for d in self.decisions if d.allowed]
        allowed.sort(key=lambda row: row[1].rank)
        rejected: list[tuple[Decision, RankedEndpoint | None]] = [
            (d, None) for d in self.decisions if not d.allowed
        ]
        return [*allowed, *rejected]


def build_report(
    listing: ModelEndpoints, policy: ProviderPolicy, workload: Workload
) -> EndpointReport:
    """Judge and rank a listing (pure)."""
    decisions = policy.evaluate(listing)
    ranked = rank(decisions.allowed, workload=workload, verified=policy.ranking_report(listing.id))
    return EndpointReport(listing, policy, workload, decisions, tuple(ranked))


def _pass_rate(report: EndpointReport, decision: Decision) -> str:
    """The endpoint's verified pass rate as ``accepted/judged`` ("-": not measured)."""
    verified = report.policy.verified
    verdict = None if verified is None else verified.verdict(decision.endpoint.slug)
    if verdict is None or not verdict.judged:
        return "-"
    return f"{verdict.accepted}/{verdict.judged}"


def _status(decision: Decision) -> str:
    endpoint = decision.endpoint
    if endpoint.status is None:
        return "-"
    return f"{int(endpoint.status)} {endpoint.health.value}"


def _quantization(decision: Decision) -> str:
    endpoint = decision.endpoint
    raw = endpoint.quantization_raw or "null"
    effective = decision.effective_quantization
    if endpoint.quantization in (None, Quantization.UNKNOWN) and effective is not None:
        return f"{raw} (→{effective.value})"
    return raw


def render_report(report: EndpointReport, console: Console) -> None:
    """The endpoints table, and a one-line summary of the best choice."""
    workload = report.workload
    verified = report.policy.verified is not None
    per_accepted = report.policy.ranking_report(report.listing.id) is not None
    caption = (
        f"workload: {workload.prompt_tokens} prompt + {workload.output_tokens} output "
        "tokens per request; $/1k ok req = expected cost of 1,000 successful requests "
        "(failed attempts' share included)"
    )
    if per_accepted:
        caption += (
            "; $/1k accepted = the same ÷ the pass rate (canaries that passed every "
            "check), the ranking's key; unverified endpoints rank after verified ones"
        )
    columns = [
        Column("#", "right", key=True),
        Column("provider", key=True),
        Column("tag", drop=2),
        Column("quant"),
        Column("prompt $/M", "right", drop=4),
        Column("compl. $/M", "right", drop=5),
        Column("uptime", "right", drop=3),
        Column("status", drop=1),
        Column("verdict"),
        Column("$/1k ok req", "right"),
    ]
    if verified:
        columns.append(Column("pass", "right"))
    if per_accepted:
        columns.append(Column("$/1k accepted", "right"))
    columns.append(Column("reason", below=True))
    table = FitTable(
        *columns,
        title=f"{report.listing.id}: {len(report.decisions)} endpoints, "
        f"{len(report.ranked)} allowed",
        caption=caption,
    )
    for decision, ranked in report.rows():
        endpoint = decision.endpoint
        verdict = (
            Text("allowed", style="green") if decision.allowed else Text("rejected", style="red")
        )
        cells: list[str | Text] = [
            "" if ranked is None else str(ranked.rank),
            endpoint.provider_name,
            endpoint.slug,
            _quantization(decision),
            format_per_million(endpoint.pricing.prompt),
            format_per_million(endpoint.pricing.completion),
            format_percent(endpoint.uptime),
            _status(decision),
            verdict,
            "" if ranked is None else format_usd(ranked.effective_cost_per_1k_requests, places=2),
        ]
        if verified:
            cells.append(_pass_rate(report, decision))
        if per_accepted:
            cells.append(_per_1k_accepted(ranked))
        table.add_row(*cells, decision.reason)
    console.print(table)
    if report.ranked:
        best = report.ranked[0]
        console.print(
            f"best: {best.endpoint.provider_name} ({best.endpoint.slug}) at "
            f"{format_usd(best.cost_per_request, places=6)} per request, "
            f"{format_usd(best.cost_per_million_output_tokens, places=2)} per million output tokens"
        )
    else:
        console.print("[red]no endpoint passes the policy[/]")


def _per_1k_accepted(ranked: RankedEndpoint | None) -> str:
    if ranked is None:
        return ""
    if ranked.cost_per_accepted_sample is None:
        return "none accepted" if ranked.pass_rate is not None else "not verified"
    return format_usd(ranked.cost_per_accepted_sample * 1000, places=2)


def report_json(report: EndpointReport) -> dict[str, Any]:
    """The report as plain JSON-able data (Decimals stay exact via the renderer)."""
    policy = report.policy
    endpoints = []
    for decision, ranked in report.rows():
        endpoint = decision.endpoint
        pricing = endpoint.pricing
        endpoints.append(
            {
                "provider_name": endpoint.provider_name,
                "tag": endpoint.tag,
                "quantization": endpoint.quantization_raw,
                "effective_quantization": decision.effective_quantization,
                "prompt_per_million": pricing.prompt_per_million,
                "completion_per_million": pricing.completion_per_million,
                "cache_read_per_million": pricing.cache_read_per_million,
                "uptime_last_30m": endpoint.uptime_last_30m,
                "status": None if endpoint.status is None else int(endpoint.status),
                "health": endpoint.health,
                "allowed": decision.allowed,
                "code": decision.code,
                "reason": decision.reason,
                "rank": None if ranked is None else ranked.rank,
                "cost_per_request": None if ranked is None else ranked.cost_per_request,
                "cost_per_1k_requests": None if ranked is None else ranked.cost_per_1k_requests,
                "expected_cost_per_success": (
                    None if ranked is None else ranked.expected_cost_per_success
                ),
                "cost_per_million_output_tokens": (
                    None if ranked is None else ranked.cost_per_million_output_tokens
                ),
                "success_probability": None if ranked is None else ranked.success_probability,
                "pass_rate": None if ranked is None else ranked.pass_rate,
                "cost_per_accepted_sample": (
                    None if ranked is None else ranked.cost_per_accepted_sample
                ),
            }
        )
    return {
        "model": report.listing.id,
        "policy": {
            "exclude_below": policy.exclude_below,
            "unknown": policy.unknown,
            "unrecognized": policy.unrecognized,
            "exclude_providers": policy.exclude_providers,
            "only": policy.only,
            "min_uptime": policy.min_uptime,
            "allowed_health": policy.allowed_health,
            "verified": None if policy.verified is None else policy.verified.reference,
            "rank_per_accepted_sample": policy.rank_per_accepted_sample,
        },
        "workload": {
            "prompt_tokens": report.workload.prompt_tokens,
            "completion_tokens": report.workload.completion_tokens,
        },
        "endpoints": endpoints,
    }


def _handle(args: argparse.Namespace) -> int:
    policy = apply_verified(policy_from_args(args), args, args.model)
    workload = Workload(prompt_tokens=args.prompt_tokens, completion_tokens=args.completion_tokens)
    listing = asyncio.run(
        load_listing(
            args.model,
            base_url=args.base_url,
            snapshot=args.snapshot,
            save_snapshot=args.save_snapshot,
        )
    )
    report = build_report(listing, policy, workload)
    if args.json:
        print_json(report_json(report))
    else:
        render_report(report, make_console())
    if not report.ranked:
        print("provider-router: no endpoint passes the policy", file=sys.stderr)
    if args.save_snapshot:
        print(f"Snapshot: {args.save_snapshot} (read it back with --snapshot)", file=sys.stderr)
    return 0
