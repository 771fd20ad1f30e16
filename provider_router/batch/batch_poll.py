"""Polling the batch route's batches without downloading their results.

``GET /batches/{id}`` of a terminal batch carries every result (the newest SDK:
"Batches in a terminal status include results"), up to 5,000 long answers in one body;
the list's items carry the same status, ``request_counts``, ``usage`` and ``error``
with ``results: null`` ("List items omit results"). So one round of polls is one walk
down ``GET /batches?created_after=`` (newest first, 100 a page), stopped as soon as
every batch asked for is seen; the results themselves are read once, page by page,
from ``GET /batches/{id}/results`` when a batch is completed. A batch the list does
not show (a fresh one, the list's lag) is asked for by id, bounded by the batch's
largest answer: a fresh batch is not terminal, so that carries no results, and only a
finished batch the list never shows has its results read twice (once there, once in
pages).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from provider_router._exceptions import InvalidResponseError
from provider_router.batch.batch_api import BatchApi
from provider_router.batch.batch_journal import BatchIntent
from provider_router.batch.batch_lost import CLOCK_SKEW_SECONDS

__all__ = ["listed_statuses"]


async def listed_statuses(
    api: BatchApi, intents: Iterable[BatchIntent]
) -> dict[str, dict[str, Any]]:
    """The list's item (status, counts, usage; no results) of each intent's batch that
    the list shows, by batch id; walks no further than the oldest one asked for."""
    wanted = {i.batch_id: i for i in intents if i.batch_id is not None}
    found: dict[str, dict[str, Any]] = {}
    if not wanted:
        return found
    since = max(0, min(i.created_after for i in wanted.values()) - CLOCK_SKEW_SECONDS)
    after: str | None = None
    asked: set[str] = set()
    while True:
        page = await api.list_page(since, after)
        for item in page.get("data") or []:
            batch_id = item.get("id") if isinstance(item, dict) else None
            if batch_id in wanted:
                found[str(batch_id)] = item
        if len(found) == len(wanted) or not page.get("has_more") or not page.get("last_id"):
            return found
        after = str(page["last_id"])
        if after in asked:
            raise InvalidResponseError(
                f"GET /batches: the list's pages repeat (last_id {after!r} again); the "
                "batches stay held and are polled on the next run"
            )
        asked.add(after)
