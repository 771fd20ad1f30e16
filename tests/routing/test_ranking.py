"""Ranking: exact costs, reliability adjustment, order, and determinism (with Hypothesis)."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provider_router import (
    ConfigurationError,
    Endpoint,
    EndpointHealth,
    ProviderPolicy,
    Quantization,
    Workload,
    precision_rank,
    rank,
    workload_cost,
)
from provider_router.catalog.quantization import read_scheme, scheme_tier
from provider_router.catalog.records import parse_endpoints_response
from provider_router.routing.ranking import UPTIME_WEIGHTS, blended_uptime

BUNDLED = Path(__file__).parents[2] / "provider_router" / "data" / "kimi-k2.5.endpoints.json"
KIMI = "moonshotai/kimi-k2.5"
WORKLOAD = Workload(prompt_tokens=200, completion_tokens=2000)


def endpoint(tag: str, prompt: str, completion: str, **overrides: Any) -> Endpoint:
    raw: dict[str, Any] = {
        "name": f"{tag} | {KIMI}",
        "provider_name": tag.title(),
        "tag": tag,
        "pricing": {"prompt": prompt, "completion": completion},
        "quantization": "int4",
        "status": 0,
        "uptime_last_30m": 100,
    }
    raw.update(overrides)
    return Endpoint.model_validate(raw)


def test_costs_are_exact_for_the_workload() -> None:
    pricing = {"prompt": "0.00000045", "completion": "0.0000022", "input_cache_read": "0.00000015"}
    chutes = endpoint("chutes", "0", "0", pricing=pricing)
    workload = Workload(
        prompt_tokens=1000,
        completion_tokens=1500,
        reasoning_tokens=500,
        cached_prompt_share=Decimal("0.4"),
    )
    [entry] = rank([chutes], workload=workload)
    expected = (
        600 * Decimal("0.00000045") + 400 * Decimal("0.00000015") + 2000 * Decimal("0.0000022")
    )
    assert entry.cost_per_request == expected == Decimal("0.00473")
    assert entry.cost_per_1k_requests == Decimal("4.73")
    assert entry.cost_per_million_output_tokens == Decimal("2.365")
    assert entry.expected_cost_per_success == expected  # 100 % uptime
    assert entry.effective_cost_per_1k_requests == Decimal("4.73")
    assert workload_cost(chutes, workload) == expected
    assert entry.rank == 1
    assert entry.health is EndpointHealth.OK


def test_uptime_turns_cost_into_expected_cost_per_success() -> None:
    [entry] = rank([endpoint("novita", "0", "0.000002", uptime_last_30m=80)], workload=WORKLOAD)
    assert entry.cost_per_request == Decimal("0.004")
    assert entry.success_probability == Decimal("0.8")
    assert entry.expected_cost_per_success == Decimal("0.005")
    assert not entry.uptime_assumed


def test_missing_uptime_uses_the_assumed_figure_and_zero_uptime_is_floored() -> None:
    unknown = endpoint("a", "0", "0.000001", uptime_last_30m=None)
    dead = endpoint("b", "0", "0.000001", uptime_last_30m=0)
    ranked = {r.endpoint.slug: r for r in rank([unknown, dead], workload=WORKLOAD)}
    assert ranked["a"].uptime_assumed
    assert ranked["a"].success_probability == Decimal("0.95")
    assert ranked["b"].success_probability == Decimal("0.01")
    custom = rank([unknown], workload=WORKLOAD, assumed_uptime=50)
    assert custom[0].success_probability == Decimal("0.5")


def test_a_cheaper_but_flakier_endpoint_can_lose() -> None:
    cheap_flaky = endpoint("cheap", "0", "0.0000022", uptime_last_30m=80)
    dear_solid = endpoint("dear", "0", "0.0000025", uptime_last_30m=100)
    assert [r.endpoint.slug for r in rank([cheap_flaky, dear_solid], workload=WORKLOAD)] == [
        "dear",
        "cheap",
    ]


def test_degraded_follows_healthy_at_equal_cost_and_down_goes_last() -> None:
    healthy = endpoint("zeta", "0", "0.000002")
    degraded = endpoint("alpha", "0", "0.000002", status=-2)
    down = endpoint("beta", "0", "0.000001", status=-5)  # cheapest, but down
    ranked = rank([down, degraded, healthy], workload=WORKLOAD)
    assert [r.endpoint.slug for r in ranked] == ["zeta", "alpha", "beta"]
    assert [r.rank for r in ranked] == [1, 2, 3]
    assert ranked[1].health is EndpointHealth.DEGRADED


def test_ties_break_by_slug_whatever_the_input_order() -> None:
    same = [endpoint(tag, "0.0000005", "0.000002") for tag in ("c", "a", "b")]
    assert [r.endpoint.slug for r in rank(same, workload=WORKLOAD)] == ["a", "b", "c"]
    assert rank(same, workload=WORKLOAD) == rank(same[::-1], workload=WORKLOAD)


def test_the_bundled_market_ranks_chutes_first() -> None:
    market = parse_endpoints_response(json.loads(BUNDLED.read_bytes()))
    decisions = ProviderPolicy(exclude_below="int4").evaluate(market)
    ranked = rank(decisions.allowed, workload=WORKLOAD)
    assert ranked[0].endpoint.slug == "chutes"
    assert ranked[0].cost_per_1k_requests == Decimal("4.49")  # 200 × $0.45/M + 2000 × $2.20/M
    assert "fireworks" not in {r.endpoint.slug for r in ranked}


def test_dynamic_pricing_is_never_ranked() -> None:
    router = endpoint("auto", "-1", "-1")
    with pytest.raises(ConfigurationError, match=r"'auto' .* has dynamic pricing"):
        rank([router], workload=WORKLOAD)


def test_a_workload_without_output_has_no_per_output_price() -> None:
    [entry] = rank([endpoint("a", "0.000001", "0.000002")], workload=Workload(100, 0))
    assert entry.cost_per_million_output_tokens is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_tokens": -1, "completion_tokens": 1}, "prompt_tokens must be an integer ≥ 0"),
        ({"prompt_tokens": 1.5, "completion_tokens": 1}, "prompt_tokens must be an integer"),
        ({"prompt_tokens": 1, "completion_tokens": True}, "completion_tokens must be an integer"),
        ({"prompt_tokens": 1, "completion_tokens": 1, "reasoning_tokens": -2}, "reasoning_tokens"),
        ({"prompt_tokens": 1, "completion_tokens": 1, "cached_prompt_share": 2}, "between 0 and 1"),
        ({"prompt_tokens": 1, "completion_tokens": 1, "cached_prompt_share": "x"}, "decimal"),
    ],
)
def test_bad_workloads_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Workload(**kwargs)


def test_bad_assumed_uptime_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="assumed_uptime must be a percentage"):
        rank([], workload=WORKLOAD, assumed_uptime=120)


# --- properties --------------------------------------------------------------------------

_PRICES = st.decimals(min_value=0, max_value=Decimal("0.00002"), places=10).map(str)
_QUANT = st.sampled_from(
    [*(q.value for q in Quantization), None, "fp3", "INT4", "q4_k_m", "w4a16", "int3", "xq-7"]
)


@st.composite
def endpoints(draw: st.DrawFn) -> list[Endpoint]:
    count = draw(st.integers(min_value=0, max_value=12))
    tags = draw(st.lists(st.sampled_from("abcdefgh"), min_size=count, max_size=count))
    result = []
    for tag in tags:  # duplicate tags on purpose: identical keys must still sort stably
        result.append(
            endpoint(
                tag,
                draw(_PRICES),
                draw(_PRICES),
                quantization=draw(_QUANT),
                status=draw(st.sampled_from([0, -1, -2, -3, -5, -10, -7, 2, None])),
                uptime_last_30m=draw(
                    st.none() | st.floats(min_value=0, max_value=100, allow_nan=False)
                ),
                context_length=draw(st.sampled_from([None, 8192, 262144])),
            )
        )
    return result


_POLICIES = st.builds(
    ProviderPolicy,
    exclude_below=st.none()
    | st.sampled_from([q for q in Quantization if precision_rank(q) is not None]),
    unknown=st.sampled_from(["assume_native", "reject", "accept"]),
    min_uptime=st.none() | st.floats(min_value=0, max_value=100),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(endpoints(), _POLICIES, st.randoms(use_true_random=False))
def test_policy_and_ranking_are_deterministic_and_respect_the_floor(
    listing: list[Endpoint], policy: ProviderPolicy, rng: random.Random
) -> None:
    shuffled = listing[:]
    rng.shuffle(shuffled)
    first = policy.evaluate(listing, model_id=KIMI)
    second = policy.evaluate(shuffled, model_id=KIMI)
    # Each verdict depends only on its endpoint, never on the others or their order.
    assert {(d.endpoint, d.allowed, d.code, d.reason) for d in first} == {
        (d.endpoint, d.allowed, d.code, d.reason) for d in second
    }
    ranked, reranked = (
        rank(first.allowed, workload=WORKLOAD),
        rank(second.allowed, workload=WORKLOAD),
    )
    assert ranked == reranked
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    scores = [(r.health is EndpointHealth.DOWN, r.expected_cost_per_success) for r in ranked]
    assert scores == sorted(scores)
    floor = policy.exclude_below
    for decision in first:
        if not decision.allowed or floor is None:
            continue
        declared = decision.endpoint.quantization
        if declared is Quantization.UNRECOGNIZED:
            # A string OpenRouter does not list passes only on the bits it names.
            scheme = read_scheme(decision.endpoint.quantization_raw)
            assert scheme is not None
            assert scheme_tier(scheme) >= precision_rank(floor)  # type: ignore[operator]
        elif declared is not None and declared is not Quantization.UNKNOWN:
            # No endpoint that declares a precision below the floor is ever allowed...
            assert precision_rank(declared) >= precision_rank(floor)  # type: ignore[operator]
        elif policy.unknown != "accept":
            # ...and an undeclared one passes only on an assumed precision that meets it.
            assert decision.effective_quantization is not None
            assert precision_rank(decision.effective_quantization) >= precision_rank(floor)  # type: ignore[operator]


# --- reliability: uptime blended over the windows ------------------------------------


def test_an_outage_in_the_last_five_minutes_counts_against_a_good_half_hour() -> None:
    """5 m / 30 m / 1 d weigh 0.2 / 0.5 / 0.3: a provider down right now loses its lead."""
    failing_now = endpoint(
        "chutes", "1e-6", "1e-6", uptime_last_5m=20, uptime_last_30m=99, uptime_last_1d=99
    )
    steady = endpoint(
        "deepinfra", "1e-6", "1e-6", uptime_last_5m=98, uptime_last_30m=98, uptime_last_1d=98
    )
    first, second = rank([failing_now, steady], workload=WORKLOAD)
    assert first.endpoint.tag == "deepinfra"
    assert (
        blended_uptime(failing_now)
        == Decimal("0.2") * 20 + Decimal("0.5") * 99 + Decimal("0.3") * 99
    )
    assert second.success_probability == blended_uptime(failing_now) / 100


def test_a_bad_day_counts_against_a_good_half_hour() -> None:
    flaky = endpoint("chutes", "1e-6", "1e-6", uptime_last_30m=100, uptime_last_1d=60)
    assert blended_uptime(flaky) == (Decimal("0.5") * 100 + Decimal("0.3") * 60) / Decimal("0.8")
    steady = endpoint("deepinfra", "1e-6", "1e-6", uptime_last_30m=95, uptime_last_1d=95)
    assert [r.endpoint.tag for r in rank([flaky, steady], workload=WORKLOAD)] == [
        "deepinfra",
        "chutes",
    ]


@pytest.mark.parametrize("window", ["uptime_last_5m", "uptime_last_30m", "uptime_last_1d"])
def test_a_single_window_is_used_as_is(window: str) -> None:
    only = endpoint("chutes", "1e-6", "1e-6", **{"uptime_last_30m": None, window: 87.5})
    assert blended_uptime(only) == Decimal("87.5")
    [entry] = rank([only], workload=WORKLOAD)
    assert entry.success_probability == Decimal("0.875")
    assert entry.uptime_assumed is False


def test_no_window_at_all_is_unknown_and_the_assumed_uptime_applies() -> None:
    blind = endpoint("chutes", "1e-6", "1e-6", uptime_last_30m=None)
    assert blended_uptime(blind) is None
    [entry] = rank([blind], workload=WORKLOAD, assumed_uptime=90)
    assert entry.uptime_assumed is True
    assert entry.success_probability == Decimal("0.9")


def test_the_weights_sum_to_one() -> None:
    assert sum(weight for _, weight in UPTIME_WEIGHTS) == 1


def test_cache_writes_count_in_the_ranking() -> None:
    """#24: an endpoint whose cache writes cost more than its prompt ranks by what a
    workload that writes pays."""
    from provider_router.catalog.records import Endpoint

    def priced(name: str, prompt: str, write: str | None) -> Endpoint:
        pricing = {"prompt": prompt, "completion": "0.000002"}
        if write is not None:
            pricing["input_cache_write"] = write
        return Endpoint.model_validate(
            {"name": name, "provider_name": name, "tag": name.lower(), "pricing": pricing}
        )

    writer = priced("Writer", "0.0000009", "0.000002")
    plain = priced("Plain", "0.000001", None)
    none = Workload(prompt_tokens=10_000, completion_tokens=10)
    writes = Workload(prompt_tokens=10_000, completion_tokens=10, cache_write_share=Decimal("0.5"))
    assert rank([writer, plain], workload=none)[0].endpoint.provider_name == "Writer"
    assert rank([writer, plain], workload=writes)[0].endpoint.provider_name == "Plain"
