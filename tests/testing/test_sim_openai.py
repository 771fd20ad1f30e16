"""The official openai SDK, pointed at the simulator, works unchanged."""

from __future__ import annotations

import json

import openai
import pytest

from provider_router.testing import SimulatorServer

MODEL = "moonshotai/kimi-k2.5"


async def test_openai_sdk_json_completion(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    async with openai.AsyncOpenAI(
        base_url=openrouter_sim.url, api_key=openrouter_api_key
    ) as client:
        completion = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a haiku about routers."}],
            max_tokens=64,
            extra_body={"provider": {"only": ["deepinfra"]}},
        )
    assert completion.id.startswith("gen-")
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 64
    extra = completion.model_extra or {}
    assert extra["provider"] == "DeepInfra"
    record = openrouter_sim.requests[-1]
    assert record.routing == {"only": ["deepinfra"]}
    assert record.generation_id == completion.id


async def test_openai_sdk_streaming_completion(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    text: list[str] = []
    finish: list[str] = []
    usage = None
    async with openai.AsyncOpenAI(
        base_url=openrouter_sim.url, api_key=openrouter_api_key
    ) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=100,
            stream=True,
        )
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                if chunk.choices[0].finish_reason:
                    finish.append(chunk.choices[0].finish_reason)
            if chunk.usage is not None:
                usage = chunk.usage
    assert "".join(text).strip()
    assert finish
    assert finish[0] in ("stop", "length")
    assert usage is not None
    assert len("".join(text).split()) == usage.completion_tokens
    assert openrouter_sim.requests[-1].completion_tokens == usage.completion_tokens


async def test_openai_sdk_sees_a_402_as_its_own_error(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    openrouter_sim.set_balance(0)
    async with openai.AsyncOpenAI(
        base_url=openrouter_sim.url, api_key=openrouter_api_key, max_retries=0
    ) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10
            )
    assert caught.value.status_code == 402


WEATHER_TOOL: openai.types.chat.ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Current weather for a place.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location", "unit"],
            "additionalProperties": False,
        },
    },
}


def _weather_arguments(arguments: str) -> dict[str, object]:
    parsed = json.loads(arguments)
    assert set(parsed) == {"location", "unit"}
    assert isinstance(parsed["location"], str)
    assert parsed["unit"] in ("celsius", "fahrenheit")
    return parsed  # type: ignore[no-any-return]


async def test_openai_sdk_tool_calls_json(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    async with openai.AsyncOpenAI(
        base_url=openrouter_sim.url, api_key=openrouter_api_key
    ) as client:
        completion = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Florence?"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "weather"}},
            max_tokens=300,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        calls = choice.message.tool_calls
        assert calls is not None
        assert len(calls) == 1
        call = calls[0]
        assert isinstance(call, openai.types.chat.ChatCompletionMessageFunctionToolCall)
        assert call.function.name == "weather"
        _weather_arguments(call.function.arguments)
        # The SDK's own message type goes back into the conversation with the result.
        follow_up = await client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": "Weather in Florence?"},
                choice.message.model_dump(exclude_none=True),  # type: ignore[misc]
                {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"},
            ],
            tools=[WEATHER_TOOL],
            tool_choice="none",
            max_tokens=30,
        )
    assert follow_up.choices[0].message.content
    assert follow_up.choices[0].message.tool_calls is None


async def test_openai_sdk_tool_calls_stream(
    openrouter_sim: SimulatorServer, openrouter_api_key: str
) -> None:
    async with (
        openai.AsyncOpenAI(base_url=openrouter_sim.url, api_key=openrouter_api_key) as client,
        client.chat.completions.stream(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Florence and Rome?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_tokens=300,
        ) as stream,
    ):
        argument_deltas = 0
        async for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                argument_deltas += 1
        completion = await stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls
    assert argument_deltas > len(calls), "arguments arrive in several deltas"
    for call in calls:
        assert call.type == "function"
        assert call.function.name == "weather"
        _weather_arguments(call.function.arguments)
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
