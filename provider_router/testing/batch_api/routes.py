"""The simulated Batch API's routes: submit, get, results, list, delete.

Each handler takes the simulator, the request, its log record and the calling key
(``app.py`` wraps them so a missing key is a 401 first). Shapes follow the newest
official SDK's batch components; docs/simulator.md ("Batches") lists what is assumed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Any

from aiohttp import web

from provider_router._money import from_units
from provider_router.testing.batch_api.lines import (
    SubmitError,
    batch_failure,
    parse_submit,
    worst_case_units,
)
from provider_router.testing.batch_api.state import TERMINAL, Batch
from provider_router.testing.billing import KeyState
from provider_router.testing.introspection import RequestRecord
from provider_router.testing.simulator import Simulator, json_error, json_response

__all__ = ["delete_batch", "get_batch", "list_batches", "batch_results", "submit_batch"]

_STATUSES = frozenset(
    [
        "validating",
        "in_progress",
        "finalizing",
        "completed",
        "failed",
        "expired",
        "cancelling",
        "cancelled",
    ]
)
_LIST_LIMIT = (1, 100, 20)
_RESULTS_LIMIT = (1, 1000, 100)


def _refuse(error: SubmitError) -> web.Response:
    return json_error(error.status, error.message)


def _unreachable(sim: Simulator) -> web.Response | None:
    """The 404 every Batch API route answers while ``faults.unreachable`` is on."""
    if not sim.batches.faults.unreachable:
        return None
    return json_error(404, "Not Found")


async def submit_batch(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``POST /batches``: 202 ``validating``, or the synchronous refusal."""
    if (gone := _unreachable(sim)) is not None:
        return gone
    submission = parse_submit(sim.market, await request.read())
    if isinstance(submission, SubmitError):
        return _refuse(submission)
    served_by = sim.batches.faults.served_by
    if served_by is not None:
        submission = replace(submission, served_by=served_by)
    record.model = submission.model.id
    record.provider = submission.provider
    if sim.batches.faults.take("drop_submit"):
        # Read whole, then lost before a batch was made: the client cannot tell this
        # from a lost 202 (it sent every byte), and no list will ever show it.
        if request.transport is not None:
            request.transport.abort()
        return json_error(500, "dropped")
    worst = worst_case_units(submission)
    room = sim.account.balance - sim.account.holds
    if key.limit is not None:
        room = min(room, key.limit - key.usage - key.holds)
    if worst > room:
        return json_error(
            402,
            f"Insufficient credits for this batch: its estimated cost is up to "
            f"${from_units(worst)} and ${from_units(max(room, 0))} can be spent. Add credits, "
            "send fewer requests or lower max_tokens.",
        )
    batch = sim.batches.submit(key, submission, batch_failure(submission))
    if sim.batches.faults.take("lose_202"):
        # The batch exists and will run; the client never hears of it.
        transport = request.transport
        if transport is not None:
            transport.abort()
    body = sim.batches.body(batch, with_results=False)
    body["status"] = "validating"
    body["provider"] = None
    body["finalized_at"] = None
    body["usage"] = None
    body["request_counts"] = {"total": len(submission.requests), "completed": 0, "failed": 0}
    return json_response(body, status=202)


def _find(sim: Simulator, request: web.Request, key: KeyState) -> Batch | web.Response:
    batch_id = request.match_info["batch_id"]
    batch = sim.batches.get(batch_id, key)
    if batch is None:
        return json_error(404, f"Batch job {batch_id} not found.")
    return batch


def _unpaid(sim: Simulator, batch: Batch) -> bool:
    return batch.finalized and not batch.paid


def _payment_required(sim: Simulator, batch: Batch) -> web.Response:
    body = sim.batches.body(batch, with_results=False)
    body["error"] = {"code": 402, "message": sim.batches.owed_message(batch)}
    return json_response(body, status=402)


async def get_batch(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``GET /batches/{id}``: the batch; terminal ones with their results (402: unpaid)."""
    if (gone := _unreachable(sim)) is not None:
        return gone
    batch = _find(sim, request, key)
    if isinstance(batch, web.Response):
        return batch
    if _unpaid(sim, batch):
        return _payment_required(sim, batch)
    return json_response(sim.batches.body(batch, with_results=True))


def _limit(request: web.Request, bounds: tuple[int, int, int]) -> int | web.Response:
    low, high, default = bounds
    raw = request.query.get("limit")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        return json_error(400, f"limit must be an integer from {low} through {high}")
    return value


async def batch_results(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``GET /batches/{id}/results?limit=&cursor=``: one page of a terminal batch's results."""
    if (gone := _unreachable(sim)) is not None:
        return gone
    batch = _find(sim, request, key)
    if isinstance(batch, web.Response):
        return batch
    limit = _limit(request, _RESULTS_LIMIT)
    if isinstance(limit, web.Response):
        return limit
    status = batch.status(sim.now())
    if status not in TERMINAL:
        return json_error(409, f"Batch {batch.id} has no results yet (status {status}).")
    if _unpaid(sim, batch):
        return _payment_required(sim, batch)
    cursor = request.query.get("cursor", "0")
    if not cursor.isdigit() or int(cursor) > len(batch.lines):
        return json_error(400, "cursor is not one this batch handed out")
    start = int(cursor)
    page = [line.result for line in batch.lines[start : start + limit]]
    more = start + limit < len(batch.lines)
    body = {
        "object": "list",
        "data": page,
        "has_more": more,
        "next_cursor": str(start + limit) if more else None,
    }
    return json_response(body)


def _timestamp(raw: str) -> int | None:
    """Unix seconds, or an ISO 8601 date or date-time (the SDK sends ``str | date``)."""
    if raw.isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        try:
            day = date.fromisoformat(raw)
        except ValueError:
            return None
        moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


async def list_batches(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``GET /batches``: newest first, ``after`` a previous page's ``last_id``, filters."""
    if (gone := _unreachable(sim)) is not None:
        return gone
    limit = _limit(request, _LIST_LIMIT)
    if isinstance(limit, web.Response):
        return limit
    statuses = request.query.getall("status", [])
    unknown = sorted(set(statuses) - _STATUSES)
    if unknown:
        return json_error(400, f"status: unknown value(s) {unknown}")
    bounds: dict[str, int] = {}
    for name in ("created_after", "created_before"):
        raw = request.query.get(name)
        if raw is not None:
            value = _timestamp(raw)
            if value is None:
                return json_error(400, f"{name} must be a Unix timestamp or an ISO 8601 date")
            bounds[name] = value
    now = sim.now()
    found = sim.batches.listed(key)
    after = request.query.get("after")
    if after is not None:
        ids = [b.id for b in found]
        if after not in ids:
            return json_error(400, f"after: batch {after} not found")
        found = found[ids.index(after) + 1 :]
    found = [
        b
        for b in found
        if (not statuses or b.status(now) in statuses)
        and b.created_at > bounds.get("created_after", -1)
        and b.created_at < bounds.get("created_before", 1 << 62)
    ]
    page = found[:limit]
    data: list[dict[str, Any]] = [sim.batches.body(b, with_results=False) for b in page]
    body = {
        "object": "list",
        "data": data,
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(found) > limit,
    }
    return json_response(body)


async def delete_batch(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``DELETE /batches/{id}``: terminal batches only; billing records stay."""
    if (gone := _unreachable(sim)) is not None:
        return gone
    batch = _find(sim, request, key)
    if isinstance(batch, web.Response):
        return batch
    status = batch.status(sim.now())
    if status not in TERMINAL or _unpaid(sim, batch):
        return json_error(409, f"Batch {batch.id} is {status} and cannot be deleted yet.")
    batch.deleted = True
    batch.lines = []
    provider = batch.submission.endpoint.provider_name
    deletion = {"openrouter": "deleted", "upstream": {"provider": provider, "status": "deleted"}}
    return json_response({"id": batch.id, "object": "batch", "deletion": deletion})
