"""Finding a batch whose 202 was lost: through the list and its results' ``custom_id``s.

An intent journaled before its submit has no batch id when the 202 never arrived (a
kill, a dropped connection). :func:`find_lost` lists the key's batches created since
an hour before the intent (a server clock behind ours must not hide it) with as many
requests, and a finished candidate is the intent's when its first result's
``custom_id`` carries the intent's id. What cannot be checked yet keeps the intent
undecided, so its prompts are never sent again while the batch may exist; a candidate
whose results cannot be read is named, so that past the grace the run stops saying
which. A failed candidate that says it ran lines or cost something is never taken as
free (docs/batch.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from provider_router._exceptions import (
    APIStatusError,
    InvalidResponseError,
    PaymentRequiredError,
    ProviderUnavailableError,
    RateLimitError,
)
from provider_router._money import from_units
from provider_router.jobs.batch_api.api import TERMINAL, BatchApi
from provider_router.jobs.batch_api.body import RESULTS_PAGE_BYTES
from provider_router.jobs.batch_api.journal import BatchIntent, BatchJournal
from provider_router.jobs.batch_api.results import failed_batch_cost
from provider_router.planning.compare import BATCH_WINDOW_SECONDS

__all__ = [
    "CLOCK_SKEW_SECONDS",
    "LIST_LAG_SECONDS",
    "LOST_GRACE_SECONDS",
    "LostSearch",
    "find_lost",
]

CLOCK_SKEW_SECONDS: Final = 3600
"""How far OpenRouter's clock may be behind ours when a lost 202 is looked for."""
LIST_LAG_SECONDS: Final = 120
"""How long a new batch may stay out of the list, or a fresh one answer 404 (ENG)."""
LOST_GRACE_SECONDS: Final = int(BATCH_WINDOW_SECONDS) + LIST_LAG_SECONDS
"""How long a submit that may have reached OpenRouter, and that no list shows, keeps its
prompts from going again: no source bounds how late the list shows a new batch, so
only the whole 24 h window proves none was made (a batch it made is listed by then,
ended, or running, which keeps the prompts held). Sooner could pay twice."""


@dataclass(frozen=True, slots=True)
class LostSearch:
    """What the list says of one intent without a batch id.

    Attributes:
        batch_id: the intent's batch, when found.
        undecided: a candidate could not be checked yet (still running, its results
            withheld, or unreadable): the intent's prompts must wait.
        maybe_billed: a candidate that shows no ``custom_id``s might be the intent's
            and billed (expired or cancelled, failed after running lines or with a
            cost, or completed listing no results).
        owed: the 402 of a candidate whose results are withheld for credits.
        unreadable: a candidate whose results cannot be read (its id and why): it
            keeps the intent undecided for good.
    """

    batch_id: str | None = None
    undecided: bool = False
    maybe_billed: bool = False
    owed: PaymentRequiredError | None = None
    unreadable: str | None = None


async def _candidates(
    api: BatchApi, journal: BatchJournal, intent: BatchIntent
) -> list[dict[str, Any]]:
    """Listed batches since the intent that could be it, not claimed by another intent."""
    known = {i.batch_id for i in journal if i.batch_id is not None}
    found: list[dict[str, Any]] = []
    after: str | None = None
    asked: set[str] = set()
    since = max(0, intent.created_after - CLOCK_SKEW_SECONDS)
    while True:
        page = await api.list_page(since, after)
        for item in page.get("data") or []:
            counts = item.get("request_counts")
            total = counts.get("total") if isinstance(counts, dict) else None
            # A running batch may not show its counts yet (absent or zero): it may be
            # the intent's, so it is a candidate until it ends.
            unknown = not total and item.get("status") not in TERMINAL
            if item.get("id") not in known and (unknown or total == len(intent.prompt_ids)):
                found.append(item)
        if not page.get("has_more") or not page.get("last_id"):
            return found
        after = str(page["last_id"])
        if after in asked:
            raise InvalidResponseError(
                f"GET /batches: the list's pages repeat (last_id {after!r} again); the "
                f"prompts of intent {intent.intent} stay unsent until it can be read"
            )
        asked.add(after)


async def find_lost(api: BatchApi, journal: BatchJournal, intent: BatchIntent) -> LostSearch:
    """Look for ``intent``'s batch (see the module docstring)."""
    undecided = billed = False
    owed: PaymentRequiredError | None = None
    unreadable: str | None = None
    for item in await _candidates(api, journal, intent):
        status = item.get("status")
        if status not in TERMINAL:
            undecided = True  # its custom_ids show only once it ends; look again later
            continue
        if status == "failed":
            # A failed batch ran nothing and cost nothing, unless it says it ran lines
            # or cost something: then it may be the intent's, billed.
            cost, _ = failed_batch_cost(item, from_units(intent.worst_units))
            billed = billed or cost > 0
            continue
        if status != "completed":
            billed = True  # expired or cancelled: may have cost something, no custom_ids
            continue
        try:
            # One line, of whichever dataset or job: bounded as a page, not by this
            # dataset's line (a longer foreign line is not an error of ours).
            page = await api.results_page(
                str(item["id"]), None, limit=1, max_bytes=RESULTS_PAGE_BYTES
            )
        except PaymentRequiredError as exc:
            owed, undecided = exc, True  # it may be ours: collect it after a top-up
            continue
        except (RateLimitError, ProviderUnavailableError):
            undecided = True  # a blip: looked at again next round
            continue
        except (APIStatusError, InvalidResponseError) as exc:
            undecided, unreadable = True, f"{str(item['id'])[:100]} (its results: {exc})"
            continue
        data = page.get("data")
        if not isinstance(data, list) or not data:
            # Completed and of the intent's size, yet no custom_id to tell: it may be
            # the intent's and billed, so it is never taken as free.
            billed = True
            continue
        first = data[0] if isinstance(data[0], dict) else {}
        if intent.prompt_for(str(first.get("custom_id", ""))) is not None:
            return LostSearch(batch_id=str(item["id"]))
    return LostSearch(None, undecided, billed, owed, unreadable)
