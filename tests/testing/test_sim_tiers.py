"""Service tiers: tier endpoints (flex, priority) serve only when asked for, by their tag
or the request's ``service_tier``; flex never falls back; billing follows the endpoint
that served; base slugs do not match tier endpoints."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _sim_client import SimClient, StartSim
from _sim_contract import contract

from provider_router.testing import COMPLETION_TOKENS_HEADER

FIXED = {COMPLETION_TOKENS_HEADER: "10"}
MODEL = "acme/tiered"
M = Decimal(1_000_000)
MARKET = Path(__file__).parents[1] / "data" / "markets" / "tiered.yaml"


@pytest.fixture
async def tiered(start_sim: StartSim) -> tuple[Any, SimClient]:
    return await start_sim(market=MARKET, seed=4)


async def post(client: SimClient, n: int = 0, **body: Any) -> Any:
    messages = [{"role": "system", "content": f"request {n}"}]
    return await client.post(
        "/chat/completions", {"model": MODEL, "messages": messages, **body}, FIXED
    )


def served_tag(sim: Any) -> str:
    return str(sim.requests[-1].attempts[-1][0])


async def test_tier_endpoints_never_serve_unasked(tiered: tuple[Any, SimClient]) -> None:
    sim, client = tiered
    tags = set()
    for n in range(40):
        reply = await post(client, n)
        assert reply.status == 200
        assert "service_tier" not in reply.json
        tags.add(served_tag(sim))
    assert tags == {"google-vertex", "chutes"}
    # A base slug matches the provider's standard endpoint, not its tiers.
    for n in range(10):
        await post(client, n, provider={"only": ["google-vertex"]})
        assert served_tag(sim) == "google-vertex"


async def test_flex_serves_at_its_price_and_never_falls_back(
    tiered: tuple[Any, SimClient],
) -> None:
    sim, client = tiered
    reply = await post(client, service_tier="flex")
    assert reply.status == 200
    assert reply.json["service_tier"] == "flex"
    usage = reply.json["usage"]
    assert Decimal(str(usage["cost"])) == (
        usage["prompt_tokens"] * Decimal("0.5") / M + 10 * Decimal("2") / M
    )
    contract().validate("/chat/completions", "post", 200, reply.json)
    await client.get("/generation", id=reply.json["id"])
    generation = await client.get("/generation", id=reply.json["id"])
    assert generation.json["data"]["service_tier"] == "flex"
    # Named by its tag, the flex endpoint serves too.
    await post(client, 1, provider={"only": ["google-vertex/flex"]})
    assert served_tag(sim) == "google-vertex/flex"
    # Flex fails: no standard endpoint takes over.
    sim.add_fault({"kind": "provider_error", "provider": "google-vertex/flex", "times": 1})
    reply = await post(client, 2, service_tier="flex")
    assert reply.status >= 500
    assert [tag for tag, _ in sim.requests[-1].attempts] == ["google-vertex/flex"]


async def test_priority_is_tried_first_and_falls_back(tiered: tuple[Any, SimClient]) -> None:
    sim, client = tiered
    reply = await post(client, service_tier="priority")
    assert reply.json["service_tier"] == "priority"
    sim.add_fault({"kind": "provider_error", "provider": "google-vertex/priority", "times": 1})
    reply = await post(client, 3, service_tier="priority")
    assert reply.status == 200
    attempts = [tag for tag, _ in sim.requests[-1].attempts]
    assert attempts[0] == "google-vertex/priority"
    assert attempts[-1] in ("google-vertex", "chutes")
    assert "service_tier" not in reply.json, "served by a standard endpoint"
