"""The newest official ``openrouter`` SDK, pointed at the simulator, works unchanged.

CI installs ``openrouter`` fresh and unpinned (the ``dev`` extra), so when OpenRouter's
SDK starts requiring something new, these tests are what tell us. Each call goes over a
real loopback socket through the SDK's own httpx client and its own response models;
anything the simulator omits or shapes wrongly is a ``ResponseValidationError`` here.

Where the real service answers something the SDK rejects (listings without
``native_tools``/``service_tier``/``supports_diarization``, JSON answers without
``system_fingerprint`` from Chutes, DeepInfra, Fireworks or Together), the simulator
answers the same and a test here shows the SDK failing on it; the other calls are
routed where the real service lets the SDK pass (docs/simulator.md).

Outside CI a venv without the SDK skips these tests (saying so); with
``PROVIDER_ROUTER_REQUIRE_OPENROUTER_SDK`` set (CI) a missing SDK fails them.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from provider_router import Catalog
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

REQUIRE_SDK_ENV = "PROVIDER_ROUTER_REQUIRE_OPENROUTER_SDK"
if os.environ.get(REQUIRE_SDK_ENV):
    import openrouter
else:
    openrouter = pytest.importorskip(
        "openrouter", reason=f"the openrouter SDK is not installed ({REQUIRE_SDK_ENV} unset)"
    )
from openrouter import components, errors  # noqa: E402

# The SDK warns when it reads the fields it still requires but has deprecated
# (`rate_limit`, `is_provisioning_key` of the key metadata): its warning, not ours.
pytestmark = pytest.mark.filterwarnings(r"ignore:warning. \*\* DEPRECATED \*\*:DeprecationWarning")

AUTHOR, SLUG = "moonshotai", "kimi-k2.5"
MODEL = f"{AUTHOR}/{SLUG}"
FINGERPRINTED = {"only": ["moonshotai"]}
"""Routing to an endpoint whose JSON answers carry ``system_fingerprint`` (Moonshot AI's
own, as captured): the SDK requires the key, which Chutes' answers leave out."""
FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "Plan a small routing test."}]
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}


@pytest_asyncio.fixture
async def sdk(openrouter_sim: SimulatorServer) -> AsyncIterator[Any]:
    """The SDK client, no retries (a retry would hide a first failure)."""
    async with openrouter.OpenRouter(
        api_key=DEFAULT_TEST_KEY, server_url=openrouter_sim.url, retry_config=None
    ) as client:
        yield client


async def test_sdk_version_is_a_current_one() -> None:
    major, minor = (int(part) for part in openrouter.VERSION.split(".")[:2])
    assert (major, minor) >= (1, 3), f"CI must test the newest SDK, got {openrouter.VERSION}"


async def test_models_list_get_and_count(sdk: Any) -> None:
    listing = await sdk.models.list_async()
    models = listing.result.data
    assert [m.id for m in models] == [MODEL, "moonshotai/kimi-k3"]
    kimi = models[0]
    assert kimi.canonical_slug == "moonshotai/kimi-k2.5-0127"
    assert kimi.pricing.input_cache_read is not None, "Kimi's listing prices cache reads"
    assert kimi.reasoning is not None
    assert kimi.reasoning.mandatory is False

    one = await sdk.models.get_async(author=AUTHOR, slug=SLUG)
    assert one.data.id == MODEL
    assert one.data.pricing == kimi.pricing
    by_canonical = await sdk.models.get_async(author=AUTHOR, slug="kimi-k2.5-0127")
    assert by_canonical.data.id == MODEL

    count = await sdk.models.count_async()
    assert count.data.count == len(models)


async def test_model_get_unknown_is_the_sdk_not_found_error(sdk: Any) -> None:
    with pytest.raises(errors.NotFoundResponseError) as caught:
        await sdk.models.get_async(author="nobody", slug="nothing")
    assert caught.value.data.error.code == 404


SDK_ONLY_FIELDS = {"native_tools", "service_tier", "supports_diarization"}
"""What the newest SDK's ``PublicEndpoint`` requires and no real listing we hold has."""


def _missing(error: Exception) -> set[str]:
    """The field names a ``ResponseValidationError``'s pydantic cause says are missing."""
    cause = error.__cause__
    assert cause is not None
    return {
        str(e["loc"][-1])
        for e in cause.errors()
        if e["type"] == "missing"  # type: ignore[attr-defined]
    }


async def test_endpoints_list_fails_in_the_sdk_as_on_real_listings_and_our_catalog_reads_it(
    sdk: Any, openrouter_sim: SimulatorServer
) -> None:
    """An expected failure on the SDK's side: real listings lack three fields the SDK
    requires, so the simulator does not invent them, and the SDK raises on its listing
    as on the captured one. Our own Catalog reads both."""
    with pytest.raises(errors.ResponseValidationError) as caught:
        await sdk.endpoints.list_async(author=AUTHOR, slug=SLUG)
    assert _missing(caught.value) == SDK_ONLY_FIELDS
    captured = json.loads(
        next(FIXTURES.glob("endpoints_google-gemini-2.5-pro-preview_2025-05-23_*")).read_text()
    )
    endpoint = captured["data"]["endpoints"][0]
    assert not SDK_ONLY_FIELDS & set(endpoint), "the captured listing lacks them too"

    async with Catalog(base_url=openrouter_sim.url, api_key=DEFAULT_TEST_KEY) as catalog:
        listing = await catalog.endpoints(MODEL)
    market = openrouter_sim.simulator.market.models[MODEL]
    assert [e.slug for e in listing.endpoints] == [e.tag for e in market.endpoints]
    for parsed in listing.endpoints:
        assert parsed.service_tier is None
        assert parsed.native_tools == ()
        flags = parsed.supports_tool_choice
        assert flags is not None
        honoured = "tool_choice" in parsed.supported_parameters
        assert (flags.none, flags.auto, flags.required, flags.function) == (honoured,) * 4


async def test_a_json_answer_without_system_fingerprint_fails_in_the_sdk(sdk: Any) -> None:
    """An expected failure on the SDK's side: Chutes' JSON answers carry no
    ``system_fingerprint`` (as captured), which the SDK's ``ChatResult`` requires."""
    with pytest.raises(errors.ResponseValidationError) as caught:
        await sdk.chat.send_async(
            model=MODEL, messages=MESSAGES, max_tokens=10, provider={"only": ["chutes"]}
        )
    assert _missing(caught.value) == {"system_fingerprint"}
    # Streams are another matter: the chunk schema makes it optional.
    stream = await sdk.chat.send_async(
        model=MODEL, messages=MESSAGES, max_tokens=10, stream=True, provider={"only": ["chutes"]}
    )
    async with stream as events:
        assert [chunk async for chunk in events]


async def test_providers_list(sdk: Any, openrouter_sim: SimulatorServer) -> None:
    providers = await sdk.providers.list_async()
    slugs = {p.slug for p in providers.data}
    market = openrouter_sim.simulator.market.models[MODEL]
    assert {e.slug for e in market.endpoints} <= slugs


async def test_chat_json_with_reasoning_then_credits_and_generation(
    sdk: Any, openrouter_sim: SimulatorServer
) -> None:
    result = await sdk.chat.send_async(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=300,
        reasoning={"effort": "high"},
        provider=FINGERPRINTED,
    )
    assert isinstance(result, components.ChatResult)
    assert result.id.startswith("gen-")
    message = result.choices[0].message
    assert message.reasoning, "effort high shows reasoning"
    assert result.usage is not None
    assert result.usage.completion_tokens_details.reasoning_tokens > 0
    cost = Decimal(str(result.usage.cost))
    assert cost > 0

    credits = await sdk.credits.get_credits_async()
    assert Decimal(str(credits.data.total_usage)) == cost == openrouter_sim.simulator.usage

    # The record lags the answer (generation_404s=1): the SDK's typed 404 first.
    with pytest.raises(errors.NotFoundResponseError):
        await sdk.generations.get_generation_async(id=result.id)
    generation = await sdk.generations.get_generation_async(id=result.id)
    assert generation.data.id == result.id
    assert Decimal(str(generation.data.total_cost)) == cost
    assert generation.data.native_tokens_reasoning == (
        result.usage.completion_tokens_details.reasoning_tokens
    )


async def test_chat_stream_with_reasoning(sdk: Any) -> None:
    stream = await sdk.chat.send_async(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=200,
        stream=True,
        reasoning={"effort": "medium"},
    )
    reasoning: list[str] = []
    content: list[str] = []
    finish: list[str] = []
    usage = None
    async with stream as events:
        async for chunk in events:
            assert isinstance(chunk, components.ChatStreamChunk)
            for choice in chunk.choices:
                reasoning.append(choice.delta.reasoning or "")
                content.append(choice.delta.content or "")
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
            if chunk.usage is not None:
                usage = chunk.usage
    assert "".join(reasoning).strip()
    assert finish
    assert finish[0] in ("stop", "length")
    assert usage is not None
    words = len("".join(reasoning).split()) + len("".join(content).split())
    assert words == usage.completion_tokens


async def test_chat_with_a_forced_tool_call_json(sdk: Any) -> None:
    result = await sdk.chat.send_async(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Florence?"}],
        max_tokens=200,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        provider=FINGERPRINTED,
    )
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert isinstance(call, components.ChatToolCall)
    assert call.function.name == "weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["location"], str)


async def test_chat_with_a_named_tool_streams_tool_call_deltas(sdk: Any) -> None:
    stream = await sdk.chat.send_async(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Florence?"}],
        max_tokens=200,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        parallel_tool_calls=False,
        stream=True,
    )
    names: list[str] = []
    arguments: list[str] = []
    finish: list[str] = []
    async with stream as events:
        async for chunk in events:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or ():
                    assert isinstance(delta, components.ChatStreamToolCall)
                    if delta.function is not None:
                        names.append(delta.function.name or "")
                        arguments.append(delta.function.arguments or "")
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
    assert "".join(names) == "weather"
    assert isinstance(json.loads("".join(arguments))["location"], str)
    assert finish[0] == "tool_calls"


async def test_current_key_metadata_without_a_limit(sdk: Any) -> None:
    key = (await sdk.api_keys.get_current_key_metadata_async()).data
    assert key.limit is None
    assert key.budgets == []
    assert key.effective_budget is None
    assert key.allowed_data_regions == ["global"]
    assert key.free_model_daily_requests.limit == 1000  # $100 of credits: the higher tier
    assert key.organization_id is None
    assert key.workspace_id is None


async def test_current_key_metadata_with_a_limit_lists_its_budget(
    openrouter_sim_factory: Any,
) -> None:
    sim = await openrouter_sim_factory(api_keys={"sk-limited": "2.5"}, credits=5)
    async with openrouter.OpenRouter(
        api_key="sk-limited", server_url=sim.url, retry_config=None
    ) as client:
        await client.chat.send_async(
            model=MODEL, messages=MESSAGES, max_tokens=20, provider=FINGERPRINTED
        )
        key = (await client.api_keys.get_current_key_metadata_async()).data
    assert key.limit == 2.5
    (budget,) = key.budgets
    assert budget.scope == "key_limit"
    assert budget.limit_usd == 2.5
    assert Decimal(str(budget.spend_usd)) == sim.simulator.usage > 0
    assert Decimal(str(budget.remaining_usd)) == Decimal("2.5") - sim.simulator.usage
    assert key.effective_budget == budget
    assert key.free_model_daily_requests.limit == 50  # under $10 of credits


async def test_payment_required_is_the_sdk_typed_error(
    sdk: Any, openrouter_sim: SimulatorServer
) -> None:
    openrouter_sim.set_balance(0)
    with pytest.raises(errors.PaymentRequiredResponseError) as caught:
        await sdk.chat.send_async(model=MODEL, messages=MESSAGES, max_tokens=10)
    assert caught.value.data.error.code == 402


async def test_a_call_whose_route_is_not_simulated_gets_a_json_404_saying_so(sdk: Any) -> None:
    """``endpoints.list_zdr_endpoints`` (``/endpoints/zdr``) is not simulated."""
    with pytest.raises(errors.OpenRouterError) as caught:
        await sdk.endpoints.list_zdr_endpoints_async()
    assert caught.value.status_code == 404
    assert caught.value.headers["content-type"].startswith("application/json")
    assert "not served by the local OpenRouter" in caught.value.body


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ({"kind": "rate_limit", "provider": "chutes"}, "TooManyRequestsResponseError"),
        ({"kind": "rate_limit", "scope": "platform"}, "TooManyRequestsResponseError"),
        (
            {"kind": "provider_error", "provider": "chutes", "status": 500},
            "InternalServerResponseError",
        ),
        ({"kind": "provider_error", "provider": "chutes"}, "BadGatewayResponseError"),
        ({"kind": "down", "provider": "chutes"}, "ServiceUnavailableResponseError"),
        (
            {"kind": "provider_error", "provider": "chutes", "status": 524},
            "EdgeNetworkTimeoutResponseError",
        ),
        (
            {"kind": "provider_error", "provider": "chutes", "status": 529},
            "ProviderOverloadedResponseError",
        ),
        (
            {"kind": "hang", "provider": "chutes", "hang_seconds": 1},
            "EdgeNetworkTimeoutResponseError",
        ),
    ],
)
async def test_every_error_status_is_the_sdk_typed_error(
    openrouter_sim_factory: Any, fault: dict[str, Any], error: str
) -> None:
    sim = await openrouter_sim_factory(faults=[fault])
    async with openrouter.OpenRouter(
        api_key=DEFAULT_TEST_KEY, server_url=sim.url, retry_config=None
    ) as client:
        with pytest.raises(getattr(errors, error)) as caught:
            await client.chat.send_async(
                model=MODEL, messages=MESSAGES, max_tokens=20, provider={"only": ["chutes"]}
            )
    assert caught.value.data.error.code == caught.value.status_code


@pytest.mark.parametrize(
    ("key", "body", "error"),
    [
        (None, {}, "UnauthorizedResponseError"),
        ("sk-nobody", {}, "UnauthorizedResponseError"),
        (DEFAULT_TEST_KEY, {"model": "nobody/nothing"}, "BadRequestResponseError"),
        (DEFAULT_TEST_KEY, {"provider": {"only": ["nobody"]}}, "NotFoundResponseError"),
    ],
)
async def test_request_errors_are_the_sdk_typed_errors(
    openrouter_sim_factory: Any, key: str | None, body: dict[str, Any], error: str
) -> None:
    sim = await openrouter_sim_factory(api_keys=[DEFAULT_TEST_KEY])
    async with openrouter.OpenRouter(api_key=key, server_url=sim.url, retry_config=None) as client:
        with pytest.raises(getattr(errors, error)):
            await client.chat.send_async(
                **{"model": MODEL, "messages": MESSAGES, "max_tokens": 20, **body}
            )


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "error_200", "provider": "moonshotai", "after_tokens": 5},
        {"kind": "stream_error", "provider": "moonshotai", "after_tokens": 20},
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_200_with_an_error_parses_in_the_sdk(
    openrouter_sim_factory: Any, fault: dict[str, Any], stream: bool
) -> None:
    if fault["kind"] == "stream_error" and not stream:
        return  # stream_error only shapes streams; the JSON answer is a normal one
    sim = await openrouter_sim_factory(faults=[fault])
    async with openrouter.OpenRouter(
        api_key=DEFAULT_TEST_KEY, server_url=sim.url, retry_config=None
    ) as client:
        result = await client.chat.send_async(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=50,
            stream=stream,
            provider=FINGERPRINTED,
        )
        if not stream:
            assert result.choices[0].finish_reason == "error"
            assert result.usage.cost == 0
            return
        async with result as events:
            chunks = [chunk async for chunk in events]
    assert chunks[-1].choices[0].finish_reason == "error"
    assert chunks[-1].error.code == 502


async def test_structured_output_variants_tiers_and_cache_discount_through_the_sdk(
    sdk: Any, openrouter_sim: SimulatorServer
) -> None:
    """#24's additions parse in the SDK: a json_schema answer, a :nitro model id, a
    models listing filtered by parameter, and a generation with cache_discount."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    result = await sdk.chat.send_async(
        model=f"{MODEL}:nitro",
        messages=MESSAGES,
        max_tokens=200,
        provider={"only": ["moonshotai", "novita"]},  # endpoints that send a fingerprint
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "trip", "strict": True, "schema": schema},
        },
    )
    answer = json.loads(result.choices[0].message.content)
    assert set(answer) == {"city", "days"}
    listing = await sdk.models.list_async(supported_parameters="structured_outputs")
    assert MODEL in [m.id for m in listing.result.data]
    system = {"role": "system", "content": "You plan careful small trips. " * 40}
    for question in ("Where first?", "And then?"):
        turn = await sdk.chat.send_async(
            model=MODEL,
            messages=[system, {"role": "user", "content": question}],
            max_tokens=20,
            provider=FINGERPRINTED,
        )
    with pytest.raises(errors.NotFoundResponseError):
        await sdk.generations.get_generation_async(id=turn.id)
    generation = await sdk.generations.get_generation_async(id=turn.id)
    assert generation.data.native_tokens_cached > 0
    assert generation.data.cache_discount is not None
    assert generation.data.cache_discount > 0


LOGPROBS: dict[str, Any] = {
    "model": MODEL,
    "messages": MESSAGES,
    "max_tokens": 12,
    "temperature": 0,
    "logprobs": True,
}


async def test_chat_with_logprobs_reads_into_the_sdks_models(sdk: Any) -> None:
    only = {"only": ["moonshotai"], "allow_fallbacks": False}
    result = await sdk.chat.send_async(**LOGPROBS, top_logprobs=4, provider=only)
    choice = result.choices[0]
    assert isinstance(choice.logprobs, components.ChatTokenLogprobs)
    tokens = choice.logprobs.content
    assert "".join(t.token for t in tokens) == choice.message.content
    assert all(len(t.top_logprobs) == 4 and t.top_logprobs[0].token == t.token for t in tokens)


async def test_chat_stream_with_logprobs_reads_into_the_sdks_models(sdk: Any) -> None:
    only = {"only": ["deepinfra"], "allow_fallbacks": False}
    content: list[str] = []
    tokens: list[str] = []
    async with await sdk.chat.send_async(**LOGPROBS, stream=True, provider=only) as events:
        async for chunk in events:
            for choice in chunk.choices:
                content.append(choice.delta.content or "")
                if choice.logprobs is not None and choice.logprobs.content:
                    tokens.extend(t.token for t in choice.logprobs.content)
    assert tokens
    assert "".join(tokens) == "".join(content)


async def test_the_management_api_through_the_sdk(openrouter_sim_factory: Any) -> None:
    """A job key's life through the SDK: made with a limit and an expiry, read, listed,
    disabled, deleted."""
    from datetime import UTC, datetime, timedelta

    management = "sk-or-v1-sdk-management-key"
    sim = await openrouter_sim_factory(management_keys=[management])
    expires = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    async with openrouter.OpenRouter(
        api_key=management, server_url=sim.url, retry_config=None
    ) as client:
        made = await client.api_keys.create_async(
            name="job", limit=1.5, limit_reset="monthly", expires_at=expires
        )
        assert made.key.startswith("sk-or-v1-")
        assert made.data.limit == 1.5
        assert made.data.expires_at == expires
        hash_ = made.data.hash
        assert (await client.api_keys.get_async(hash=hash_)).data.name == "job"
        listed = await client.api_keys.list_async()
        assert hash_ in {k.hash for k in listed.data}
        updated = await client.api_keys.update_async(hash=hash_, disabled=True)
        assert updated.data.disabled is True
        assert (await client.api_keys.delete_async(hash=hash_)).DELETED is True
        with pytest.raises(errors.NotFoundResponseError):
            await client.api_keys.get_async(hash=hash_)
