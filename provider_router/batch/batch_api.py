"""The Batch API's calls, through the existing :class:`~provider_router._http.HttpClient`.

Submit, get, one page of results, one page of the list, the account's balance: each
one ``get_json`` / ``post_json``, errors mapped as every other call (a 402 is a
:class:`~provider_router.PaymentRequiredError` carrying the batch's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from provider_router._exceptions import InvalidResponseError
from provider_router._http import HttpClient

__all__ = ["TERMINAL", "BatchApi"]

TERMINAL: Final = frozenset(["completed", "failed", "expired", "cancelled"])
_RESULTS_PAGE: Final = 1000
_LIST_PAGE: Final = 100


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

    async def get(self, batch_id: str) -> dict[str, Any]:
        return _object(await self.http.get_json(f"/batches/{batch_id}"), "GET /batches/{id}")

    async def results_page(self, batch_id: str, cursor: str | None) -> dict[str, Any]:
        params = {"limit": str(_RESULTS_PAGE)}
        if cursor is not None:
            params["cursor"] = cursor
        page = await self.http.get_json(f"/batches/{batch_id}/results", params)
        return _object(page, "GET /batches/{id}/results")

    async def list_page(self, created_after: int, after: str | None) -> dict[str, Any]:
        params = {"limit": str(_LIST_PAGE), "created_after": str(created_after)}
        if after is not None:
            params["after"] = after
        return _object(await self.http.get_json("/batches", params), "GET /batches")

    async def balance(self) -> Decimal | None:
        """The account's credits minus its usage (None: not readable with this key)."""
        try:
            body = await self.http.get_json("/credits")
            data = body["data"]
            return Decimal(str(data["total_credits"])) - Decimal(str(data["total_usage"]))
        except Exception:  # only the top-up hint depends on it
            return None
