"""Model variants (:nitro, :floor, :exacto), ``models`` fallbacks, unknown models, Auto
Exacto for tool requests, and the listing headers, as OpenRouter documents them."""

from __future__ import annotations

from typing import Any

from _sim_client import MODEL, SimClient
from _sim_contract import contract

from provider_router.testing import COMPLETION_TOKENS_HEADER
from provider_router.testing.market.listing import Market
from provider_router.testing.market.variants import split_variants

FIXED = {COMPLETION_TOKENS_HEADER: "10"}
ENDPOINTS = Market.default().models[MODEL].endpoints
STABLE = [e for e in ENDPOINTS if e.status >= 0 and not e.down]
FASTEST = max(STABLE, key=lambda e: e.throughput).provider_name
CHEAPEST = min(STABLE, key=lambda e: (e.blended_price, e.tag)).provider_name


async def served(client: SimClient, n: int = 0, **body: Any) -> Any:
    messages = [{"role": "system", "content": f"variant request {n}"}]
    reply = await client.post("/chat/completions", {"messages": messages, **body}, FIXED)
    return reply


async def test_variants_sort_and_the_last_one_wins(client: SimClient) -> None:
    for n in range(5):
        nitro = await served(client, n, model=f"{MODEL}:nitro")
        assert nitro.status == 200, nitro.text
        assert nitro.json["provider"] == FASTEST
        assert nitro.json["model"] == "moonshotai/kimi-k2.5-0127", "the base model serves"
        floor = await served(client, n, model=f"{MODEL}:nitro:floor")
        assert floor.json["provider"] == CHEAPEST
    # A body sort wins over the variant.
    reply = await served(client, model=f"{MODEL}:floor", provider={"sort": "throughput"})
    assert reply.json["provider"] == FASTEST
    assert split_variants("a/b:free:nitro") == ("a/b:free", "nitro")
    assert split_variants("a/b:exacto") == ("a/b", "exacto")


async def test_models_fallbacks_and_unknown_models(client: SimClient) -> None:
    reply = await served(client, models=["acme/missing", MODEL])
    assert reply.status == 200, reply.text
    reply = await served(client, model="acme/missing", models=[f"{MODEL}:nitro"])
    assert reply.status == 200
    assert reply.json["provider"] == FASTEST
    reply = await served(client)  # no model at all
    assert reply.status == 400
    assert "None" not in reply.json["error"]["message"]
    assert "model" in reply.json["error"]["message"]
    reply = await served(client, model="acme/missing")
    assert reply.status == 400
    assert reply.json["error"]["message"] == "acme/missing is not a valid model ID"
    assert reply.json["error"]["availability"]["code"] == "model_not_found"
    contract().validate("/chat/completions", "post", 400, reply.json)
    reply = await served(client, models="not-a-list", model="acme/missing")
    assert reply.status == 400
    assert "models" in reply.json["error"]["message"]


async def test_auto_exacto_ranks_tool_requests_unless_sorted_or_ordered(
    client: SimClient,
) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    capable = [e for e in STABLE if "tools" in e.supported_parameters]
    best = max(capable, key=lambda e: e.throughput).provider_name
    for n in range(5):
        reply = await served(client, n, model=MODEL, tools=[tool], tool_choice="none")
        assert reply.json["provider"] == best
    reply = await served(
        client, model=MODEL, tools=[tool], tool_choice="none", provider={"sort": "price"}
    )
    assert reply.json["provider"] == CHEAPEST
    reply = await served(
        client, model=MODEL, tools=[tool], tool_choice="none", provider={"order": ["novita"]}
    )
    assert reply.json["provider"] == "Novita"


async def test_variant_model_routes_and_listing_headers(client: SimClient) -> None:
    reply = await client.get(f"/model/{MODEL}:nitro")
    assert reply.status == 200
    assert reply.json["data"]["id"] == MODEL
    assert (await client.get(f"/model/{MODEL}:turbo")).status == 404
    listing = await client.get("/models")
    assert listing.headers["cache-control"].startswith("public, max-age=300")
