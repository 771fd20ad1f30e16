"""Router failure handling against the local OpenRouter: retries, 402s, quarantine, secrets."""

from __future__ import annotations

import asyncio
import dataclasses
from decimal import Decimal
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter, RecordingSleep

from provider_router import (
    AdaptiveLimiter,
    AllAttemptsFailed,
    AuthenticationError,
    Backoff,
    Catalog,
    CreditsExhausted,
    MemoryLedger,
    PaymentRequiredError,
    ProviderUnavailableError,
    RateLimitError,
    RetryPolicy,
)
from provider_router.testing import Market, SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=50)

NO_JITTER = RetryPolicy(backoff=Backoff(base=1.0, jitter=False), deadline=None)


def _charged(sim: SimulatorServer) -> Decimal:
    return sum((r.cost for r in sim.requests), Decimal(0))


@pytest.mark.parametrize(
    ("kind", "stream", "extra"),
    [
        ("rate_limit", False, {}),
        ("provider_error", False, {"status": 502}),
        ("provider_error", False, {"status": 503}),
        ("provider_error", True, {"status": 529}),
        ("reset", False, {}),
        ("reset", True, {}),
        ("truncate", False, {}),
        ("truncate", True, {}),
        ("error_200", False, {}),
        ("stream_error", True, {"after_tokens": 10}),
    ],
)
async def test_each_fault_kind_is_retried_and_money_is_exact(
    openrouter_sim: SimulatorServer,
    make_router: MakeRouter,
    recording_sleep: RecordingSleep,
    kind: str,
    stream: bool,
    extra: dict,
) -> None:
    openrouter_sim.add_fault(
        {"kind": kind, "provider": "chutes", "times": 1, "no_fallback": True, **extra}
    )
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(openrouter_sim, ledger=ledger, retry=NO_JITTER)
    result = await router.chat(MESSAGES, max_tokens=100, stream=stream)
    assert result.attempts == 2
    assert result.usage is not None
    assert result.usage.completion_tokens == 50
    assert recording_sleep.calls[0] == 1.0
    await router.close()  # waits for background reconciliation of cut responses
    state = await ledger.snapshot()
    assert state.reserved == 0
    # whatever OpenRouter charged (a cut response is billed in full), the ledger knows
    assert state.spent == _charged(openrouter_sim)


async def test_rate_limit_shrinks_the_concurrency_window(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    # OpenRouter's own 429 (the key's limit): the key-wide window. An endpoint's 429 is
    # its lane's (admission), never the key's: tests/client/test_router_admission.py.
    fault = {"kind": "rate_limit", "scope": "platform", "times": 1}
    openrouter_sim.add_fault(dict(fault))
    plain = await make_router(openrouter_sim, max_concurrency=AdaptiveLimiter(100))
    await plain.chat(MESSAGES, max_tokens=20)
    assert plain.limiter.limit == 90  # AIMD: x0.9
    # The default limiter slow-starts from 32; the 429 ends the slow start and, with
    # nothing else in flight, leaves one slot, which the retry's success grows to 2.
    openrouter_sim.add_fault(dict(fault))
    router = await make_router(openrouter_sim, max_concurrency=100)
    assert router.limiter.slow_start
    assert router.limiter.limit == 32
    await router.chat(MESSAGES, max_tokens=20)
    assert not router.limiter.slow_start
    assert router.limiter.limit == 2


async def test_retries_exhausted_raise_a_group_with_every_error(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, recording_sleep: RecordingSleep
) -> None:
    openrouter_sim.add_fault(
        {"kind": "provider_error", "provider": "chutes", "status": 502, "no_fallback": True}
    )
    ledger = MemoryLedger(Decimal(1))
    retry = RetryPolicy(max_attempts=3, backoff=Backoff(base=0.5, jitter=False))
    router = await make_router(openrouter_sim, ledger=ledger, retry=retry)
    with pytest.raises(AllAttemptsFailed) as info:
        await router.chat(MESSAGES, max_tokens=20)
    errors = info.value.exceptions
    assert len(errors) == 3
    assert all(isinstance(e, ProviderUnavailableError) for e in errors)
    assert all(e.provider_name == "Chutes" for e in errors)  # type: ignore[attr-defined]
    assert recording_sleep.calls == [0.5, 1.0]
    state = await ledger.snapshot()
    assert state.spent == 0
    assert state.released == 3
    assert router.failures == 1


async def test_never_retries_a_401(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    router._http._headers["Authorization"] = "Bearer wrong"  # type: ignore[union-attr]
    router._http._session._default_headers["Authorization"] = "Bearer wrong"  # type: ignore[union-attr]
    with pytest.raises(AuthenticationError):
        await router.chat(MESSAGES, max_tokens=20)
    assert len([r for r in openrouter_sim.requests if r.status == 401]) == 1


async def test_provider_that_keeps_failing_is_demoted_to_the_end(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    openrouter_sim.add_fault(
        {"kind": "provider_error", "provider": "chutes", "status": 502, "no_fallback": True}
    )
    router = await make_router(openrouter_sim, retry=RetryPolicy.never())
    for _ in range(5):
        with pytest.raises(ProviderUnavailableError):
            await router.chat(MESSAGES, max_tokens=20)
    assert router.health.is_demoted("Chutes")
    result = await router.chat(MESSAGES, max_tokens=20)
    routing = openrouter_sim.requests[-1].routing
    assert routing["only"] == ["novita"]  # the best endpoint not demoted
    assert "chutes" in router.admission.lanes()  # demoted, still allowed (used last)
    assert result.provider != "Chutes"


async def test_credits_exhausted_stops_new_work(
    openrouter_sim_factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    sim = await openrouter_sim_factory(credits="0.0003", completion_tokens=50)
    router = await make_router(sim, ledger=MemoryLedger(Decimal(1)))
    first = await router.chat(MESSAGES, max_tokens=100)
    with pytest.raises(CreditsExhausted) as info:
        await router.chat(MESSAGES, max_tokens=100)
    assert info.value.limit_source == "openrouter_credits"
    assert info.value.spent == first.cost
    assert "spent $" in str(info.value)
    assert isinstance(info.value.__cause__, PaymentRequiredError)
    assert router.stopped is not None
    assert any(e["event"] == "route.credits_exhausted" for e in log_events)
    sent = len(sim.requests)
    with pytest.raises(CreditsExhausted):
        await router.chat(MESSAGES, max_tokens=100)
    assert len(sim.requests) == sent  # nothing new was sent


async def test_key_limit_is_credits_exhausted_too(
    openrouter_sim_factory, make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(api_keys={"sk-limited": "0.0001"})
    router = await make_router(sim, api_key="sk-limited")
    with pytest.raises(CreditsExhausted) as info:
        await router.chat(MESSAGES, max_tokens=1000)
    assert info.value.limit_source == "openrouter_key_limit"


async def test_in_flight_hold_is_waited_out(
    openrouter_sim_factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    # The balance covers one worst case at a time: concurrent requests meet the
    # in-flight hold (a transient 402) and wait for the first to settle.
    sim = await openrouter_sim_factory(credits="0.004", speed=200.0, completion_tokens=20)

    async def real_sleep(seconds: float) -> None:
        await asyncio.sleep(0.01)

    router = await make_router(sim, sleep=real_sleep, ledger=MemoryLedger(Decimal(1)))
    results = await asyncio.gather(*(router.chat(MESSAGES, max_tokens=1000) for _ in range(3)))
    assert len(results) == 3
    assert any(r.limit_source == "openrouter_in_flight_budget" for r in sim.requests)
    assert any(e["event"] == "route.credits_hold" for e in log_events)
    assert router.stopped is None


async def test_unallowed_provider_serving_is_quarantined(
    openrouter_sim_factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    # The router routes on a listing where tag "chutes" is Chutes (int4); the live
    # market now serves that tag as "Impostor AI", a provider the policy never allowed.
    listing_sim = await openrouter_sim_factory()
    async with Catalog(listing_sim.url) as catalog:
        stale = await catalog.endpoints(KIMI)
    market = Market.default()
    model = market.models[KIMI]
    endpoints = tuple(
        dataclasses.replace(e, provider_name="Impostor AI") if e.tag == "chutes" else e
        for e in model.endpoints
    )
    live = Market([dataclasses.replace(model, endpoints=endpoints)], market.providers)
    sim = await openrouter_sim_factory(market=live, completion_tokens=30)
    router = await make_router(sim, endpoints=stale, ledger=MemoryLedger(Decimal(1)))
    result = await router.chat(MESSAGES, max_tokens=50)
    assert result.provider == "Impostor AI"
    assert result.quarantined
    assert result.quarantine_reason is not None
    assert "Impostor AI" in result.quarantine_reason
    assert router.quarantined == 1
    violations = [e for e in log_events if e["event"] == "route.policy_violation"]
    assert len(violations) == 1
    assert violations[0]["provider"] == "Impostor AI"
    assert "Chutes" in violations[0]["allowed"]
    # it was still paid for: the money side is exact even for a quarantined result
    assert (await router.ledger.snapshot()).spent == result.cost  # type: ignore[union-attr]


async def test_secrets_never_reach_logs_reprs_or_errors(
    openrouter_sim_factory, make_router: MakeRouter, log_events: list[dict[str, Any]]
) -> None:
    secret = "sk-or-v1-" + "ab" * 8 + "-not-a-real-key"
    sim = await openrouter_sim_factory(api_keys=[secret], completion_tokens=20)
    sim.add_fault({"kind": "rate_limit", "times": 1, "no_fallback": True})
    sim.add_fault({"kind": "reset", "times": 1, "after": 1, "no_fallback": True})
    errors: list[BaseException] = []
    router = await make_router(sim, api_key=secret, ledger=MemoryLedger(Decimal(1)))
    await router.chat(MESSAGES, max_tokens=50, stream=True)
    http = router._http
    assert http is not None
    wrong = "Bearer sk-or-v1-wrong"
    http._session._default_headers["Authorization"] = wrong  # type: ignore[union-attr]
    http._headers["Authorization"] = wrong
    if http._pool is not None:  # the lean POST path: rebuilt with the wrong key
        await http._pool.aclose()
        http._pool = None
        http._heads.clear()
    try:
        await router.chat(MESSAGES, max_tokens=50)
    except AuthenticationError as exc:
        errors.append(exc)
    assert errors
    texts = [repr(log_events), repr(router), str(errors[0]), repr(errors[0]), repr(router._http)]
    texts.append(repr(vars(errors[0])))
    for text in texts:
        assert secret not in text
        assert "ab" * 8 not in text


async def test_retry_after_is_honoured(
    openrouter_sim_factory, make_router: MakeRouter, recording_sleep: RecordingSleep
) -> None:
    # speed 1: the simulator's Retry-After is not time-compressed (429s answer at once)
    sim = await openrouter_sim_factory(speed=1.0)
    sim.add_fault({"kind": "rate_limit", "retry_after": 7, "no_fallback": True})
    router = await make_router(sim, retry=RetryPolicy(max_attempts=2, deadline=None))
    with pytest.raises(AllAttemptsFailed) as info:
        await router.chat(MESSAGES, max_tokens=20)
    error = info.value.exceptions[-1]
    assert isinstance(error, RateLimitError)
    assert error.retry_after == 7
    assert error.status == 429
    assert recording_sleep.calls == [7.0]


async def test_a_charged_error_finish_reaches_on_paid_before_its_retry(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    # A provider that bills its error finish (the simulator's assumption, `confirm`).
    billed = {"after_tokens": 10, "reported": 0.002, "confirm": True}
    openrouter_sim.add_fault(
        {"kind": "error_200", "provider": "chutes", "times": 1, "no_fallback": True, **billed}
    )
    ledger = MemoryLedger(Decimal(1))
    router = await make_router(openrouter_sim, ledger=ledger, retry=NO_JITTER)
    paid: list[Any] = []

    async def keep(result: Any) -> None:
        paid.append(result)

    result = await router.chat(MESSAGES, max_tokens=100, on_paid=keep)
    await router.close()
    partial, answer = paid
    assert (partial.finish_reason, partial.cost, partial.attempts) == ("error", Decimal("0.002"), 1)
    assert partial.generation_id
    assert partial.generation_id != result.generation_id
    assert answer.finish_reason != "error"
    assert (answer.generation_id, answer.text) == (result.generation_id, result.text)
    state = await ledger.snapshot()
    assert state.spent == _charged(openrouter_sim) == partial.cost + result.cost


async def test_a_free_error_finish_is_not_handed_to_on_paid(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    openrouter_sim.add_fault(
        {"kind": "error_200", "provider": "chutes", "times": 1, "no_fallback": True}
    )
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)), retry=NO_JITTER)
    paid: list[Any] = []

    async def keep(result: Any) -> None:
        paid.append(result)

    result = await router.chat(MESSAGES, max_tokens=100, on_paid=keep)
    await router.close()
    assert [r.generation_id for r in paid] == [result.generation_id]
