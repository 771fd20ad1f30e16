"""The management API's keys: ``POST /keys``, ``GET /keys``, ``GET/PATCH/DELETE /keys/{hash}``.

As OpenRouter documents them (docs/simulator.md, "Management keys"): only a management
key may call them (else 403 ``Only management keys can perform this operation``); a
key is made with ``name``, ``limit`` (USD or null), ``limit_reset``,
``include_byok_in_limit`` and ``expires_at`` (UTC, with seconds) and answered 201 with
the plaintext ``key`` at the top level, shown this once, beside ``data`` (its ``hash``
is the id in the paths); ``PATCH`` changes ``name``, ``disabled``, ``limit``,
``limit_reset``, ``include_byok_in_limit``; ``DELETE`` answers ``{"deleted": true}``.
The limit is enforced per key like any key's (``billing.Account.check``); a disabled or
expired key is refused with a 401.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from aiohttp import web

from provider_router._money import to_decimal, to_units
from provider_router.testing.billing import KeyState
from provider_router.testing.chat import bodies
from provider_router.testing.introspection import RequestRecord
from provider_router.testing.simulator import Simulator, json_error, json_response

__all__ = [
    "create_key",
    "delete_key",
    "get_key",
    "limit_and_usage",
    "list_keys",
    "update_key",
]

MANAGEMENT_ONLY: Final = "Only management keys can perform this operation"
LIMIT_RESETS: Final = frozenset({"daily", "weekly", "monthly"})
DEFAULT_WORKSPACE_ID: Final = "00000000-0000-4000-8000-000000000000"
"""The account's default workspace (the description requires a UUID on every key)."""
_PAGE: Final = 100
"""``GET /keys`` answers the most recent 100 from ``offset``."""
_UTC_SECONDS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|\+00:00)$")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def limit_and_usage(key: KeyState) -> dict[str, Any]:
    """A key's limit and usage fields, as both ``GET /key`` and the management API show
    them (the simulator's usage never resets: each window shows the whole)."""
    usage = bodies.usd(key.usage)
    return {
        "limit": None if key.limit is None else bodies.usd(key.limit),
        "limit_remaining": None if key.limit is None else bodies.usd(key.limit - key.usage),
        "limit_reset": key.limit_reset,
        "include_byok_in_limit": key.include_byok_in_limit,
        "usage": usage,
        "usage_daily": usage,
        "usage_weekly": usage,
        "usage_monthly": usage,
        "byok_usage": 0,
        "byok_usage_daily": 0,
        "byok_usage_weekly": 0,
        "byok_usage_monthly": 0,
    }


def key_object(key: KeyState) -> dict[str, Any]:
    """The key as the management API shows it (never the key itself)."""
    return {
        "hash": key.hash,
        "name": key.name,
        "label": key.masked_label,
        "disabled": key.disabled,
        **limit_and_usage(key),
        "created_at": _iso(key.created_at),
        "updated_at": _iso(key.updated_at),
        "creator_user_id": bodies.USER_ID,
        "workspace_id": DEFAULT_WORKSPACE_ID,
        "expires_at": _iso(key.expires_at),
        # What the newest SDK requires beyond the description (its overlay in tests/data).
        "external_user": None,
        "last_used_at": _iso(key.last_used),
    }


async def _body(request: web.Request) -> Mapping[str, Any]:
    try:
        # Amounts read from their digits, never through a float.
        body = json.loads(await request.read(), parse_float=Decimal)
    except ValueError:
        raise _Refused(400, "the body is not JSON") from None
    if not isinstance(body, Mapping):
        raise _Refused(400, "the body must be a JSON object")
    return body


def _limit(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise _Refused(400, "limit must be a number of USD or null")
    try:
        amount = to_decimal(value, what="limit")
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None
    if amount < 0:
        raise _Refused(400, "limit must be ≥ 0")
    return to_units(amount)


def _limit_reset(value: object) -> str | None:
    if value is not None and value not in LIMIT_RESETS:
        raise _Refused(400, "limit_reset must be daily, weekly, monthly or null")
    return value if isinstance(value, str) else None


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise _Refused(400, f"{name} must be true or false")
    return value


def _expires_at(value: object) -> float | None:
    """``expires_at``: ISO 8601 in UTC with seconds (other zones and minute
    precision are refused, as the SDK documents), or null."""
    if value is None:
        return None
    if not isinstance(value, str) or _UTC_SECONDS.match(value) is None:
        raise _Refused(400, "expires_at must be an ISO 8601 date-time in UTC with seconds, or null")
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _Refused(400, "name must be a non-empty string")
    return value


def _managing(key: KeyState) -> None:
    if not key.management:
        raise _Refused(403, MANAGEMENT_ONLY)


def _known(sim: Simulator, request: web.Request) -> KeyState:
    found = sim.account.by_hash.get(request.match_info["hash"])
    if found is None or found.management:
        raise _Refused(404, "Key not found")
    return found


def _answer(refused: _Refused) -> web.Response:
    return json_error(refused.status, refused.message)


async def create_key(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``POST /keys``: 201 with ``data`` and the plaintext ``key``, shown only here."""
    try:
        _managing(key)
        body = await _body(request)
        name = _name(body.get("name"))
        limit = _limit(body.get("limit"))
        reset = _limit_reset(body.get("limit_reset"))
        byok = _flag(body.get("include_byok_in_limit", False), "include_byok_in_limit")
        expires = _expires_at(body.get("expires_at"))
    except _Refused as refused:
        return _answer(refused)
    token = "sk-or-v1-" + secrets.token_hex(32)
    made = sim.account.add_key(token, limit, name=name)
    made.limit_reset = reset
    made.include_byok_in_limit = byok
    made.expires_at = expires
    made.created_at = sim.wall_clock()
    return json_response({"data": key_object(made), "key": token}, status=201)


async def list_keys(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``GET /keys``: the account's keys, newest first, 100 from ``offset``."""
    try:
        _managing(key)
        offset = int(request.query.get("offset", "0"))
    except _Refused as refused:
        return _answer(refused)
    except ValueError:
        return json_error(400, "offset must be an integer")
    include_disabled = request.query.get("include_disabled", "false").lower() == "true"
    # ``include_expired``: the newest SDK's parameter (the description has none).
    include_expired = request.query.get("include_expired", "false").lower() == "true"
    now = sim.wall_clock()
    keys = [
        k
        for k in sim.account.by_hash.values()
        if not k.management
        and (include_disabled or not k.disabled)
        and (include_expired or k.expires_at is None or k.expires_at > now)
    ]
    keys.reverse()  # newest first: made ones were added last
    page = keys[max(offset, 0) : max(offset, 0) + _PAGE]
    return json_response({"data": [key_object(k) for k in page]})


async def get_key(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``GET /keys/{hash}``."""
    try:
        _managing(key)
        found = _known(sim, request)
    except _Refused as refused:
        return _answer(refused)
    return json_response({"data": key_object(found)})


async def update_key(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``PATCH /keys/{hash}``: ``name``, ``disabled``, ``limit``, ``limit_reset``,
    ``include_byok_in_limit`` (no ``expires_at``: the API does not take it here)."""
    try:
        _managing(key)
        found = _known(sim, request)
        body = await _body(request)
        changes: dict[str, Any] = {}
        if "name" in body:
            changes["name"] = _name(body["name"])
        if "disabled" in body:
            changes["disabled"] = _flag(body["disabled"], "disabled")
        if "limit" in body:
            changes["limit"] = _limit(body["limit"])
        if "limit_reset" in body:
            changes["limit_reset"] = _limit_reset(body["limit_reset"])
        if "include_byok_in_limit" in body:
            flag = _flag(body["include_byok_in_limit"], "include_byok_in_limit")
            changes["include_byok_in_limit"] = flag
    except _Refused as refused:
        return _answer(refused)
    for name, value in changes.items():
        setattr(found, name, value)
    found.updated_at = sim.wall_clock()
    return json_response({"data": key_object(found)})


async def delete_key(
    sim: Simulator, request: web.Request, record: RequestRecord, key: KeyState
) -> web.Response:
    """``DELETE /keys/{hash}``: ``{"deleted": true}``; the key is refused from then on."""
    try:
        _managing(key)
        found = _known(sim, request)
    except _Refused as refused:
        return _answer(refused)
    sim.forget_key(found)
    return json_response({"deleted": True})
