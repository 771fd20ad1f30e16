"""``provider-router run``: generate a plan's outputs, resumably, within a budget.

::

    provider-router run PROMPTS.jsonl --out DIR --model M (--budget USD | --add-budget USD) \\
        [--max-tokens N] [--concurrency C] [--exclude-below int4] \\
        [--target-output-tokens N] [--max-requests N] [--temperature T] \\
        [--plan plan.yaml] [--strict] [--base-url URL] [--progress auto|rich|plain|off] \\
        [--ledger redis://HOST:6379/0 --ledger-name NAME]
        [--ray [ADDRESS] [--ray-actors N]]

Everything the job leaves lives in DIR (outputs, journal, ledger, ``summary.json``,
``report.html``); the same command again resumes, with a higher ``--budget`` after a
top-up. The API key comes from ``OPENROUTER_API_KEY``, never from a flag (flags show up
in process listings). The command maps its flags onto
:func:`provider_router.jobs.run_plan` (with ``--ray``, onto
:class:`provider_router.ray.plan_run.RayPlanRun`, docs/workers.md) and prints.
Exit codes: 0 done, 1 error, 2 usage, 3 budget used up, 4 OpenRouter credits
exhausted, 5 finished with failed prompts (re-run to retry them), 130 interrupted.
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

from rich.console import Console

from provider_router._collector import tune_for_process
from provider_router._exceptions import ConfigurationError, PreflightFailed
from provider_router._format import decimal_str
from provider_router.cli._errors import UsageError, as_usage
from provider_router.cli._exit_codes import exit_code, note_exit_code
from provider_router.cli._logging import report_events
from provider_router.cli._options import PRECISIONS, budget_usd, parse_count, positive_count
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
from provider_router.jobs.inputs import check_run
from provider_router.jobs.observe.drift_view import verification_lines
from provider_router.jobs.observe.live import ProgressMode, show_progress
from provider_router.jobs.observe.summary_view import render_summary
from provider_router.jobs.run import added_budget
from provider_router.jobs.store._layout import JobLayout
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


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {value!r}")
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
        description=(
            "Send every prompt of one or more datasets through the routed, budgeted client, "
            "writing DIR/<dataset>.jsonl. Re-running the same command resumes; a higher "
            "--budget continues after a top-up. Exit codes: 0 done, 3 budget used up, "
            "4 credits exhausted, 5 some prompts failed, 6 a target not reached (too few prompts), "
            "130 interrupted."
        ),
    )
    parser.add_argument("prompts", nargs="*", metavar="PROMPTS.jsonl", help="prompt files")
    parser.add_argument("--out", required=True, metavar="DIR", help="job directory")
    parser.add_argument("--plan", metavar="FILE", help="plan file (.yaml/.yml/.toml)")
    parser.add_argument("--model", help="OpenRouter model id, e.g. moonshotai/kimi-k2.5")
    parser.add_argument("--budget", type=budget_usd, metavar="USD", help="hard spending cap")
    parser.add_argument(
        "--add-budget",
        type=budget_usd,
        metavar="USD",
        help="raise the job's budget by USD: its ledger's current limit plus USD (to resume)",
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
        "--exclude-below",
        choices=PRECISIONS,
        metavar="Q",
        help=f"lowest precision allowed ({', '.join(PRECISIONS)})",
    )
    parser.add_argument(
        "--target-output-tokens", type=positive_count, metavar="N", help="stop each dataset at N"
    )
    parser.add_argument("--max-requests", type=positive_count, metavar="N", help="cap per dataset")
    parser.add_argument("--temperature", type=float, metavar="T", help="sampling temperature")
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
        "--strict", action="store_true", help="any bad input line is fatal before spending"
    )
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight (key valid and not used up, credits, model exists, policy "
        "allows an endpoint, one 1-token request pinned to the top-ranked provider, paid from "
        "the job's budget)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="before any prompt, measure each allowed provider against the model's reference "
        "(provider-router verify, canaries from the first dataset, a few cents from the "
        "job's budget; DIR/verify.json) and send nothing to those that fail; then again "
        "every --verify-every rows: one that fails is excluded from then on and the rows it "
        "served since its last passing check are flagged (drift_flagged in the outputs)",
    )
    parser.add_argument(
        "--verify-every",
        type=parse_count,
        metavar="N",
        help=f"with --verify: rows between two checks during the run (default: the plan's "
        f"verify_every, else {DEFAULT_VERIFY_EVERY:,}; 0: only before the run)",
    )
    parser.add_argument("--base-url", help="OpenRouter API root (default: OPENROUTER_BASE_URL)")
    parser.add_argument(
        "--batch-poll",
        type=_seconds,
        default=_BATCH.poll,
        metavar="S",
        help="route: batch datasets: seconds before the first poll of a batch (doubles up "
        "to 300 while nothing changes; default 5)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_count,
        default=_BATCH.size,
        metavar="N",
        help="route: batch datasets: requests per batch (at most 5,000, the Batch API's limit)",
    )
    parser.add_argument(
        "--batch-lost-grace",
        type=_seconds,
        default=_BATCH.lost_grace,
        metavar="S",
        help="route: batch datasets: seconds after a submit whose answer was lost (and "
        "that may have reached OpenRouter) before its prompts go again if no listed batch "
        "carries them (default 86520: the 24 h window and 2 min; less may pay twice)",
    )
    parser.add_argument(
        "--batch-accept-disputed",
        action="store_true",
        help="route: batch datasets: the disputed batch bills on record were checked on "
        "the dashboard and their booked worst cases stand: send batches again",
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "rich", "plain", "off"],
        default="auto",
        help="live table on a terminal (auto), plain log lines, or nothing",
    )
    parser.add_argument(
        "--own-key",
        nargs="?",
        const=-1.0,
        type=float,
        metavar="S",
        help="the API key is this job's own (nothing else spends through it): bound "
        "worst-case charges of cut requests by the key's usage (GET /key), S seconds "
        "after each was given up on (default: its stream deadline; docs/ledger.md)",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus metrics on http://ADDR:N/metrics while running "
        "(needs the metrics extra; docs/observability.md)",
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address --metrics-port listens on (default %(default)s)",
    )
    shared = parser.add_argument_group("one budget in Redis (docs/workers.md)")
    shared.add_argument(
        "--ledger", metavar="URL", help="keep the budget in Redis (redis://host:6379/0)"
    )
    shared.add_argument(
        "--ledger-name", metavar="NAME", help="the Redis ledger's name (needed with --ledger)"
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
        "cluster without it); needs the ray extra and --ledger redis://...",
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
    )
    if args.ledger or args.ledger_name or args.distillable_text is not None:
        plan = plan.with_overrides(
            ledger=args.ledger,
            ledger_name=args.ledger_name,
            distillable_text=args.distillable_text,
        )
    return plan


def _handle(args: argparse.Namespace) -> int:
    if args.workers_share is not None:
        raise UsageError(
            "--workers-share was removed with the Redis-streams fleet: run the plan on Ray "
            "with --ray [ADDRESS] --ledger URL --ledger-name NAME (docs/workers.md)"
        )
    with as_usage():
        plan = plan_from_args(args)
    if args.add_budget is not None and args.budget is not None:
        raise UsageError("give --budget or --add-budget, not both")
    if args.add_budget is None and plan.budget is None:
        raise UsageError("--budget USD is required (or `budget:` in the plan file)")
    # The library checks the rest before --out is made (jobs/inputs.py): what it
    # refuses (JobRefused) is a usage error, exit 2, as these are.
    if args.ray is not None:
        return _handle_ray(args, plan)
    console = make_console(sys.stderr)
    metrics = None if args.metrics_port is None else Metrics()
    try:
        outcome = run_plan_sync(
            plan,
            args.out,
            base_url=args.base_url,
            add_budget=args.add_budget,
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
            hooks=RunHooks(
                on_start=lambda: _serve_metrics(args, metrics),
                on_batch_line=None if args.progress == "off" else _say,
                on_batch_done=lambda part: _batch_done(args, part),
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
        _report(args, outcome.summary, make_console())
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


def _batch_done(args: argparse.Namespace, part: BatchPart) -> None:
    """The end of the Batch API route's part: what it did, and what to do next."""
    for line in part.lines:
        print(line, file=sys.stderr)
    if part.summary is not None:
        print(f"Summary: {JobLayout(Path(args.out)).summary}", file=sys.stderr)
    if part.needs_credits:
        print(f"To resume after adding credits: {' '.join(args.argv)}", file=sys.stderr)
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


def _report(args: argparse.Namespace, summary: RunSummary, out: Console) -> None:
    """The end of a run: counted events, the tables, the hints."""
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
        print(f"To resume: {resume_command(args.argv, summary.budget_to_resume)}", file=sys.stderr)
    print(f"Summary: {JobLayout(Path(args.out)).summary}", file=sys.stderr)


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
    check_run(plan, args.out, verify_every=args.verify_every)
    if plan.ledger is None:
        raise UsageError(
            "--ray needs a Redis ledger: --ledger redis://host:6379/0 --ledger-name NAME "
            "(the budget and the paid answers live there, shared by every actor)"
        )
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
                base_url=args.base_url,
                actors=args.ray_actors,
                strict=args.strict,
                preflight=not args.no_preflight,
                account_horizon=args.own_key,
                metrics=metrics,
                console=console,
                progress=args.progress,
                lease=args.lease,
            )
        with _ray_interrupts(ray_run, console):
            summary = ray_run.run()
    except KeyboardInterrupt:
        # The second Ctrl-C: the paid answers already written stay; Ray's actors died
        # with the requests in flight, which the next run recovers from the ledger.
        print("provider-router: interrupted", file=sys.stderr)
        print(f"To resume: {shlex.join(['provider-router', *args.argv])}", file=sys.stderr)
        return exit_code(StopReason.INTERRUPTED)
    except PreflightFailed as exc:
        return _preflight_failed(exc)
    finally:
        if metrics is not None:
            metrics.close()
    note_exit_code(JobLayout(Path(args.out)).summary)
    _report(args, summary, make_console())
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


def resume_command(argv: Sequence[str], budget: Decimal | None = None) -> str:
    """The command to run again; with ``budget`` (after a budget stop, the budget that
    finishes the plan) it carries that ``--budget``."""
    args = list(argv)
    if budget is not None:
        args = _with_option(args, "--budget", decimal_str(budget))
    return shlex.join(["provider-router", *args])


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
