"""The Batch API's calls, through the existing :class:`~provider_router._http.session.HttpClient`.

Submit, get, one page of results, one page of the list, a probe that the route answers
for the key, the account's balance: each
one ``get_json`` / ``post_json``, errors mapped as every other call (a 402 is a
:class:`~provider_router.PaymentRequiredError` carrying the batch's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from provider_router._exceptions import InvalidResponseError, NotFoundError
from provider_router._http.session import HttpClient

__all__ = ["LIST_PAGE_BYTES", "RESULTS_PAGE_LINES", "TERMINAL", "BatchApi"]

TERMINAL: Final = frozenset(["completed", "failed", "expired", "cancelled"])
RESULTS_PAGE_LINES: Final = 1000
"""The most results one page may hold (the API's limit)."""
_LIST_PAGE: Final = 100
LIST_PAGE_BYTES: Final = 16 * 1024 * 1024
"""A page of the batch list: 100 batch objects without their results."""
_SMALL_BODY_BYTES: Final = 1024 * 1024


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidResponseError(f"{what}: expected a JSON object, got {type(body).__name__}")
    return body


class BatchApi:
    """The five calls the batch route makes."""

    def __init__(self, http: HttpClient) -> None:
        self.http = http

    async def submit(
        self,
        model: str,
        requests: Sequence[Mapping[str, Any]],
        provider: Mapping[str, Any],
        *,
        request_timeout: float | None = None,
    ) -> dict[str, Any]:
        # endpoint and model first: OpenRouter stream-parses the body.
        body = {
            "endpoint": "/v1/chat/completions",
            "model": model,
            "provider": dict(provider),
            "completion_window": "24h",
            "requests": list(requests),
        }
        answer = await self.http.post_json("/batches", body, request_timeout=request_timeout)
        batch = _object(answer, "POST /batches")
        if not isinstance(batch.get("id"), str):
            raise InvalidResponseError("POST /batches: the answer has no batch id")
        return batch

    async def get(self, batch_id: str, *, max_bytes: int | None = None) -> dict[str, Any]:
        """The batch (a terminal one carries every result: ``max_bytes`` bounds them)."""
        body = await self.http.get_json(f"/batches/{batch_id}", max_bytes=max_bytes)
        return _object(body, "GET /batches/{id}")

    async def results_page(
        self,
        batch_id: str,
        cursor: str | None,
        *,
        limit: int = RESULTS_PAGE_LINES,
        max_bytes: int | None = None,
    ) -> dict[str, Any]:
        params = {"limit": str(limit)}
        if cursor is not None:
            params["cursor"] = cursor
        page = await self.http.get_json(f"/batches/{batch_id}/results", params, max_bytes=max_bytes)
        return _object(page, "GET /batches/{id}/results")

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        params = {"limit": str(_LIST_PAGE), "created_after": str(created_after)}
        if after is not None:
            params["after"] = after
        body = await self.http.get_json("/batches", params, max_bytes=LIST_PAGE_BYTES)
        return _object(body, "GET /batches")

    async def reachable(self) -> bool:
        """One probe (``GET /batches?limit=1``): False when the Batch API answers 404 for
        this key (as it did for some keys in August 2026), True when it lists.

        Raises:
            ProviderRouterError: any other failure (a rejected key, the network...).
        """
        try:
            await self.http.get_json("/batches", {"limit": "1"}, max_bytes=LIST_PAGE_BYTES)
        except NotFoundError:
            return False
        return True

    async def balance(self) -> Decimal | None:
        """The account's credits minus its usage (None: not readable with this key)."""
        try:
            body = await self.http.get_json("/credits", max_bytes=_SMALL_BODY_BYTES)
            data = body["data"]
            return Decimal(str(data["total_credits"])) - Decimal(str(data["total_usage"]))
        except Exception:  # only the top-up hint depends on it
            return None
