"""``provider-router run``: generate a plan's outputs, resumably, within a budget.

Everything the job leaves lives in DIR (outputs, journal, ledger, ``summary.json``,
``report.html``); the same command again resumes. The API key comes from
``OPENROUTER_API_KEY``, never from a flag (flags show up in process listings); with
``--job-key`` each run makes its own key with the management key in
``OPENROUTER_MANAGEMENT_KEY``. The command maps its flags onto
:func:`provider_router.jobs.run_plan` (with ``--ray``, onto
:class:`provider_router.ray.plan_run.RayPlanRun`, docs/workers.md) and prints; its flags
are in ``run --help``. Exit codes: 0 done, 1 error, 2 usage, 3 a budget used up (the
job's, or one OpenRouter keeps), 4 OpenRouter credits exhausted, 5 finished with failed
prompts (re-run to retry them), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console

from provider_router._collector import tune_for_process
from provider_router._constants import DEFAULT_JOB_KEY_HOURS, ENV_MANAGEMENT_KEY
from provider_router._exceptions import ConfigurationError, PreflightFailed
from provider_router._format import decimal_str
from provider_router.cli._errors import UsageError, as_usage
from provider_router.cli._exit_codes import exit_code, note_exit_code
from provider_router.cli._logging import report_events
from provider_router.cli._options import (
    PRECISIONS,
    budget_usd,
    max_premium,
    parse_count,
    positive_count,
)
from provider_router.cli._render import make_console
from provider_router.cli.preflight import print_report
from provider_router.client.metrics import Metrics
from provider_router.jobs import (
    BatchOptions,
    BatchPart,
    JobRunner,
    RunHooks,
    RunSummary,
    StopReason,
    run_plan_sync,
)
from provider_router.jobs.drift import DEFAULT_VERIFY_EVERY
from provider_router.jobs.finish import Resume, resume_budget
from provider_router.jobs.inputs import check_run
from provider_router.jobs.job_key import JobKeyLease
from provider_router.jobs.observe.drift_view import verification_lines
from provider_router.jobs.observe.live import ProgressMode, show_progress
from provider_router.jobs.observe.summary_view import render_summary
from provider_router.jobs.run import added_budget, budget_left
from provider_router.jobs.store._layout import SET_ASIDE_DIR, JobLayout
from provider_router.jobs.summary import SharedLedger
from provider_router.ledger._outage import DEFAULT_OUTAGE_WINDOW
from provider_router.ledger.redis import DEFAULT_LEASE
from provider_router.planning.plan import (
    DEFAULT_BATCH_CONCURRENCY,
    DEFAULT_BATCH_MAX_TOKENS,
    Plan,
    load_plan,
)

__all__ = ["plan_from_args", "register", "resume_command"]

_BATCH = BatchOptions()


def _hours(value: str) -> float:
    try:
        hours = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hours: {value!r}") from None
    if not 0 < hours < float("inf"):
        raise argparse.ArgumentTypeError(f"hours must be more than 0, got {value!r}")
    return hours


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {value!r}")
    return seconds


def _cache_ttl(value: str) -> int:
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, got {value!r}") from None
    if not 1 <= seconds <= 86_400:
        raise argparse.ArgumentTypeError(f"expected 1 to 86400 seconds, got {value!r}")
    return seconds


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value!r}")
    return port


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="generate responses for prompt files within a budget (resumable)",
        usage="%(prog)s [PROMPTS.jsonl ...] --out DIR (--model M --budget USD | --plan FILE) "
        "[options]",
        description=(
            "Send every prompt of one or more datasets through the routed, budgeted client, "
            "writing DIR/<dataset>.jsonl. Re-running the same command resumes; a higher "
            "--budget continues after a top-up. Exit codes: 0 done, 3 a budget used up (the "
            "job's, the key's limit, a workspace's), 4 credits exhausted, 5 some prompts "
            "failed, 6 a target not reached (too few prompts), 130 interrupted."
        ),
    )
    # The everyday flags first (argparse's own group); the rest in named groups below.
    parser.add_argument("prompts", nargs="*", metavar="PROMPTS.jsonl", help="prompt files")
    parser.add_argument("--out", required=True, metavar="DIR", help="job directory (required)")
    parser.add_argument(
        "--plan",
        metavar="FILE",
        help="plan file: .yaml, .yml or .toml (default: none: the prompt files and these flags)",
    )
    parser.add_argument(
        "--model",
        metavar="M",
        help="OpenRouter model id, e.g. moonshotai/kimi-k2.5 (default: the plan's; "
        "required without --plan)",
    )
    parser.add_argument(
        "--budget",
        type=budget_usd,
        metavar="USD",
        help="hard spending cap (default: the plan's budget; required without --plan)",
    )
    parser.add_argument(
        "--add-budget",
        type=budget_usd,
        metavar="USD",
        help="raise the job's budget by USD: its ledger's current limit plus USD, to resume "
        "(default: the budget as given)",
    )
    parser.add_argument(
        "--raise-budget",
        action="store_true",
        help="let --budget raise a limit set outside this job's runs (by `provider-router "
        "ledger topup`): without it such a raise is refused (docs/ledger.md, \"A job's "
        'budget")',
    )
    # No argparse default: a plan file's own value wins over one the flag never gave.
    parser.add_argument(
        "--max-tokens",
        type=positive_count,
        metavar="N",
        help=f"completion cap per request (default: {DEFAULT_BATCH_MAX_TOKENS}, or the "
        "plan's generation.max_tokens)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_count,
        metavar="C",
        help=f"requests in flight (default: {DEFAULT_BATCH_CONCURRENCY}, or the plan's)",
    )
    parser.add_argument(
        "--max-premium",
        type=max_premium,
        metavar="SHARE|none",
        help="the most paid above the floor, averaged over the run (default 0.02: 2 %%, "
        "waiting for the cheapest endpoints when they are full; 0: the floor only; none: "
        "latency first, the cheapest endpoint with room)",
    )
    parser.add_argument(
        "--exclude-below",
        choices=PRECISIONS,
        metavar="Q",
        help=f"lowest precision allowed: {', '.join(PRECISIONS)} (default: no floor, or "
        "the plan's policy)",
    )
    parser.add_argument(
        "--target-output-tokens",
        type=positive_count,
        metavar="N",
        help="stop each dataset at N output tokens (default: no target: every prompt)",
    )
    parser.add_argument(
        "--max-requests",
        type=positive_count,
        metavar="N",
        help="requests per dataset at most (default: no cap)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="sampling temperature (default: the plan's generation.temperature, else the "
        "model's own)",
    )
    parser.add_argument(
        "--no-distillable-text",
        dest="distillable_text",
        action="store_false",
        default=None,
        help="also route to models whose author forbids training on their outputs (by "
        "default a job sends provider.enforce_distillable_text: true; docs/batch.md)",
    )
    parser.add_argument("--name", help="dataset name (default: the prompts file's name)")
    parser.add_argument(
        "--add-inputs",
        action="store_true",
        help="give the job in DIR prompt files it does not have yet (a new dataset, or other "
        "files for one); without it a job that has outputs refuses them, as a wrong --out",
    )
    parser.add_argument(
        "--strict", action="store_true", help="any bad input line is fatal before spending"
    )
    parser.add_argument(
        "--redo-truncated",
        action="store_true",
        help="send again the answers cut at a max_tokens below this run's (finish_reason "
        "length), and only those besides prompts never done: they are moved out of the "
        "outputs first, kept in DIR/set_aside/truncated/ (give a larger --max-tokens; "
        "docs/batch.md)",
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "rich", "plain", "off"],
        default="auto",
        help="live table on a terminal (auto), plain log lines, or nothing",
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenRouter API root (default: $OPENROUTER_BASE_URL, else OpenRouter)",
    )
    checks = parser.add_argument_group("checks before and during the run")
    checks.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight (key valid and not used up, credits, model exists, policy "
        "allows an endpoint, one 1-token request pinned to the top-ranked provider, paid from "
        "the job's budget)",
    )
    checks.add_argument(
        "--verify",
        action="store_true",
        help="before any prompt, measure each allowed provider against the model's reference "
        "(provider-router verify, canaries from the first dataset, a few cents from the "
        "job's budget; DIR/verify.json) and send nothing to those that fail; then again "
        "every --verify-every rows: one that fails is excluded from then on and the rows it "
        "served since its last passing check are flagged (drift_flagged in the outputs)",
    )
    checks.add_argument(
        "--verify-every",
        type=parse_count,
        metavar="N",
        help=f"with --verify: rows between two checks during the run (default: the plan's "
        f"verify_every, else {DEFAULT_VERIFY_EVERY:,}; 0: only before the run)",
    )
    batch = parser.add_argument_group(
        "the Batch API route (datasets with route: batch; docs/batch.md)"
    )
    batch.add_argument(
        "--batch-poll",
        type=_seconds,
        default=_BATCH.poll,
        metavar="S",
        help="seconds before the first poll of a batch (doubles up to 300 while nothing "
        "changes; default 5)",
    )
    batch.add_argument(
        "--batch-size",
        type=positive_count,
        default=_BATCH.size,
        metavar="N",
        help="requests per batch (at most 5,000, the Batch API's limit)",
    )
    batch.add_argument(
        "--batch-lost-grace",
        type=_seconds,
        default=_BATCH.lost_grace,
        metavar="S",
        help="seconds after a submit whose answer was lost (and that may have reached "
        "OpenRouter) before its prompts go again if no listed batch carries them (default "
        "86520: the 24 h window and 2 min; less may pay twice)",
    )
    batch.add_argument(
        "--batch-accept-disputed",
        action="store_true",
        help="the disputed batch bills on record were checked on the dashboard and their "
        "booked worst cases stand: send batches again",
    )
    own = parser.add_argument_group("a key of the job's own, and metrics")
    own.add_argument(
        "--own-key",
        nargs="?",
        const=-1.0,
        type=float,
        metavar="S",
        help="the API key is this job's own (nothing else spends through it): bound "
        "worst-case charges of cut requests by the key's usage (GET /key), S seconds "
        "after each was given up on (default: off; S: its stream deadline; docs/ledger.md)",
    )
    own.add_argument(
        "--job-key",
        action="store_true",
        default=None,
        help="make an OpenRouter key for this run, with what the budget has left as its "
        "limit, send with it and disable it when the run ends (needs a management key in "
        f"{ENV_MANAGEMENT_KEY}; docs/ledger.md): OpenRouter then refuses anything past the "
        "budget, even spending outside this run (default: off, or the plan's job_key)",
    )
    own.add_argument(
        "--job-key-hours",
        type=_hours,
        metavar="H",
        help=f"with --job-key: hours the key is accepted (default: the plan's "
        f"job_key_hours, else {DEFAULT_JOB_KEY_HOURS:g})",
    )
    own.add_argument(
        "--response-cache",
        nargs="?",
        const=86_400,
        type=_cache_ttl,
        metavar="S",
        help="turn on OpenRouter's response cache: a prompt sent again within S seconds "
        "(1-86400, default 86400) is answered again for free; each prompt's body stays "
        "its own, so two samples never share an answer (docs/client.md) (default: off)",
    )
    own.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus metrics on http://ADDR:N/metrics while running "
        "(needs the metrics extra; docs/observability.md) (default: no metrics)",
    )
    own.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address --metrics-port listens on (default %(default)s)",
    )
    shared = parser.add_argument_group("one budget in Redis (docs/workers.md)")
    shared.add_argument(
        "--ledger",
        metavar="URL",
        help="keep the budget in Redis, redis://host:6379/0 (default: DIR/ledger.sqlite)",
    )
    shared.add_argument(
        "--ledger-name",
        metavar="NAME",
        help="the Redis ledger's name (default: none; needed with --ledger)",
    )
    # Retired with the Redis-streams fleet: refused, saying what to use instead.
    shared.add_argument("--workers-share", metavar="NAME", help=argparse.SUPPRESS)
    shared.add_argument(
        "--lease",
        type=_seconds,
        default=DEFAULT_LEASE,
        metavar="S",
        help="a dead worker's reservations are recovered after S seconds (default %(default)s)",
    )
    shared.add_argument(
        "--outage-window",
        type=_seconds,
        default=DEFAULT_OUTAGE_WINDOW,
        metavar="S",
        help="an unreachable Redis ledger is waited out for S seconds, then the run stops "
        "(default %(default)s)",
    )
    on_ray = parser.add_argument_group("beyond one machine on Ray (docs/workers.md)")
    on_ray.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the plan on a Ray cluster (ADDRESS, e.g. ray://head:10001 or auto; a local "
        "cluster without it); needs the ray extra and --ledger redis://... (default: one "
        "machine, no Ray)",
    )
    on_ray.add_argument(
        "--ray-actors",
        type=positive_count,
        metavar="N",
        help="stage actors on Ray (each runs concurrency/N requests; default: one per node)",
    )
    parser.set_defaults(handler=_handle)


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The plan the flags describe (a plan file with flag overrides, or flags alone)."""
    if args.plan:
        if args.prompts:
            raise ConfigurationError("give prompt files or --plan, not both")
        plan = load_plan(args.plan)
        return plan.with_overrides(
            model=args.model,
            budget=args.budget,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            exclude_below=args.exclude_below,
            target_output_tokens=args.target_output_tokens,
            ledger=args.ledger,
            ledger_name=args.ledger_name,
            max_premium=args.max_premium,
            response_cache=args.response_cache,
            distillable_text=args.distillable_text,
        )
    if not args.prompts:
        raise ConfigurationError("give a prompts file (PROMPTS.jsonl) or --plan FILE")
    if not args.model:
        raise ConfigurationError("--model is required without --plan")
    plan = Plan.single(
        args.prompts,
        model=args.model,
        budget=args.budget,
        name=args.name,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        exclude_below=args.exclude_below,
        target_output_tokens=args.target_output_tokens,
        max_requests=args.max_requests,
        max_premium=args.max_premium,
    )
    if args.ledger or args.ledger_name or args.response_cache or args.distillable_text is not None:
        plan = plan.with_overrides(
            ledger=args.ledger,
            ledger_name=args.ledger_name,
            response_cache=args.response_cache,
            distillable_text=args.distillable_text,
        )
    return plan


def _missing(args: argparse.Namespace) -> list[str]:
    """What a run without a plan file still needs, every one named at once."""
    if args.plan:
        return []
    missing = []
    if not args.prompts:
        missing.append("give a prompts file (PROMPTS.jsonl) or --plan FILE")
    if not args.model:
        missing.append("--model is required without --plan")
    if args.budget is None and args.add_budget is None:
        missing.append("--budget USD is required")
    return missing


def _handle(args: argparse.Namespace) -> int:
    if args.workers_share is not None:
        raise UsageError(
            "--workers-share was removed with the Redis-streams fleet: run the plan on Ray "
            "with --ray [ADDRESS] --ledger URL --ledger-name NAME (docs/workers.md)"
        )
    missing = _missing(args)
    if missing:
        raise UsageError("; ".join(missing))
    with as_usage():
        plan = plan_from_args(args)
    if args.add_budget is not None and args.budget is not None:
        raise UsageError("give --budget or --add-budget, not both")
    if args.add_budget is None and plan.budget is None:
        raise UsageError("--budget USD is required (or `budget:` in the plan file)")
    # The library checks the rest before --out is made (jobs/inputs.py): what it
    # refuses (JobRefused) is a usage error, exit 2, as these are.
    if args.ray is not None:
        if args.redo_truncated:
            raise UsageError(
                "--redo-truncated runs on one machine (it sends again only the answers cut at "
                "max_tokens): run it without --ray"
            )
        return _handle_ray(args, plan)
    console = make_console(sys.stderr)
    metrics = None if args.metrics_port is None else Metrics()
    try:
        outcome = run_plan_sync(
            plan,
            args.out,
            base_url=args.base_url,
            add_budget=args.add_budget,
            raise_budget=args.raise_budget,
            strict=args.strict,
            preflight=not args.no_preflight,
            verify=args.verify,
            verify_every=args.verify_every,
            account_horizon=args.own_key,
            lease=args.lease,
            outage_window=args.outage_window,
            batch=BatchOptions(
                poll=args.batch_poll,
                size=args.batch_size,
                lost_grace=args.batch_lost_grace,
                accept_disputed=args.batch_accept_disputed,
            ),
            metrics=metrics,
            add_inputs=args.add_inputs,
            redo_truncated=args.redo_truncated,
            job_key=args.job_key,
            job_key_hours=args.job_key_hours,
            hooks=RunHooks(
                on_start=lambda: _serve_metrics(args, metrics),
                on_batch_line=None if args.progress == "off" else _say,
                on_route_note=_say,
                on_batch_done=lambda part: _batch_done(args, plan, part),
                around_sync=lambda runner: _watched(
                    runner, console, args.progress, own_process=args.own_process
                ),
            ),
        )
    except PreflightFailed as exc:
        return _preflight_failed(exc)
    finally:
        if metrics is not None:
            metrics.close()
    last = outcome.summary or (outcome.batch.summary if outcome.batch is not None else None)
    if last is not None:
        note_exit_code(JobLayout(Path(args.out)).summary)
    if outcome.summary is not None:
        _report(args, plan, outcome.summary, make_console())
    return exit_code(outcome.reason)


@contextlib.asynccontextmanager
async def _watched(
    runner: JobRunner, console: Console, progress: ProgressMode, *, own_process: bool
) -> AsyncIterator[None]:
    """The sync route's run with a progress display; the first Ctrl-C stops, the
    second abandons."""
    if own_process:
        # Thousands of requests in flight for hours: the young generation is
        # collected ten times less often, the start-up heap never walked again
        # (docs/performance.md, "Where a request's CPU goes").
        tune_for_process()
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_interrupt() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            console.print(
                "Stopping: no new requests; letting those in flight finish "
                "(Ctrl-C again abandons them, counted at worst case)…"
            )
            runner.stop(StopReason.INTERRUPTED, "interrupted by Ctrl-C")
        else:
            console.print("Abandoning requests in flight…")
            runner.abandon()

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    loop.add_signal_handler(signal.SIGTERM, on_interrupt)
    display = asyncio.ensure_future(show_progress(runner, console, progress))
    try:
        yield
    finally:
        display.cancel()
        await asyncio.gather(display, return_exceptions=True)
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _serve_metrics(args: argparse.Namespace, metrics: Metrics | None) -> None:
    """``--metrics-port``: serve the metrics once the run is accepted, and say where."""
    if metrics is None:
        return
    metrics.serve(args.metrics_port, args.metrics_addr)
    host, port = metrics.address or (args.metrics_addr, args.metrics_port)
    print(f"Metrics: http://{host}:{port}/metrics", file=sys.stderr)


def _batch_done(args: argparse.Namespace, plan: Plan, part: BatchPart) -> None:
    """The end of the Batch API route's part: what it did, and what to do next."""
    for line in part.lines:
        print(line, file=sys.stderr)
    if part.summary is not None:
        print(f"Summary: {JobLayout(Path(args.out)).summary}", file=sys.stderr)
    summary = part.summary
    if part.needs_credits:
        again = resume_command(args.argv, _resume(args, plan, summary))
        print(f"To resume after adding credits: {again}", file=sys.stderr)
    elif part.reason is StopReason.BUDGET and summary is not None:
        print(
            f"To resume: {resume_command(args.argv, _resume(args, plan, summary))}", file=sys.stderr
        )
    elif part.stuck:
        # The sync part (if any) still runs; these prompts keep the exit code incomplete.
        print(
            f"Batch route: {part.stuck} prompts of route: batch datasets failed in every "
            "batch they went in; they are not written (route: auto would send them sync).",
            file=sys.stderr,
        )


def _preflight_failed(exc: PreflightFailed) -> int:
    print_report(exc.report, file=sys.stderr)
    print("provider-router: error: the preflight failed; no prompt was sent "
          "(--no-preflight skips it)", file=sys.stderr)  # fmt: skip
    return 1


def _resume(args: argparse.Namespace, plan: Plan, summary: RunSummary | None) -> Resume | None:
    """What the ``To resume:`` line carries: None when the command as given resumes."""
    if summary is None:
        return None
    resume = resume_budget(summary)
    same = args.add_budget is None and resume.budget == plan.budget
    if same and not resume.raise_limit and resume.shared_limit is None:
        return None
    return resume


def _report(
    args: argparse.Namespace,
    plan: Plan,
    summary: RunSummary,
    out: Console,
    *,
    on_ray: bool = False,
) -> None:
    """The end of a run: counted events, the tables, the hints (``on_ray``: where
    ``--redo-truncated`` does not run)."""
    # Counted events first (one line per kind), then the tables and the hints.
    report_events()
    render_summary(summary, out)
    # Plain prints: a command to copy must not be wrapped or styled.
    for note in summary.recovered:
        print(f"resumed: {note}", file=sys.stderr)
    if summary.verification is not None:
        for line in verification_lines(summary.verification, Path(args.out)):
            print(line, file=sys.stderr)
    if summary.reason not in (StopReason.COMPLETE, StopReason.TARGET_NOT_REACHED):
        again = resume_command(args.argv, _resume(args, plan, summary), summary.shared)
        limit = summary.spend_limit
        if limit is not None:
            # Which cap stopped it and what lifts it, then the command on its own line.
            print(
                f"Stopped by {limit.what} (HTTP {limit.status}): {limit.remedy}; then resume.",
                file=sys.stderr,
            )
        print(f"To resume: {again}", file=sys.stderr)
    if summary.truncated:
        print(_redo_hint(args, summary, None if on_ray else plan), file=sys.stderr)
    print(f"Summary: {JobLayout(Path(args.out)).summary}", file=sys.stderr)


def _redo_hint(args: argparse.Namespace, summary: RunSummary, plan: Plan | None) -> str:
    """How to send the cut answers again with a larger cap, and only them."""
    what = f"To send the {summary.truncated:,} cut answers again with a larger cap"
    if plan is None:
        return f"{what}: run the plan without --ray, with --max-tokens N --redo-truncated"
    cap = 2 * max(plan.params_for(d).max_tokens or 0 for d in plan.datasets)
    again = [a for a in args.argv if a != "--redo-truncated"]
    again = [*_with_option(again, "--max-tokens", str(cap)), "--redo-truncated"]
    kept = Path(args.out) / SET_ASIDE_DIR
    return (
        f"{what} (the others are kept and not paid again; the cut ones move to {kept}): "
        f"{shlex.join(['provider-router', *again])}"
    )


def _handle_ray(args: argparse.Namespace, plan: Plan) -> int:
    """``--ray``: the plan on a Ray cluster; the same checks, outputs, summary and report."""
    if args.add_budget is not None:
        plan = plan.with_overrides(
            budget=asyncio.run(added_budget(plan, args.out, args.add_budget))
        )
    if args.verify:
        raise UsageError(
            "--verify measures the providers of the sync route before a run on one machine; "
            "with --ray or a batch-route dataset run provider-router verify first instead"
        )
    own_job_key = plan.job_key if args.job_key is None else args.job_key
    check_run(
        plan,
        args.out,
        verify_every=args.verify_every,
        add_inputs=args.add_inputs,
        redo_truncated=args.redo_truncated,
        job_key=own_job_key,
        own_key=args.own_key is not None,
    )
    if plan.ledger is None:
        raise UsageError(
            "--ray needs a Redis ledger: --ledger redis://host:6379/0 --ledger-name NAME "
            "(the budget and the paid answers live there, shared by every actor)"
        )
    if own_job_key:
        # The key is made before Ray starts and disabled after it is gone; Ray's actors
        # get it split in two (ray/_secret.py), as any key.
        room = asyncio.run(
            budget_left(plan, args.out, lease=args.lease, outage_window=args.outage_window)
        )
        hours = plan.job_key_hours if args.job_key_hours is None else args.job_key_hours
        lease = JobKeyLease(args.out, budget_left=room, base_url=args.base_url, hours=hours)
        with lease.held() as key:
            return _run_on_ray(args, plan, key.secret)
    return _run_on_ray(args, plan, None)


def _run_on_ray(args: argparse.Namespace, plan: Plan, api_key: SecretStr | None) -> int:
    """``--ray``'s run itself (with the run's own key when it has one)."""
    from provider_router.ray.plan_run import RayPlanRun

    metrics = None if args.metrics_port is None else Metrics()
    _serve_metrics(args, metrics)
    console = make_console(sys.stderr)
    try:
        with as_usage():
            ray_run = RayPlanRun(
                plan,
                Path(args.out),
                address=args.ray or None,
                api_key=api_key,
                base_url=args.base_url,
                actors=args.ray_actors,
                strict=args.strict,
                preflight=not args.no_preflight,
                account_horizon=args.own_key,
                metrics=metrics,
                console=console,
                progress=args.progress,
                lease=args.lease,
                raise_budget=args.raise_budget,
            )
        with _ray_interrupts(ray_run, console):
            summary = ray_run.run()
    except KeyboardInterrupt:
        # The second Ctrl-C: the paid answers already written stay; Ray's actors died
        # with the requests in flight, which the next run recovers from the ledger.
        print("provider-router: interrupted", file=sys.stderr)
        print(f"To resume: {resume_command(args.argv)}", file=sys.stderr)
        return exit_code(StopReason.INTERRUPTED)
    except PreflightFailed as exc:
        return _preflight_failed(exc)
    finally:
        if metrics is not None:
            metrics.close()
    note_exit_code(JobLayout(Path(args.out)).summary)
    _report(args, plan, summary, make_console(), on_ray=True)
    return exit_code(summary.reason)


@contextlib.contextmanager
def _ray_interrupts(ray_run: Any, console: Console) -> Iterator[None]:
    """The first Ctrl-C (or SIGTERM) stops sending and lets requests in flight finish;
    the second stops at once (Ray's actors die with their requests: the next run
    recovers those at their real cost where a generation id was known)."""
    interrupts = 0

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            raise KeyboardInterrupt
        console.print(
            "Stopping: no new requests; letting those in flight finish "
            "(Ctrl-C again stops at once: the next run recovers them)…"
        )
        ray_run.stop()

    previous = {sig: signal.signal(sig, on_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command(
    argv: Sequence[str],
    resume: Resume | Decimal | None = None,
    shared: SharedLedger | None = None,
) -> str:
    """The command to run again: ``argv`` with the budget that resumes.

    ``resume`` (:func:`~provider_router.jobs.finish.resume_budget`; a plain amount is
    its ``budget``) puts its ``--budget`` in place of the one given and of any
    ``--add-budget`` (which would add again), adds ``--raise-budget`` when the raise
    needs it, and, when a shared ledger's limit must rise first, the ``ledger topup``
    of ``shared`` before it.
    """
    args = list(argv)
    if isinstance(resume, Decimal):
        resume = Resume(resume)
    if resume is None:
        return shlex.join(["provider-router", *args])
    args = _without_option(args, "--add-budget")
    args = _with_option(args, "--budget", decimal_str(resume.budget))
    if resume.raise_limit and "--raise-budget" not in args:
        args.append("--raise-budget")
    command = shlex.join(["provider-router", *args])
    if resume.shared_limit is not None and shared is not None:
        command = f"{shared.topup(resume.shared_limit)} && {command}"
    return command


def _without_option(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (``--flag V`` or ``--flag=V``)."""
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item == flag:
            skip = True
        elif not item.startswith(flag + "="):
            out.append(item)
    return out


def _with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (``--flag V`` or ``--flag=V``), or added."""
    out: list[str] = []
    replaced = False
    skip = False
    for index, item in enumerate(argv):
        if skip:
            skip = False
            continue
        if item == flag and index + 1 < len(argv):
            out += [flag, value]
            replaced = skip = True
        elif item.startswith(flag + "="):
            out.append(f"{flag}={value}")
            replaced = True
        else:
            out.append(item)
    if not replaced:
        out += [flag, value]
    return out
