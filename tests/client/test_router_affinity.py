"""Cache-aware pinning: a conversation (or a ``session_id``) goes to one allowed endpoint,
chosen at the expected cache hit rate, with a one-tag ``only``, no ``order`` and its
``session_id``, and moves only when that endpoint fails it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from importlib import resources
from typing import Any

import pytest
from _markets import edited_market
from _router_helpers import MakeRouter

from provider_router import AffinityOptions, ConfigurationError, MemoryLedger
from provider_router.client.affinity import CacheAffinity, conversation_session
from provider_router.routing.ranking import Workload
from provider_router.testing import SimulatorServer

SYSTEM = {"role": "system", "content": "You write careful multi-turn training data. " * 60}
# A prompt-heavy workload: the cache read price decides (DeepInfra's $0.10 beats
# Chutes' $0.15 once most of the prompt is cached, though Chutes' $0.45 prompt is cheapest).
LONG = Workload(prompt_tokens=20_000, completion_tokens=400)


def turns(n: int, conversation: int = 0) -> list[list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = [SYSTEM]
    out = []
    for turn in range(n):
        messages = [*messages, {"role": "user", "content": f"Chat {conversation}, turn {turn}?"}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"Reply {turn}. " * 30}]
    return out


async def test_a_conversation_is_pinned_where_cache_reads_make_it_cheapest(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]], make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=40)
    ledger = MemoryLedger(Decimal(5))
    router = await make_router(
        sim, ledger=ledger, workload=LONG, cache_affinity=AffinityOptions(hit_rate="0.9")
    )
    plan = router.plan
    assert plan.ranked[0].endpoint.slug == "chutes"  # by list price
    assert plan.cache_ranked[0].endpoint.slug == "deepinfra"  # at a 90 % hit rate
    results = [await router.chat(m, max_tokens=100) for m in turns(8)]
    assert {r.provider for r in results} == {"DeepInfra"}
    assert [r.usage.cached_tokens > 0 for r in results if r.usage] == [False] + [True] * 7
    session = conversation_session(turns(1)[0], router.affinity.digest_key)
    for record in sim.requests:
        assert record.routing is not None
        assert record.routing["only"] == ["deepinfra"]
        assert "order" not in record.routing, "order turns OpenRouter's sticky routing off"
        # The pinned endpoint's own ceilings, the very ones its reservation assumed.
        assert record.routing == plan.route("deepinfra").object
    assert session is not None
    assert any(session in key for key in sim.simulator.sticky._routes), "sent as session_id"
    assert router.affinity.pinned == 1
    # What caching saved: every cached token at DeepInfra's $0.50 prompt less $0.10 read.
    cached = sum(r.usage.cached_tokens for r in results if r.usage)
    assert router.cache_saved == cached * (Decimal("0.50") - Decimal("0.10")) / 1_000_000
    state = await ledger.snapshot()
    assert state.spent == sim.simulator.usage


async def test_an_explicit_session_id_is_pinned_only_when_asked(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]], make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=10)
    plain = await make_router(sim)
    await plain.chat(turns(1, 1)[0], max_tokens=50, session_id="job-7")
    not_asked = sim.requests[-1].routing
    assert not_asked == plain.plan.route("chutes").object, "not asked: admission's choice"
    assert plain.affinity.pinned == 0
    router = await make_router(sim, cache_affinity=True)
    await router.chat(turns(1, 1)[0], max_tokens=50, session_id="job-7")
    await router.chat(turns(1, 2)[0], max_tokens=50, session_id="job-7")
    pinned = [r.routing for r in sim.requests[-2:]]
    assert pinned[0] == pinned[1]
    assert pinned[0] is not None
    assert len(pinned[0]["only"]) == 1
    assert "order" not in pinned[0]
    with pytest.raises(ConfigurationError, match="session_id"):
        await router.chat(turns(1)[0], max_tokens=50, session_id="")
    with pytest.raises(ConfigurationError, match="session_id"):
        await router.chat(turns(1)[0], max_tokens=50, session_id="x" * 257)


async def test_a_failed_pinned_endpoint_moves_the_session_once(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]], make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=10)
    router = await make_router(sim, cache_affinity=True)
    first = router.plan.cache_ranked[0].endpoint
    # One failure: the retry stays (a passing error; moving would lose the cache).
    sim.add_fault({"kind": "provider_error", "provider": first.slug, "times": 1})
    stayed = await router.chat(turns(1, 9)[0], max_tokens=50)
    assert stayed.provider == first.provider_name
    assert stayed.attempts == 2
    assert router.affinity.moves == 0
    # Two in a row: the session moves.
    sim.add_fault({"kind": "provider_error", "provider": first.slug, "times": 2})
    conversation = turns(3)
    result = await router.chat(conversation[0], max_tokens=50)
    assert result.provider != first.provider_name
    assert result.attempts == 3
    assert router.affinity.moves == 1
    # The session stays where it moved: later turns go there, and read its cache.
    later = [await router.chat(m, max_tokens=50) for m in conversation[1:]]
    assert {r.provider for r in later} == {result.provider}
    assert [r.routing for r in sim.requests][-1] == sim.requests[-2].routing


def test_sessions_are_bounded_and_expire_when_idle() -> None:
    from provider_router.catalog.records import ModelEndpoints
    from provider_router.routing.route_plan import build_route_plan

    class Allowed:
        def __init__(self, endpoint: Any) -> None:
            self.endpoint = endpoint
            self.allowed = True

    raw = json.loads(
        resources.files("provider_router.data").joinpath("kimi-k2.5.endpoints.json").read_text()
    )
    endpoints = ModelEndpoints.model_validate(raw["data"])
    plan = build_route_plan(
        "moonshotai/kimi-k2.5",
        [Allowed(e) for e in endpoints.endpoints if e.pricing.prompt is not None],
        workload=LONG,
    )
    affinity = CacheAffinity(idle_seconds=600, max_sessions=2)
    best = plan.cache_ranked[0].endpoint.slug
    assert affinity.pin("a", plan, 0.0) == best
    assert affinity.pin("a", plan, 599.0) == best
    assert affinity.pinned == 1
    assert affinity.pin("a", plan, 1200.0) == best  # idle: chosen afresh
    assert affinity.pinned == 2
    second = affinity.pin("b", plan, 0.0, demoted={plan.cache_ranked[0].endpoint.provider_name})
    assert second != best, "a demoted provider gets no new session"
    affinity.pin("c", plan, 0.0)
    assert len(affinity) == 2
    assert conversation_session([{"role": "system", "content": "no user"}]) is None
    one = conversation_session(turns(2)[1])
    assert one == conversation_session(turns(1)[0]), "every turn of a conversation"
    assert one != conversation_session(turns(1, 1)[0])
    assert one is not None
    assert one.startswith("pr-")
    assert len(one) == 19
    # Keyed: whoever holds a guessed opener cannot confirm it against the session_id.
    key = CacheAffinity().digest_key
    keyed = conversation_session(turns(1)[0], key)
    assert keyed == conversation_session(turns(2)[1], key), "every turn, under one key"
    assert keyed != one
    assert keyed != conversation_session(turns(1)[0], CacheAffinity().digest_key)


async def test_a_conversation_session_id_is_keyed_per_router(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]], make_router: MakeRouter
) -> None:
    sim = await openrouter_sim_factory(completion_tokens=10)
    sent = []
    for _ in range(2):
        router = await make_router(sim, cache_affinity=True)
        await router.chat(turns(1)[0], max_tokens=50)
        sent.append(conversation_session(turns(1)[0], router.affinity.digest_key))
    assert sent[0] != sent[1]
    sticky = " ".join(map(str, sim.simulator.sticky._routes))
    assert all(session is not None and session in sticky for session in sent)
    unkeyed = conversation_session(turns(1)[0])
    assert unkeyed is not None
    assert unkeyed not in sticky, "never the unkeyed digest"


def test_a_bad_cache_hit_rate_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"AffinityOptions\.hit_rate .*'1\.5'"):
        AffinityOptions(hit_rate="1.5")
    with pytest.raises(ConfigurationError, match=r"AffinityOptions\.hit_rate"):
        AffinityOptions(hit_rate="many")


async def test_pin_fallbacks_send_a_request_elsewhere_when_its_pin_is_full(
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]], make_router: MakeRouter
) -> None:
    """A pinned request waits for its own endpoint's room; with ``pin_fallbacks`` a full
    pin does not hold it: admission sends it where there is room (one cache miss, our
    choice, not OpenRouter's), and the session stays pinned."""
    sim = await openrouter_sim_factory(completion_tokens=10)
    conversation = turns(3)
    for fallbacks in (False, True):
        router = await make_router(
            sim,
            max_concurrency=2,
            workload=LONG,  # pinned to DeepInfra (its cache reads), Chutes first otherwise
            cache_affinity=AffinityOptions(hit_rate="0.9", pin_fallbacks=fallbacks),
        )
        pin = router.plan.cache_ranked[0].endpoint
        assert pin.slug == "deepinfra"
        first = await router.chat(conversation[0], max_tokens=50)
        assert first.endpoint == pin.slug
        admission = router.admission
        held = [admission.try_admit(admission.queue(pin=pin.slug)) for _ in range(2)]
        assert all(held), "the pin's two places, taken"
        second = asyncio.ensure_future(router.chat(conversation[1], max_tokens=50))
        for _ in range(20):
            await asyncio.sleep(0)  # it is prepared and admitted, or waits
        if not fallbacks:
            assert not second.done(), "a full pin holds its request"
            assert admission.waiting == 1
        for ticket in held:
            assert ticket is not None
            admission.release(ticket, "neutral")
        result = await second
        assert (result.endpoint == pin.slug) is not fallbacks
        assert sim.requests[-1].routing == router.plan.route(result.endpoint or "").object
        third = await router.chat(conversation[2], max_tokens=50)
        assert third.endpoint == pin.slug, "the session stayed on its pin"
        assert router.affinity.moves == 0


async def test_a_pin_keeps_to_endpoints_that_list_what_the_request_uses(
    tmp_path: Any,
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
    make_router: MakeRouter,
) -> None:
    # A one-tag pin has no fallback inside OpenRouter: pinned to an endpoint without
    # `tools`, a tool request would be answered (and paid) in plain text.
    def only_moonshot_lists_tools(endpoint: dict[str, Any]) -> None:
        params = [p for p in endpoint.get("supported_parameters") or [] if p != "tools"]
        if endpoint["slug"] == "moonshotai":  # only the dearest lists tools
            params.append("tools")
        endpoint["supported_parameters"] = params

    market = edited_market(tmp_path, only_moonshot_lists_tools)
    sim = await openrouter_sim_factory(market=market, completion_tokens=10)
    router = await make_router(sim, cache_affinity=True)
    best = router.plan.cache_ranked[0].endpoint.slug
    assert best != "moonshotai"  # what an unconstrained pin would choose
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    await router.chat(turns(1, 5)[0], max_tokens=50, tools=[tool])
    assert sim.requests[-1].routing["only"] == ["moonshotai"]
    await router.chat(turns(1, 6)[0], max_tokens=50)  # no tools: the cheapest pin
    assert sim.requests[-1].routing["only"] == [best]


async def test_a_pin_holds_the_prompt_and_the_cap_in_its_context_window(
    tmp_path: Any,
    openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]],
    make_router: MakeRouter,
) -> None:
    # A one-tag pin cannot fall back: an endpoint whose window holds the cap but not
    # the prompt with it would fail the request (or truncate a paid answer).
    def small_window_at_chutes(endpoint: dict[str, Any]) -> None:
        if endpoint["slug"] == "chutes":
            endpoint["context_length"] = 3_000

    market = edited_market(tmp_path, small_window_at_chutes)
    sim = await openrouter_sim_factory(market=market, completion_tokens=10)
    router = await make_router(sim, cache_affinity=True)
    assert router.plan.cache_ranked[0].endpoint.slug == "chutes"
    long_prompt = [{"role": "user", "content": "Summarise these words. " + "word " * 2_500}]
    await router.chat(long_prompt, max_tokens=1_000)  # the cap alone fits 3,000
    routing = sim.requests[-1].routing
    assert routing is not None
    assert len(routing["only"]) == 1
    assert routing["only"] != ["chutes"]
    short = [{"role": "user", "content": "Say hello."}]
    await router.chat(short, max_tokens=1_000)
    assert sim.requests[-1].routing["only"] == ["chutes"], "a short prompt still fits"
