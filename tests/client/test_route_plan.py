"""RoutePlan: ceilings, the provider object, demotion, estimates, prompt-token bound."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider_router import (
    ConfigurationError,
    Endpoint,
    Workload,
    build_route_plan,
)
from provider_router.routing.route_plan import estimate_prompt_tokens
from provider_router.testing.chat.synth import count_prompt_tokens


class D:
    def __init__(self, endpoint: Endpoint, allowed: bool) -> None:
        self.endpoint = endpoint
        self.allowed = allowed


def ep(name: str, tag: str, prompt: str, completion: str, **pricing: Any) -> Endpoint:
    return Endpoint.model_validate(
        {
            "name": f"{name} | m",
            "provider_name": name,
            "tag": tag,
            "pricing": {"prompt": prompt, "completion": completion, **pricing},
            "quantization": "int4",
            "uptime_last_30m": 100,
            "status": 0,
        }
    )


WORKLOAD = Workload(prompt_tokens=100, completion_tokens=1000)
CHEAP = ep("Cheap", "cheap", "0.0000004", "0.0000022")
DEAR = ep("Dear", "dear", "0.0000007", "0.0000028", request="0.001")
BAD = ep("Bad", "bad/fp4", "0.0000001", "0.0000010")
MIXED_OK = ep("Mixed", "mixed/int4", "0.0000005", "0.0000024")
MIXED_BAD = ep("Mixed", "mixed/fp4", "0.0000002", "0.0000011")


def plan(*decisions: D):
    return build_route_plan("a/m", decisions, workload=WORKLOAD)


def test_provider_object_uses_tags_ranks_and_ceilings() -> None:
    p = plan(D(DEAR, True), D(CHEAP, True), D(BAD, False))
    obj = p.provider_object()
    assert obj == {
        "order": ["cheap", "dear"],
        "only": ["cheap", "dear"],
        "ignore": ["bad/fp4"],
        "allow_fallbacks": True,
        "max_price": {
            "prompt": "0.7000000",
            "completion": "2.8000000",
            "request": "0.001",
            "image": "0",
        },
        "quantizations": ["int4"],
    }
    assert p.provider_object() is obj  # cached, built once


def test_demoted_providers_go_last_but_stay_allowed() -> None:
    p = plan(D(DEAR, True), D(CHEAP, True))
    obj = p.provider_object(frozenset({"Cheap"}))
    assert obj["order"] == ["dear", "cheap"]
    assert obj["only"] == ["cheap", "dear"]


def test_worst_case_is_exact() -> None:
    p = plan(D(DEAR, True), D(CHEAP, True))
    assert p.worst_case(100, 1000) == Decimal("0.00007") + Decimal("0.0028") + Decimal("0.001")


def test_ceilings_include_cache_writes_reasoning_and_overrides() -> None:
    odd = ep(
        "Odd",
        "odd",
        "0.0000001",
        "0.0000010",
        input_cache_write="0.0000009",
        internal_reasoning="0.000003",
        overrides=[{"min_prompt_tokens": 1000, "prompt": "0.0000012", "completion": "0.0000013"}],
    )
    p = plan(D(odd, True))
    assert p.max_prompt_price == Decimal("0.0000012")
    assert p.max_completion_price == Decimal("0.000003")


def test_estimate_prices_the_serving_provider_and_unknown_is_none() -> None:
    p = plan(D(DEAR, True), D(CHEAP, True))
    assert p.estimate("Cheap", 10, 100) == Decimal("0.000004") + Decimal("0.00022")
    assert p.estimate("Nobody", 10, 100) is None
    assert p.estimate(None, 10, 100) is None
    assert p.estimate("Cheap", 10, 100, cached_tokens=20) is None  # inconsistent counts


def test_a_provider_with_allowed_and_rejected_endpoints_is_ambiguous() -> None:
    p = plan(D(MIXED_OK, True), D(MIXED_BAD, False), D(CHEAP, True))
    assert p.ambiguous_providers == {"Mixed"}
    assert "mixed/fp4" in p.provider_object()["ignore"]
    assert "mixed/int4" in p.provider_object()["only"]


def test_dynamic_pricing_is_never_routed() -> None:
    auto = ep("Auto", "auto", "-1", "-1")
    p = plan(D(auto, True), D(CHEAP, True))
    assert p.order == ("cheap",)
    assert p.ignore == ("auto",)


def test_nothing_allowed_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="allows no endpoint of 'a/m'"):
        plan(D(BAD, False))


def test_fallbacks_can_be_turned_off() -> None:
    p = build_route_plan("a/m", [D(CHEAP, True)], workload=WORKLOAD, allow_fallbacks=False)
    assert p.provider_object()["allow_fallbacks"] is False
    assert "ignore" not in p.provider_object()


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["system", "user", "assistant"]),
                "content": st.text(max_size=300),
            }
        ),
        min_size=1,
        max_size=6,
    )
)
def test_prompt_estimate_bounds_the_simulators_count(messages: list[dict[str, str]]) -> None:
    assert estimate_prompt_tokens(messages) >= count_prompt_tokens(messages)


def test_prompt_estimate_counts_multipart_content() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "x" * 400}]}]
    assert estimate_prompt_tokens(parts) > 400


@pytest.mark.parametrize(
    ("quantizations", "sent"),
    [
        (["int4", "fp8"], ["fp8", "int4"]),
        (["int4", None], ["int4", "unknown"]),
        (["int4", "unknown"], ["int4", "unknown"]),
        (["mxfp4"], ["mxfp4"]),
        (["int4", "q4_k_m"], None),  # not nameable: no filter rather than a wrong one
    ],
)
def test_quantizations_name_the_allowed_endpoints_values(
    quantizations: list[str | None], sent: list[str] | None
) -> None:
    endpoints = []
    for i, quantization in enumerate(quantizations):
        raw = ep(f"P{i}", f"p{i}", "0.0000004", "0.0000022").model_dump(mode="json")
        raw["quantization"] = quantization
        endpoints.append(D(Endpoint.model_validate(raw), True))
    obj = plan(*endpoints, D(BAD, False)).provider_object()
    assert obj.get("quantizations") == sent


def _tiered(name: str, tag: str, tier: str | None, prompt: str, completion: str) -> Endpoint:
    endpoint = ep(name, tag, prompt, completion)
    return endpoint.model_copy(update={"service_tier": tier})


def test_a_flex_endpoint_whose_standard_twin_is_dynamically_priced_is_not_routed() -> None:
    # A flex request may be served, and billed, on the provider's standard tier: priced
    # "-1", that bill has no ceiling, so the flex endpoint cannot be reserved for either.
    flex = _tiered("Vertex", "vertex/flex", "flex", "0.0000005", "0.000002")
    dynamic = _tiered("Vertex", "vertex", None, "-1", "-1")
    p = plan(D(flex, True), D(dynamic, False), D(CHEAP, True))
    assert p.order == ("cheap",)
    assert "vertex/flex" in p.ignore
    with pytest.raises(ConfigurationError, match="allows no endpoint"):
        plan(D(flex, True), D(dynamic, False))
    # A priced standard twin keeps the flex endpoint, its price in the ceilings.
    priced = _tiered("Vertex", "vertex", None, "0.000001", "0.000004")
    kept = plan(D(flex, True), D(priced, False))
    assert kept.order == ("vertex/flex",)
    assert kept.max_completion_price == Decimal("0.000004")


def test_cache_saving_prices_each_endpoint_with_its_own_listing() -> None:
    from provider_router.routing.route_plan import cache_saving

    # One provider, two allowed endpoints: the answer does not say which served, so the
    # saving is the smaller of the two, never the dearest full price less the dearest read.
    a = ep("Two", "two/int4", "0.000001", "0.000002", input_cache_read="0.0000001")
    b = ep("Two", "two/fp8", "0.0000005", "0.000002", input_cache_read="0.00000045")
    p = plan(D(a, True), D(b, True))
    saved = cache_saving(p, "Two", 1_000, 900)
    assert saved == 900 * (Decimal("0.0000005") - Decimal("0.00000045"))
    only_a = plan(D(a, True))
    assert cache_saving(only_a, "Two", 1_000, 900) == 900 * Decimal("0.0000009")
    assert cache_saving(only_a, "Two", 1_000, 0) == 0
    assert cache_saving(only_a, "Nobody", 1_000, 900) == 0
