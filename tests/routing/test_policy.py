"""ProviderPolicy: each rule, their composition, the reasons, and bad arguments."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import (
    ConfigurationError,
    DecisionCode,
    Endpoint,
    EndpointHealth,
    ModelEndpoints,
    NativePrecisionRegistry,
    ProviderPolicy,
    Quantization,
)
from provider_router.catalog.records import parse_endpoints_response

BUNDLED = Path(__file__).parents[2] / "provider_router" / "data" / "kimi-k2.5.endpoints.json"
KIMI = "moonshotai/kimi-k2.5"


@pytest.fixture(scope="module")
def market() -> ModelEndpoints:
    return parse_endpoints_response(json.loads(BUNDLED.read_bytes()))


def endpoint(**overrides: Any) -> Endpoint:
    raw: dict[str, Any] = {
        "name": "Chutes | moonshotai/kimi-k2.5-0127",
        "provider_name": "Chutes",
        "tag": "chutes",
        "pricing": {"prompt": "0.00000045", "completion": "0.0000022"},
        "quantization": "int4",
        "status": 0,
        "uptime_last_30m": 99.0,
        "context_length": 262144,
        "supported_parameters": ["tools", "temperature"],
    }
    raw.update(overrides)
    return Endpoint.model_validate(raw)


def decide(policy: ProviderPolicy, e: Endpoint, model_id: str = KIMI) -> tuple[bool, str, str]:
    d = policy.decide(e, model_id=model_id)
    return d.allowed, d.code, d.reason


# --- the headline: int4 floor on the Kimi K2.5 market -----------------------------------


def test_int4_floor_rejects_fireworks_and_baseten_and_keeps_the_rest(
    market: ModelEndpoints,
) -> None:
    decisions = ProviderPolicy(exclude_below="int4").evaluate(market)
    assert decisions.model_id == KIMI
    assert len(decisions) == len(market.endpoints)
    verdicts = {d.endpoint.slug: d for d in decisions}
    assert verdicts["fireworks"].code is DecisionCode.QUANTIZATION_BELOW_MINIMUM
    assert verdicts["fireworks"].reason == "quantization nvfp4 is below the int4 floor"
    assert verdicts["baseten"].code is DecisionCode.QUANTIZATION_BELOW_MINIMUM
    # Every failed rule is named, not only the first.
    assert "status -5 means down, not allowed" in verdicts["baseten"].reason
    assert {e.slug for e in decisions.allowed} == {
        "chutes",
        "deepinfra",
        "siliconflow",
        "atlas-cloud",
        "together",
        "novita",
        "parasail",
        "moonshotai",
        "venice",
    }
    assert [d.endpoint.slug for d in decisions.rejected] == ["fireworks", "baseten"]
    assert decisions[0].endpoint.slug == "chutes"  # listing order is kept


def test_undeclared_quantization_assumes_the_native_precision_and_says_so(
    market: ModelEndpoints,
) -> None:
    verdicts = {d.endpoint.slug: d for d in ProviderPolicy("int4").evaluate(market)}
    atlas = verdicts["atlas-cloud"]  # quantization null
    assert atlas.allowed
    assert atlas.effective_quantization is Quantization.INT4
    assert atlas.reason == (
        "quantization not declared: assumed int4, the native precision of "
        "moonshotai/kimi-k2.5; meets the int4 floor"
    )
    venice = verdicts["venice"]  # quantization "unknown", status -2
    assert venice.allowed
    assert "declared 'unknown': assumed int4" in venice.reason
    assert "status -2 means degraded" in venice.reason


# --- unknown quantization choices --------------------------------------------------------


@pytest.mark.parametrize("raw", [None, "unknown"])
def test_unknown_reject_rejects_every_undeclared_form(raw: str | None) -> None:
    allowed, code, reason = decide(
        ProviderPolicy("int4", unknown="reject"), endpoint(quantization=raw)
    )
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_UNKNOWN
    assert "unknown='reject'" in reason


def test_an_unrecognised_value_is_read_never_assumed_native() -> None:
    allowed, code, reason = decide(ProviderPolicy("int4"), endpoint(quantization="fp3.5"))
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_BELOW_MINIMUM
    assert reason.startswith("quantization 'fp3.5' read as 3.5-bit float; is below the int4")
    assert "assumed" not in reason


def test_unknown_accept_lets_undeclared_pass_even_below_a_high_floor() -> None:
    allowed, code, reason = decide(
        ProviderPolicy("fp16", unknown="accept"), endpoint(quantization=None)
    )
    assert allowed
    assert code == DecisionCode.ALLOWED
    assert "accepted (unknown='accept')" in reason


def test_assume_native_compares_the_native_precision_with_the_floor() -> None:
    allowed, code, reason = decide(ProviderPolicy("fp8"), endpoint(quantization=None))
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_BELOW_MINIMUM
    assert (
        "assumed int4, the native precision of moonshotai/kimi-k2.5; is below the fp8 floor"
        in reason
    )


def test_a_model_the_registry_does_not_know_says_so_plainly() -> None:
    allowed, _, reason = decide(
        ProviderPolicy("int4"), endpoint(quantization=None), model_id="google/gemini-2.5-pro"
    )
    assert allowed
    assert "assumed bf16, the native-precision registry's default" in reason
    assert "it does not list google/gemini-2.5-pro" in reason
    strict = ProviderPolicy(
        "int4", native_precision=NativePrecisionRegistry.builtin().with_default(None)
    )
    allowed, code, reason = decide(
        strict, endpoint(quantization=None), model_id="google/gemini-2.5-pro"
    )
    assert not allowed
    assert code == DecisionCode.QUANTIZATION_UNKNOWN
    assert "google/gemini-2.5-pro is not in the native-precision registry" in reason


def test_a_user_registered_model_is_used() -> None:
    registry = NativePrecisionRegistry.builtin().with_model("deepseek/deepseek-v3", "fp8")
    policy = ProviderPolicy("fp8", native_precision=registry)
    allowed, _, reason = decide(
        policy, endpoint(quantization=None), model_id="deepseek/deepseek-v3"
    )
    assert allowed
    assert "assumed fp8, the native precision of deepseek/deepseek-v3" in reason


def test_no_floor_allows_any_declared_quantization() -> None:
    allowed, code, reason = decide(ProviderPolicy(), endpoint(quantization="fp4"))
    assert (allowed, code, reason) == (True, DecisionCode.ALLOWED, "passes every rule")


# --- the other rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "overrides", "code", "reason"),
    [
        (
            ProviderPolicy(exclude_providers=["chutes"]),
            {},
            "provider_excluded",
            "provider 'chutes' is excluded",
        ),
        (
            ProviderPolicy(exclude_providers=["Moonshot AI"]),
            {"provider_name": "Moonshot AI", "tag": "moonshotai/int4"},
            "provider_excluded",
            "excluded",
        ),
        (
            ProviderPolicy(exclude_providers=["deepinfra"]),
            {"tag": "deepinfra/fp4"},
            "provider_excluded",
            "excluded",
        ),
        (
            ProviderPolicy(only=["deepinfra", "together"]),
            {},
            "provider_not_allowed",
            "not among only=['deepinfra', 'together']",
        ),
        (
            ProviderPolicy(min_uptime=99.5),
            {},
            "uptime_below_minimum",
            "uptime 99.00% is below the minimum 99.5%",
        ),
        (
            ProviderPolicy(),
            {"status": -5},
            "status_not_allowed",
            "status -5 means down, not allowed",
        ),
        (
            ProviderPolicy(allowed_health=["ok"]),
            {"status": -2},
            "status_not_allowed",
            "degraded, not allowed",
        ),
        (
            ProviderPolicy(required_parameters=["tools", "response_format"]),
            {},
            "missing_parameters",
            "does not support response_format",
        ),
        (
            ProviderPolicy(min_context_length=300_000),
            {},
            "context_too_short",
            "context length 262144 is below 300000",
        ),
        (
            ProviderPolicy(max_prompt_price="0.4"),
            {},
            "prompt_price_above_maximum",
            "prompt price $0.45/M is above the maximum $0.4/M",
        ),
        (
            ProviderPolicy(max_completion_price=2),
            {},
            "completion_price_above_maximum",
            "completion price $2.2/M",
        ),
        (
            ProviderPolicy(),
            {"pricing": {"prompt": "-1", "completion": "-1"}},
            "pricing_dynamic",
            "pricing is dynamic",
        ),
    ],
)
def test_each_rule_rejects_with_its_code_and_reason(
    policy: ProviderPolicy, overrides: dict[str, Any], code: str, reason: str
) -> None:
    allowed, got_code, got_reason = decide(policy, endpoint(**overrides))
    assert not allowed
    assert got_code == code
    assert reason in got_reason


@pytest.mark.parametrize(
    ("policy", "overrides"),
    [
        (ProviderPolicy(only=["CHUTES"]), {}),
        (ProviderPolicy(only=["chutes"]), {"tag": "chutes/fp8", "quantization": "fp8"}),
        (ProviderPolicy(min_uptime=99.0), {}),
        (ProviderPolicy(min_uptime=99.9), {"uptime_last_30m": None}),
        (ProviderPolicy(required_parameters="tools"), {}),
        (ProviderPolicy(max_prompt_price=Decimal("0.45"), max_completion_price="2.20"), {}),
        (ProviderPolicy(allowed_health=[EndpointHealth.OK, "down"]), {"status": -10}),
        (ProviderPolicy(), {"status": None}),
        (ProviderPolicy(min_context_length=1000), {"context_length": None}),
    ],
)
def test_boundaries_and_unknowns_pass(policy: ProviderPolicy, overrides: dict[str, Any]) -> None:
    allowed, code, reason = decide(policy, endpoint(**overrides))
    assert allowed, reason
    assert code == DecisionCode.ALLOWED


def test_missing_uptime_is_noted_in_the_reason() -> None:
    _, _, reason = decide(ProviderPolicy(min_uptime=99), endpoint(uptime_last_30m=None))
    assert reason == "uptime not reported"


def test_rules_compose_and_the_first_failure_is_the_code() -> None:
    policy = ProviderPolicy("int4", exclude_providers=["fireworks"], min_uptime=99.5)
    d = policy.decide(
        endpoint(
            provider_name="Fireworks", tag="fireworks", quantization="nvfp4", uptime_last_30m=90.0
        ),
        model_id=KIMI,
    )
    assert d.code is DecisionCode.PROVIDER_EXCLUDED
    assert d.reason == (
        "provider 'fireworks' is excluded; quantization nvfp4 is below the int4 floor; "
        "uptime 90.00% is below the minimum 99.5%"
    )


def test_evaluate_accepts_bare_endpoints_with_a_model_id() -> None:
    decisions = ProviderPolicy("int4").evaluate(
        [endpoint(), endpoint(quantization="fp4")], model_id=KIMI
    )
    assert [d.allowed for d in decisions] == [True, False]
    assert decisions[:1][0].allowed
    with pytest.raises(ConfigurationError, match="needs model_id="):
        ProviderPolicy().evaluate([endpoint()])


def test_policies_are_values() -> None:
    assert ProviderPolicy("INT4", only=["b", "a"]) == ProviderPolicy(
        Quantization.INT4, only=("a", "b")
    )
    assert hash(ProviderPolicy("int4")) == hash(ProviderPolicy("int4"))
    with pytest.raises(AttributeError):
        ProviderPolicy().min_uptime = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exclude_below": "int3"}, "exclude_below must be one of"),
        ({"exclude_below": "unknown"}, "exclude_below must be one of"),
        ({"unknown": "maybe"}, "unknown must be one of assume_native, reject, accept"),
        ({"only": []}, "only must name at least one provider"),
        (
            {"exclude_providers": ["chutes", " "]},
            "exclude_providers contains an empty provider name",
        ),
        ({"min_uptime": 101}, "min_uptime must be a percentage"),
        (
            {"allowed_health": ["sick"]},
            "allowed_health must hold values of ok, degraded, down, unknown",
        ),
        ({"max_prompt_price": "-1"}, "max_prompt_price must be ≥ 0"),
        ({"max_completion_price": "cheap"}, "max_completion_price must be a decimal number"),
        ({"min_context_length": -1}, "min_context_length must be ≥ 0"),
        (
            {"native_precision": {"a/b": "int4"}},
            "native_precision must be a NativePrecisionRegistry",
        ),
    ],
)
def test_bad_arguments_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ProviderPolicy(**kwargs)


# --- tool_choice support and service tiers (fields of the newest SDK) -------------------

_TOOL_FLAGS = {"none": True, "auto": True, "required": False, "function": True}


@pytest.mark.parametrize(
    ("variant", "allowed"), [("required", False), ("function", True), ("auto", True)]
)
def test_tool_choice_rejects_endpoints_where_that_variant_failed_testing(
    variant: str, allowed: bool
) -> None:
    got, code, reason = decide(
        ProviderPolicy(tool_choice=variant),  # type: ignore[arg-type]
        endpoint(supports_tool_choice=_TOOL_FLAGS),
    )
    assert got is allowed
    if not allowed:
        assert code == DecisionCode.TOOL_CHOICE_UNSUPPORTED
        assert reason == "tool_choice 'required' did not pass OpenRouter's testing here"


def test_an_endpoint_that_does_not_report_tool_choice_support_passes_and_says_so() -> None:
    allowed, _, reason = decide(ProviderPolicy(tool_choice="required"), endpoint())
    assert allowed
    assert "tool_choice 'required' support not reported" in reason


@pytest.mark.parametrize(
    ("tiers", "tier", "allowed"),
    [
        ([None], None, True),
        ([None], "flex", False),
        (["priority", None], "priority", True),
        (["priority"], None, False),
        (None, None, True),
        (None, "default", True),
        (None, "ultrafast", False),
        (None, "priority", False),
        (None, "flex", False),
    ],
)
def test_service_tiers_keep_only_the_tiers_named(
    tiers: list[str | None] | None, tier: str | None, allowed: bool
) -> None:
    """By default only standard endpoints: a tier bills or behaves otherwise."""
    got, code, reason = decide(ProviderPolicy(service_tiers=tiers), endpoint(service_tier=tier))
    assert got is allowed
    if not allowed:
        assert code == DecisionCode.SERVICE_TIER_NOT_ALLOWED
        assert f"service tier {tier or 'standard'!r} is not allowed" == reason


def test_allow_flex_keeps_flex_endpoints_beside_the_standard_ones() -> None:
    policy = ProviderPolicy(allow_flex=True)
    assert decide(policy, endpoint(service_tier="flex"))[0] is True
    assert decide(policy, endpoint(service_tier=None))[0] is True
    assert decide(policy, endpoint(service_tier="priority"))[0] is False
    only_flex = ProviderPolicy(allow_flex=True, service_tiers=["flex"])
    assert decide(only_flex, endpoint(service_tier=None))[0] is False
    with pytest.raises(ConfigurationError, match="allow_flex"):
        ProviderPolicy(allow_flex="yes")  # type: ignore[arg-type]


def test_bad_tool_choice_and_empty_service_tiers_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="tool_choice must be one of none, auto"):
        ProviderPolicy(tool_choice="always")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="service_tiers must keep at least one"):
        ProviderPolicy(service_tiers=[])


async def test_the_simulated_market_narrowed_by_tool_choice_support(tmp_path: Path) -> None:
    """End to end over the simulator's listing: an endpoint whose market entry says
    `required` failed testing is rejected by `tool_choice="required"`."""
    from provider_router.testing import Market

    path = tmp_path / "market.yaml"
    path.write_text(
        "models:\n  - id: a/b\n    endpoints:\n"
        "      - provider: Alpha\n        pricing: {prompt: 1, completion: 1}\n"
        "        supported_parameters: [tools, tool_choice]\n"
        "      - provider: Beta\n        pricing: {prompt: 1, completion: 1}\n"
        "        supported_parameters: [tools, tool_choice]\n"
        "        supports_tool_choice: [none, auto]\n"
    )
    listing = parse_endpoints_response(json.loads(Market.from_file(path).endpoints_bodies["a/b"]))
    decisions = ProviderPolicy(tool_choice="required").evaluate(listing)
    assert [(d.endpoint.slug, d.allowed) for d in decisions] == [("alpha", True), ("beta", False)]
