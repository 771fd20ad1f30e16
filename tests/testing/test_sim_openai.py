"""The official openai SDK, pointed at the simulator, works unchanged."""

from __future__ import annotations

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
