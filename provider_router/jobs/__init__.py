"""A plan run to its end, exactly once, within its budget: ``provider-router run`` as a library.

:func:`run_plan` does everything the command does for a plan and a job directory
(docs/batch.md, "From Python") and returns one :class:`RunOutcome`; :class:`JobRunner`
is its sync route alone. The job directory holds the journal (:class:`FileJournal`) and
the outputs (:func:`read_outputs`, :func:`merge_outputs`, :func:`export_conversations`,
each row's :func:`request_digest`; docs/output.md); a run's observers
(:class:`RunObserver`, :func:`standard_observers`) write what an operator reads besides.
Names load on first use, so ``import provider_router.jobs`` stays cheap.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from provider_router import _deprecated

if _typing.TYPE_CHECKING:
    from provider_router.jobs.events import ObservedRun, RunObserver
    from provider_router.jobs.observe.standard import standard_observers
    from provider_router.jobs.pilot import pilot_into_job
    from provider_router.jobs.run import (
        BatchOptions,
        BatchPart,
        RunHooks,
        RunOutcome,
        run_plan,
        run_plan_sync,
    )
    from provider_router.jobs.runner import JobRunner
    from provider_router.jobs.snapshots import DatasetProgress, RunProgress
    from provider_router.jobs.store.digest import request_digest
    from provider_router.jobs.store.journal import DatasetTally, FileJournal, Journal, LostRequest
    from provider_router.jobs.store.outputs import (
        DatasetMerge,
        ExportReport,
        MergeReport,
        OutputRecord,
        OutputUsage,
        export_conversations,
        merge_outputs,
        read_outputs,
    )
    from provider_router.jobs.summary import DatasetReport, RunSummary, StopReason

# Loaded on first use (PEP 562): `import provider_router.jobs` loads neither the
# runner nor the Router, rich or sqlite3 behind it.
_LAZY: dict[str, str] = {
    "BatchOptions": "provider_router.jobs.run",
    "BatchPart": "provider_router.jobs.run",
    "DatasetMerge": "provider_router.jobs.store.outputs",
    "DatasetProgress": "provider_router.jobs.snapshots",
    "DatasetReport": "provider_router.jobs.summary",
    "DatasetTally": "provider_router.jobs.store.journal",
    "ExportReport": "provider_router.jobs.store.outputs",
    "FileJournal": "provider_router.jobs.store.journal",
    "JobRunner": "provider_router.jobs.runner",
    "Journal": "provider_router.jobs.store.journal",
    "LostRequest": "provider_router.jobs.store.journal",
    "MergeReport": "provider_router.jobs.store.outputs",
    "ObservedRun": "provider_router.jobs.events",
    "OutputRecord": "provider_router.jobs.store.outputs",
    "OutputUsage": "provider_router.jobs.store.outputs",
    "RunHooks": "provider_router.jobs.run",
    "RunObserver": "provider_router.jobs.events",
    "RunOutcome": "provider_router.jobs.run",
    "RunProgress": "provider_router.jobs.snapshots",
    "RunSummary": "provider_router.jobs.summary",
    "StopReason": "provider_router.jobs.summary",
    "export_conversations": "provider_router.jobs.store.outputs",
    "merge_outputs": "provider_router.jobs.store.outputs",
    "pilot_into_job": "provider_router.jobs.pilot",
    "read_outputs": "provider_router.jobs.store.outputs",
    "request_digest": "provider_router.jobs.store.digest",
    "run_plan": "provider_router.jobs.run",
    "run_plan_sync": "provider_router.jobs.run",
    "standard_observers": "provider_router.jobs.observe.standard",
}

# Old names: they resolve for one more release, with a DeprecationWarning.
_RENAMED: dict[str, str] = {
    "BatchRunner": "provider_router.jobs.JobRunner",
}

__all__ = [
    "BatchOptions",
    "BatchPart",
    "DatasetMerge",
    "DatasetProgress",
    "DatasetReport",
    "DatasetTally",
    "ExportReport",
    "FileJournal",
    "JobRunner",
    "Journal",
    "LostRequest",
    "MergeReport",
    "ObservedRun",
    "OutputRecord",
    "OutputUsage",
    "RunHooks",
    "RunObserver",
    "RunOutcome",
    "RunProgress",
    "RunSummary",
    "StopReason",
    "export_conversations",
    "merge_outputs",
    "pilot_into_job",
    "read_outputs",
    "request_digest",
    "run_plan",
    "run_plan_sync",
    "standard_observers",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        if name in _RENAMED:
            return _deprecated.resolve_old_name(f"{__name__}.{name}", _RENAMED[name])
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
