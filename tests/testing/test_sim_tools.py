"""Tool calls from the local OpenRouter: decided, well-formed, billed, within the spec."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from _sim_client import MODEL, SimClient, StartSim, chat_body, parse_sse
from _sim_contract import contract
from hypothesis import given
from hypothesis import strategies as st

from provider_router.testing.chat.tools import fake_value, split_pieces

CHAT = "/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Current weather for a place.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "minLength": 3},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["location", "unit"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["news", "docs"]},
                    "minItems": 1,
                },
                "exact": {"type": "boolean"},
            },
            "required": ["query", "filters"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def fits(call: dict[str, Any]) -> dict[str, Any]:
    """Assert a tool call's arguments are a JSON object valid for its tool; return them."""
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, SCHEMAS[call["function"]["name"]])
    return arguments  # type: ignore[no-any-return]


def streamed_calls(events: list[Any]) -> dict[int, dict[str, Any]]:
    """Accumulate ``delta.tool_calls`` the way the OpenAI SDK does, checking the shape."""
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        for choice in event["choices"]:
            for entry in choice["delta"].get("tool_calls") or ():
                index = entry["index"]
                if index not in calls:
                    assert entry["id"], entry
                    assert entry["type"] == "function", entry
                    assert entry["function"]["name"] in SCHEMAS
                    assert entry["function"]["arguments"] == ""
                    calls[index] = {"id": entry["id"], "function": dict(entry["function"])}
                else:
                    assert set(entry) == {"index", "function"}, entry
                    assert set(entry["function"]) == {"arguments"}
                    calls[index]["function"]["arguments"] += entry["function"]["arguments"]
    return calls


async def test_required_returns_tool_calls_that_fit_the_schema(client: SimClient) -> None:
    reply = await client.chat(max_tokens=500, tools=TOOLS, tool_choice="required")
    assert reply.status == 200, reply.text
    contract().validate(CHAT, "post", 200, reply.json)
    choice = reply.json["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["native_finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    calls = message["tool_calls"]
    assert calls
    for index, call in enumerate(calls):
        assert call["index"] == index
        assert call["type"] == "function"
        assert call["id"] == f"functions.{call['function']['name']}:{index}"  # Kimi's ids
        fits(call)
    usage = reply.json["usage"]
    tokens = sum(1 + len(split_pieces(c["function"]["arguments"])) for c in calls)
    assert usage["completion_tokens"] == tokens


async def test_a_named_function_is_the_one_called(client: SimClient) -> None:
    for name in ("weather", "search"):
        choice = {"type": "function", "function": {"name": name}}
        reply = await client.chat(max_tokens=500, tools=TOOLS, tool_choice=choice)
        assert reply.status == 200, reply.text
        calls = reply.json["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == [name]
        fits(calls[0])


async def test_none_and_no_tools_answer_in_text(client: SimClient) -> None:
    for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        reply = await client.chat(max_tokens=50, **extra)
        assert reply.status == 200
        choice = reply.json["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        assert "tool_calls" not in choice["message"]
        assert choice["message"]["content"]


async def test_auto_is_a_seeded_decision(start_sim: StartSim) -> None:
    outcomes = []
    for seed in (1, 1, 2):
        _, client = await start_sim(seed=seed)
        decided = []
        for i in range(12):
            reply = await client.chat(content=f"question {i}", max_tokens=300, tools=TOOLS)
            choice = reply.json["choices"][0]
            decided.append(choice["finish_reason"] == "tool_calls")
            if decided[-1]:
                assert all(fits(c) for c in choice["message"]["tool_calls"])
            else:
                assert "tool_calls" not in choice["message"]
        outcomes.append(decided)
    assert outcomes[0] == outcomes[1], "the same seed decides the same"
    assert any(outcomes[0]), "auto sometimes calls"
    assert not all(outcomes[0]), "auto sometimes answers in text"
    assert outcomes[0] != outcomes[2]


async def test_a_tool_result_turn_is_accepted_and_answered(client: SimClient) -> None:
    first = await client.chat(
        content="Weather in Florence?", max_tokens=300, tools=TOOLS, tool_choice="required"
    )
    calls = first.json["choices"][0]["message"]["tool_calls"]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Florence?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    messages += [
        {"role": "tool", "tool_call_id": c["id"], "content": '{"temp": 21}'} for c in calls
    ]
    body = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 40}
    reply = await client.post(CHAT, body)
    assert reply.status == 200, reply.text
    choice = reply.json["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), "auto answers tool results in text"
    assert choice["message"]["content"]
    # A second round of calls continues Kimi's numbering across the conversation.
    reply = await client.post(CHAT, {**body, "tool_choice": "required", "max_tokens": 300})
    again = reply.json["choices"][0]["message"]["tool_calls"]
    assert again[0]["id"].endswith(f":{len(calls)}")


async def test_streamed_tool_calls_arrive_as_openrouter_sends_them(client: SimClient) -> None:
    reply = await client.chat(
        max_tokens=500,
        stream=True,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "search"}},
        reasoning={"effort": "low"},
    )
    assert reply.status == 200
    assert reply.done
    for event in reply.events:
        contract().validate_chunk(event)
    calls = streamed_calls(reply.events)
    assert list(calls) == [0]
    assert calls[0]["function"]["name"] == "search"
    fits(calls[0])
    pieces = [
        e["choices"][0]["delta"]["tool_calls"][0]
        for e in reply.events
        if e["choices"] and e["choices"][0]["delta"].get("tool_calls")
    ]
    assert len(pieces) >= 2, "the arguments are split across deltas"
    reasoning_at = [
        i for i, e in enumerate(reply.events) if e["choices"][0]["delta"].get("reasoning")
    ]
    first_call = next(
        i for i, e in enumerate(reply.events) if e["choices"][0]["delta"].get("tool_calls")
    )
    assert reasoning_at
    assert max(reasoning_at) < first_call, "reasoning comes first"
    finishes = [e["choices"][0]["finish_reason"] for e in reply.events if e["choices"]]
    assert finishes[-1] == "tool_calls"
    usage = reply.events[-1]["usage"]
    call_tokens = 1 + len(split_pieces(calls[0]["function"]["arguments"]))
    assert (
        usage["completion_tokens"]
        == usage["completion_tokens_details"]["reasoning_tokens"] + call_tokens
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_cuts_a_tool_call_short(start_sim: StartSim, stream: bool) -> None:
    _, client = await start_sim(speed=math.inf)
    reply = await client.chat(max_tokens=3, stream=stream, tools=[WEATHER], tool_choice="required")
    assert reply.status == 200
    if stream:
        events = reply.events
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        arguments = streamed_calls(events)[0]["function"]["arguments"]
        assert events[-1]["usage"]["completion_tokens"] == 3
    else:
        choice = reply.json["choices"][0]
        assert choice["finish_reason"] == "length"
        arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
        assert reply.json["usage"]["completion_tokens"] == 3
    assert len(split_pieces(arguments)) == 2
    with pytest.raises(json.JSONDecodeError, match=r"Unterminated|Expecting"):
        json.loads(arguments)  # cut short, as a real provider would


async def test_same_seed_same_calls(start_sim: StartSim) -> None:
    bodies = []
    for _ in range(2):
        _, client = await start_sim(seed=7)
        reply = await client.chat(max_tokens=500, tools=TOOLS, tool_choice="required")
        bodies.append(reply.json["choices"][0]["message"]["tool_calls"])
    assert bodies[0] == bodies[1]


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"tools": "weather"}, "tools: expected a non-empty array"),
        ({"tools": []}, "tools: expected a non-empty array"),
        ({"tools": [42]}, "tools[0]: expected a tool object"),
        ({"tools": [{"function": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        (
            {"tools": [WEATHER, {"type": "function", "function": {"name": "a b"}}]},
            "tools[1].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "x", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        ({"tool_choice": "required"}, "only allowed when tools are specified"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice: expected"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "'nope' is not among",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function.name"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
async def test_bad_tool_input_is_a_clear_400(
    client: SimClient, extra: dict[str, Any], where: str
) -> None:
    reply = await client.post(CHAT, chat_body(max_tokens=10, **extra))
    assert reply.status == 400
    contract().validate(CHAT, "post", 400, reply.json)
    assert where in reply.json["error"]["message"]


async def test_a_tool_message_without_its_call_id_is_a_400(client: SimClient) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]
    reply = await client.post(CHAT, {"model": MODEL, "messages": messages})
    assert reply.status == 400
    assert "messages[1].tool_call_id" in reply.json["error"]["message"]


SCHEMA_CASES: list[dict[str, Any]] = [
    WEATHER["function"]["parameters"],
    SEARCH["function"]["parameters"],
    {},
    {"type": "object"},
    {"type": "object", "properties": {"n": {"type": ["integer", "null"], "exclusiveMinimum": 5}}},
    {
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": 0.5, "maximum": 0.75}},
        "required": ["x"],
    },
    {"type": "object", "properties": {"c": {"const": "fixed"}}, "required": ["c", "undescribed"]},
    {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]},
        ]
    },
    {
        "allOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "string", "format": "date"}},
                "required": ["a"],
            },
            {
                "properties": {
                    "b": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "minItems": 2,
                        "maxItems": 2,
                    }
                },
                "required": ["b"],
            },
        ]
    },
    {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 40, "maxLength": 50}},
        "required": ["s"],
    },
    {
        "type": "object",
        "properties": {
            "deep": {
                "type": "object",
                "properties": {
                    "deeper": {
                        "type": "object",
                        "properties": {
                            "list": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {"k": {"type": "string"}},
                                    "required": ["k"],
                                },
                            }
                        },
                    }
                },
            }
        },
        "required": ["deep"],
    },
]


@pytest.mark.parametrize("schema", SCHEMA_CASES)
def test_fake_arguments_fit_their_schema(schema: dict[str, Any]) -> None:
    for seed in range(25):
        value = fake_value(schema, random.Random(seed))
        jsonschema.validate(value, schema)
        json.dumps(value)


@given(st.text())
def test_pieces_join_back_to_the_text(text: str) -> None:
    pieces = split_pieces(text)
    assert "".join(pieces) == text
    assert all(pieces)


async def test_an_endpoint_without_tools_ignores_them(start_sim: StartSim, tmp_path: Path) -> None:
    # Routing prefers endpoints that list `tools` (a soft parameter); when none does,
    # the request is served anyway and the provider answers in text.
    market = tmp_path / "market.yaml"
    market.write_text(
        """
models:
  - id: acme/plain
    endpoints:
      - provider: Plain
        pricing: {prompt: "1", completion: "2"}
        supported_parameters: [max_tokens, temperature]
"""
    )
    _, client = await start_sim(market=market)
    for i in range(8):
        body = {
            "model": "acme/plain",
            "messages": [{"role": "user", "content": f"q{i}"}],
            "tools": TOOLS,
            "max_tokens": 50,
        }
        reply = await client.post(CHAT, body)
        assert reply.status == 200, reply.text
        choice = reply.json["choices"][0]
        assert "tool_calls" not in choice["message"]
        assert choice["finish_reason"] in ("stop", "length")


async def test_a_variant_that_failed_testing_is_not_honoured(
    start_sim: StartSim, tmp_path: Path
) -> None:
    market = tmp_path / "market.yaml"
    market.write_text(
        """
models:
  - id: acme/tools
    endpoints:
      - provider: Loose
        pricing: {prompt: "1", completion: "2"}
        supported_parameters: [max_tokens, tools, tool_choice]
        supports_tool_choice: [none, auto]
      - provider: Strict
        pricing: {prompt: "1", completion: "2"}
        supported_parameters: [max_tokens, tools, tool_choice]
"""
    )
    _, client = await start_sim(market=market)
    outcomes: dict[str, set[str]] = {"loose": set(), "strict": set()}
    for provider, seen in outcomes.items():
        for i in range(12):
            body = {
                "model": "acme/tools",
                "messages": [{"role": "user", "content": f"q{i}"}],
                "tools": TOOLS,
                "tool_choice": "required",
                "max_tokens": 300,
                "provider": {"only": [provider]},
            }
            reply = await client.post(CHAT, body)
            seen.add(reply.json["choices"][0]["finish_reason"])
    assert outcomes["strict"] == {"tool_calls"}, "required is honoured where it passed testing"
    assert "tool_calls" in outcomes["loose"]
    assert outcomes["loose"] - {"tool_calls"}, "where it failed, the model sometimes answers text"


async def test_parallel_calls_happen_only_when_allowed(client: SimClient) -> None:
    counts: dict[bool, set[int]] = {True: set(), False: set()}
    for parallel, seen in counts.items():
        for i in range(16):
            reply = await client.chat(
                content=f"q{i}",
                max_tokens=500,
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=parallel,
            )
            calls = reply.json["choices"][0]["message"]["tool_calls"]
            seen.add(len(calls))
            assert [c["index"] for c in calls] == list(range(len(calls)))
            assert len({c["id"] for c in calls}) == len(calls), "ids are distinct"
    assert counts[False] == {1}
    assert counts[True] == {1, 2}


def _tool_shapes(events: list[Any]) -> tuple[set[Any], set[Any], set[Any]]:
    """(delta shapes, first-entry shapes, later-entry shapes) of a stream's tool chunks."""
    deltas, firsts, laters = set(), set(), set()
    for event in events:
        for choice in event["choices"]:
            delta = choice["delta"]
            entries = delta.get("tool_calls")
            if not entries:
                continue
            deltas.add((tuple(sorted(delta)), delta["content"], delta["role"]))
            for entry in entries:
                shape = (tuple(sorted(entry)), tuple(sorted(entry["function"])))
                (firsts if "id" in entry else laters).add(shape)
    return deltas, firsts, laters


async def test_streamed_tool_deltas_have_the_captured_shape(start_sim: StartSim) -> None:
    capture = Path(__file__).parents[1] / "data" / "fixtures"
    path = next(capture.glob("sse_kimi-k2.5_chutes_tool_stream_*.sse"))
    captured, _, _ = parse_sse(path.read_text(encoding="utf-8"))
    _, client = await start_sim(stream_chunk_tokens=1)
    reply = await client.chat(
        max_tokens=300,
        stream=True,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        reasoning={"effort": "low"},
        provider={"only": ["chutes"]},
    )
    assert _tool_shapes(reply.events) == _tool_shapes(captured)
    finishes = {c["finish_reason"] for e in captured for c in e["choices"]} - {None}
    assert finishes == {"tool_calls"}
    assert {c["finish_reason"] for e in reply.events for c in e["choices"]} - {None} == finishes


@pytest.mark.parametrize("stream", [False, True])
async def test_auto_sometimes_writes_a_few_words_before_its_calls(
    client: SimClient, stream: bool
) -> None:
    seen = {"words then calls": 0, "calls only": 0}
    for i in range(16):
        reply = await client.chat(
            content=f"Weather {i}?", max_tokens=300, tools=TOOLS, stream=stream
        )
        if stream:
            calls = list(streamed_calls(reply.events).values())
            deltas = [c["delta"] for e in reply.events for c in e["choices"]]
            text = "".join(d.get("content") or "" for d in deltas)
            first_call = next((i for i, d in enumerate(deltas) if d.get("tool_calls")), None)
            if text and first_call is not None:
                assert not any(d.get("content") for d in deltas[first_call:]), "words first"
            usage = reply.events[-1]["usage"]
        else:
            message = reply.json["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            text = message["content"] or ""
            usage = reply.json["usage"]
        if not calls:
            continue
        seen["words then calls" if text else "calls only"] += 1
        tokens = sum(1 + len(split_pieces(c["function"]["arguments"])) for c in calls)
        assert usage["completion_tokens"] == len(text.split()) + tokens
        assert 4 <= len(text.split()) <= 12 or not text
    assert seen["words then calls"]
    assert seen["calls only"]
