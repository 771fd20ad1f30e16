"""What the batch route's parts share for one run: the calls, the bodies, the journals,
the money and the result they all write to.

:class:`~provider_router.jobs.batch_api.route.BatchRouteRun` builds one
:class:`RouteParts`; its submitter and collector are :class:`RoutePart`\\ s of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from provider_router.jobs.batch_api.api import BatchApi
from provider_router.jobs.batch_api.body import BatchBody
from provider_router.jobs.batch_api.journal import BatchJournal
from provider_router.jobs.batch_api.money import BatchMoney
from provider_router.jobs.batch_api.result import BatchRouteResult
from provider_router.jobs.store.journal import FileJournal

__all__ = ["RoutePart", "RouteParts"]


@dataclass(frozen=True, slots=True)
class RouteParts:
    """One run's shared pieces."""

    api: BatchApi
    body: BatchBody
    journal: FileJournal
    """The output journal (exactly-once outputs)."""
    batches: BatchJournal
    """``batches.jsonl``: each batch's intent, id and end."""
    money: BatchMoney
    result: BatchRouteResult
    clock: Callable[[], float]


class RoutePart:
    """A part of the batch route, with the run's shared pieces as attributes."""

    def __init__(self, parts: RouteParts) -> None:
        self.api = parts.api
        self.body = parts.body
        self.journal = parts.journal
        self.batches = parts.batches
        self.money = parts.money
        self.result = parts.result
        self.clock = parts.clock
