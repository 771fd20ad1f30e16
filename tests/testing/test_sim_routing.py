"""OpenRouter's provider routing semantics, as the simulator implements them."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from _sim_client import SimClient

from provider_router.testing import Market
from provider_router.testing.market.provider_routing import (
    RoutingError,
    parse_preferences,
    plan_route,
    traffic_weights,
)

KIMI = Market.default().models["moonshotai/kimi-k2.5"]
INT4 = {
    "chutes",
    "deepinfra",
    "siliconflow",
    "atlas-cloud",
    "together",
    "novita",
    "parasail",
    "moonshotai",
}


def route(provider: dict[str, Any] | None, used: tuple[str, ...] = (), seed: int = 0) -> list[str]:
    prefs = parse_preferences(provider)
    return [e.tag for e in plan_route(KIMI, prefs, used, random.Random(seed))]


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        ({"only": ["chutes"]}, ["chutes"]),
        ({"only": ["Chutes", "DEEPINFRA"]}, None),  # case-insensitive; order not implied
        ({"only": ["Moonshot AI"]}, ["moonshotai"]),  # display names are accepted too
        ({"order": ["together", "novita"], "allow_fallbacks": False}, ["together", "novita"]),
        (
            {"sort": "price", "only": ["together", "chutes", "novita"]},
            ["chutes", "novita", "together"],
        ),
        (
            {"sort": {"by": "throughput"}, "only": ["chutes", "fireworks", "together"]},
            ["fireworks", "together", "chutes"],
        ),
        ({"sort": "latency", "only": ["chutes", "deepinfra"]}, ["deepinfra", "chutes"]),
        ({"quantizations": ["fp4"], "sort": "price"}, ["fireworks", "baseten"]),
        ({"quantizations": ["unknown"]}, ["venice"]),
        ({"max_price": {"completion": 2.3}, "sort": "price"}, ["chutes", "novita", "baseten"]),
        ({"max_price": {"completion": "2.30", "prompt": "0.5"}}, ["chutes", "baseten"]),
    ],
)
def test_filters_and_sorts(provider: dict[str, Any], expected: list[str] | None) -> None:
    tags = route(provider)
    if expected is None:
        assert sorted(tags) == ["chutes", "deepinfra"]
    else:
        assert tags == expected


def test_ignore_excludes_and_int4_quantization_keeps_the_natives() -> None:
    tags = route({"ignore": ["fireworks", "baseten"], "quantizations": ["int4"]})
    assert set(tags) == INT4


def test_order_goes_first_then_the_rest_as_fallbacks() -> None:
    tags = route({"order": ["venice", "parasail"]})
    assert tags[:2] == ["venice", "parasail"]
    assert len(tags) == len(KIMI.endpoints)


def test_no_fallbacks_without_order_tries_one_endpoint() -> None:
    assert len(route({"allow_fallbacks": False})) == 1


def test_default_choice_follows_the_traffic_shares_among_stable_providers() -> None:
    """OpenRouter's traffic-routing guide: shares from the adjusted price and speed,
    a competitive edge, and a little exploration for every stable endpoint."""
    firsts = Counter(route(None, seed=seed)[0] for seed in range(3000))
    assert "baseten" not in firsts
    assert "venice" not in firsts, "unstable endpoints only as fallbacks"
    stable = [e for e in KIMI.endpoints if e.status >= 0]
    weights = traffic_weights(stable)
    total = sum(weights)
    for endpoint, weight in zip(stable, weights, strict=True):
        expected = 3000 * weight / total
        assert abs(firsts[endpoint.tag] - expected) < 4 * expected**0.5 + 5, endpoint.tag
        assert weight / total >= 0.009, "every stable endpoint keeps some traffic"
    # A faster endpoint may cost more and still win: shares are not inverse price alone.
    best = stable[weights.index(max(weights))]
    assert best.blended_price > min(e.blended_price for e in stable)
    tail = route(None, seed=1)[-2:]
    assert tail == ["venice", "baseten"]


def test_require_parameters_filters_and_tools_are_a_soft_filter() -> None:
    tags = route({"require_parameters": True}, used=("tools", "max_tokens"))
    assert "parasail" not in tags
    assert "venice" not in tags
    assert "parasail" not in route(None, used=("tools",)), "tools prefer capable endpoints"


@pytest.mark.parametrize(
    ("provider", "message", "excluded_by"),
    [
        (
            {"only": ["nobody"]},
            "No allowed providers are available for the selected model.",
            "allowed_providers",
        ),
        ({"only": ["chutes"], "ignore": ["chutes"]}, "No allowed providers", "allowed_providers"),
        ({"quantizations": ["bf16"]}, "quantization", "quantization"),
        ({"max_price": {"completion": 1}}, "max_price", "max_price"),
        (
            {"order": ["nobody"], "allow_fallbacks": False},
            "No allowed providers",
            "allowed_providers",
        ),
    ],
)
def test_nothing_left_is_a_404_worded_like_openrouter(
    provider: dict[str, Any], message: str, excluded_by: str
) -> None:
    with pytest.raises(RoutingError) as caught:
        route(provider)
    assert caught.value.status == 404
    assert message in caught.value.message
    assert caught.value.excluded_by == (excluded_by,)


@pytest.mark.parametrize(
    "provider",
    [
        "chutes",
        {"order": "chutes"},
        {"only": [1]},
        {"allow_fallbacks": "no"},
        {"sort": "cheapest"},
        {"max_price": {"completion": "cheap"}},
        {"max_price": {"tokens": 1}},
        {"max_price": {"completion": -1}},
        {"colour": "blue"},
    ],
)
def test_bad_provider_objects_are_400s_naming_the_field(provider: Any) -> None:
    with pytest.raises(RoutingError) as caught:
        parse_preferences(provider)
    assert caught.value.status == 400
    assert "provider" in caught.value.message


async def test_routing_over_http_reports_the_serving_provider(
    client: SimClient, openrouter_sim: Any
) -> None:
    reply = await client.chat(
        max_tokens=5, provider={"order": ["novita"], "allow_fallbacks": False}
    )
    assert reply.json["provider"] == "Novita"
    reply = await client.chat(max_tokens=5, provider={"only": ["nobody"]})
    assert reply.status == 404
    assert reply.json["error"]["availability"]["excluded_by"] == ["allowed_providers"]


async def test_a_down_provider_falls_back_unless_fallbacks_are_off(
    client: SimClient, openrouter_sim: Any
) -> None:
    openrouter_sim.set_down("deepinfra")
    reply = await client.chat(max_tokens=5, provider={"order": ["deepinfra", "together"]})
    assert reply.status == 200
    assert reply.json["provider"] == "Together"
    assert openrouter_sim.requests[-1].attempts == [("deepinfra", 503), ("together", 200)]
    reply = await client.chat(
        max_tokens=5, provider={"order": ["deepinfra"], "allow_fallbacks": False}
    )
    assert reply.status == 503
    assert reply.json["error"]["metadata"]["provider_name"] == "DeepInfra"
    openrouter_sim.set_down("deepinfra", False)
    reply = await client.chat(max_tokens=5, provider={"only": ["deepinfra"]})
    assert reply.json["provider"] == "DeepInfra"


def test_a_sort_tries_endpoints_in_its_order_whatever_failed_recently() -> None:
    """A sort turns load balancing off (provider-selection guide): no breaker moves a
    recently failed endpoint back; default routing still keeps it as a fallback."""
    prefs = parse_preferences({"sort": "price", "only": ["chutes", "novita", "deepinfra"]})
    tags = [e.tag for e in plan_route(KIMI, prefs, (), random.Random(0), {"chutes"})]
    assert tags == ["chutes", "novita", "deepinfra"]
    default = [e.tag for e in plan_route(KIMI, None, (), random.Random(0), {"chutes"})]
    assert default[0] != "chutes"


async def test_a_429_is_no_outage_but_an_error_trips_the_breaker(start_sim: Any) -> None:
    """Uptime leaves rate-limited requests out: a full endpoint's 429 falls back inside
    the request and the next request under ``sort: price`` tries it first again; a 502
    makes it unstable for default routing's 30 seconds."""
    sim, client = await start_sim(
        faults=[
            {"kind": "rate_limit", "provider": "chutes", "times": 1},
            {"kind": "provider_error", "provider": "novita", "status": 502, "times": 1},
        ]
    )
    provider = {"sort": "price", "only": ["chutes", "novita", "deepinfra"]}
    first = await client.chat(max_tokens=5, provider=provider)
    assert first.json["provider"] == "DeepInfra"
    assert sim.requests[-1].attempts == [("chutes", 429), ("novita", 502), ("deepinfra", 200)]
    assert sim.simulator.unstable_tags() == {"novita"}
    second = await client.chat(max_tokens=5, provider=provider)
    assert second.json["provider"] == "Chutes"
