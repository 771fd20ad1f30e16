"""Records parse every real capture and spec example, tolerate drift, and reject junk clearly."""

from __future__ import annotations

import copy
import functools
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from provider_router import (
    Endpoint,
    EndpointHealth,
    EndpointStatus,
    InvalidResponseError,
    Model,
    ModelEndpoints,
    PercentileStats,
    Pricing,
    Quantization,
)
from provider_router.catalog.records import (
    parse_endpoints_response,
    parse_model_entries,
    parse_models_response,
)

DATA = Path(__file__).parents[1] / "data"
FIXTURES = DATA / "fixtures"
BUNDLED = Path(__file__).parents[2] / "provider_router" / "data" / "kimi-k2.5.endpoints.json"


def _endpoint(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "Chutes | moonshotai/kimi-k2.5-0127",
        "provider_name": "Chutes",
        "tag": "chutes",
        "pricing": {"prompt": "0.00000045", "completion": "0.0000022"},
        "quantization": "int4",
        "status": 0,
        "uptime_last_30m": 99.0,
    }
    raw.update(overrides)
    return raw


def _listing(*endpoints: dict[str, Any]) -> dict[str, Any]:
    return {"data": {"id": "moonshotai/kimi-k2.5", "endpoints": list(endpoints)}}


# --- every capture and every spec example ------------------------------------------


@pytest.mark.parametrize(
    "path", [*sorted(FIXTURES.glob("endpoints_*.json")), BUNDLED], ids=lambda p: p.name
)
def test_every_endpoints_capture_parses(path: Path) -> None:
    body = json.loads(path.read_bytes())
    listing = parse_endpoints_response(body)
    assert listing.id == body["data"]["id"]
    assert len(listing.endpoints) == len(body["data"]["endpoints"])
    for endpoint, raw in zip(listing.endpoints, body["data"]["endpoints"], strict=True):
        assert endpoint.provider_name == raw["provider_name"]
        assert endpoint.pricing.prompt == Decimal(raw["pricing"]["prompt"])
        assert endpoint.quantization_raw == raw["quantization"]


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("models_list_*.json")), ids=lambda p: p.name)
def test_every_models_capture_parses(path: Path) -> None:
    body = json.loads(path.read_bytes())
    # Two captures are bare arrays of model objects (the wrapper was dropped).
    models = parse_models_response(body) if isinstance(body, dict) else parse_model_entries(body)
    entries = body["data"] if isinstance(body, dict) else body
    assert [m.id for m in models] == [e["id"] for e in entries]
    for model in models:
        assert model.pricing.is_dynamic or model.pricing.prompt is not None


@functools.cache
def _spec() -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is 10x faster
    spec: dict[str, Any] = yaml.load((DATA / "openrouter-openapi.yaml").read_bytes(), Loader=loader)  # noqa: S506
    return spec


def _response_example(spec: dict[str, Any], path: str) -> Any:
    return spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["example"]


def test_spec_examples_parse() -> None:
    spec = _spec()
    schemas = spec["components"]["schemas"]
    listing = parse_endpoints_response(_response_example(spec, "/models/{author}/{slug}/endpoints"))
    assert listing.id == "openai/gpt-4"
    assert listing.endpoints == ()
    for example in (
        schemas["ListEndpointsResponse"]["example"],
        spec["paths"]["/models/{author}/{slug}/endpoints"]["get"]["responses"]["200"]["content"][
            "application/json"
        ]["schema"]["example"]["data"],
    ):
        assert ModelEndpoints.model_validate(example).endpoints[0].quantization is Quantization.FP16
    endpoint = Endpoint.model_validate(schemas["PublicEndpoint"]["example"])
    assert endpoint.uptime_last_5m == 100
    assert endpoint.latency_last_30m == PercentileStats(p50=0.25, p75=0.35, p90=0.48, p99=0.85)
    for raw in _response_example(spec, "/endpoints/zdr")["data"]:
        Endpoint.model_validate(raw)
    for path in ("/models", "/models/user"):
        assert parse_models_response(_response_example(spec, path))[0].id == "openai/gpt-4"
    assert Model.model_validate(schemas["Model"]["example"]).reasoning is not None
    assert parse_models_response(schemas["ModelsListResponse"]["example"])
    pricing = Pricing.model_validate(schemas["PublicPricing"]["example"])
    assert pricing.request == 0
    assert PercentileStats.model_validate(schemas["PercentileStats"]["example"]).p99 == 85.3


def test_every_spec_enum_value_is_known() -> None:
    schemas = _spec()["components"]["schemas"]
    ours = {q.value for q in Quantization} - {Quantization.UNRECOGNIZED.value}
    assert ours == set(schemas["Quantization"]["enum"])
    assert {int(s) for s in EndpointStatus} == set(schemas["EndpointStatus"]["enum"])


def test_every_public_endpoint_field_is_a_record_field() -> None:
    schemas = _spec()["components"]["schemas"]
    assert set(schemas["PublicEndpoint"]["properties"]) <= set(Endpoint.model_fields)
    pricing_keys = set(schemas["PublicPricing"]["properties"])
    assert pricing_keys <= set(Pricing.model_fields)
    assert set(schemas["PercentileStats"]["properties"]) <= set(PercentileStats.model_fields)


# --- tolerant going in ---------------------------------------------------------------


def test_unknown_fields_are_kept_and_missing_optional_fields_are_none() -> None:
    endpoint = Endpoint.model_validate(
        {
            "name": "x",
            "provider_name": "P",
            "pricing": {"prompt": "0", "completion": "0", "new_fee": "0.5"},
            "new": {"nested": [1]},
        }
    )
    assert endpoint.model_extra == {"new": {"nested": [1]}}
    assert endpoint.pricing.model_extra == {"new_fee": "0.5"}
    assert hash(endpoint) == hash(endpoint.model_copy())  # still hashable with extras
    assert endpoint.tag is None
    assert endpoint.uptime_last_30m is None  # unknown stays unknown, never 0
    assert endpoint.status is None
    assert endpoint.health is EndpointHealth.UNKNOWN
    assert endpoint.supported_parameters == ()


def test_wild_fields_are_kept() -> None:
    endpoint = Endpoint.model_validate(
        _endpoint(
            supports_tool_choice={"none": True, "auto": True, "required": False, "function": True},
            supports_image_reference=True,
        )
    )
    assert endpoint.supports_tool_choice is not None
    assert endpoint.supports_tool_choice.required is False
    assert endpoint.supports_image_reference is True


def test_the_fields_the_newest_sdk_requires_are_typed() -> None:
    """openrouter 1.3.84 ``PublicEndpoint`` (docs/records.md): typed where we use them."""
    endpoint = Endpoint.model_validate(
        _endpoint(
            native_tools={"openrouter:web_search": {"type": "web_search_20260209"}},
            service_tier="priority",
            supports_diarization=False,
            supports_tool_choice={"none": True, "auto": True, "required": False, "function": True},
            perf_last_30m_by_workload={"text_generation": {"request_count": 12}},
        )
    )
    assert [(t.name, t.type) for t in endpoint.native_tools] == [
        ("openrouter:web_search", "web_search_20260209")
    ]
    assert endpoint.service_tier == "priority"
    assert endpoint.supports_diarization is False
    assert endpoint.model_extra == {
        "perf_last_30m_by_workload": {"text_generation": {"request_count": 12}}
    }
    assert endpoint.supports_tool_choice_value("auto") is True
    assert endpoint.supports_tool_choice_value("required") is False
    assert endpoint.supports_tool_choice_value({"type": "function", "function": {}}) is True
    assert endpoint.supports_tool_choice_value("sometimes") is None
    hash(endpoint)


@pytest.mark.parametrize(
    ("native_tools", "expected"),
    [
        (
            {"openrouter:bash": {"type": "bash_2026", "runs": "client"}},
            [("openrouter:bash", "bash_2026")],
        ),
        ({"openrouter:web_search": "google_search"}, [("openrouter:web_search", "google_search")]),
        ({"openrouter:x": 3}, [("openrouter:x", None)]),
        ({}, []),
        (None, []),
    ],
)
def test_native_tools_in_any_shape_are_kept_never_fatal(
    native_tools: Any, expected: list[tuple[str, str | None]]
) -> None:
    endpoint = Endpoint.model_validate(_endpoint(native_tools=native_tools))
    assert [(t.name, t.type) for t in endpoint.native_tools] == expected


@pytest.mark.parametrize("tier", ["ultrafast", "a-tier-from-2027", None])
def test_service_tier_is_an_open_enum_kept_as_sent(tier: str | None) -> None:
    assert Endpoint.model_validate(_endpoint(service_tier=tier)).service_tier == tier


def test_an_endpoint_without_the_new_fields_is_unknown_not_false() -> None:
    endpoint = Endpoint.model_validate(_endpoint())
    assert endpoint.supports_tool_choice is None
    assert endpoint.supports_tool_choice_value("required") is None
    assert endpoint.supports_diarization is None
    assert endpoint.native_tools == ()


async def test_the_simulator_listing_parses_with_every_field_it_sends(
    openrouter_sim: Any, openrouter_api_key: str
) -> None:
    """The simulator's listing is shaped as real 2026 ones are (no native_tools,
    service_tier or supports_diarization: docs/simulator.md); every field it does send
    is modelled."""
    import aiohttp

    headers = {"Authorization": f"Bearer {openrouter_api_key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(openrouter_sim.url + "/models/moonshotai/kimi-k2.5/endpoints") as response,
    ):
        body = await response.json()
    listing = parse_endpoints_response(body)
    for endpoint in listing.endpoints:
        assert endpoint.supports_tool_choice is not None
        assert endpoint.supports_diarization is None
        assert endpoint.model_extra == {}, "every field the simulator sends is modelled"


def test_records_are_frozen_and_hashable() -> None:
    endpoint = Endpoint.model_validate(_endpoint())
    with pytest.raises(pydantic.ValidationError):
        endpoint.tag = "other"  # type: ignore[misc]
    assert hash(endpoint) == hash(Endpoint.model_validate(_endpoint()))


@pytest.mark.parametrize(
    ("raw", "member", "kept"),
    [
        ("int4", Quantization.INT4, "int4"),
        ("NVFP4", Quantization.NVFP4, "NVFP4"),
        ("unknown", Quantization.UNKNOWN, "unknown"),
        ("fp3.5", Quantization.UNRECOGNIZED, "fp3.5"),  # a value OpenRouter may add later
        ("q4_k_m", Quantization.UNRECOGNIZED, "q4_k_m"),
        (None, None, None),
    ],
)
def test_quantization_is_an_open_enum(
    raw: str | None, member: Quantization | None, kept: str
) -> None:
    endpoint = Endpoint.model_validate(_endpoint(quantization=raw))
    assert endpoint.quantization is member
    assert endpoint.quantization_raw == kept


@pytest.mark.parametrize(
    ("raw", "expected", "health"),
    [
        (0, EndpointStatus.OK, EndpointHealth.OK),
        (-1, EndpointStatus.DEPRIORITISED, EndpointHealth.DEGRADED),
        (-2, EndpointStatus.DEGRADED, EndpointHealth.DEGRADED),
        (-3, EndpointStatus.DEGRADED_SEVERELY, EndpointHealth.DEGRADED),
        (-5, EndpointStatus.DOWN, EndpointHealth.DOWN),
        (-10, EndpointStatus.DISABLED, EndpointHealth.DOWN),
        (-4, -4, EndpointHealth.DEGRADED),  # unseen codes stay plain ints
        (-42, -42, EndpointHealth.DOWN),
        (3, 3, EndpointHealth.OK),
        ("-2", EndpointStatus.DEGRADED, EndpointHealth.DEGRADED),
    ],
)
def test_status_codes_have_meanings(raw: object, expected: int, health: EndpointHealth) -> None:
    endpoint = Endpoint.model_validate(_endpoint(status=raw))
    assert endpoint.status == expected
    assert type(endpoint.status) is type(expected)
    assert endpoint.health is health


@pytest.mark.parametrize("raw", ["down", -2.5, True, [0]])
def test_a_junk_status_is_a_clear_error(raw: object) -> None:
    with pytest.raises(
        InvalidResponseError, match=r"endpoints\.0\.status: status must be an integer"
    ):
        parse_endpoints_response(_listing(_endpoint(status=raw)))


def test_uptime_off_scale_is_an_error_and_float_noise_is_clamped() -> None:
    assert Endpoint.model_validate(_endpoint(uptime_last_30m=100.0000000001)).uptime == 100.0
    with pytest.raises(InvalidResponseError, match=r"uptime_last_30m: uptime must be a percentage"):
        parse_endpoints_response(_listing(_endpoint(uptime_last_30m=180)))


def test_uptime_falls_back_across_windows() -> None:
    endpoint = Endpoint.model_validate(
        _endpoint(uptime_last_30m=None, uptime_last_1d=97.5, uptime_last_5m=12.0)
    )
    assert endpoint.uptime == 97.5


def test_slug_falls_back_to_the_provider_name_without_a_tag() -> None:
    endpoint = Endpoint.model_validate(_endpoint(tag=None, provider_name="Moonshot AI"))
    assert endpoint.slug == "moonshotai"
    assert Endpoint.model_validate(_endpoint(tag="deepinfra/fp4")).provider_slug == "deepinfra"


# --- pricing ----------------------------------------------------------------------------


def test_prices_are_exact_decimals_per_token_with_per_million_helpers() -> None:
    pricing = Pricing.model_validate(
        {"prompt": "0.0000000245", "completion": "0.0000022", "input_cache_read": "0.00000015"}
    )
    assert pricing.prompt == Decimal("0.0000000245")
    assert pricing.prompt_per_million == Decimal("0.0245")
    assert pricing.completion_per_million == Decimal("2.2")
    assert pricing.cache_read_per_million == Decimal("0.15")


def test_missing_fees_are_zero_but_missing_cache_prices_are_not_offered() -> None:
    pricing = Pricing.model_validate({"prompt": "0.000001", "completion": "0.000002"})
    assert (pricing.request, pricing.image, pricing.web_search) == (0, 0, 0)
    assert pricing.internal_reasoning == 0
    assert pricing.input_cache_read is None
    assert pricing.input_cache_write is None
    assert pricing.discount == 0


def test_minus_one_is_the_dynamic_price_sentinel() -> None:
    pricing = Pricing.model_validate({"prompt": "-1", "completion": "-1"})
    assert pricing.is_dynamic
    assert pricing.prompt is None
    assert pricing.prompt_per_million is None
    with pytest.raises(ValueError, match="dynamic pricing"):
        pricing.cost(10, 10)


@pytest.mark.parametrize(
    ("pricing", "message"),
    [
        ({"prompt": "-0.5", "completion": "1"}, r"pricing: price 'prompt' must be ≥ 0"),
        ({"prompt": "abc", "completion": "1"}, r"price 'prompt' must be a decimal number"),
        ({"prompt": "1", "completion": "NaN"}, r"price 'completion' must be finite"),
        ({"prompt": "1", "completion": None}, r"price 'completion' must be a decimal string"),
        ({"completion": "1"}, r"pricing\.prompt: Field required"),
        ({"prompt": "1", "completion": "1", "request": "-3"}, r"price 'request' must be ≥ 0"),
        ({"prompt": "1", "completion": "1", "discount": 1.5}, r"discount must be ≤ 1"),
        ({"prompt": "1", "completion": "1", "discount": "x"}, r"discount must be a decimal"),
    ],
)
def test_bad_prices_name_the_field(pricing: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidResponseError, match=rf"endpoints\.0\..*{message}"):
        parse_endpoints_response(_listing(_endpoint(pricing=pricing)))


def test_discount_is_already_applied_and_the_list_price_is_derivable() -> None:
    pricing = Pricing.model_validate(
        {"prompt": "0.0000004", "completion": "0.0000015", "discount": 0.5}
    )
    assert pricing.list_price(pricing.prompt) == Decimal("0.0000008")
    assert pricing.cost(1, 0) == Decimal("0.0000004")  # the listed price is what is billed
    markup = Pricing.model_validate({"prompt": "0.0000012", "completion": "1", "discount": -0.2})
    assert markup.list_price(markup.prompt) == Decimal("0.000001")
    free = Pricing.model_validate({"prompt": "0", "completion": "0", "discount": 1})
    assert free.list_price(free.prompt) is None


def test_cost_matches_the_captured_bills() -> None:
    # Kimi K2.5 on Inceptron: 202 completion tokens (166 reasoning) at $2.20/M.
    inceptron = Pricing.model_validate({"prompt": "0.00000044", "completion": "0.0000022"})
    assert inceptron.cost(0, 202, requests=0) == Decimal("0.0004444")
    # Kimi K2 on DeepInfra: 20 prompt tokens, 8 cached: 12 × 4e-7 + 8 × 1.5e-7.
    deepinfra = Pricing.model_validate(
        {"prompt": "0.0000004", "completion": "0.000002", "input_cache_read": "0.00000015"}
    )
    assert deepinfra.cost(20, 0, cached_tokens=8) == Decimal("0.0000060")
    assert deepinfra.cost(121, 0, cached_tokens=32) == Decimal("0.0000404")
    # WandB prices no cache reads: cached tokens bill at the prompt rate.
    wandb = Pricing.model_validate({"prompt": "0.00000135", "completion": "0.000004"})
    assert wandb.cost(97, 0, cached_tokens=64) == wandb.cost(97, 0)


def test_cost_adds_cache_writes_and_the_request_fee() -> None:
    pricing = Pricing.model_validate(
        {
            "prompt": "0.000003",
            "completion": "0.000015",
            "input_cache_write": "0.00000375",
            "request": "0.001",
        }
    )
    expected = 50 * Decimal("0.000003") + 50 * Decimal("0.00000375") + 10 * Decimal("0.000015")
    assert pricing.cost(100, 10, cache_write_tokens=50) == expected + Decimal("0.001")
    assert pricing.cost(100, 10, cache_write_tokens=50, requests=0) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_tokens": -1, "completion_tokens": 0}, "prompt_tokens must be ≥ 0"),
        ({"prompt_tokens": 1, "completion_tokens": 0, "cached_tokens": 2}, "exceed prompt_tokens"),
        ({"prompt_tokens": 1, "completion_tokens": 0, "requests": -1}, "requests must be ≥ 0"),
    ],
)
def test_cost_rejects_impossible_counts(kwargs: dict[str, int], message: str) -> None:
    pricing = Pricing.model_validate({"prompt": "1", "completion": "1"})
    with pytest.raises(ValueError, match=message):
        pricing.cost(**kwargs)


def test_long_context_overrides_apply_by_prompt_length() -> None:
    pricing = Pricing.model_validate(
        {
            "prompt": "0.000003",
            "completion": "0.000015",
            "overrides": [
                {"min_prompt_tokens": 200000, "prompt": "0.000006", "completion": "0.0000225"}
            ],
        }
    )
    assert pricing.cost(200_000, 0, requests=0) == 200_000 * Decimal("0.000003")
    assert pricing.cost(200_001, 1, requests=0) == 200_001 * Decimal("0.000006") + Decimal(
        "0.0000225"
    )


def test_time_window_overrides_apply_only_when_the_time_is_given() -> None:
    pricing = Pricing.model_validate(
        {
            "prompt": "0.000002",
            "completion": "0.000004",
            "overrides": [{"utc_start": 2200, "utc_end": 600, "completion": "0.000001"}],
        }
    )
    assert pricing.cost(0, 1, requests=0) == Decimal("0.000004")
    assert pricing.cost(0, 1, requests=0, utc_hhmm=2330) == Decimal("0.000001")
    assert pricing.cost(0, 1, requests=0, utc_hhmm=130) == Decimal("0.000001")
    assert pricing.cost(0, 1, requests=0, utc_hhmm=600) == Decimal("0.000004")


def test_a_weekday_limited_override_does_not_apply_every_day() -> None:
    """``utc_days`` (openrouter SDK 1.3.84): a long-context price limited to Saturdays
    must not be applied on a day we do not know, however long the prompt."""
    pricing = Pricing.model_validate(
        {
            "prompt": "0.000003",
            "completion": "0.000015",
            "overrides": [
                {"min_prompt_tokens": 1000, "utc_days": ["Saturday"], "prompt": "0.000001"}
            ],
        }
    )
    (override,) = pricing.overrides
    assert override.utc_days == ("saturday",)
    assert pricing.cost(2000, 0, requests=0) == 2000 * Decimal("0.000003")
    assert override.applies(2000, None, "saturday")
    assert not override.applies(2000, None, "sunday")
    assert not override.applies(500, None, "saturday")


# --- whole responses --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"data": [1, 2]}, r"expected an endpoints listing .* whose 'data' is an array of 2 items"),
        ([], r"expected an endpoints listing .* got an array of 0 items"),
        ({"error": {"code": 404}}, r"got an object with keys \['error'\]"),
        ({"data": {"id": "a/b", "endpoints": "none"}}, r"expected an endpoints listing"),
        ("<html>", r"got str '<html>'"),
    ],
)
def test_a_body_that_is_not_a_listing_says_what_was_expected(body: object, message: str) -> None:
    with pytest.raises(InvalidResponseError, match=message):
        parse_endpoints_response(body, source="GET /x")


def test_a_bad_endpoint_names_its_index_and_field() -> None:
    good = _endpoint()
    bad = copy.deepcopy(good)
    del bad["provider_name"]
    with pytest.raises(InvalidResponseError, match=r"endpoints\.1\.provider_name: Field required"):
        parse_endpoints_response(_listing(good, bad))


def test_a_bad_model_names_its_index() -> None:
    with pytest.raises(InvalidResponseError, match=r"data\[1\]: pricing: price 'prompt'"):
        parse_models_response(
            {
                "data": [
                    {"id": "a/b", "name": "A", "pricing": {"prompt": "0", "completion": "0"}},
                    {"id": "c/d", "name": "C", "pricing": {"prompt": "x", "completion": "0"}},
                ]
            }
        )
    with pytest.raises(InvalidResponseError, match="expected a models list"):
        parse_models_response({"models": []})
