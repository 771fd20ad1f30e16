"""A plan's batch-route datasets: which they are, and running them into the job directory.

:func:`batch_datasets` resolves each dataset's ``route`` (``batch``; ``auto`` where an
allowed batch endpoint exists, no deadline is sooner than the window, the ``:batch``
price is not above the live sync price and the Batch API answers for the key) against
the model's ``:batch`` listing. :func:`run_plan_batches` runs those datasets through
:class:`~provider_router.jobs.batch_api.route.BatchRouteRun` with the job's own journal
and ledger (the same files the sync runner uses, so one budget covers both), watched by
the observers it is given; :func:`~provider_router.jobs.run.run_plan` calls it, with the
standard ones, before the sync runner takes the other datasets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Final

from provider_router._constants import ENV_API_KEY
from provider_router._exceptions import ConfigurationError, JobRefused
from provider_router._http.session import HttpClient
from provider_router.catalog.fetch import Catalog
from provider_router.client.metrics import Metrics
from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.body import params_problem
from provider_router.jobs.batch_api.route import BatchRouteResult, BatchRouteRun
from provider_router.jobs.budget import apply_choice, choose_limit
from provider_router.jobs.events import RunObserver
from provider_router.jobs.identity import check_identity
from provider_router.jobs.redo import redo_truncated as set_aside_truncated
from provider_router.jobs.revisions import revise_plan
from provider_router.jobs.snapshots import BatchSampled
from provider_router.jobs.store._layout import NOT_IN_INPUTS_FILE, QUARANTINED_FILE, JobLayout
from provider_router.jobs.store.job_ledger import open_job_ledger
from provider_router.jobs.store.journal import FileJournal
from provider_router.planning.compare import BATCH_WINDOW_SECONDS
from provider_router.planning.plan import Plan
from provider_router.planning.prompts import Prompt, PromptReader
from provider_router.routing.batch_endpoints import BatchRoute, batch_route, price_against_sync
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload
from provider_router.routing.route_plan import estimate_prompt_tokens

__all__ = [
    "PRICE_SAMPLE_PROMPTS",
    "PlanBatches",
    "batch_datasets",
    "describe",
    "run_plan_batches",
    "without_datasets",
    "write_report",
]


@dataclass(frozen=True, slots=True)
class PlanBatches:
    """The datasets a plan sends as batches, the endpoint they are pinned to, and one
    sentence for each dataset that asked for the Batch API and was sent sync instead
    (or kept batch against a cheaper sync price)."""

    names: tuple[str, ...]
    route: BatchRoute | None
    notes: tuple[str, ...] = ()


PRICE_SAMPLE_PROMPTS: Final = 100
"""Prompts of a dataset read to price its mean prompt on both routes."""


async def batch_datasets(
    plan: Plan,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    probe: bool = True,
) -> PlanBatches:
    """Which datasets take the batch route.

    ``auto`` takes batch where an allowed batch endpoint exists, no deadline is sooner
    than the window, its generation fields pass the endpoint's limits, the pinned
    ``:batch`` price is not above the live sync price, and (``probe``) the Batch API
    answers for the key: one ``GET /batches?limit=1``, a 404 meaning unreachable.
    Each ``auto`` dataset sent sync for one of the last three gets a sentence.

    Raises:
        JobRefused: a dataset asks for ``batch`` and the model has no batch endpoint the
            plan's policy allows (the message names the plan file and line, and why;
            nothing is sent).
        ConfigurationError: a ``batch`` dataset's generation fields would fail every
            batch, or the Batch API is unreachable for the key (the message says why).
    """
    asking = [d for d in plan.datasets if d.route != "sync"]
    if not asking:
        return PlanBatches((), None)
    policy = ProviderPolicy(**plan.policy)
    async with Catalog(base_url=base_url) as catalog:
        listing = await catalog.batch_endpoints(plan.model)
        sync_listing = await catalog.endpoints(plan.model) if listing.endpoints else None
    max_tokens = max(plan.params_for(d).max_tokens or 1 for d in asking)
    route = batch_route(
        listing,
        policy,
        Workload(prompt_tokens=0, completion_tokens=max_tokens),
        model_id=plan.model,
    )
    names: list[str] = []
    notes: list[str] = []
    for dataset in asking:
        if not route.available:
            if dataset.route == "batch":
                where = plan.where(dataset.name, "route")
                raise JobRefused(
                    ("" if where is None else f"{where}: ")
                    + f"dataset {dataset.name!r} asks for route: batch, but {route.reason}. "
                    "Give it route: sync, or route: auto (batch only where the policy allows "
                    "a batch endpoint); nothing was sent"
                )
            continue
        deadline = dataset.deadline_hours
        if (
            dataset.route == "auto"
            and deadline is not None
            and deadline * 3600 < (BATCH_WINDOW_SECONDS)
        ):
            continue
        assert route.endpoint is not None
        params = plan.params_for(dataset).request_params()
        problem = params_problem(route.endpoint, params)
        if problem is not None:
            if dataset.route == "batch":
                raise ConfigurationError(
                    f"dataset {dataset.name!r} asks for route batch, but every line would "
                    f"fail its batch: {problem}"
                )
            notes.append(
                f"dataset {dataset.name!r} goes sync: every line would fail a batch ({problem})"
            )
            continue
        assert sync_listing is not None
        price = price_against_sync(route, sync_listing, policy, _workload(dataset, params))
        if price.sync_cheaper:
            notes.append(price.sentence(dataset.name, dataset.route))
            if dataset.route == "auto":
                continue
        names.append(dataset.name)
    if names and probe and not await _reachable(base_url, api_key):
        asked = [n for n in names if plan.dataset(n).route == "batch"]
        if asked:
            raise ConfigurationError(
                f"dataset {asked[0]!r} asks for route batch, but the Batch API answers 404 "
                "for this key (GET /batches): it is not available to it; use route: auto "
                "(sent synchronously then) or sync"
            )
        notes.extend(
            f"dataset {name!r} goes sync: the Batch API answers 404 for this key "
            "(GET /batches), so it is not available to it"
            for name in names
        )
        names = []
    return PlanBatches(tuple(names), route if names else None, tuple(notes))


def _workload(dataset: Any, params: dict[str, Any]) -> Workload:
    """The shape both routes are priced at: the mean prompt of the dataset's first
    prompts (about four bytes a token) and its ``max_tokens`` (what is reserved)."""
    sizes = [
        estimate_prompt_tokens(p.messages) // 4
        for p in islice(PromptReader(list(dataset.inputs)), PRICE_SAMPLE_PROMPTS)
    ]
    prompt = sum(sizes) // len(sizes) if sizes else 0
    return Workload(prompt_tokens=prompt, completion_tokens=int(params["max_tokens"]))


async def _reachable(base_url: str | None, api_key: str | None) -> bool:
    """Whether the Batch API answers for the key (one probe; without a key there is
    nothing to probe with, and the run refuses that on its own)."""
    key = api_key or os.environ.get(ENV_API_KEY)
    if not key:
        return True
    async with HttpClient(base_url, key) as http:
        return await BatchApi(http).reachable()


def without_datasets(plan: Plan, names: tuple[str, ...]) -> Plan | None:
    """The plan with ``names`` taken out (None: nothing left for the sync runner)."""
    left = tuple(d for d in plan.datasets if d.name not in names)
    return plan.model_copy(update={"datasets": left}) if left else None


async def run_plan_batches(
    plan: Plan,
    out: str | Path,
    batches: PlanBatches,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    api_factory: Callable[[HttpClient], BatchApi] = BatchApi,
    metrics: Metrics | None = None,
    observers: Sequence[RunObserver] = (),
    redo_truncated: bool = False,
    raise_budget: bool = False,
    **options: Any,
) -> BatchRouteResult:
    """Run the batch-route datasets of ``plan`` into ``out`` (``options``: see BatchRouteRun;
    ``api_factory``: makes its Batch API calls, e.g. :meth:`BatchWatch.api`).

    ``observers`` watch the route (:class:`~provider_router.jobs.snapshots.BatchSampled`)
    from its start to its last collect, and are told after each round of polls, so a
    collect's spend shows at once; none by default. ``redo_truncated``: first move the
    answers of every dataset of ``plan`` cut at a ``max_tokens`` below the plan's out of
    the outputs, so they are sent again (:mod:`provider_router.jobs.redo`).
    :func:`~provider_router.jobs.observe.standard.standard_observers` (what
    :func:`~provider_router.jobs.run.run_plan` passes) sample the ledger into
    ``DIR/timeline.ndjson`` and ``metrics`` every interval and after each round.
    The plan's budget is the job's as on the sync route (:mod:`provider_router.jobs.budget`;
    ``raise_budget``: it may raise a limit set by ``ledger topup``).

    Raises:
        JobRefused: the plan's budget is below what the job spent, or raises a limit
            set outside its runs without ``raise_budget`` (nothing was changed or sent).
    """
    watching = tuple(observers)
    if batches.route is None or not batches.names:
        return BatchRouteResult()
    if plan.budget is None:
        raise ConfigurationError("the batch route needs a budget")
    if plan.ledger is not None:
        raise ConfigurationError(
            "the batch route runs on the job's own ledger: a shared ledger takes route: sync "
            "for now"
        )
    directory = Path(out)
    chosen = [d for d in plan.datasets if d.name in batches.names]
    journal = FileJournal.read(directory)
    try:
        # Refused before anything is written, if this run would change what the job answers.
        identity = check_identity(plan, directory, add_inputs=True, redo_truncated=redo_truncated)
        path = JobLayout(directory).ledger
        ledger = await open_job_ledger(path, plan.budget, journal, None)
        try:
            # Chosen before the journal begins: a refusal leaves every file as it was.
            choice = choose_limit(
                plan.budget,
                await ledger.snapshot(),
                journal.budget,
                raise_limit=raise_budget,
                where=str(path),
            )
            journal.begin()
            said = await apply_choice(ledger, choice, journal)
            notes = identity.write(directory)
            moved = set_aside_truncated(journal, plan, directory) if redo_truncated else []
            key = api_key or os.environ.get(ENV_API_KEY)
            async with HttpClient(base_url, key) as http:
                runner = BatchRouteRun(
                    api=api_factory(http),
                    ledger=ledger,
                    journal=journal,
                    directory=directory,
                    route=batches.route,
                    params=_params(plan, chosen[0]),
                    dataset_params={d.name: _params(plan, d) for d in chosen},
                    limits={d.name: (d.target_output_tokens, d.max_requests) for d in chosen},
                    sync_after=[d.name for d in chosen if d.route == "auto"],
                    **options,
                )
                runner.result.events += moved
                prompts: dict[str, list[Prompt]] = {
                    d.name: list(PromptReader(list(d.inputs))) for d in chosen
                }
                # Done prompts whose content changed under their id: moved aside, sent again.
                notes += revise_plan(
                    plan.model_copy(update={"datasets": tuple(chosen)}),
                    journal,
                    directory,
                    prompts=prompts,
                )
                runner.result.events.extend(notes)
                sampled = BatchSampled(
                    directory,
                    budget=choice.budget,
                    ledger=ledger,
                    journal=journal,
                    batches=runner.batches,
                    datasets={d.name: _most(d, len(prompts[d.name])) for d in chosen},
                    metrics=metrics,
                )
                sampled.ledger_state = await ledger.snapshot()  # the first line has money

                async def each_round() -> None:
                    for observer in watching:
                        await observer.on_progress(sampled)

                runner.result.events.extend(batches.notes)
                if watching:
                    runner.on_round = each_round
                try:
                    for observer in watching:
                        await observer.on_start(sampled)
                    result = await runner.run(prompts)
                    result.events[:0] = said
                finally:
                    try:
                        for observer in watching:
                            await observer.on_dispatch_end(sampled)
                    finally:
                        runner.close()
                write_report(directory, result)
                return result
        finally:
            await ledger.close()
    finally:
        journal.close("batch route")


def write_report(directory: Path, result: BatchRouteResult) -> Path:
    """``DIR/batches.json``: what the last run of the batch route did."""
    path = JobLayout(directory).batches_report
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    return path


def _most(dataset: Any, prompts: int) -> tuple[int | None, int | None]:
    """(prompts it will complete at most, its output-token target), for the timeline."""
    cap = dataset.max_requests
    return (prompts if cap is None else min(prompts, cap)), dataset.target_output_tokens


def _params(plan: Plan, dataset: Any) -> dict[str, Any]:
    params = plan.params_for(dataset).request_params()
    params.pop("stream", None)
    return params


def describe(result: BatchRouteResult) -> list[str]:
    """The batch route's lines for the end of ``provider-router run``."""
    lines = [
        f"Batch route: {result.submitted} batches submitted, {result.collected} collected, "
        f"{result.lines_done} lines written ({result.lines_failed} failed lines, free), "
        f"${result.cost} billed; {result.pending} batches still pending."
    ]
    if result.found_after_lost_202:
        lines.append(
            f"Batch route: {result.found_after_lost_202} batches whose 202 was lost were found "
            "and collected (nothing sent twice)."
        )
    if result.not_in_inputs:
        lines.append(
            f"Batch route: {result.not_in_inputs} paid answers to prompts no longer in the "
            f"inputs were kept in {NOT_IN_INPUTS_FILE} (not in the outputs)."
        )
    if result.earlier_content:
        lines.append(
            f"Batch route: {result.earlier_content} paid answers to an earlier content of "
            f"prompts edited while their batch ran were kept in {NOT_IN_INPUTS_FILE} (never "
            "under the new text); the new text is sent as a new prompt."
        )
    if result.quarantined:
        lines.append(
            f"Batch route: {result.quarantined} paid answers served by a provider the policy "
            f"excludes were quarantined in {QUARANTINED_FILE} (not data; their prompts go "
            "again)."
        )
    if result.stop is not None:
        lines.append(f"Batch route stopped: {result.stop}.")
    lines.extend(f"Batch route: {event}." for event in result.events)
    return lines
