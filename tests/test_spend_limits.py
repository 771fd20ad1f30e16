"""Every 402 and 403 form OpenRouter answers, read into the limit it means (or none).

The forms are those of docs/openrouter.md, "Spend limits": the documented 402s with
``limit_source`` and ``reason``, the older wordings without them, the field's bare 403
``Key limit exceeded``, the workspace and guardrail budgets, and the 403s that are no
spend limit (a guardrail content block, moderation, a key not allowed an operation).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from provider_router import (
    APIStatusError,
    CreditsExhausted,
    PaymentRequiredError,
    PermissionDeniedError,
)
from provider_router._http.session import error_from_response
from provider_router._spend_limits import SpendLimit, SpendLimitKind, classify

K = SpendLimitKind


def body(
    code: int, message: str, metadata: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        error["metadata"] = metadata
    return {"error": error, **extra}


IN_FLIGHT_MESSAGE = (
    "This request would exceed your available credits given your current in-flight "
    "requests. Retry after in-flight requests settle, or add credits."
)
AFFORD_KEY = (
    "This request requires more credits, or fewer max_tokens. You requested up to 8192 "
    "tokens, but can only afford 1021. To increase, visit https://openrouter.ai/settings/keys "
    "and create a key with a higher monthly limit"
)
AFFORD_ACCOUNT = (
    "This request requires more credits, or fewer max_tokens. You requested up to 8192 "
    "tokens, but can only afford 512. To increase, visit https://openrouter.ai/settings/credits "
    "and upgrade to a paid account"
)

# (status, message, metadata, kind, interval, is_budget, transient)
SPEND_LIMITS: list[tuple[int, str, dict[str, Any] | None, K, str | None, bool, bool]] = [
    # The documented 402s: limit_source, and reason where it says more.
    (
        402,
        IN_FLIGHT_MESSAGE,
        {
            "reason": "in_flight_budget_exhausted",
            "limit_source": "openrouter_in_flight_budget",
            "remedy_hint": "Retry after your in-flight requests settle (see Retry-After).",
        },
        K.IN_FLIGHT,
        None,
        False,
        True,
    ),
    # The field's variant: the same body, Retry-After also relayed in metadata.headers.
    (
        402,
        IN_FLIGHT_MESSAGE,
        {
            "reason": "in_flight_budget_exhausted",
            "limit_source": "openrouter_in_flight_budget",
            "headers": {"Retry-After": "120"},
        },
        K.IN_FLIGHT,
        None,
        False,
        True,
    ),
    # An in-flight 402 nesting the "can only afford" text is still the in-flight hold.
    (402, AFFORD_KEY, {"reason": "in_flight_budget_exhausted"}, K.IN_FLIGHT, None, False, True),
    (
        402,
        "Insufficient credits. Add more using https://openrouter.ai/credits",
        {"limit_source": "openrouter_credits"},
        K.CREDITS,
        None,
        False,
        False,
    ),
    (
        402,
        "This request's estimated cost exceeds your in-flight budget.",
        {"limit_source": "openrouter_credits", "reason": "weight_exceeds_budget"},
        K.REQUEST_TOO_LARGE,
        None,
        False,
        False,
    ),
    (402, AFFORD_KEY, {"limit_source": "openrouter_key_limit"}, K.KEY_LIMIT, None, True, False),
    # Older 402 wordings without limit_source: the URL they send to says which limit.
    (402, AFFORD_KEY, None, K.KEY_LIMIT, None, True, False),
    (402, AFFORD_ACCOUNT, None, K.CREDITS, None, False, False),
    (
        402,
        "More credits are required to run this request. 128000 token capacity required, "
        "19484 available. To increase, visit https://openrouter.ai/settings/credits",
        None,
        K.CREDITS,
        None,
        False,
        False,
    ),
    (
        402,
        "Prompt tokens limit exceeded: 9123 > 4096. To increase, visit "
        "https://openrouter.ai/settings/keys and create a key with a higher limit",
        None,
        K.KEY_LIMIT,
        None,
        True,
        False,
    ),
    (
        402,
        "Insufficient credits. Add more using https://openrouter.ai/credits",
        None,
        K.CREDITS,
        None,
        False,
        False,
    ),
    (402, "Payment Required", None, K.CREDITS, None, False, False),
    # The field's 403 key caps: a bare body, no metadata.
    (
        403,
        "Key limit exceeded (total limit). Manage it using https://openrouter.ai/settings/keys",
        None,
        K.KEY_LIMIT,
        "total",
        True,
        False,
    ),
    (
        403,
        "Key limit exceeded (monthly limit). Manage it using https://openrouter.ai/settings/keys",
        None,
        K.KEY_LIMIT,
        "monthly",
        True,
        False,
    ),
    (
        403,
        "Key limit exceeded. Manage it using https://openrouter.ai/keys",
        None,
        K.KEY_LIMIT,
        None,
        True,
        False,
    ),
    (
        403,
        "Prompt tokens limit exceeded: 9123 > 4096. To increase, visit "
        "https://openrouter.ai/settings/keys and create a key with a higher limit",
        None,
        K.KEY_LIMIT,
        None,
        True,
        False,
    ),
    # Workspace budgets (Enterprise): the broadest exceeded window is named.
    (
        403,
        "Workspace monthly budget of $500.00 exceeded. Contact your workspace admin.",
        None,
        K.WORKSPACE_BUDGET,
        "monthly",
        True,
        False,
    ),
    (
        403,
        "Workspace lifetime budget of $12,000.00 exceeded. Contact your workspace admin.",
        None,
        K.WORKSPACE_BUDGET,
        "lifetime",
        True,
        False,
    ),
    # A guardrail's budget, and the third-party catalogue's form with limit_source.
    (
        403,
        "Guardrail budget exceeded for this API key",
        None,
        K.GUARDRAIL_BUDGET,
        None,
        True,
        False,
    ),
    (
        403,
        "Budget limit exceeded",
        {
            "limit_source": "openrouter_guardrail_budget",
            "scope": "guardrail",
            "limit_usd": 50,
            "spend_usd": 50.02,
            "resets_at": "2026-12-01T00:00:00Z",
        },
        K.GUARDRAIL_BUDGET,
        None,
        True,
        False,
    ),
    (
        403,
        "Budget limit exceeded",
        {"limit_source": "openrouter_workspace_budget", "scope": "workspace"},
        K.WORKSPACE_BUDGET,
        None,
        True,
        False,
    ),
    (
        403,
        "Budget limit exceeded",
        {"limit_source": "openrouter_key_limit", "scope": "key"},
        K.KEY_LIMIT,
        None,
        True,
        False,
    ),
    # A limit_source nobody documented: still a limit, kept as it was named.
    (403, "Limit reached", {"limit_source": "openrouter_org_cap"}, K.OTHER, None, True, False),
]


@pytest.mark.parametrize(
    ("status", "message", "metadata", "kind", "interval", "is_budget", "transient"),
    SPEND_LIMITS,
)
def test_every_spend_limit_form_is_read_into_its_limit(
    status: int,
    message: str,
    metadata: dict[str, Any] | None,
    kind: K,
    interval: str | None,
    is_budget: bool,
    transient: bool,
) -> None:
    limit = classify(status, message, body(status, message, metadata))
    assert limit is not None
    assert (limit.kind, limit.interval) == (kind, interval)
    assert (limit.is_budget, limit.transient) == (is_budget, transient)
    assert limit.status == status
    assert limit.limit_source == (metadata or {}).get("limit_source")
    assert limit.what
    assert limit.remedy


NOT_SPEND_LIMITS: list[tuple[int, str, dict[str, Any] | None]] = [
    # A guardrail content block (with and without router metadata).
    (
        403,
        "Request blocked: prompt injection patterns detected",
        {"patterns": ["ignore previous instructions"]},
    ),
    # Moderation: flagged input, even when its words mention a budget.
    (
        403,
        "Your input was flagged: budget limit exceeded",
        {
            "reasons": ["harassment"],
            "flagged_input": "budget limit exceeded",
            "provider_name": "OpenAI",
            "model_slug": "openai/gpt-4o",
        },
    ),
    (403, "Only management keys can perform this operation", None),
    (403, "This model is not allowed by your organization's allowlist", None),
    (403, "Forbidden", None),
    # Neither 402 nor 403: never a spend limit, whatever the words.
    (429, "Key limit exceeded (total limit)", None),
    (400, "Insufficient credits", {"limit_source": "openrouter_credits"}),
]


@pytest.mark.parametrize(("status", "message", "metadata"), NOT_SPEND_LIMITS)
def test_other_refusals_are_no_spend_limit(
    status: int, message: str, metadata: dict[str, Any] | None
) -> None:
    assert classify(status, message, body(status, message, metadata)) is None


def test_a_guardrail_block_with_router_metadata_is_no_spend_limit() -> None:
    message = "Request blocked: prompt injection patterns detected"
    stage = {
        "type": "guardrail",
        "name": "content-filter",
        "guardrail_id": "gr_1",
        "guardrail_scope": "key",
        "summary": "blocked",
        "data": {"action": "block", "detected": True, "engines": ["regex"], "patterns": []},
    }
    answer = body(403, message, {"patterns": ["x"]}, openrouter_metadata={"pipeline": [stage]})
    assert classify(403, message, answer) is None


def test_the_error_from_a_response_carries_its_spend_limit() -> None:
    key_cap = b'{"error":{"message":"Key limit exceeded (monthly limit). Manage it using https://openrouter.ai/settings/keys","code":403}}'
    error = error_from_response(403, {"Content-Type": "application/json"}, key_cap)
    assert isinstance(error, PermissionDeniedError)
    assert error.spend_limit == SpendLimit(K.KEY_LIMIT, 403, error.message, interval="monthly")
    in_flight = body(
        402,
        IN_FLIGHT_MESSAGE,
        {"reason": "in_flight_budget_exhausted", "headers": {"Retry-After": "120"}},
    )
    error = error_from_response(402, {}, json.dumps(in_flight).encode())
    assert isinstance(error, PaymentRequiredError)
    assert error.retry_after == 120
    limit = error.spend_limit
    assert limit is not None
    assert limit.transient
    blocked = APIStatusError(403, "Request blocked", body=body(403, "x", {"patterns": []}))
    assert blocked.spend_limit is None


def test_what_lifts_each_limit_is_said_and_kept_in_json() -> None:
    key = classify(403, "Key limit exceeded (monthly limit)", None)
    assert key is not None
    assert key.what == "the API key's monthly limit"
    assert key.remedy == (
        "raise the key's limit on https://openrouter.ai/settings/keys or use another key, "
        "or wait until the monthly window resets"
    )
    workspace = classify(403, "Workspace monthly budget of $500.00 exceeded.", None)
    assert workspace is not None
    assert workspace.remedy.startswith("ask the workspace admin")
    credits = classify(402, "Insufficient credits", None)
    assert credits is not None
    assert (
        credits.remedy == "top up the OpenRouter credits at https://openrouter.ai/settings/credits"
    )
    assert key.to_json() == {
        "kind": "key_limit",
        "status": 403,
        "limit_source": None,
        "reason": None,
        "interval": "monthly",
        "message": "Key limit exceeded (monthly limit)",
        "remedy": key.remedy,
    }
    stopped = CreditsExhausted("stopped", limit=key)
    assert stopped.limit is key
