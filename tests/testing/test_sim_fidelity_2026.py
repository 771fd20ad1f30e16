"""Small fidelity fixes of #24: /models filters and paging, listings without a key,
openrouter_metadata on request."""

from __future__ import annotations

from _sim_client import MODEL, SimClient, StartSim
from _sim_contract import contract

from provider_router.testing import COMPLETION_TOKENS_HEADER

FIXED = {COMPLETION_TOKENS_HEADER: "10"}


async def test_models_filters_and_pages(client: SimClient) -> None:
    every = await client.get("/models")
    total = every.json["total_count"]
    assert total == len(every.json["data"]) >= 2  # Kimi K2.5 and K3 (the Batch API's)
    reply = await client.get("/models", supported_parameters="tools,response_format")
    assert MODEL in [m["id"] for m in reply.json["data"]]
    reply = await client.get("/models", supported_parameters="web_search_options")
    assert reply.json["data"] == []
    reply = await client.get("/models", output_modalities="image")
    assert reply.json["data"] == []
    assert len((await client.get("/models", output_modalities="all")).json["data"]) == total
    reply = await client.get("/models", offset=str(total), limit="10")
    assert reply.json["data"] == []
    assert reply.json["total_count"] == total
    reply = await client.get("/models", offset="1", limit="1")
    assert [m["id"] for m in reply.json["data"]] == [every.json["data"][1]["id"]]
    contract().validate("/models", "get", 200, reply.json)
    assert (await client.get("/models", limit="0")).status == 400
    assert (await client.get("/models", offset="x")).status == 400


async def test_a_listing_without_a_key_has_no_recent_performance(start_sim: StartSim) -> None:
    _, anonymous = await start_sim(key=None)
    reply = await anonymous.get(f"/models/{MODEL}/endpoints")
    assert reply.status == 200
    endpoints = reply.json["data"]["endpoints"]
    assert all(e["latency_last_30m"] is None for e in endpoints)
    assert all(e["throughput_last_30m"] is None for e in endpoints)
    contract().validate("/models/{author}/{slug}/endpoints", "get", 200, reply.json)
    _, keyed = await start_sim()
    reply = await keyed.get(f"/models/{MODEL}/endpoints")
    assert reply.json["data"]["endpoints"][0]["latency_last_30m"]["p50"] > 0


async def test_openrouter_metadata_when_asked(client: SimClient) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    reply = await client.post("/chat/completions", body, FIXED)
    assert "openrouter_metadata" not in reply.json
    asked = {**FIXED, "X-OpenRouter-Metadata": "enabled"}
    reply = await client.post(
        "/chat/completions", {**body, "provider": {"only": ["novita"]}}, asked
    )
    metadata = reply.json["openrouter_metadata"]
    assert metadata["requested"] == MODEL
    assert metadata["endpoints"]["available"] == [
        {"model": MODEL, "provider": "Novita", "selected": True}
    ]
    assert metadata["attempt"] == 1
    contract().validate("/chat/completions", "post", 200, reply.json)
