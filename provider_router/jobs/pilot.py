"""A pilot that is the job's own first requests: ``project PLAN --pilot N --out DIR``.

A pilot measures response lengths on a uniform sample of the plan's prompts. Run
here, it is not a side trip paid outside the budget: the sampled prompts go
through the :class:`~provider_router.jobs.runner.JobRunner` of the job directory
(``only=`` the sample), so every request reserves from the job's ledger under the
plan's budget, and every answer is journaled and written as a first result of its
dataset. ``provider-router run`` on the same directory then sends only the rest:
nothing paid for is thrown away or sent twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

from provider_router._exceptions import ConfigurationError
from provider_router.client.results import Usage
from provider_router.jobs.events import RunObserver
from provider_router.jobs.inputs import check_run
from provider_router.jobs.runner import JobRunner
from provider_router.jobs.store._layout import JobLayout
from provider_router.jobs.store.outputs import TRUNCATED_FINISH, read_outputs
from provider_router.jobs.summary import RunSummary
from provider_router.planning.plan import Plan
from provider_router.planning.workload_stats import PilotResult, pilot_result, sample_prompts

__all__ = ["pilot_into_job"]


async def pilot_into_job(
    plan: Plan,
    out: str | Path,
    n: int,
    *,
    seed: int = 0,
    concurrency: int = 16,
    base_url: str | None = None,
    api_key: str | None = None,
    confidence: float = 0.95,
    observers: Sequence[RunObserver] = (),
) -> tuple[PilotResult, RunSummary]:
    """Send a uniform sample of ``n`` of the plan's prompts as the job's first requests.

    The same share from every dataset (``ceil(n / datasets)``), sampled within it
    with ``seed + index``; each with its dataset's own ``max_tokens`` and fields.
    ``observers`` watch its run as the job's runner's
    (:func:`~provider_router.jobs.observe.standard.standard_observers`: the job
    directory's timeline and report start with the pilot; none by default).

    Returns:
        What the pilot measured (from the answers it wrote) and the runner's
        summary (its spend is in ``summary.spent``, on the job's ledger).

    Raises:
        JobRefused: what :func:`~provider_router.jobs.run_plan` refuses before it starts
            (no budget, a prompt file without a usable line, no API key, ``out`` not
            writable), checked before anything is sent.
        ConfigurationError: fewer than two answers came back (the message says why
            the others did not).
    """
    check_run(plan, out, api_key=api_key)
    out = Path(out)
    share = math.ceil(n / len(plan.datasets))
    only: dict[str, set[str]] = {}
    for index, dataset in enumerate(plan.datasets):
        sample, _ = sample_prompts(dataset.inputs, share, seed=seed + index)
        only[dataset.name] = {prompt.id for prompt in sample}
    runner = JobRunner(
        plan.with_overrides(concurrency=concurrency),
        out,
        base_url=base_url,
        api_key=api_key,
        only=only,
        observers=observers,
    )
    summary = await runner.run()
    usages: list[Usage] = []
    providers: dict[str, int] = {}
    cost = floor = Decimal(0)
    truncated = 0
    for name, ids in only.items():
        path = JobLayout(out).output(name)
        if not path.exists():
            continue
        for _, record in read_outputs(path):
            if record["id"] not in ids:
                continue  # an answer of an earlier run of this job, not of the sample
            usage = Usage.from_json(record["usage"])
            if usage is None:
                continue
            usages.append(usage)
            provider = record["provider"] or "unknown"
            providers[provider] = providers.get(provider, 0) + 1
            cost += Decimal(record["cost"])
            truncated += record.get("finish_reason") == TRUNCATED_FINISH
            floor += Decimal(record.get("floor_cost") or record["cost"])
    sent = sum(len(ids) for ids in only.values())
    try:
        result = pilot_result(
            usages,
            providers,
            cost,
            max(sent - len(usages), 0),
            confidence=confidence,
            truncated=truncated,
            floor_cost=floor,
        )
    except ConfigurationError as exc:
        raise ConfigurationError(_why_failed(summary, str(exc))) from None
    return result, summary


def _why_failed(summary: RunSummary, said: str) -> str:
    """``said`` (the pilot came back short) after its cause: the run's stop, or its
    failures by kind, so the reader meets the cause first."""
    kinds: dict[str, int] = {}
    for dataset in summary.datasets:
        for kind, count in dataset.run.failures_by_kind.items():
            kinds[kind] = kinds.get(kind, 0) + count
    causes = [summary.message.strip().rstrip(".")] if summary.message.strip() else []
    if kinds:
        causes.append("failures: " + ", ".join(f"{n} × {k}" for k, n in sorted(kinds.items())))
    if not causes:
        return said
    return f"{'; '.join(causes)}. So {said}"
