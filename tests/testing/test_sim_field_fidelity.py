"""The local OpenRouter no kinder than the field: router metadata on every path, context
compression, Moonshot's fixed parameters, token-sized tool-call fragments, logprobs
routed as OpenRouter routes them (docs/simulator.md, each row with its source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _sim_client import MODEL, SimClient, StartSim, chat_body, parse_sse
from _sim_contract import contract

from provider_router.testing import COMPLETION_TOKENS_HEADER, Market

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
FIXED = {COMPLETION_TOKENS_HEADER: "12"}
ASKED = {**FIXED, "X-OpenRouter-Metadata": "enabled"}
NOVITA = {"only": ["novita"]}


# --- router metadata -------------------------------------------------------------------


async def test_a_stream_carries_router_metadata_in_its_final_chunk(client: SimClient) -> None:
    reply = await client.chat(ASKED, max_tokens=40, stream=True, provider=NOVITA)
    assert reply.done
    *rest, last = reply.events
    assert "usage" in last, "the final chunk before [DONE]"
    metadata = last["openrouter_metadata"]
    assert metadata["attempts"] == [{"provider": "Novita", "model": MODEL, "status": 200}]
    assert metadata["attempt"] == 1
    assert not any("openrouter_metadata" in chunk for chunk in rest)
    for chunk in reply.events:
        contract().validate_chunk(chunk)
    quiet = await client.chat(FIXED, max_tokens=40, stream=True, provider=NOVITA)
    assert not any("openrouter_metadata" in chunk for chunk in quiet.events)


async def test_the_legacy_header_and_any_case_turn_metadata_on_and_nothing_else_does(
    client: SimClient,
) -> None:
    for header, value, on in [
        ("X-OpenRouter-Experimental-Metadata", "enabled", True),
        ("X-OpenRouter-Metadata", "ENABLED", True),
        ("X-OpenRouter-Metadata", "disabled", False),
        ("X-OpenRouter-Metadata", "enable", False),
    ]:
        reply = await client.chat({**FIXED, header: value}, max_tokens=10, provider=NOVITA)
        assert ("openrouter_metadata" in reply.json) is on, (header, value)


async def test_attempts_show_the_fallbacks_a_request_took(start_sim: StartSim) -> None:
    _, client = await start_sim(
        faults=[
            {"kind": "rate_limit", "provider": "deepinfra"},
            {"kind": "provider_error", "provider": "together", "status": 503},
        ]
    )
    order = {"order": ["deepinfra", "together", "novita"], "allow_fallbacks": True}
    reply = await client.chat(ASKED, max_tokens=10, provider=order)
    assert reply.status == 200
    metadata = reply.json["openrouter_metadata"]
    assert [(a["provider"], a["status"]) for a in metadata["attempts"]] == [
        ("DeepInfra", 429),
        ("Together", 503),
        ("Novita", 200),
    ]
    assert metadata["attempt"] == 3
    selected = [e["provider"] for e in metadata["endpoints"]["available"] if e["selected"]]
    assert selected == ["Novita"]
    contract().validate("/chat/completions", "post", 200, reply.json)


async def test_an_upstream_failure_keeps_its_metadata_a_rate_limit_does_not(
    start_sim: StartSim,
) -> None:
    _, client = await start_sim(
        faults=[
            {"kind": "provider_error", "provider": "novita", "status": 502},
            {"kind": "rate_limit", "provider": "together"},
        ]
    )
    reply = await client.chat(ASKED, max_tokens=10, provider=NOVITA)
    assert reply.status == 502
    metadata = reply.json["openrouter_metadata"]
    assert metadata["attempts"] == [{"provider": "Novita", "model": MODEL, "status": 502}]
    assert not any(e["selected"] for e in metadata["endpoints"]["available"])
    assert reply.json["error"]["metadata"]["provider_name"] == "Novita"
    contract().validate("/chat/completions", "post", 502, reply.json)
    reply = await client.chat(ASKED, max_tokens=10, provider={"only": ["together"]})
    assert reply.status == 429
    assert "openrouter_metadata" not in reply.json


# --- context compression ----------------------------------------------------------------


def _small_market(tmp_path: Path, context: int = 8192) -> Market:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/small\n    endpoints:\n"
        "      - provider: Tiny\n        pricing: {prompt: 1, completion: 2}\n"
        f"        context_length: {context}\n"
    )
    return Market.from_file(path)


def _conversation(turns: int, words: int = 400) -> list[dict[str, Any]]:
    """A long conversation: ``turns`` user/assistant pairs of ``words`` words each."""
    text = " ".join(["word"] * words)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{i}: {text}"})
        messages.append({"role": "assistant", "content": f"{i}: {text}"})
    messages.append({"role": "user", "content": "And so?"})
    return messages


async def test_a_small_endpoint_compresses_a_long_prompt_by_default_and_says_so(
    start_sim: StartSim, tmp_path: Path
) -> None:
    sim, client = await start_sim(market=_small_market(tmp_path))
    messages = _conversation(20)  # about 20,000 tokens: more than twice the context
    body = {"model": "a/small", "messages": messages, "max_tokens": 100}
    reply = await client.post("/chat/completions", body, ASKED)
    assert reply.status == 200
    usage = reply.json["usage"]
    assert usage["prompt_tokens"] + 100 <= 8192, "billed for the messages kept"
    (stage,) = reply.json["openrouter_metadata"]["pipeline"]
    assert stage["type"] == "context_compression"
    assert stage["name"] == "context-compression"
    data = stage["data"]
    assert data["engine"] == "middle-out"
    assert data["original_count"] == len(messages)
    assert 2 <= data["compressed_count"] < len(messages)
    contract().validate("/chat/completions", "post", 200, reply.json)
    record = sim.simulator.log.chat()[-1]
    assert record.compressed
    assert record.prompt_tokens == usage["prompt_tokens"]

    # Streams say it in their final chunk.
    reply = await client.post("/chat/completions", {**body, "stream": True}, ASKED)
    assert reply.events[-1]["openrouter_metadata"]["pipeline"][0]["data"] == data


async def test_compression_turned_off_leaves_the_prompt_whole_or_refuses_it(
    start_sim: StartSim, tmp_path: Path
) -> None:
    sim, client = await start_sim(market=_small_market(tmp_path))
    off = [{"id": "context-compression", "enabled": False}]
    long = {"model": "a/small", "messages": _conversation(20), "max_tokens": 100, "plugins": off}
    reply = await client.post("/chat/completions", long, ASKED)
    assert reply.status == 400
    assert reply.json["error"]["metadata"]["error_type"] == "context_length_exceeded"
    short = {**long, "messages": _conversation(1)}
    for plugins in (off, None):  # a prompt that fits is never touched: no stage at all
        reply = await client.post("/chat/completions", {**short, "plugins": plugins}, ASKED)
        assert reply.status == 200
        assert "pipeline" not in reply.json["openrouter_metadata"]
    assert not any(r.compressed for r in sim.simulator.log.chat())


async def test_a_large_endpoint_compresses_only_when_asked(
    start_sim: StartSim, tmp_path: Path
) -> None:
    _, client = await start_sim(market=_small_market(tmp_path, context=16_384))
    body = {"model": "a/small", "messages": _conversation(30), "max_tokens": 100}
    reply = await client.post("/chat/completions", body, ASKED)
    assert reply.status == 400, "above 8,192 tokens of context nothing is compressed unasked"
    on = [{"id": "context-compression"}]
    reply = await client.post("/chat/completions", {**body, "plugins": on}, ASKED)
    assert reply.status == 200
    assert reply.json["openrouter_metadata"]["pipeline"][0]["type"] == "context_compression"


# --- a vendor's fixed parameters (Kimi) ------------------------------------------------------


def _lenient_market(tmp_path: Path) -> Market:
    """The bundled market's rules, with Chutes accepting any temperature."""
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: moonshotai/kimi-k2.5\n"
        "    fixed_parameters: {temperature: [0, 0.6, 1.0], top_p: [0.95]}\n"
        "    endpoints:\n"
        "      - provider: Moonshot AI\n        slug: moonshotai\n"
        "        pricing: {prompt: 0.6, completion: 2.5}\n"
        "      - provider: Chutes\n        pricing: {prompt: 0.45, completion: 2.2}\n"
        "        fixed_parameters: {}\n"
    )
    return Market.from_file(path)


async def test_the_bundled_kimi_endpoints_refuse_a_temperature_moonshot_forbids(
    start_sim: StartSim,
) -> None:
    sim, client = await start_sim()
    reply = await client.chat(FIXED, max_tokens=10, temperature=1.1, provider=NOVITA)
    assert reply.status == 400
    assert reply.json["error"]["metadata"]["raw"] == (
        "invalid temperature: only 0 or 0.6 or 1 is allowed for this model"
    )
    contract().validate("/chat/completions", "post", 400, reply.json)
    reply = await client.chat(FIXED, max_tokens=10, top_p=0.5, provider=NOVITA)
    assert reply.status == 400
    for fine in ({"temperature": 1.0, "top_p": 0.95}, {"temperature": 0}, {}):
        reply = await client.chat(FIXED, max_tokens=10, provider=NOVITA, **fine)
        assert reply.status == 200, fine
    assert sim.simulator.usage > 0
    assert sim.simulator.log.counters["refused_parameter"] == 2


async def test_an_endpoint_that_accepts_any_value_serves_it_and_fallbacks_reach_it(
    start_sim: StartSim, tmp_path: Path
) -> None:
    _, client = await start_sim(market=_lenient_market(tmp_path))
    pinned = await client.chat(
        FIXED, max_tokens=10, temperature=1.1, provider={"only": ["moonshotai"]}
    )
    assert pinned.status == 400
    lenient = await client.chat(
        FIXED, max_tokens=10, temperature=1.1, provider={"only": ["chutes"]}
    )
    assert lenient.status == 200
    order = {"order": ["moonshotai", "chutes"]}
    fallen = await client.chat(ASKED, max_tokens=10, temperature=1.1, provider=order)
    assert fallen.status == 200
    attempts = fallen.json["openrouter_metadata"]["attempts"]
    assert [(a["provider"], a["status"]) for a in attempts] == [
        ("Moonshot AI", 400),
        ("Chutes", 200),
    ]


# --- streamed tool calls, logprobs routing ------------------------------------------------


TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["location", "days"],
        },
    },
}


async def test_streamed_tool_arguments_come_in_token_sized_fragments_like_chutes(
    client: SimClient,
) -> None:
    captured, _, _ = parse_sse(
        next(FIXTURES.glob("sse_kimi-k2.5_chutes_tool_stream_*.sse")).read_text()
    )
    captured_pieces = [
        call["function"]["arguments"]
        for event in captured
        for choice in event["choices"]
        for call in choice["delta"].get("tool_calls") or ()
        if "id" not in call
    ]
    assert max(len(p) for p in captured_pieces) <= 8  # "location"
    reply = await client.chat(
        max_tokens=300,
        stream=True,
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        provider={"only": ["chutes"]},
    )
    entries = [
        call
        for event in reply.events
        for choice in event["choices"]
        for call in choice["delta"].get("tool_calls") or ()
    ]
    first, *pieces = entries
    assert first["function"] == {"name": "weather", "arguments": ""}
    assert len(pieces) > 5
    assert all(set(p) == {"index", "function"} for p in pieces)
    assert max(len(p["function"]["arguments"]) for p in pieces) <= 8
    chunks_with_calls = [e for e in reply.events if e["choices"][0]["delta"].get("tool_calls")]
    assert len(chunks_with_calls) == len(entries), "one fragment a chunk"
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    assert arguments.startswith('{"')


async def test_logprobs_reach_only_endpoints_listing_them_when_routing_is_told_to(
    client: SimClient,
) -> None:
    body = chat_body(max_tokens=8, logprobs=True, top_logprobs=2)
    # Parasail lists no logprobs: under default routing it answers without a word.
    plain = await client.post(
        "/chat/completions",
        {**body, "provider": {"only": ["parasail", "novita"], "order": ["parasail"]}},
        FIXED,
    )
    assert plain.json["provider"] == "Parasail"
    assert plain.json["choices"][0]["logprobs"] is None
    strict = {"only": ["parasail", "novita"], "order": ["parasail"], "require_parameters": True}
    told = await client.post("/chat/completions", {**body, "provider": strict}, FIXED)
    assert told.json["provider"] == "Novita"
    assert told.json["choices"][0]["logprobs"]["content"]
    none_listing = {"only": ["parasail"], "require_parameters": True}
    refused = await client.post("/chat/completions", {**body, "provider": none_listing}, FIXED)
    assert refused.status == 404
