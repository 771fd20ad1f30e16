"""A plan run to its end, exactly once, within its budget: ``provider-router run`` as a library.

:func:`run_plan` does everything the command does for a plan and a job directory
(docs/batch.md, "From Python"); :class:`JobRunner` is its sync route alone. The
sub-packages are the job directory (``store``), OpenRouter's Batch API route
(``batch_api``) and what an operator sees (``observe``). Names load on first use, so
``import provider_router.jobs`` stays cheap.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from provider_router._exceptions import JobRefused

if _typing.TYPE_CHECKING:
    from provider_router.jobs.counter import Counter
    from provider_router.jobs.inputs import check_inputs, check_out, check_run
    from provider_router.jobs.run import (
        BatchOptions,
        BatchPart,
        RunHooks,
        RunOutcome,
        added_budget,
        open_shared_ledger,
        run_plan,
        run_plan_sync,
    )
    from provider_router.jobs.runner import JobRunner
    from provider_router.jobs.summary import DatasetReport, RunSummary, StopReason

_LAZY: dict[str, str] = {
    "BatchOptions": "provider_router.jobs.run",
    "BatchPart": "provider_router.jobs.run",
    "Counter": "provider_router.jobs.counter",
    "DatasetReport": "provider_router.jobs.summary",
    "JobRunner": "provider_router.jobs.runner",
    "RunHooks": "provider_router.jobs.run",
    "RunOutcome": "provider_router.jobs.run",
    "RunSummary": "provider_router.jobs.summary",
    "StopReason": "provider_router.jobs.summary",
    "added_budget": "provider_router.jobs.run",
    "check_inputs": "provider_router.jobs.inputs",
    "check_out": "provider_router.jobs.inputs",
    "check_run": "provider_router.jobs.inputs",
    "open_shared_ledger": "provider_router.jobs.run",
    "run_plan": "provider_router.jobs.run",
    "run_plan_sync": "provider_router.jobs.run",
}

__all__ = [
    "BatchOptions",
    "BatchPart",
    "Counter",
    "DatasetReport",
    "JobRefused",
    "JobRunner",
    "RunHooks",
    "RunOutcome",
    "RunSummary",
    "StopReason",
    "added_budget",
    "check_inputs",
    "check_out",
    "check_run",
    "open_shared_ledger",
    "run_plan",
    "run_plan_sync",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'provider_router.jobs' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
