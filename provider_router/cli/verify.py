"""``provider-router verify``: measure each allowed provider against the model's reference.

::

    provider-router verify moonshotai/kimi-k2.5 --exclude-below int4
        [--prompts FILE] [--reference TAG] [--top-logprobs K | --no-logprobs]
        [--no-vendor-rules] [--report FILE] [--ledger FILE] [--json]

Runs :func:`~provider_router.checks.verify.verify` and prints each endpoint's verdict,
what it could not measure, and its pass rate (docs/policy.md, "Measured fidelity").
``--report FILE`` saves the measurements for ``ProviderPolicy(verified=...)``; with
``--ledger`` the canaries are booked on that SQLite ledger, within its limit. Exit 0
when no endpoint failed, 1 when one did (each says why).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from provider_router._exceptions import ConfigurationError
from provider_router._format import format_usd
from provider_router._table import Column, FitTable
from provider_router.catalog.verdicts import EndpointVerdict, VerificationReport, VerifyThresholds
from provider_router.checks.verify import (
    DEFAULT_SAMPLES,
    DEFAULT_TOKENS,
    DEFAULT_TOOL_SAMPLES,
    DEFAULT_TOP_LOGPROBS,
    MAX_TOP_LOGPROBS,
    verify,
)
from provider_router.cli._options import positive_count
from provider_router.cli._render import make_console, print_json
from provider_router.cli.endpoints import add_policy_arguments, policy_from_args
from provider_router.ledger import SQLiteLedger
from provider_router.planning.prompts import PromptReader

__all__ = ["print_verification", "register"]

_VERDICTS = {True: "pass", False: "FAIL", None: "?"}


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text!r}")
    return value


def _top_logprobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise argparse.ArgumentTypeError(f"must be within 0..{MAX_TOP_LOGPROBS}, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = VerifyThresholds()
    parser = subparsers.add_parser(
        "verify",
        help="measure each allowed provider against the model's reference before a run",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("model", help="model id, e.g. moonshotai/kimi-k2.5")
    add_policy_arguments(parser)
    parser.add_argument(
        "--base-url", metavar="URL", help="API root (default: $OPENROUTER_BASE_URL)"
    )
    parser.add_argument(
        "--prompts", metavar="FILE", help="JSONL prompts (as run reads them) to use as canaries"
    )
    parser.add_argument(
        "--reference", metavar="TAG", help="the endpoint to compare against (default: the author's)"
    )
    parser.add_argument(
        "--samples", type=positive_count, default=DEFAULT_SAMPLES, metavar="N",
        help="text canaries per endpoint",
    )  # fmt: skip
    parser.add_argument(
        "--tokens", type=positive_count, default=DEFAULT_TOKENS, metavar="N",
        help="the first N tokens compared (each canary's max_tokens)",
    )  # fmt: skip
    parser.add_argument(
        "--tool-samples", type=int, default=DEFAULT_TOOL_SAMPLES, metavar="N",
        help="tool-call canaries per endpoint that lists tools (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--min-agreement-ratio", type=_share, default=defaults.min_agreement_ratio,
        metavar="R", help="fail below this share of the reference's self-agreement",
    )  # fmt: skip
    parser.add_argument(
        "--max-tool-error-rate", type=_share, default=defaults.max_tool_error_rate,
        metavar="R", help="fail when more tool calls than this break their schema",
    )  # fmt: skip
    parser.add_argument(
        "--max-prompt-token-skew", type=_share, default=defaults.max_prompt_token_skew,
        metavar="R", help="fail when prompt tokens differ from the reference's by more",
    )  # fmt: skip
    parser.add_argument(
        "--max-divergence-excess", type=_share, default=defaults.max_divergence_excess,
        metavar="D", help="fail when the top-k divergence exceeds the reference's own by more",
    )  # fmt: skip
    logprobs = parser.add_mutually_exclusive_group()
    logprobs.add_argument(
        "--top-logprobs", type=_top_logprobs, default=DEFAULT_TOP_LOGPROBS, metavar="K",
        help=f"alternatives per token asked for where logprobs are listed "
        f"(0..{MAX_TOP_LOGPROBS}, default {DEFAULT_TOP_LOGPROBS})",
    )  # fmt: skip
    logprobs.add_argument(
        "--no-logprobs", dest="top_logprobs", action="store_const", const=None,
        help="ask for no logprobs (the top-k divergence is not measured)",
    )  # fmt: skip
    parser.add_argument(
        "--max-prompt-token-difference", type=int, default=defaults.max_prompt_token_difference,
        metavar="N", help="where the vendor requires the reference's prompt token count (Kimi), "
        "fail a canary more than N tokens away (default 0: equal)",
    )  # fmt: skip
    parser.add_argument(
        "--no-vendor-rules", dest="vendor_rules", action="store_false",
        help="do not hold endpoints to the model vendor's own rules (Kimi: fixed sampling "
        "parameters, equal prompt token counts)",
    )  # fmt: skip
    parser.add_argument("--report", metavar="FILE", help="save the measurements as JSON here")
    parser.add_argument(
        "--ledger", metavar="FILE", help="book the canaries on this SQLite ledger (a job's own)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=_handle)


def _prompts(path: str | None) -> list[Any]:
    if path is None:
        return []
    if not Path(path).is_file():
        raise ConfigurationError(f"no prompts file at {path}")
    return [prompt.messages for prompt in PromptReader([Path(path)], strict=True)]


async def _verify(args: argparse.Namespace) -> VerificationReport:
    kwargs: dict[str, Any] = {
        "policy": policy_from_args(args),
        "prompts": _prompts(args.prompts),
        "reference": args.reference,
        "samples": args.samples,
        "tokens": args.tokens,
        "tool_samples": args.tool_samples,
        "thresholds": VerifyThresholds(
            min_agreement_ratio=args.min_agreement_ratio,
            max_tool_error_rate=args.max_tool_error_rate,
            max_prompt_token_skew=args.max_prompt_token_skew,
            max_divergence_excess=args.max_divergence_excess,
            max_prompt_token_difference=args.max_prompt_token_difference,
        ),
        "base_url": args.base_url,
        "top_logprobs": args.top_logprobs,
        "vendor_rules": args.vendor_rules,
    }
    if args.ledger is None:
        return await verify(args.model, **kwargs)
    async with SQLiteLedger(args.ledger) as ledger:
        return await verify(args.model, ledger=ledger, **kwargs)


def _measures(verdict: EndpointVerdict) -> list[str]:
    """The row's measured cells: agreement, divergence, tools, prompt ratio, canaries."""
    agreement, divergence = verdict.agreement, verdict.divergence
    tools, ratio = verdict.tool_validity, verdict.prompt_token_ratio
    return [
        "-" if agreement is None else f"{agreement.value:.2f}",
        "-" if divergence is None else f"{divergence.value:.3f}",
        "-" if tools is None else f"{tools.value:.0%}",
        "-" if ratio is None else f"×{ratio.value:.3f}",
        f"{verdict.accepted}/{verdict.judged}" if verdict.judged else "-",
    ]


def _vendor_notes(verdict: EndpointVerdict) -> list[str]:
    """What the vendor's own rules found (Kimi's fixed parameters, equal prompt tokens)."""
    notes = []
    if verdict.params_accepted:
        notes.append(f"serves {len(verdict.params_accepted)} fixed-parameter violation(s)")
    if verdict.prompt_tokens_unequal:
        notes.append(f"prompt tokens ≠ reference on {verdict.prompt_tokens_unequal}")
    return notes


def print_verification(report: VerificationReport, console: Console) -> None:
    """The verdicts as a table that fits ``console``, each failure's why under its row."""
    baseline = []
    if report.self_agreement is not None:
        baseline.append(f"self-agreement {report.self_agreement.value:.2f}")
    if report.self_divergence is not None:
        baseline.append(f"self-divergence {report.self_divergence.value:.3f}")
    table = FitTable(
        Column("verdict", key=True),
        Column("endpoint", key=True),
        Column("agreement", "right"),
        Column("divergence", "right"),
        Column("tools", "right", drop=1),
        Column("prompt", "right", drop=0),
        Column("canaries passed", "right"),
        Column("why", below=True),
        title=f"verify: {report.model} against {report.reference}"
        + (f" ({', '.join(baseline)})" if baseline else ""),
        caption="agreement: tokens matching the reference's, in order; divergence: top-k "
        "divergence from the reference's (its own run's as the baseline); prompt: prompt "
        "tokens ÷ the reference's",
    )
    for v in report.endpoints:
        notes = [] if v.passed is True else [v.reason]
        style = {True: "green", False: "red", None: "yellow"}[v.passed]
        table.add_row(
            Text(_VERDICTS[v.passed], style=style),
            v.tag,
            *_measures(v),
            "\n".join([*notes, *_vendor_notes(v), *v.unmeasured]),
        )
    console.print(table)
    if report.vendor_rules:
        console.print(f"endpoints held to {report.vendor_rules}", highlight=False, markup=False)
    failed = ", ".join(report.failed) or "none"
    console.print(
        f"verify: {len(report.endpoints)} endpoints measured for {format_usd(report.cost)}; "
        f"failed: {failed}",
        highlight=False,
        markup=False,
    )


def _handle(args: argparse.Namespace) -> int:
    if args.tool_samples < 0:
        raise ConfigurationError(f"--tool-samples must be ≥ 0, got {args.tool_samples}")
    if args.max_prompt_token_difference < 0:
        raise ConfigurationError(
            f"--max-prompt-token-difference must be ≥ 0, got {args.max_prompt_token_difference}"
        )
    if args.ledger is not None and not Path(args.ledger).is_file():
        raise ConfigurationError(f"no ledger file at {args.ledger}")
    report = asyncio.run(_verify(args))
    if args.report:
        report.save(args.report)
    if args.json:
        print_json(report.to_json())
    else:
        print_verification(report, make_console())
    return 1 if report.failed else 0
