"""Prompt-cache sticky routing (OpenRouter's prompt-caching guide, "Provider Sticky
Routing"): a conversation or ``session_id`` stays on the endpoint that served it while
its cache read is cheaper, not with ``provider.order``, and expires after 10 idle minutes."""

from __future__ import annotations

from typing import Any

from _sim_client import MODEL, SimClient, StartSim

from provider_router.testing import COMPLETION_TOKENS_HEADER
from provider_router.testing.market.sticky import STICKY_IDLE_SECONDS, StickyRoutes, sticky_key

FIXED = {COMPLETION_TOKENS_HEADER: "20"}
SYSTEM = {"role": "system", "content": "You write careful training data. " * 40}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def conversation(n: int, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [SYSTEM]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Conversation {n}, question {turn}."})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"Answer {turn} of {n}. " * 10})
    return messages


async def served(client: SimClient, body: dict[str, Any], headers: Any = None) -> tuple[str, int]:
    reply = await client.post("/chat/completions", {"model": MODEL, **body}, headers or FIXED)
    assert reply.status == 200, reply.text
    usage = reply.json["usage"]
    return reply.json["provider"], int(usage["prompt_tokens_details"]["cached_tokens"])


async def test_default_routing_keeps_a_conversation_on_one_provider(start_sim: StartSim) -> None:
    _, client = await start_sim(seed=3)
    providers = []
    cached_turns = []
    # Among endpoints that cache and some that do not (no order: stickiness stays on).
    only = {"only": ["chutes", "deepinfra", "novita", "moonshotai", "together", "parasail"]}
    for turn in range(1, 13):
        body = {"messages": conversation(1, turn), "provider": only}
        provider, cached = await served(client, body)
        providers.append(provider)
        cached_turns.append(cached > 0)
    # Stickiness starts after the first cache hit (the guide), at an endpoint whose
    # cache read is cheaper; from then on every turn goes there and reads the one before.
    first_hit = cached_turns.index(True)
    assert first_hit > 0, "the first turn has nothing cached"
    assert providers[first_hit] in providers[:first_hit], "a hit reads an earlier turn's"
    assert providers[first_hit] in {"Chutes", "DeepInfra", "Novita", "Moonshot AI"}
    assert set(providers[first_hit:]) == {providers[first_hit]}, providers
    assert all(cached_turns[first_hit:]), cached_turns


async def test_session_id_is_the_sticky_key(start_sim: StartSim) -> None:
    _, client = await start_sim(seed=5)
    # Different conversations, one session: they stay together.
    providers = {
        (await served(client, {"messages": conversation(n, 1), "session_id": "s-1"}))[0]
        for n in range(12)
    }
    assert len(providers) == 1
    # The x-session-id header works too.
    header = {**FIXED, "x-session-id": "s-2"}
    providers = {
        (await served(client, {"messages": conversation(n, 1)}, header))[0] for n in range(12)
    }
    assert len(providers) == 1


async def test_a_request_without_a_sticky_key_is_routed_afresh(start_sim: StartSim) -> None:
    """The control: no session_id and no user message (no conversation to keep)."""
    _, client = await start_sim(seed=3)
    drawn = set()
    for n in range(40):
        body = {"messages": [{"role": "system", "content": f"only a system prompt {n}"}]}
        drawn.add((await served(client, body))[0])
    assert len(drawn) > 1


async def test_order_disables_stickiness(start_sim: StartSim) -> None:
    _, client = await start_sim(seed=1)
    first, _ = await served(client, {"messages": conversation(7, 1), "session_id": "x"})
    other = "together" if first != "Together" else "novita"
    provider, _ = await served(
        client,
        {"messages": conversation(7, 2), "session_id": "x", "provider": {"order": [other]}},
    )
    assert provider.lower() == other


async def test_a_sticky_session_expires_after_ten_idle_minutes(start_sim: StartSim) -> None:
    clock = FakeClock()
    _, client = await start_sim(seed=2, clock=clock)

    async def providers(turns: int) -> list[str]:
        return [
            (await served(client, {"messages": conversation(n, turns), "session_id": f"s{n}"}))[0]
            for n in range(12)
        ]

    first = await providers(1)
    clock.now += STICKY_IDLE_SECONDS - 1
    assert await providers(2) == first  # kept: idle less than ten minutes
    clock.now += STICKY_IDLE_SECONDS + 1
    assert await providers(3) != first  # forgotten: routed afresh, so some move


def test_a_session_is_forgotten_once_idle_for_ten_minutes() -> None:
    from provider_router.testing.market.listing import Market

    chutes = next(e for e in Market.default().models[MODEL].endpoints if e.tag == "chutes")
    routes = StickyRoutes()
    key = sticky_key("k", MODEL, {"session_id": "s", "messages": []}, None)
    assert key == ("k", MODEL, "s")
    routes.remember(key, chutes, 0.0)
    assert routes.lookup(key, STICKY_IDLE_SECONDS - 0.5) == "chutes"
    routes.remember(key, chutes, 100.0)  # use refreshes it
    assert routes.lookup(key, 100.0 + STICKY_IDLE_SECONDS - 0.5) == "chutes"
    assert routes.lookup(key, 100.0 + STICKY_IDLE_SECONDS) is None
    # Without session_id the conversation opener is the key; the body's id beats the header's.
    opener = sticky_key("k", MODEL, {"messages": [SYSTEM, {"role": "user", "content": "q"}]}, None)
    later = sticky_key(
        "k",
        MODEL,
        {"messages": [SYSTEM, {"role": "user", "content": "q"}, {"role": "user", "content": "r"}]},
        None,
    )
    assert opener is not None
    assert opener == later
    assert sticky_key("k", MODEL, {"session_id": "b", "messages": []}, "h") == ("k", MODEL, "b")
    assert sticky_key("k", MODEL, {"messages": [SYSTEM]}, "h") == ("k", MODEL, "h")


def test_stickiness_needs_a_cheaper_cache_read_and_is_bounded() -> None:
    from provider_router.testing.market.listing import Market

    model = Market.default().models[MODEL]
    by_tag = {e.tag: e for e in model.endpoints}
    routes = StickyRoutes(capacity=2)
    routes.remember(("k", MODEL, 1), by_tag["together"], 0.0, cache_hit=True)  # no read price
    assert routes.lookup(("k", MODEL, 1), 1.0) is None
    routes.remember(("k", MODEL, 2), by_tag["chutes"], 0.0)  # a conversation before its hit
    assert routes.lookup(("k", MODEL, 2), 1.0) is None
    routes.remember(("k", MODEL, 2), by_tag["chutes"], 0.0, cache_hit=True)
    assert routes.lookup(("k", MODEL, 2), 1.0) == "chutes"
    routes.remember(("k", MODEL, "s"), by_tag["together"], 0.0)  # a session_id: kept anyway
    assert routes.lookup(("k", MODEL, "s"), 1.0) == "together"
    for name in "abc":
        routes.remember(("k", MODEL, name), by_tag["chutes"], 0.0)
    assert len(routes) == 2
    assert routes.lookup(("k", MODEL, "a"), 1.0) is None  # least recently used went first
    assert routes.lookup(("k", MODEL, "c"), 1.0) == "chutes"
