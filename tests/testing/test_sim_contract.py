"""Every simulator response, error bodies included, matches OpenRouter's OpenAPI spec."""

from __future__ import annotations

import math
from typing import Any

import pytest
from _sim_client import MODEL, SimClient, StartSim, chat_body
from _sim_contract import apply_overlay, contract

CHAT = "/chat/completions"


def check(path: str, method: str, status: int, body: Any) -> None:
    contract().validate(path, method, status, body)


def check_stream(events: list[Any]) -> None:
    assert events, "a stream with no data events"
    for event in events:
        contract().validate_chunk(event)


def test_the_validator_rejects_a_body_that_breaks_the_spec() -> None:
    with pytest.raises(AssertionError, match="choices"):
        check(
            CHAT, "post", 200, {"id": "x", "created": 1, "model": "m", "object": "chat.completion"}
        )
    with pytest.raises(AssertionError, match="code"):
        check(CHAT, "post", 402, {"error": {"message": "no code"}})


async def test_listing_routes(client: SimClient) -> None:
    reply = await client.get("/models")
    check("/models", "get", reply.status, reply.json)
    reply = await client.get(f"/models/{MODEL}/endpoints")
    assert reply.status == 200
    check("/models/{author}/{slug}/endpoints", "get", 200, reply.json)
    reply = await client.get("/models/nobody/nothing/endpoints")
    assert reply.status == 404
    check("/models/{author}/{slug}/endpoints", "get", 404, reply.json)
    reply = await client.get("/providers")
    check("/providers", "get", reply.status, reply.json)
    reply = await client.get("/models/count")
    assert reply.status == 200
    check("/models/count", "get", 200, reply.json)
    for model in (MODEL, "moonshotai/kimi-k2.5-0127"):
        reply = await client.get(f"/model/{model}")
        assert reply.status == 200
        check("/model/{author}/{slug}", "get", 200, reply.json)
    reply = await client.get("/model/nobody/nothing")
    assert reply.status == 404
    check("/model/{author}/{slug}", "get", 404, reply.json)


def test_the_sdk_overlay_extends_the_description() -> None:
    """What the newest SDK requires is required here too (docs/records.md lists it),
    unless real answers omit it (the field overlay): then the simulator may omit it."""
    endpoint = contract().doc["components"]["schemas"]["PublicEndpoint"]
    assert "supports_tool_choice" in endpoint["required"]
    for name in ("native_tools", "service_tier", "supports_diarization"):
        assert name in endpoint["properties"]
        assert name not in endpoint["required"], "no real listing we hold has it"
    assert (
        "system_fingerprint"
        not in contract().doc["components"]["schemas"]["ChatResult"]["required"]
    )
    key_data = contract().doc["paths"]["/key"]["get"]["responses"]["200"]["content"][
        "application/json"
    ]["schema"]["properties"]["data"]
    assert "free_model_daily_requests" in key_data["required"]


def test_the_overlay_never_replaces_a_definition() -> None:
    doc: dict[str, Any] = {"components": {"schemas": {"X": {"type": "object"}}}}
    with pytest.raises(AssertionError, match="replace"):
        apply_overlay(doc, {"patches": [{"target": "/components/schemas/X", "schema": {}}]})
    with pytest.raises(KeyError):
        apply_overlay(doc, {"patches": [{"target": "/components/schemas/Y", "required": ["a"]}]})
    with pytest.raises(ValueError, match="not in list"):  # it must have been required
        apply_overlay(doc, {"patches": [{"target": "/components/schemas/X", "optional": ["a"]}]})


async def test_account_routes(client: SimClient, start_sim: StartSim) -> None:
    reply = await client.chat(max_tokens=20)
    gen_id = reply.json["id"]
    first = await client.get("/generation", id=gen_id)
    assert first.status == 404, "the record lags the response, like the real one"
    check("/generation", "get", 404, first.json)
    second = await client.get("/generation", id=gen_id)
    assert second.status == 200
    check("/generation", "get", 200, second.json)
    missing = await client.get("/generation")
    assert missing.status == 400
    check("/generation", "get", 400, missing.json)
    for path in ("/key", "/credits"):
        reply = await client.get(path)
        assert reply.status == 200
        check(path, "get", 200, reply.json)
    _, limited = await start_sim(key="sk-limited", api_keys={"sk-limited": "3"})
    reply = await limited.get("/key")
    assert reply.json["data"]["effective_budget"]["scope"] == "key_limit"
    check("/key", "get", 200, reply.json)
    _, anonymous = await start_sim(key=None)
    for path in ("/key", "/credits", "/generation"):
        reply = await anonymous.get(path, id=gen_id)
        assert reply.status == 401
        check(path, "get", 401, reply.json)


async def test_completion_json_and_stream_with_reasoning(client: SimClient) -> None:
    reply = await client.chat(max_tokens=200, reasoning={"effort": "high"})
    assert reply.status == 200
    check(CHAT, "post", 200, reply.json)
    reply = await client.chat(max_tokens=200, stream=True, reasoning={"effort": "high"})
    assert reply.status == 200
    check_stream(reply.events)
    assert reply.done


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "nobody/nothing", "messages": [{"role": "user", "content": "x"}]}, 400),
        ({"model": MODEL, "messages": []}, 400),
        (chat_body(provider={"order": "chutes"}), 400),
        (chat_body(provider={"only": ["nobody"]}), 404),
        (chat_body(max_tokens=0), 400),
    ],
)
async def test_request_errors(client: SimClient, body: dict[str, Any], status: int) -> None:
    reply = await client.post(CHAT, body)
    assert reply.status == status
    check(CHAT, "post", status, reply.json)


async def test_auth_errors(start_sim: StartSim) -> None:
    _, anonymous = await start_sim(key=None)
    _, stranger = await start_sim(key="sk-not-a-key")
    for who in (anonymous, stranger):
        reply = await who.chat()
        assert reply.status == 401
        check(CHAT, "post", 401, reply.json)


@pytest.mark.parametrize(
    ("kwargs", "source"),
    [
        ({"credits": 0}, "openrouter_credits"),
        ({"credits": "0.001"}, "openrouter_credits"),
        ({"api_keys": {"sk-sim-test-key": "0.0001"}}, "openrouter_key_limit"),
    ],
)
async def test_payment_required(start_sim: StartSim, kwargs: dict[str, Any], source: str) -> None:
    _, client = await start_sim(**kwargs)
    reply = await client.chat(max_tokens=1000)
    assert reply.status == 402
    assert reply.json["error"]["metadata"]["limit_source"] == source
    check(CHAT, "post", 402, reply.json)


FAULTS: list[tuple[dict[str, Any], bool, int]] = [
    ({"kind": "rate_limit", "provider": "chutes"}, False, 429),
    ({"kind": "rate_limit", "scope": "platform"}, False, 429),
    ({"kind": "provider_error", "provider": "chutes", "status": 500}, False, 500),
    ({"kind": "provider_error", "provider": "chutes"}, False, 502),
    ({"kind": "provider_error", "provider": "chutes", "status": 503}, False, 503),
    ({"kind": "provider_error", "provider": "chutes", "status": 524}, False, 524),
    ({"kind": "provider_error", "provider": "chutes", "status": 529}, False, 529),
    ({"kind": "down", "provider": "chutes"}, False, 503),
    ({"kind": "hang", "provider": "chutes", "hang_seconds": 1}, False, 524),
    ({"kind": "error_200", "provider": "chutes", "after_tokens": 5}, False, 200),
    ({"kind": "error_200", "provider": "chutes"}, True, 200),
    ({"kind": "stream_error", "provider": "chutes"}, True, 200),
    ({"kind": "stream_error", "provider": "chutes"}, False, 200),
    ({"kind": "truncate", "provider": "chutes"}, True, 200),
    ({"kind": "reset", "provider": "chutes", "after_tokens": 20}, True, 200),
]


@pytest.mark.parametrize(("fault", "stream", "status"), FAULTS)
async def test_every_fault_answers_within_the_spec(
    start_sim: StartSim, fault: dict[str, Any], stream: bool, status: int
) -> None:
    sim, client = await start_sim(faults=[fault], speed=math.inf)
    body = chat_body(max_tokens=100, stream=stream, provider={"only": ["chutes"]})
    try:
        reply = await client.post(CHAT, body)
    except Exception:
        assert fault["kind"] in ("reset", "truncate")
        return
    assert reply.status == status, reply.text[:300]
    if stream and status == 200:
        check_stream(reply.events)
        if fault["kind"] in ("error_200", "stream_error"):
            assert reply.events[-1]["choices"][0]["finish_reason"] == "error"
            assert not reply.done
    else:
        check(CHAT, "post", status, reply.json)
    assert sim.log.counters["fault." + fault["kind"]] == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/models/user"), ("POST", "/embeddings"), ("GET", "/endpoints/zdr"), ("GET", "/x")],
)
async def test_a_route_not_simulated_is_openrouters_json_404(
    client: SimClient, method: str, path: str
) -> None:
    async with client.session.request(method, client.url + path, json={}) as response:
        assert response.status == 404
        assert response.content_type == "application/json"
        body = await response.json()
    check("/models/{author}/{slug}/endpoints", "get", 404, body)  # the generic NotFound schema
    assert body["error"]["code"] == 404
    assert (
        f"{method} /api/v1{path} is not served by the local OpenRouter"
        in (body["error"]["message"])
    )
