"""``provider-router project``: what a plan costs, and how much of it fits a budget.

::

    provider-router project plan.yaml [--budget 100] [--pilot 200] [--json]
    provider-router project --model M --datasets 6 --target-output-tokens 10M \
        --prompt-tokens 200 --completion-tokens 2000 --budget 100 [--exclude-below int4]

The market comes from ``--snapshot FILE`` (offline), else ``--base-url`` /
``$OPENROUTER_BASE_URL``, else OpenRouter. With a plan, prompt tokens are estimated from
each dataset's files and response lengths come from ``--completion-tokens`` or a pilot
(``--pilot N``, which needs ``$OPENROUTER_API_KEY``); docs/projection.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from provider_router._constants import DEFAULT_MAX_PREMIUM
from provider_router._exceptions import ConfigurationError
from provider_router._format import decimal_str, format_usd
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli._errors import UsageError, as_usage
from provider_router.cli._options import (
    PRECISIONS,
    add_market_arguments,
    budget_usd,
    load_listing,
    max_premium,
    positive_count,
)
from provider_router.cli._project_render import load_batch_listing, render_projection, render_routes
from provider_router.cli._render import make_console, print_wrapped
from provider_router.cli.endpoints import add_verified_arguments, apply_verified
from provider_router.jobs.inputs import check_run
from provider_router.jobs.observe.standard import standard_observers
from provider_router.jobs.pilot import pilot_into_job
from provider_router.planning.compare import RouteComparison, compare_routes
from provider_router.planning.plan import DEFAULT_BATCH_CONCURRENCY, Plan, load_plan
from provider_router.planning.projection import Projection, project
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate
from provider_router.planning.workload_stats import (
    PilotResult,
    PromptFileStats,
    measure_prompts,
)
from provider_router.routing.policy import ProviderPolicy

__all__ = ["register"]


def _decimal(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number ≥ 0, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "project",
        help="project what a plan costs and how much fits a budget",
        description=(
            "Project the cost of a batch plan (or of a uniform plan given by flags) on "
            "the endpoints the policy allows: per dataset and in total, low / expected / "
            "high, under the cheapest allowed endpoint and the expected routing mix, and "
            "what a budget buys. See docs/projection.md."
        ),
    )
    parser.add_argument("plan", nargs="?", metavar="PLAN", help="plan file (YAML or TOML)")
    uniform = parser.add_argument_group("a uniform plan without a file")
    uniform.add_argument("--model", help="model id (with a plan file: overrides it)")
    uniform.add_argument("--datasets", type=positive_count, help="how many identical datasets")
    uniform.add_argument(
        "--target-output-tokens",
        type=positive_count,
        metavar="N",
        help="output tokens per dataset (10M, 250k...; with a plan: overrides every dataset's)",
    )
    uniform.add_argument(
        "--max-requests", type=positive_count, metavar="N", help="request cap per dataset"
    )
    workload = parser.add_argument_group("the workload")
    workload.add_argument(
        "--prompt-tokens",
        type=_decimal,
        metavar="N",
        help="prompt tokens per request (with a plan: default estimated from its files)",
    )
    workload.add_argument(
        "--completion-tokens",
        type=_decimal,
        metavar="N",
        help="expected output tokens per response, reasoning included",
    )
    workload.add_argument(
        "--completion-tokens-low",
        type=_decimal,
        metavar="N",
        help="the low end of the output tokens per response, for the cost range "
        "(default: the pilot's 95%% interval, else --completion-tokens)",
    )
    workload.add_argument(
        "--completion-tokens-high",
        type=_decimal,
        metavar="N",
        help="the high end of the output tokens per response, for the cost range "
        "(default: the pilot's 95%% interval, else --completion-tokens)",
    )
    workload.add_argument(
        "--reasoning-tokens",
        type=_decimal,
        default=Decimal(0),
        metavar="N",
        help="of which reasoning (default 0)",
    )
    workload.add_argument(
        "--cached-share",
        type=_decimal,
        default=Decimal(0),
        metavar="F",
        help="fraction of prompt tokens read from the provider's cache (default 0)",
    )
    workload.add_argument(
        "--pilot",
        type=positive_count,
        metavar="N",
        help="measure response lengths by sending N sampled prompts of the plan first, as "
        "the job's first requests (needs --out and a budget)",
    )
    workload.add_argument(
        "--out",
        metavar="DIR",
        help="with --pilot: the job directory the run will use; the pilot's spend is booked "
        "on its ledger under the plan's budget and its answers kept as the datasets' first "
        "results (run --plan PLAN --out DIR sends the rest)",
    )
    workload.add_argument(
        "--pilot-concurrency",
        type=positive_count,
        default=16,
        metavar="C",
        help="the pilot's requests in flight",
    )
    workload.add_argument("--seed", type=int, default=0, help="pilot sampling seed (default 0)")
    parser.add_argument(
        "--budget",
        type=budget_usd,
        metavar="USD",
        help="fit the plan into this (default: the plan's budget, else none)",
    )
    parser.add_argument(
        "--max-premium",
        type=max_premium,
        metavar="SHARE|none",
        help="the run's cap on the premium over the floor, for the cost when the cheapest "
        "endpoints are full (default: the plan's, else 0.02)",
    )
    parser.add_argument(
        "--exclude-below",
        choices=PRECISIONS,
        metavar="PRECISION",
        help=f"reject endpoints below this: {', '.join(PRECISIONS)} (default: no floor, or "
        "the plan's policy)",
    )
    add_verified_arguments(parser)
    add_market_arguments(parser.add_argument_group("the market"))
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(handler=_handle)


@dataclass(frozen=True, slots=True)
class _Job:
    """Everything the projection needs, gathered from flags and files."""

    model: str
    plan: Plan | None
    demands: tuple[DatasetDemand, ...]
    policy: ProviderPolicy
    budget: Decimal | None


def _policy(args: argparse.Namespace, plan: Plan | None, model: str) -> ProviderPolicy:
    options: dict[str, Any] = dict(plan.policy) if plan is not None else {}
    if args.exclude_below is not None:
        options["exclude_below"] = args.exclude_below
    try:
        policy = ProviderPolicy(**options)
    except TypeError as exc:
        raise ConfigurationError(f"invalid policy in the plan: {exc}") from None
    return apply_verified(policy, args, model)


def _missing_workload(args: argparse.Namespace, prompt_tokens: Decimal | None) -> list[str]:
    """The workload flags still needed, named together (one mistake, one message)."""
    missing = []
    if prompt_tokens is None:
        missing.append("--prompt-tokens N (prompt tokens per request)")
    if args.completion_tokens is None:
        missing.append(
            "--completion-tokens N (expected output tokens per response)"
            + (", or --pilot N to measure them" if args.plan else "")
        )
    return [f"give {' and '.join(missing)}"] if missing else []


def _flag_workload(args: argparse.Namespace, prompt_tokens: Decimal | None) -> WorkloadEstimate:
    missing = _missing_workload(args, prompt_tokens)
    if missing:
        raise UsageError("; ".join(missing))
    assert prompt_tokens is not None
    return WorkloadEstimate(
        prompt_tokens,
        args.completion_tokens,
        completion_tokens_low=args.completion_tokens_low,
        completion_tokens_high=args.completion_tokens_high,
        reasoning_tokens=args.reasoning_tokens,
        cached_prompt_share=args.cached_share,
    )


def _uniform_job(args: argparse.Namespace) -> tuple[_Job, WorkloadEstimate]:
    if args.model is None:
        raise ConfigurationError("give a PLAN file, or --model M for a uniform plan")
    if args.pilot is not None:
        raise ConfigurationError("--pilot needs a PLAN file: it samples the plan's prompts")
    missing = []
    if args.target_output_tokens is None and args.max_requests is None:
        missing.append(
            "a uniform plan needs --target-output-tokens N or --max-requests N per dataset"
        )
    missing += _missing_workload(args, args.prompt_tokens)
    if missing:
        raise UsageError("; ".join(missing))
    count = args.datasets or 1
    width = len(str(count))
    demands = tuple(
        DatasetDemand(
            f"dataset-{i:0{width}d}",
            target_output_tokens=args.target_output_tokens,
            max_requests=args.max_requests,
        )
        for i in range(1, count + 1)
    )
    job = _Job(args.model, None, demands, _policy(args, None, args.model), args.budget)
    return job, _flag_workload(args, args.prompt_tokens)


def _plan_job(
    args: argparse.Namespace,
) -> tuple[_Job, dict[str, PromptFileStats]]:
    if args.datasets is not None:
        raise ConfigurationError("--datasets is for a uniform plan; a plan file lists its own")
    if args.pilot is not None and args.out is None:
        raise UsageError(
            "--pilot needs --out DIR, the job directory the run will use: the pilot is the "
            "job's first requests, booked on its ledger under its budget"
        )
    plan = load_plan(args.plan).with_overrides(
        model=args.model, target_output_tokens=args.target_output_tokens
    )
    files = {
        d.name: measure_prompts(d.inputs, tools=plan.params_for(d).tools) for d in plan.datasets
    }
    demands = tuple(
        DatasetDemand(
            d.name,
            target_output_tokens=d.target_output_tokens,
            max_requests=args.max_requests or d.max_requests,
            available_prompts=files[d.name].prompts,
            max_tokens=plan.params_for(d).max_tokens,
        )
        for d in plan.datasets
    )
    budget = args.budget if args.budget is not None else plan.budget
    if args.pilot is not None and budget is None:
        raise UsageError("--pilot spends from the job's budget: give --budget USD or `budget:`")
    return _Job(plan.model, plan, demands, _policy(args, plan, plan.model), budget), files


def _pilot_plan(args: argparse.Namespace, job: _Job) -> Plan:
    """The plan the pilot runs: the job's, with its budget and policy flags."""
    assert job.plan is not None  # _uniform_job refuses --pilot
    assert job.budget is not None  # _plan_job checked
    return job.plan.with_overrides(budget=job.budget, exclude_below=args.exclude_below)


async def _pilot(args: argparse.Namespace, job: _Job, n: int) -> PilotResult:
    assert args.out is not None
    plan = _pilot_plan(args, job)
    result, summary = await pilot_into_job(
        plan,
        args.out,
        n,
        seed=args.seed,
        concurrency=args.pilot_concurrency,
        base_url=args.base_url,
        observers=standard_observers(),
    )
    print(
        f"pilot: booked on the job's ledger in {args.out}: spent {format_usd(summary.spent)} "
        f"of {format_usd(summary.budget)}; its answers are the datasets' first results "
        f"(provider-router run --plan {args.plan} --out {args.out} sends the rest)",
        file=sys.stderr,
    )
    return result


def _workloads(
    args: argparse.Namespace,
    job: _Job,
    files: dict[str, PromptFileStats],
    pilot: PilotResult | None,
) -> tuple[WorkloadEstimate, tuple[DatasetDemand, ...]]:
    if pilot is not None:
        # Measured prompt tokens beat the approximation; one pooled workload.
        return pilot.estimate, job.demands
    if job.plan is None:
        return _flag_workload(args, args.prompt_tokens), job.demands
    own = {
        name: _flag_workload(args, args.prompt_tokens or stats.mean_tokens)
        for name, stats in files.items()
    }
    demands = tuple(
        DatasetDemand(
            d.name,
            target_output_tokens=d.target_output_tokens,
            max_requests=d.max_requests,
            available_prompts=d.available_prompts,
            workload=own[d.name],
            max_tokens=d.max_tokens,
        )
        for d in job.demands
    )
    return own[job.demands[0].name], demands


async def _routes(
    args: argparse.Namespace,
    job: _Job,
    listing: ModelEndpoints,
    workload: WorkloadEstimate,
    demands: tuple[DatasetDemand, ...],
) -> RouteComparison | None:
    """Sync and batch side by side (None: a snapshot without the ``:batch`` listing)."""
    batch = await load_batch_listing(job.model, base_url=args.base_url, snapshot=args.snapshot)
    if batch is None:
        return None
    plan = job.plan
    return compare_routes(
        demands,
        listing,
        batch,
        job.policy,
        workload,
        budget=job.budget,
        model_id=job.model,
        concurrency=plan.concurrency if plan is not None else DEFAULT_BATCH_CONCURRENCY,
        routes={d.name: d.route for d in plan.datasets} if plan is not None else None,
        deadlines={d.name: d.deadline_hours for d in plan.datasets} if plan is not None else None,
    )


async def _gather(
    args: argparse.Namespace,
) -> tuple[Projection, PilotResult | None, RouteComparison | None, tuple[int, ...]]:
    with as_usage():
        if args.plan is None:
            job, _ = _uniform_job(args)
            files: dict[str, PromptFileStats] = {}
        else:
            job, files = _plan_job(args)
        if args.pilot is not None:
            # What a run refuses (no API key above all), refused before anything is fetched.
            check_run(_pilot_plan(args, job), args.out)
    listing = await load_listing(job.model, base_url=args.base_url, snapshot=args.snapshot)
    pilot = None
    caps: tuple[int, ...] = ()
    if args.pilot is not None:
        pilot = await _pilot(args, job, args.pilot)
        assert job.plan is not None  # _uniform_job refuses --pilot
        caps = tuple(sorted({job.plan.params_for(d).max_tokens or 0 for d in job.plan.datasets}))
    workload, demands = _workloads(args, job, files, pilot)
    premium = args.max_premium
    if premium is None:
        premium = job.plan.max_premium if job.plan is not None else DEFAULT_MAX_PREMIUM
    projection = project(
        demands,
        listing,
        job.policy,
        workload,
        budget=job.budget,
        max_premium=None if premium == "none" else premium,
    )
    return projection, pilot, await _routes(args, job, listing, workload, demands), caps


def _pilot_dict(pilot: PilotResult, caps: tuple[int, ...]) -> dict[str, Any]:
    stats = pilot.completion
    share = pilot.truncated_share
    vs_floor = pilot.price_vs_floor
    return {
        "requests": pilot.requests,
        "failures": pilot.failures,
        "cost": decimal_str(pilot.cost),
        "floor_cost": decimal_str(pilot.floor_cost),
        "price_vs_floor": None if vs_floor is None else decimal_str(vs_floor),
        "providers": dict(pilot.providers),
        "max_tokens": list(caps),
        "truncated": pilot.truncated,
        "truncated_share": {"value": share.value, "low": share.low, "high": share.high},
        "completion_tokens": {
            "mean": stats.mean,
            "mean_low": stats.mean_low,
            "mean_high": stats.mean_high,
            "confidence": stats.confidence,
            "stdev": stats.stdev,
            "p10": stats.p10,
            "p50": stats.p50,
            "p90": stats.p90,
        },
    }


def _truncation_words(pilot: PilotResult, caps: tuple[int, ...]) -> str:
    """What the pilot says of the chosen ``max_tokens``: the share of answers it cuts."""
    cap = "/".join(f"{c:,}" for c in caps) or "?"
    share = pilot.truncated_share
    said = (
        f"pilot: {pilot.truncated} of {pilot.requests} answers ({share.value:.0%}, 95% CI "
        f"{share.low:.0%}–{share.high:.0%}) were cut at max_tokens {cap} (finish_reason: "
        "length)"
    )
    if not pilot.truncated:
        return f"{said}: that cap cuts few or none of the job's answers"
    return (
        f"{said}: at that cap the job would cut about {share.value:.0%} of its answers, paid "
        "for and not whole; raise generation.max_tokens, or re-run the cut ones later with "
        "run --max-tokens N --redo-truncated (docs/batch.md)"
    )


def _handle(args: argparse.Namespace) -> int:
    projection, pilot, routes, caps = asyncio.run(_gather(args))
    if args.json:
        data = projection.to_dict()
        data["pilot"] = None if pilot is None else _pilot_dict(pilot, caps)
        data["routes"] = None if routes is None else routes.to_dict()
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    console = make_console()
    if pilot is not None:
        stats = pilot.completion
        print_wrapped(
            console,
            f"pilot: {pilot.requests} requests ({pilot.failures} failed), spent "
            f"${pilot.cost:.4f}; output tokens per response {stats.mean:.0f} "
            f"(95% CI {stats.mean_low:.0f}–{stats.mean_high:.0f}, p10 {stats.p10:.0f}, "
            f"p90 {stats.p90:.0f})",
        )
        print_wrapped(console, _truncation_words(pilot, caps))
        if pilot.price_vs_floor is not None:
            print_wrapped(
                console,
                f"pilot: paid {pilot.price_vs_floor}× the floor at {args.pilot_concurrency} in "
                "flight (a lower bound: a loaded run spills more, up to 1 + max_premium)",
            )
    render_projection(projection, file=sys.stdout, console=console)
    if routes is not None:
        render_routes(routes, file=sys.stdout, console=console)
    return 0
