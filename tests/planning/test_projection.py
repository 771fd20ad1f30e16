"""The cost projection: the reference check, the arithmetic, budget fitting, bad input."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provider_router import ConfigurationError, ProviderPolicy
from provider_router.catalog.records import Endpoint, ModelEndpoints
from provider_router.planning.plan import Plan
from provider_router.planning.projection import CostBasis, Projection, project
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate

MODEL = "moonshotai/kimi-k2.5"
MILLION = 1_000_000


def endpoint(
    provider: str,
    prompt: str,
    completion: str,
    *,
    quantization: str = "int4",
    uptime: float | None = 100.0,
    status: int = 0,
    **pricing: Any,
) -> Endpoint:
    """An endpoint priced in USD per million tokens (as people read prices)."""
    return Endpoint.model_validate(
        {
            "name": f"{provider} | {MODEL}",
            "provider_name": provider,
            "tag": provider.lower(),
            "quantization": quantization,
            "status": status,
            "uptime_last_30m": uptime,
            "pricing": {
                "prompt": str(Decimal(prompt) / MILLION),
                "completion": str(Decimal(completion) / MILLION),
                **pricing,
            },
        }
    )


def market(*endpoints: Endpoint) -> ModelEndpoints:
    return ModelEndpoints(id=MODEL, endpoints=endpoints)


# The reference market: the cheapest endpoint of all (Fireworks, NVFP4) is excluded
# by exclude_below="int4", so the cheapest *allowed* one is Chutes at $0.45 / $2.20.
REFERENCE_MARKET = market(
    endpoint("Fireworks", "0.40", "2.00", quantization="nvfp4"),
    endpoint("BaseTen", "0.42", "2.10", quantization="fp4"),
    endpoint("Chutes", "0.45", "2.20", uptime=99.0),
    endpoint("DeepInfra", "0.50", "2.40", uptime=99.6),
    endpoint("Together", "0.60", "2.85", uptime=97.0),
)
INT4 = ProviderPolicy(exclude_below="int4")
SIX = [DatasetDemand(f"b{i}", target_output_tokens=10 * MILLION) for i in range(3, 9)]
REFERENCE_WORKLOAD = WorkloadEstimate(prompt_tokens=200, completion_tokens=2000)


def reference(budget: object = 100, demands: list[DatasetDemand] = SIX) -> Projection:
    return project(demands, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD, budget=budget)  # type: ignore[arg-type]


# --- the reference check ------------------------------------------------------------------


def test_reference_check_full_plan_cost_and_budget_fit() -> None:
    projection = reference()
    assert projection.cheapest.provider_name == "Chutes"
    totals = projection.total.expected.tokens
    assert totals.requests == 30_000
    assert totals.prompt_tokens == 6 * MILLION
    assert totals.completion_tokens == 60 * MILLION
    # 6M × $0.45/M + 60M × $2.20/M = $2.70 + $132.00
    assert projection.total.expected.cost_cheapest == Decimal("134.70")
    fit = projection.budget_fit("cheapest")
    assert fit is not None
    assert fit.needed.expected == Decimal("134.70")
    assert not fit.fits
    assert fit.uniform_target is not None
    assert 7_400_000 <= fit.uniform_target < 7_450_000


@pytest.mark.parametrize(("per_dataset", "fits"), [(7 * MILLION, True), (8 * MILLION, False)])
def test_reference_check_7m_fits_and_8m_does_not(per_dataset: int, fits: bool) -> None:
    demands = [DatasetDemand(f"b{i}", target_output_tokens=per_dataset) for i in range(3, 9)]
    projection = reference(demands=demands)
    cost = projection.total.expected.cost_cheapest
    assert (cost <= 100) is fits
    fit = projection.budget_fit("cheapest")
    assert fit is not None
    assert fit.fits is fits


def test_uniform_target_is_the_largest_that_fits() -> None:
    fit = reference().budget_fit("cheapest")
    assert fit is not None
    assert fit.uniform_target is not None
    at = [DatasetDemand(d.name, target_output_tokens=fit.uniform_target) for d in SIX]
    above = [DatasetDemand(d.name, target_output_tokens=fit.uniform_target + 1) for d in SIX]
    assert reference(demands=at).total.expected.cost_cheapest <= 100
    assert reference(demands=above).total.expected.cost_cheapest > 100


def test_routing_mix_costs_more_than_the_cheapest_and_less_than_the_dearest() -> None:
    projection = reference()
    shares = {s.endpoint.provider_name: s.share for s in projection.mix}
    assert set(shares) == {"Chutes", "DeepInfra", "Together"}
    # Chutes serves what it can (99 %); DeepInfra most of the rest; Together what both miss.
    served = 1 - Decimal("0.01") * Decimal("0.004") * Decimal("0.03")
    assert shares["Chutes"] == Decimal("0.99") / served
    assert shares["DeepInfra"] == Decimal("0.01") * Decimal("0.996") / served
    assert abs(sum(shares.values(), Decimal(0)) - 1) < Decimal("1e-20")
    expected = projection.total.expected
    assert (
        Decimal("134.70")
        < expected.cost_mix
        < Decimal("134.70") * Decimal("2.85") / Decimal("2.20")
    )
    fit_mix = projection.budget_fit("mix")
    fit_cheapest = projection.budget_fit("cheapest")
    assert fit_mix is not None
    assert fit_cheapest is not None
    assert fit_mix.uniform_target is not None
    assert fit_cheapest.uniform_target is not None
    assert fit_mix.uniform_target <= fit_cheapest.uniform_target


def test_a_fully_reliable_cheapest_endpoint_takes_the_whole_mix() -> None:
    projection = project(
        SIX,
        market(endpoint("Chutes", "0.45", "2.20"), endpoint("DeepInfra", "0.5", "2.4")),
        INT4,
        REFERENCE_WORKLOAD,
    )
    assert [(s.endpoint.provider_name, s.share) for s in projection.mix] == [("Chutes", Decimal(1))]
    assert projection.total.expected.cost_mix == projection.total.expected.cost_cheapest
    assert projection.budget_fits == ()


# --- the range from response lengths ------------------------------------------------------


def test_longer_responses_cost_less_for_a_token_target() -> None:
    # Output is fixed by the target; longer responses mean fewer requests, fewer prompts.
    workload = WorkloadEstimate(200, 2000, completion_tokens_low=1000, completion_tokens_high=4000)
    one = project([SIX[0]], REFERENCE_MARKET, INT4, workload)
    dataset = one.datasets[0]
    assert dataset.low.completion_tokens_per_response == 4000
    assert dataset.high.completion_tokens_per_response == 1000
    assert dataset.low.tokens.requests == 2500
    assert dataset.high.tokens.requests == 10_000
    cost = dataset.cost("cheapest")
    assert cost.low == Decimal("22.225")  # 0.5M × 0.45 + 10M × 2.20 (per M)
    assert cost.expected == Decimal("22.45")
    assert cost.high == Decimal("22.90")


def test_longer_responses_cost_more_for_a_request_cap() -> None:
    workload = WorkloadEstimate(100, 1000, completion_tokens_low=500, completion_tokens_high=1500)
    capped = [DatasetDemand("b3", max_requests=1000)]
    dataset = project(capped, REFERENCE_MARKET, INT4, workload).datasets[0]
    assert dataset.limited_by == "max_requests"
    assert dataset.low.tokens.completion_tokens == 500_000
    assert dataset.high.tokens.completion_tokens == 1_500_000
    assert dataset.cost("cheapest").high == Decimal("3.345")  # 0.1M × 0.45 + 1.5M × 2.20


def test_a_datasets_max_tokens_caps_its_projected_response_length() -> None:
    workload = WorkloadEstimate(
        100, 600, completion_tokens_low=400, completion_tokens_high=900, reasoning_tokens=300
    )
    demands = [
        DatasetDemand("chat", max_requests=1000, max_tokens=256),
        DatasetDemand("code", max_requests=1000),
    ]
    chat, code = project(demands, REFERENCE_MARKET, INT4, workload).datasets
    # A provider stops at max_tokens: no response of "chat" is billed longer.
    assert chat.expected.tokens.completion_tokens == 256_000
    assert chat.low.tokens.completion_tokens == 256_000
    assert chat.high.tokens.completion_tokens == 256_000
    assert chat.expected.tokens.reasoning_tokens == 128_000  # its share kept: 300/600
    assert code.expected.tokens.completion_tokens == 600_000  # uncapped
    assert workload.capped(None) is workload
    assert workload.capped(900) is workload
    assert workload.capped(500).completion_tokens == 500
    assert "capped at max_tokens 500" in workload.capped(500).source


def test_a_plan_gives_each_dataset_its_own_max_tokens() -> None:
    plan = Plan.model_validate(
        {
            "model": MODEL,
            "generation": {"max_tokens": 1024},
            "datasets": [
                {"name": "code", "input": "c.jsonl", "max_requests": 10},
                {
                    "name": "chat",
                    "input": "p.jsonl",
                    "max_requests": 10,
                    "generation": {"max_tokens": 256},
                },
            ],
        }
    )
    workload = WorkloadEstimate(100, 600)
    code, chat = project(plan, REFERENCE_MARKET, INT4, workload).datasets
    assert chat.expected.tokens.completion_tokens == 2_560
    assert code.expected.tokens.completion_tokens == 6_000


def test_prompts_running_out_stop_a_dataset_short_of_its_target() -> None:
    short = [DatasetDemand("b3", target_output_tokens=10 * MILLION, available_prompts=1200)]
    dataset = project(short, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD).datasets[0]
    assert dataset.limited_by == "prompts"
    assert dataset.expected.tokens.requests == 1200
    assert not dataset.target_reached
    assert not project(short, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD).total.target_reached


def test_a_partial_response_is_rounded_up_to_a_whole_one() -> None:
    odd = [DatasetDemand("b3", target_output_tokens=2001)]
    dataset = project(odd, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD).datasets[0]
    assert dataset.expected.tokens.requests == 2
    assert dataset.expected.tokens.completion_tokens == 4000


def test_fractional_means_give_whole_token_totals() -> None:
    workload = WorkloadEstimate(Decimal("187.5"), Decimal("1873.25"))
    dataset = project(
        [DatasetDemand("b3", max_requests=3)], REFERENCE_MARKET, INT4, workload
    ).datasets[0]
    assert dataset.expected.tokens.prompt_tokens == 562  # 562.5 rounds half-even
    assert dataset.expected.tokens.completion_tokens == 5620  # 5619.75


# --- caching, reasoning, fees ---------------------------------------------------------------


def test_cached_prompt_tokens_bill_at_the_cache_read_rate() -> None:
    cached = market(endpoint("DeepInfra", "0.40", "2.00", input_cache_read="0.00000015"))
    workload = WorkloadEstimate(100, 1000, cached_prompt_share=Decimal("0.25"))
    dataset = project([DatasetDemand("b3", max_requests=1000)], cached, INT4, workload).datasets[0]
    tokens = dataset.expected.tokens
    assert (tokens.prompt_tokens, tokens.cached_tokens) == (100_000, 25_000)
    # 75k × $0.40/M + 25k × $0.15/M + 1M × $2.00/M
    assert dataset.expected.cost_cheapest == Decimal("0.03") + Decimal("0.00375") + Decimal("2")


def test_cached_tokens_bill_in_full_where_caching_is_not_priced() -> None:
    workload = WorkloadEstimate(100, 1000, cached_prompt_share=Decimal("0.25"))
    cached = project([DatasetDemand("b3", max_requests=1000)], REFERENCE_MARKET, INT4, workload)
    uncached = project(
        [DatasetDemand("b3", max_requests=1000)],
        REFERENCE_MARKET,
        INT4,
        WorkloadEstimate(100, 1000),
    )
    assert cached.total.expected.cost_cheapest == uncached.total.expected.cost_cheapest


def test_reasoning_tokens_are_output_tokens_billed_at_the_completion_rate() -> None:
    with_reasoning = WorkloadEstimate(200, 2000, reasoning_tokens=1500)
    projection = project(SIX[:1], REFERENCE_MARKET, INT4, with_reasoning)
    tokens = projection.total.expected.tokens
    assert tokens.completion_tokens == 10 * MILLION  # the target counts reasoning too
    assert tokens.reasoning_tokens == 7_500_000
    assert projection.total.expected.cost_cheapest == Decimal("22.45")
    # Ranking's workload counts reasoning on top of visible completion tokens.
    ranked_workload = with_reasoning.to_workload()
    assert (ranked_workload.completion_tokens, ranked_workload.reasoning_tokens) == (500, 1500)


def test_long_context_prices_apply_per_request_not_to_the_plan_total() -> None:
    long_context = {"overrides": [{"min_prompt_tokens": 100_000, "prompt": "0.000001"}]}
    tiered = market(endpoint("Chutes", "0.45", "2.20", **long_context))
    short = project(SIX[:1], tiered, INT4, REFERENCE_WORKLOAD)  # 1M prompt tokens in total
    assert short.total.expected.cost_cheapest == Decimal("22.45")
    long = project(
        [DatasetDemand("b3", max_requests=10)], tiered, INT4, WorkloadEstimate(100_001, 1000)
    )
    # 10 × 100,001 prompt tokens at $1/M + 10k output tokens at $2.20/M
    assert long.total.expected.cost_cheapest == Decimal("1.00001") + Decimal("0.022")


def test_per_request_fees_are_charged_per_request() -> None:
    fee = market(endpoint("Chutes", "0.45", "2.20", request="0.001"))
    projection = project(SIX[:1], fee, INT4, REFERENCE_WORKLOAD)
    assert projection.total.expected.cost_cheapest == Decimal("22.45") + 5000 * Decimal("0.001")


# --- budget fitting ----------------------------------------------------------------------------


def test_datasets_fit_whole_in_priority_order_then_one_partly() -> None:
    fit = reference(budget=50).budget_fit("cheapest")
    assert fit is not None
    assert fit.whole_datasets == ("b3", "b4")  # $22.45 each
    assert fit.partial is not None
    assert fit.partial.name == "b5"
    assert fit.partial.cost <= Decimal(50) - 2 * Decimal("22.45")
    assert 2_260_000 < fit.partial.output_tokens <= 2_271_700  # $5.10 / $2.245 per M


def test_a_budget_that_covers_the_plan_needs_no_cap() -> None:
    fit = reference(budget=200).budget_fit("cheapest")
    assert fit is not None
    assert fit.fits
    assert fit.fits_high
    assert fit.uniform_target is None
    assert fit.whole_datasets == tuple(d.name for d in SIX)
    assert fit.partial is None


def test_a_budget_too_small_for_one_response_gives_a_zero_target() -> None:
    fit = reference(budget="0.001").budget_fit("cheapest")
    assert fit is not None
    assert fit.uniform_target == 0
    assert fit.whole_datasets == ()
    assert fit.partial is not None
    assert fit.partial.output_tokens == 0


def test_the_conservative_target_uses_the_high_scenario() -> None:
    workload = WorkloadEstimate(200, 2000, completion_tokens_low=1000, completion_tokens_high=4000)
    projection = project(SIX, REFERENCE_MARKET, INT4, workload, budget=100)
    fit = projection.budget_fit("cheapest")
    assert fit is not None
    assert fit.uniform_target is not None
    assert fit.uniform_target_conservative is not None
    assert fit.uniform_target_conservative < fit.uniform_target
    assert fit.needed.low < fit.needed.expected < fit.needed.high


@settings(max_examples=40, deadline=None)
@given(
    targets=st.lists(st.integers(1, 5 * MILLION), min_size=1, max_size=4),
    completion=st.integers(50, 4000),
    prompt=st.integers(0, 3000),
    budget=st.integers(1, 60),
)
def test_budget_fit_is_tight_for_any_plan(
    targets: list[int], completion: int, prompt: int, budget: int
) -> None:
    demands = [DatasetDemand(f"d{i}", target_output_tokens=t) for i, t in enumerate(targets)]
    workload = WorkloadEstimate(prompt, completion)
    projection = project(demands, REFERENCE_MARKET, INT4, workload, budget=budget)
    assert projection.total.expected.cost_mix == sum(
        (d.expected.cost_mix for d in projection.datasets), Decimal(0)
    )
    bases: tuple[CostBasis, ...] = ("cheapest", "mix")
    for basis in bases:
        fit = projection.budget_fit(basis)
        assert fit is not None
        if fit.fits:
            assert fit.uniform_target is None
            continue
        assert fit.uniform_target is not None

        def cost(cap: int, basis: str = basis) -> Decimal:
            capped = [
                DatasetDemand(d.name, target_output_tokens=min(d.target_output_tokens or 0, cap))
                for d in demands
            ]
            total = project(capped, REFERENCE_MARKET, INT4, workload).total.expected
            return total.cost_cheapest if basis == "cheapest" else total.cost_mix

        assert cost(fit.uniform_target) <= budget
        assert cost(fit.uniform_target + 1) > budget


# --- plans, policies, output ---------------------------------------------------------------------


def test_a_batch_plan_brings_its_policy_budget_and_model(tmp_path: Any) -> None:
    plan = Plan.model_validate(
        {
            "model": MODEL,
            "budget": "100",
            "policy": {"exclude_below": "int4"},
            "datasets": [
                {
                    "name": f"b{i}",
                    "input": str(tmp_path / f"b{i}.jsonl"),
                    "target_output_tokens": 10 * MILLION,
                }
                for i in range(3, 9)
            ],
        }
    )
    projection = project(plan, REFERENCE_MARKET.endpoints, None, REFERENCE_WORKLOAD)
    assert projection.model_id == MODEL
    assert projection.cheapest.provider_name == "Chutes"  # Fireworks/BaseTen rejected
    fit = projection.budget_fit("cheapest")
    assert fit is not None
    assert fit.budget == 100
    assert not fit.fits
    capped = project(plan, REFERENCE_MARKET, None, REFERENCE_WORKLOAD, prompt_counts={"b3": 10})
    assert capped.datasets[0].expected.tokens.requests == 10


def test_per_dataset_workloads_override_the_plan_wide_one() -> None:
    long_prompts = WorkloadEstimate(2000, 2000)
    demands = [
        SIX[0],
        DatasetDemand("b4", target_output_tokens=10 * MILLION, workload=long_prompts),
    ]
    projection = project(demands, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD)
    first, second = projection.datasets
    assert first.expected.tokens.prompt_tokens == 1 * MILLION
    assert second.expected.tokens.prompt_tokens == 10 * MILLION


def test_without_a_policy_everything_is_allowed() -> None:
    projection = project(SIX, REFERENCE_MARKET, None, REFERENCE_WORKLOAD)
    assert projection.cheapest.provider_name == "Fireworks"


def test_to_dict_is_json_and_exact() -> None:
    data = json.loads(json.dumps(reference().to_dict()))
    assert data["model"] == MODEL
    assert Decimal(data["total"]["expected"]["cost_cheapest"]) == Decimal("134.70")
    assert data["total"]["expected"]["requests"] == 30_000
    cheapest = next(f for f in data["budget"] if f["basis"] == "cheapest")
    assert cheapest["fits"] is False
    assert 7_400_000 <= cheapest["uniform_target"] < 7_450_000
    assert [d["name"] for d in data["datasets"]] == [d.name for d in SIX]
    assert data["cheapest"]["provider"] == "Chutes"


# --- bad input ----------------------------------------------------------------------------------


def test_a_policy_that_allows_nothing_says_why() -> None:
    only_fp4 = market(endpoint("Fireworks", "0.40", "2.00", quantization="nvfp4"))
    with pytest.raises(ConfigurationError, match=r"allows none of the 1 endpoints.*Fireworks"):
        project(SIX, only_fp4, INT4, REFERENCE_WORKLOAD)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_tokens": -1, "completion_tokens": 10}, "prompt_tokens must be ≥ 0"),
        ({"prompt_tokens": 1, "completion_tokens": 0}, "completion_tokens must be > 0"),
        ({"prompt_tokens": "many", "completion_tokens": 10}, "decimal number"),
        (
            {"prompt_tokens": 1, "completion_tokens": 10, "completion_tokens_low": 11},
            "completion_tokens_low ≤ completion_tokens",
        ),
        (
            {"prompt_tokens": 1, "completion_tokens": 10, "completion_tokens_high": 9},
            "≤ completion_tokens_high",
        ),
        (
            {"prompt_tokens": 1, "completion_tokens": 10, "reasoning_tokens": 11},
            "cannot exceed",
        ),
        (
            {"prompt_tokens": 1, "completion_tokens": 10, "cached_prompt_share": "1.5"},
            "between 0 and 1",
        ),
    ],
)
def test_bad_workloads_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        WorkloadEstimate(**kwargs)


def test_bad_demands_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"'b3' has no output-token target"):
        DatasetDemand("b3")
    with pytest.raises(ConfigurationError, match=r"'b3': max_requests must be ≥ 0"):
        DatasetDemand("b3", max_requests=-1)
    with pytest.raises(ConfigurationError, match="must be an integer"):
        DatasetDemand("b3", target_output_tokens=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: project([], REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD), "at least one dataset"),
        (
            lambda: project([SIX[0], SIX[0]], REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD),
            "unique",
        ),
        (
            lambda: project(SIX, REFERENCE_MARKET.endpoints, INT4, REFERENCE_WORKLOAD),
            "needs model_id",
        ),
        (
            lambda: project(SIX, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD, budget=0),
            "more than \\$0",
        ),
        (
            lambda: project(SIX, REFERENCE_MARKET, INT4, REFERENCE_WORKLOAD, budget="lots"),
            "budget must be a decimal number",
        ),
    ],
)
def test_bad_calls_are_refused(call: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        call()


def test_cache_reads_and_writes_are_priced_at_the_expected_shares() -> None:
    """#24: the projection prices input_cache_read and input_cache_write for a hit rate."""
    writes = endpoint(
        "Anthropicish",
        "1",
        "2",
        input_cache_read=str(Decimal("0.1") / MILLION),
        input_cache_write=str(Decimal("1.25") / MILLION),
    )
    demand = [DatasetDemand("d", max_requests=1000)]
    workload = WorkloadEstimate(
        prompt_tokens=1000,
        completion_tokens=100,
        cached_prompt_share="0.6",
        cache_write_share="0.3",
    )
    result = project(demand, market(writes), None, workload)
    tokens = result.total.expected.tokens
    assert tokens.cached_tokens == 600_000
    assert tokens.cache_write_tokens == 300_000
    expected = (
        Decimal(100_000) * 1
        + Decimal(600_000) * Decimal("0.1")
        + Decimal(300_000) * Decimal("1.25")
    ) / MILLION + Decimal(100_000) * 2 / MILLION
    assert result.total.cost("cheapest").expected == expected
    with pytest.raises(ConfigurationError, match="cache_write_share"):
        WorkloadEstimate(100, 10, cached_prompt_share="0.8", cache_write_share="0.3")
