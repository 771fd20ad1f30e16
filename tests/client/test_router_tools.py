"""Typed tool calls through the Router: JSON, streamed deltas, and a round trip."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from _router_helpers import MakeRouter
from hypothesis import given
from hypothesis import strategies as st

from provider_router import InvalidResponseError, StreamDelta, ToolCall
from provider_router.client._completion import StreamAccumulator, parse_completion
from provider_router.testing import SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=50)

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location", "unit"],
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Florence and Rome?"}]


def check_weather(call: ToolCall) -> None:
    assert call.name == "weather"
    assert call.id
    arguments = call.parsed_arguments()
    assert isinstance(arguments["location"], str)
    assert arguments["unit"] in ("celsius", "fahrenheit")


async def test_chat_returns_typed_tool_calls(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    result = await router.chat(ASK, max_tokens=300, tools=[WEATHER], tool_choice="required")
    assert result.finish_reason == "tool_calls"
    assert result.text == ""
    assert result.tool_calls
    assert [c.index for c in result.tool_calls] == list(range(len(result.tool_calls)))
    for call in result.tool_calls:
        check_weather(call)
    raw = result.message["tool_calls"]
    assert [c["function"]["arguments"] for c in raw] == [c.arguments for c in result.tool_calls]
    assert result.usage is not None
    assert result.cost == openrouter_sim.requests[-1].cost


async def test_a_text_answer_has_no_tool_calls(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    result = await router.chat(ASK, max_tokens=100, tools=[WEATHER], tool_choice="none")
    assert result.tool_calls == ()
    assert result.finish_reason == "stop"
    assert result.text


@pytest.mark.openrouter_sim(completion_tokens=50, stream_chunk_tokens=2)
async def test_stream_deltas_carry_tool_call_pieces_and_the_result_puts_them_together(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    deltas: list[StreamDelta] = []
    async with router.stream(
        ASK,
        max_tokens=300,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "weather"}},
    ) as stream:
        async for delta in stream:
            deltas.append(delta)
    result = stream.result
    assert result is not None
    assert result.finish_reason == "tool_calls"
    assert len(result.tool_calls) == 1
    call = result.tool_calls[0]
    check_weather(call)
    pieces = [piece for delta in deltas for piece in delta.tool_calls]
    assert pieces[0].id == call.id
    assert pieces[0].name == "weather"
    assert pieces[0].arguments == ""
    assert len(pieces) > 2, "the arguments came in several deltas"
    assert all(p.id is None and p.name is None for p in pieces[1:])
    assert "".join(p.arguments for p in pieces) == call.arguments
    assert result.message["tool_calls"] == [{"index": 0, **call.message()}]
    assert result.message["content"] is None


async def test_tool_calls_go_back_into_the_conversation(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    first = await router.chat(ASK, max_tokens=300, tools=[WEATHER], tool_choice="required")
    conversation: list[dict[str, Any]] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [c.message() for c in first.tool_calls],
        },
        *({"role": "tool", "tool_call_id": c.id, "content": "21 C"} for c in first.tool_calls),
    ]
    answer = await router.chat(conversation, max_tokens=40, tools=[WEATHER])
    assert answer.finish_reason in ("stop", "length")
    assert answer.tool_calls == ()
    assert answer.text


def _chunk(entries: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    delta = {"role": "assistant", "content": None, "tool_calls": entries}
    return {"id": "gen-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_parallel_calls_sent_at_one_index_are_told_apart_by_id() -> None:
    accumulator = StreamAccumulator()
    chunks = [
        _chunk([{"index": 0, "id": "a", "type": "function", "function": {"name": "f"}}]),
        _chunk([{"index": 0, "function": {"arguments": '{"x": '}}]),
        _chunk([{"index": 0, "function": {"arguments": "1}"}}]),
        _chunk([{"index": 0, "id": "b", "type": "function", "function": {"name": "g"}}]),
        _chunk([{"index": 0, "function": {"arguments": "{}"}}]),
        _chunk([{"id": "c", "function": {"name": "h", "arguments": '{"y": 2}'}}], "tool_calls"),
    ]
    for chunk in chunks:
        accumulator.feed(chunk)
    calls = accumulator.finish().tool_calls
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, "a", "f", '{"x": 1}'),
        (1, "b", "g", "{}"),
        (2, "c", "h", '{"y": 2}'),
    ]
    assert calls[0].parsed_arguments() == {"x": 1}


def test_json_tool_calls_are_read_tolerantly() -> None:
    body = {
        "id": "gen-1",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": {"k": 1}},
                        },
                        "not a call",
                        {"id": "b", "function": {"name": "g"}},
                    ],
                },
            }
        ],
    }
    calls = parse_completion(body).tool_calls
    assert [(c.index, c.id, c.name) for c in calls] == [(0, "a", "f"), (2, "b", "g")]
    assert calls[0].parsed_arguments() == {"k": 1}
    assert calls[1].parsed_arguments() == {}


@pytest.mark.parametrize(
    ("arguments", "match"),
    [('{"location": "Flor', "not valid JSON"), ('["a"]', "JSON list, not an object")],
)
def test_parsed_arguments_names_the_call_when_they_do_not_parse(arguments: str, match: str) -> None:
    call = ToolCall(id="call_1", name="weather", arguments=arguments)
    with pytest.raises(InvalidResponseError, match=match) as caught:
        call.parsed_arguments()
    assert "'call_1' (weather)" in str(caught.value)


_calls = st.lists(
    st.tuples(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), st.text(max_size=40)),
    min_size=1,
    max_size=4,
)


@given(calls=_calls, data=st.data())
def test_any_split_and_interleaving_of_call_pieces_accumulates_the_same(
    calls: list[tuple[str, str]], data: st.DataObject
) -> None:
    # Each call: a first entry naming it, then its arguments cut anywhere; calls may
    # interleave (by index), but each call's own pieces keep their order.
    queues: list[list[dict[str, Any]]] = []
    for index, (name, arguments) in enumerate(calls):
        cuts = sorted(data.draw(st.sets(st.integers(0, len(arguments)), max_size=5)))
        bounds = [0, *cuts, len(arguments)]
        pieces = [arguments[a:b] for a, b in itertools.pairwise(bounds)]
        first = {"index": index, "id": f"call_{index}", "type": "function"}
        first["function"] = {"name": name, "arguments": ""}
        queue = [first] + [{"index": index, "function": {"arguments": p}} for p in pieces]
        queues.append(queue)
    accumulator = StreamAccumulator()
    while any(queues):
        live = [q for q in queues if q]
        queue = live[data.draw(st.integers(0, len(live) - 1))]
        accumulator.feed(_chunk([queue.pop(0)]))
    result = accumulator.finish().tool_calls
    assert [(c.id, c.name, c.arguments) for c in result] == [
        (f"call_{i}", name, arguments) for i, (name, arguments) in enumerate(calls)
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_words_before_the_calls_are_the_text_and_the_calls_still_typed(
    openrouter_sim: SimulatorServer, make_router: MakeRouter, stream: bool
) -> None:
    router = await make_router(openrouter_sim)
    both = []
    for i in range(16):
        ask = [{"role": "user", "content": f"Weather in city {i}?"}]
        result = await router.chat(ask, max_tokens=300, tools=[WEATHER], stream=stream)
        if result.text and result.tool_calls:
            both.append(result)
    assert both, "auto sometimes writes a few words, then calls"
    for result in both:
        assert result.finish_reason == "tool_calls"
        assert result.message["content"] == result.text
        for call in result.tool_calls:
            check_weather(call)
