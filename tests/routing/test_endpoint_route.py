"""Each allowed endpoint as a route of its own: its provider object and its own ceilings."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider_router import Endpoint, Workload, build_route_plan
from provider_router._constants import PER_MILLION

WORKLOAD = Workload(prompt_tokens=500, completion_tokens=2000)


class D:
    def __init__(self, endpoint: Endpoint, allowed: bool = True) -> None:
        self.endpoint = endpoint
        self.allowed = allowed


def ep(name: str, tag: str, prompt: str, completion: str, **extra: Any) -> Endpoint:
    pricing = {"prompt": prompt, "completion": completion, **extra.pop("pricing", {})}
    return Endpoint.model_validate(
        {
            "name": f"{name} | m",
            "provider_name": name,
            "tag": tag,
            "pricing": pricing,
            "quantization": "int4",
            "uptime_last_30m": 100,
            "status": 0,
            **extra,
        }
    )


CHEAP = ep("Cheap", "cheap", "0.00000045", "0.0000022")
DEAR = ep(
    "Dear",
    "dear",
    "0.0000005",
    "0.0000024",
    pricing={
        "internal_reasoning": "0.000003",
        "input_cache_write": "0.0000009",
        "request": "0.001",
    },
)
REJECTED = ep("Bad", "bad/fp4", "0.0000001", "0.000001")


def test_a_route_sends_one_endpoint_alone_at_its_own_ceilings() -> None:
    plan = build_route_plan("a/m", [D(DEAR), D(CHEAP), D(REJECTED, False)], workload=WORKLOAD)
    assert [r.tag for r in plan.routes] == ["cheap", "dear"]  # rank order
    cheap, dear = plan.route("cheap"), plan.route("dear")
    assert cheap.object == {
        "only": ["cheap"],
        "allow_fallbacks": False,
        "max_price": {
            "prompt": "0.45000000",
            "completion": "2.2000000",
            "request": "0",
            "image": "0",
        },
        "ignore": ["bad/fp4"],
        "quantizations": ["int4"],
    }
    assert "order" not in dear.object, "sticky routing stays on"
    # Its own ceilings: reasoning and cache writes included, the request fee too.
    assert dear.completion_price == Decimal("0.000003")
    assert dear.prompt_price == Decimal("0.0000009")
    assert Decimal(dear.object["max_price"]["completion"]) == 3 * PER_MILLION / 10**6
    assert dear.request_price == Decimal("0.001")
    assert cheap.worst_case(100, 1000) == 100 * cheap.prompt_price + 1000 * cheap.completion_price
    with pytest.raises(KeyError):
        plan.route("bad/fp4")


def test_the_floor_is_the_cheapest_per_request_and_prices_tokens_exactly() -> None:
    plan = build_route_plan("a/m", [D(DEAR), D(CHEAP)], workload=WORKLOAD)
    assert plan.floor is plan.route("cheap")
    assert plan.floor_cost(523, 1877) == CHEAP.pricing.cost(523, 1877)
    assert plan.floor_cost(523, 1877, cached_tokens=100) == CHEAP.pricing.cost(
        523, 1877, cached_tokens=100
    )
    same = ep("Same", "same", "0.00000045", "0.0000022", uptime_last_30m=50)
    tied = build_route_plan("a/m", [D(same), D(CHEAP)], workload=WORKLOAD)
    assert tied.floor is not None
    assert tied.floor.tag == "cheap", "equal cost: the better rank"


def test_a_flex_tier_route_covers_its_providers_standard_price() -> None:
    flex = ep("Acme", "acme/flex", "0.0000002", "0.000001", service_tier="flex")
    standard = ep("Acme", "acme", "0.0000004", "0.000003", quantization="fp8")
    plan = build_route_plan("a/m", [D(flex), D(standard, False)], workload=WORKLOAD)
    route = plan.route("acme/flex")
    assert route.completion_price == Decimal("0.000003"), "its standard twin's price"
    assert route.prompt_price == Decimal("0.0000004")


@given(
    st.integers(0, 200_000),
    st.integers(0, 100_000),
    st.integers(0, 3),
)
def test_a_routes_worst_case_never_exceeds_the_plans(prompt: int, cap: int, images: int) -> None:
    plan = build_route_plan("a/m", [D(DEAR), D(CHEAP)], workload=WORKLOAD)
    for route in plan.routes:
        assert route.worst_case(prompt, cap, images) <= plan.worst_case(prompt, cap, images)
    assert plan.route("dear").worst_case(prompt, cap, images) == plan.worst_case(
        prompt, cap, images
    )
