"""The router against every spend limit OpenRouter answers, over real sockets.

A key past its limit in the field's form (a bare 403), a workspace budget (403), the
in-flight hold (a 402 with ``Retry-After``, waited out), and the 403s that are no spend
limit (a guardrail content block): the first two stop the router as the credits do,
the hold passes, the block fails only its own request.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter, RecordingSleep
from _wire_server import ANSWER, Serve, answer, wire_fixture  # noqa: F401  (the wire fixture)

from provider_router import (
    CreditsExhausted,
    MemoryLedger,
    PermissionDeniedError,
    RetryPolicy,
    Router,
    Safeguards,
)
from provider_router._spend_limits import SpendLimitKind
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=50)


def refusal(status: int, message: str, metadata: dict[str, Any] | None = None) -> bytes:
    error: dict[str, Any] = {"message": message, "code": status}
    if metadata is not None:
        error["metadata"] = metadata
    reason = {402: "Payment Required", 403: "Forbidden"}[status]
    return answer(json.dumps({"error": error}).encode(), status=f"{status} {reason}")


async def wire_router(
    server_url: str, sim: SimulatorServer, make_router: MakeRouter, **options: Any
) -> Router:
    """A router on the scripted server, routing on the simulator's listing."""
    listing = await make_router(sim)
    endpoints = await listing._plans.catalog.endpoints(KIMI)  # type: ignore[union-attr]
    router = Router(
        KIMI,
        endpoints=endpoints,
        api_key=DEFAULT_TEST_KEY,
        base_url=server_url,
        retry=RetryPolicy(max_attempts=3),
        # The canned answer bills $0.25 on a hold of cents: taken as it is, not disputed.
        safeguards=Safeguards(cost_sanity_factor=10**12),
        **options,
    )
    await router.open()
    return router


async def test_a_key_past_its_limit_in_the_fields_403_stops_the_router(
    openrouter_sim_factory: Any, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    sim = await openrouter_sim_factory(
        key_limit_status=403, api_keys={"sk-capped": "0.0005"}, completion_tokens=50
    )
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(sim, api_key="sk-capped", ledger=ledger)
    with pytest.raises(CreditsExhausted) as info:
        await router.chat(MESSAGES, max_tokens=1000)
    limit = info.value.limit
    assert limit is not None
    assert (limit.kind, limit.status, limit.interval) == (SpendLimitKind.KEY_LIMIT, 403, "total")
    assert limit.is_budget
    assert not limit.transient
    assert isinstance(info.value.__cause__, PermissionDeniedError)
    assert "OpenRouter refused with 403: the API key's limit is used up" in str(info.value)
    assert router.stopped is not None
    sent = len(sim.requests)
    assert sent == 1  # never retried
    with pytest.raises(CreditsExhausted) as again:
        await router.chat(MESSAGES, max_tokens=10)
    assert again.value.limit == limit
    assert len(sim.requests) == sent  # nothing new was sent
    assert (await ledger.snapshot()).reserved == 0  # a refusal is not billed: released
    stops = [e for e in log_events if e["event"] == "route.credits_exhausted"]
    assert [(e["kind"], e["status"]) for e in stops] == [("key_limit", 403)]


async def test_a_workspace_budget_stops_the_router(
    wire: Serve, openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    message = "Workspace monthly budget of $500.00 exceeded. Contact your workspace admin."
    server = await wire([refusal(403, message)])
    router = await wire_router(server.url, openrouter_sim, make_router)
    try:
        with pytest.raises(CreditsExhausted) as info:
            await router.chat(MESSAGES, max_tokens=16)
    finally:
        await router.close()
    limit = info.value.limit
    assert limit is not None
    assert (limit.kind, limit.interval) == (SpendLimitKind.WORKSPACE_BUDGET, "monthly")
    assert limit.remedy.startswith("ask the workspace admin")
    assert len(server.requests) == 1


async def test_a_guardrail_block_fails_its_request_and_the_router_goes_on(
    wire: Serve, openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    blocked = refusal(
        403, "Request blocked: prompt injection patterns detected", {"patterns": ["ignore"]}
    )
    server = await wire([blocked], [answer(ANSWER)])
    router = await wire_router(server.url, openrouter_sim, make_router)
    try:
        with pytest.raises(PermissionDeniedError) as info:
            await router.chat(MESSAGES, max_tokens=16)
        assert info.value.spend_limit is None
        assert router.stopped is None
        result = await router.chat(MESSAGES, max_tokens=16)
    finally:
        await router.close()
    assert result.text == "hi"
    assert len(server.requests) == 2  # the block was not retried; the next request went


async def test_only_the_in_flight_hold_is_retried_after_its_retry_after(
    wire: Serve, openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    hold = refusal(
        402,
        "This request would exceed your available credits given your current in-flight "
        "requests. Retry after in-flight requests settle, or add credits.",
        {
            "reason": "in_flight_budget_exhausted",
            "limit_source": "openrouter_in_flight_budget",
            "headers": {"Retry-After": "120"},
        },
    )
    server = await wire([hold], [answer(ANSWER)])
    sleep = RecordingSleep()
    router = await wire_router(server.url, openrouter_sim, make_router, sleep=sleep)
    try:
        result = await router.chat(MESSAGES, max_tokens=16)
    finally:
        await router.close()
    assert result.text == "hi"
    assert sleep.calls == [120.0]  # waited what the body's relayed Retry-After said
    assert router.stopped is None
    # A weight_exceeds_budget 402 is not waited out: it stops at once.
    too_large = refusal(
        402,
        "This request's estimate exceeds your in-flight budget.",
        {"reason": "weight_exceeds_budget", "limit_source": "openrouter_credits"},
    )
    server = await wire([too_large])
    sleep = RecordingSleep()
    router = await wire_router(server.url, openrouter_sim, make_router, sleep=sleep)
    try:
        with pytest.raises(CreditsExhausted) as info:
            await router.chat(MESSAGES, max_tokens=16)
    finally:
        await router.close()
    assert info.value.limit is not None
    assert info.value.limit.kind is SpendLimitKind.REQUEST_TOO_LARGE
    assert sleep.calls == []
    assert len(server.requests) == 1
