"""What the Router asks of OpenRouter beyond a route: its routing trace, distillable models
only, context compression turned off, and logprobs only from endpoints that list them
(docs/client.md, "Router metadata, compression, distillable text, logprobs")."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from _router_helpers import KIMI, MESSAGES, MakeRouter

from provider_router import (
    AffinityOptions,
    ConfigurationError,
    MemoryLedger,
    ProviderPolicy,
    Router,
    RouterMetadata,
)
from provider_router.client.router_metadata import METADATA_HEADERS, parse_router_metadata
from provider_router.testing import Market, SimulatorServer

pytestmark = pytest.mark.openrouter_sim(completion_tokens=20)

COMPRESSION_OFF = [{"id": "context-compression", "enabled": False}]
DISTILLABLE = {"provider": {"enforce_distillable_text": True}}


async def test_router_metadata_is_off_by_default_and_read_when_asked(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    plain = await make_router(openrouter_sim)
    assert (await plain.chat(MESSAGES, max_tokens=20)).router_metadata is None
    traced = await make_router(openrouter_sim, headers=METADATA_HEADERS)
    for stream in (False, True):
        result = await traced.chat(MESSAGES, max_tokens=20, stream=stream)
        metadata = result.router_metadata
        assert isinstance(metadata, RouterMetadata)
        assert metadata.attempt == 1
        ((attempt),) = metadata.attempts
        assert (attempt.provider, attempt.status) == (result.provider, 200)
        assert metadata.pipeline == ()
        assert not metadata.compressed
        assert metadata.to_json() == {
            "attempt": 1,
            "attempts": [{"provider": result.provider, "model": KIMI, "status": 200}],
            "pipeline": [],
        }
    assert "router_metadata" not in repr(result), "the trace stays out of the repr"


@pytest.mark.openrouter_sim(
    completion_tokens=20, faults=[{"kind": "provider_error", "provider": "novita", "times": 1}]
)
async def test_the_trace_shows_no_fallback_inside_openrouter(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    """Each attempt is admitted to one endpoint (``allow_fallbacks: false``): a failing
    provider's error comes back to the router, which retries, and the answer's trace
    shows the one upstream attempt that served it."""
    policy = ProviderPolicy(only=["novita", "together"])
    router = await make_router(openrouter_sim, policy=policy, headers=METADATA_HEADERS)
    record_count = len(openrouter_sim.requests)
    result = None
    for _ in range(6):  # until a request meets Novita's error
        result = await router.chat(MESSAGES, max_tokens=20)
        assert result.router_metadata is not None
        if result.attempts > 1:
            break
    assert result is not None
    assert result.attempts == 2, "the error came back to the router, which retried"
    trace = result.router_metadata
    assert trace is not None
    assert [(a.provider, a.status) for a in trace.attempts] == [(result.provider, 200)]
    assert (trace.attempt, trace.fallbacks) == (1, 0)
    assert len(openrouter_sim.requests) > record_count


def _small_market(tmp_path: Path) -> Market:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/small\n    endpoints:\n"
        "      - provider: Tiny\n        pricing: {prompt: 1, completion: 2}\n"
        "        context_length: 8192\n        supported_parameters: [max_tokens]\n"
    )
    return Market.from_file(path)


def _long_conversation() -> list[dict[str, Any]]:
    text = " ".join(["word"] * 400)
    messages: list[dict[str, Any]] = []
    for i in range(20):
        messages += [
            {"role": "user", "content": f"{i}: {text}"},
            {"role": "assistant", "content": f"{i}: {text}"},
        ]
    return [*messages, {"role": "user", "content": "So?"}]


async def test_compression_is_seen_in_the_trace_and_can_be_turned_off(
    openrouter_sim_factory: Any, make_router: MakeRouter, tmp_path: Path
) -> None:
    sim = await openrouter_sim_factory(market=_small_market(tmp_path), completion_tokens=20)
    router = await make_router(sim, model="a/small", headers=METADATA_HEADERS, policy=None)
    result = await router.chat(_long_conversation(), max_tokens=100)
    assert result.router_metadata is not None
    assert result.router_metadata.compressed
    (stage,) = result.router_metadata.pipeline
    assert stage.name == "context-compression"
    assert stage.data["compressed_count"] < stage.data["original_count"]
    assert sim.requests[-1].compressed

    strict = await make_router(
        sim,
        model="a/small",
        headers=METADATA_HEADERS,
        policy=None,
        params={"plugins": COMPRESSION_OFF},
    )
    with pytest.raises(Exception, match="context length"):
        await strict.chat(_long_conversation(), max_tokens=100)
    assert sim.requests[-1].routing is not None
    assert not sim.requests[-1].compressed


async def test_enforce_distillable_text_is_sent_with_every_provider_object(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, params=DISTILLABLE)
    await router.chat(MESSAGES, max_tokens=20)
    assert openrouter_sim.requests[-1].routing["enforce_distillable_text"] is True
    pinned = await make_router(openrouter_sim, params=DISTILLABLE, cache_affinity=AffinityOptions())
    await pinned.chat(MESSAGES, max_tokens=20)
    routing = openrouter_sim.requests[-1].routing
    assert len(routing["only"]) == 1
    assert routing["enforce_distillable_text"] is True
    plain = await make_router(openrouter_sim)
    await plain.chat(MESSAGES, max_tokens=20)
    assert "enforce_distillable_text" not in openrouter_sim.requests[-1].routing


async def test_a_model_whose_author_forbids_distillation_is_not_served(
    openrouter_sim_factory: Any, make_router: MakeRouter, tmp_path: Path
) -> None:
    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/closed\n    distillable: false\n    endpoints:\n"
        "      - provider: Shut\n        pricing: {prompt: 1, completion: 2}\n"
    )
    sim = await openrouter_sim_factory(market=Market.from_file(path))
    router = await make_router(sim, model="a/closed", policy=None, params=DISTILLABLE)
    with pytest.raises(Exception, match="distillation"):
        await router.chat(MESSAGES, max_tokens=20)
    assert sim.simulator.usage == 0
    plain = await make_router(sim, model="a/closed", policy=None)
    assert (await plain.chat(MESSAGES, max_tokens=20)).text


async def test_turning_a_plugin_off_is_priced_other_plugins_are_refused(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, ledger=MemoryLedger(Decimal(1)))
    await router.chat(MESSAGES, max_tokens=20, plugins=COMPRESSION_OFF)
    await router.chat(MESSAGES, max_tokens=20, plugins=[{"id": "context-compression"}])
    with pytest.raises(ConfigurationError, match=r"'plugins' \(entry 1, 'web'\)"):
        await router.chat(MESSAGES, max_tokens=20, plugins=[*COMPRESSION_OFF, {"id": "web"}])


async def test_logprobs_are_asked_only_of_endpoints_that_list_them(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    """Under plain routing OpenRouter may send a logprobs request to an endpoint that
    does not list them, which answers ``logprobs: null``; the router sends such a
    request with ``require_parameters: true``."""
    router = await make_router(openrouter_sim)
    for stream in (False, True):
        for _ in range(4):
            result = await router.chat(
                MESSAGES, max_tokens=20, logprobs=True, top_logprobs=2, stream=stream
            )
            routing = openrouter_sim.requests[-1].routing
            assert routing["require_parameters"] is True
            assert result.logprobs, f"served by {result.provider}, which lists them"
    await router.chat(MESSAGES, max_tokens=20)
    assert "require_parameters" not in openrouter_sim.requests[-1].routing
    defaults = await make_router(openrouter_sim, params={"logprobs": True})
    await defaults.chat(MESSAGES, max_tokens=20)
    assert openrouter_sim.requests[-1].routing["require_parameters"] is True
    await defaults.chat(MESSAGES, max_tokens=20, logprobs=False)
    assert "require_parameters" not in openrouter_sim.requests[-1].routing


async def test_logprobs_no_allowed_endpoint_lists_are_refused_before_sending(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim, policy=ProviderPolicy(only=["chutes", "parasail"]))
    sent = len(openrouter_sim.requests)
    with pytest.raises(ConfigurationError, match=r"no allowed endpoint .* lists logprobs"):
        await router.chat(MESSAGES, max_tokens=20, logprobs=True)
    assert len(openrouter_sim.requests) == sent


def test_router_metadata_is_read_tolerantly() -> None:
    assert parse_router_metadata(None) is None
    assert parse_router_metadata([]) is None
    trace = parse_router_metadata(
        {
            "attempt": 2,
            "attempts": [{"provider": "A", "status": 429}, "junk", {"status": 200}],
            "pipeline": [
                {"type": "guardrail", "name": "content-filter", "data": {"flagged": True}},
                {"type": "something_new", "name": "x"},
                {"name": "no type"},
            ],
            "strategy": "direct",
            "future_field": 1,
        }
    )
    assert trace is not None
    assert [(a.provider, a.status) for a in trace.attempts] == [("A", 429)]
    assert [s.type for s in trace.pipeline] == ["guardrail", "something_new"]
    assert not trace.compressed
    assert trace.raw["future_field"] == 1


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"provider": {"only": ["chutes"]}}, "'provider.only' is set by the Router"),
        ({"provider": ["zdr"]}, "'provider' must be a mapping"),
    ],
)
def test_provider_fields_the_policy_decides_are_refused(
    openrouter_sim: SimulatorServer, params: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Router(KIMI, base_url=openrouter_sim.url, params=params)


async def test_provider_per_call_is_refused_and_says_where_its_open_fields_go(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    router = await make_router(openrouter_sim)
    with pytest.raises(ConfigurationError, match=r"Router\(params=\{'provider'"):
        await router.chat(MESSAGES, max_tokens=20, provider={"zdr": True})
