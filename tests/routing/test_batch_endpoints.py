"""Batch endpoints under the same policy: the `:batch` listing read into the same records,
the policy's quantization floor turned into a safe `only` pin, ranked by their own prices."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provider_router import ConfigurationError, ProviderPolicy
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import parse_endpoints_response
from provider_router.routing.batch_endpoints import base_model_id, batch_listing_id, batch_route
from provider_router.routing.ranking import Workload
from provider_router.testing import Market, SimulatorServer

WORKLOAD = Workload(prompt_tokens=200, completion_tokens=2000)


def listing(*endpoints: dict[str, Any], model: str = "acme/model") -> Any:
    base = {
        "provider": "P",
        "pricing": {"prompt": "0.5", "completion": "2"},
        "quantization": "int4",
    }
    data = {
        "models": [
            {
                "id": model,
                "endpoints": [
                    {
                        "provider": "Sync",
                        "quantization": "int4",
                        "pricing": {"prompt": "1", "completion": "4"},
                    }
                ],
                "batch_endpoints": [{**base, **e} for e in endpoints],
            }
        ]
    }
    market = Market.from_data(data, Path("inline.yaml"))
    body = json.loads(market.batch_endpoints_bodies[model])
    return parse_endpoints_response(body, source="test")


def test_ids() -> None:
    assert batch_listing_id("moonshotai/kimi-k3") == "moonshotai/kimi-k3:batch"
    assert batch_listing_id("moonshotai/kimi-k3:batch") == "moonshotai/kimi-k3:batch"
    assert base_model_id("moonshotai/kimi-k3:batch") == "moonshotai/kimi-k3"


def test_cheapest_allowed_endpoint_is_pinned_alone() -> None:
    route = batch_route(
        listing(
            {"provider": "Together", "pricing": {"prompt": "0.6", "completion": "2.6"}},
            {
                "provider": "Cheap",
                "pricing": {"prompt": "0.3", "completion": "1.5"},
                "quantization": "fp4",
            },
            {"provider": "Fair", "pricing": {"prompt": "0.5", "completion": "2.4"}},
        ),
        ProviderPolicy(exclude_below="int4"),
        WORKLOAD,
    )
    assert route.available
    assert route.endpoint is not None
    assert route.endpoint.provider_name == "Fair"
    assert route.only == ("fair",)
    assert route.provider_object() == {"only": ["fair"], "allow_fallbacks": False}
    assert route.prices() == (Decimal("0.5") / 10**6, Decimal("2.4") / 10**6)
    assert route.model_id == "acme/model"
    assert [d.allowed for d in route.decisions] == [True, False, True]


def test_without_a_floor_the_cheapest_of_all_is_chosen() -> None:
    route = batch_route(
        listing(
            {"provider": "Fair", "pricing": {"prompt": "0.5", "completion": "2.4"}},
            {
                "provider": "Cheap",
                "pricing": {"prompt": "0.3", "completion": "1.5"},
                "quantization": "fp4",
            },
        ),
        ProviderPolicy(),
        WORKLOAD,
    )
    assert route.only == ("cheap",)


def test_a_provider_with_a_rejected_variant_is_never_pinned() -> None:
    # `only: [deepinfra]` would let OpenRouter run the batch on deepinfra/fp4 (no
    # quantizations filter in a batch), so deepinfra cannot be the pin.
    route = batch_route(
        listing(
            {
                "provider": "DeepInfra",
                "slug": "deepinfra",
                "tag": "deepinfra",
                "pricing": {"prompt": "0.2", "completion": "1"},
            },
            {
                "provider": "DeepInfra",
                "slug": "deepinfra",
                "tag": "deepinfra/fp4",
                "quantization": "fp4",
                "pricing": {"prompt": "0.1", "completion": "0.5"},
            },
            {"provider": "Together", "pricing": {"prompt": "0.6", "completion": "2.6"}},
        ),
        ProviderPolicy(exclude_below="int4"),
        WORKLOAD,
    )
    assert route.only == ("together",)
    assert [e.slug for e in route.unpinnable] == ["deepinfra"]


def test_only_unpinnable_endpoints_says_why() -> None:
    route = batch_route(
        listing(
            {"provider": "DeepInfra", "slug": "deepinfra", "tag": "deepinfra"},
            {
                "provider": "DeepInfra",
                "slug": "deepinfra",
                "tag": "deepinfra/fp4",
                "quantization": "fp4",
            },
        ),
        ProviderPolicy(exclude_below="int4"),
        WORKLOAD,
    )
    assert not route.available
    assert "no quantization filter" in route.reason
    with pytest.raises(ConfigurationError, match="pinned safely"):
        route.provider_object()


def test_every_endpoint_rejected_names_each_reason() -> None:
    route = batch_route(
        listing({"provider": "Cheap", "quantization": "nvfp4"}),
        ProviderPolicy(exclude_below="int4"),
        WORKLOAD,
    )
    assert not route.available
    assert "rejects every batch endpoint" in route.reason
    assert "cheap" in route.reason


def test_policy_provider_rules_apply_to_batch_endpoints() -> None:
    route = batch_route(
        listing({"provider": "Together"}, {"provider": "Fair"}),
        ProviderPolicy(exclude_providers=["fair"]),
        WORKLOAD,
    )
    assert route.only == ("together",)


def test_a_model_without_batch_endpoints_says_so_plainly() -> None:
    route = batch_route(listing(), ProviderPolicy(exclude_below="int4"), WORKLOAD)
    assert not route.available
    assert route.reason == "acme/model has no Batch API endpoint; only the sync route"
    assert route.only == ()
    with pytest.raises(ConfigurationError, match="no Batch API endpoint"):
        route.prices()


async def test_catalog_reads_the_batch_listing_into_the_same_records(tmp_path: Path) -> None:
    async with SimulatorServer() as sim, Catalog(sim.url) as catalog:
        k3 = await catalog.batch_endpoints("moonshotai/kimi-k3")
        assert k3.id == "moonshotai/kimi-k3:batch"
        (together,) = k3.endpoints
        assert together.provider_name == "Together"
        assert together.pricing.completion == Decimal("0.00000266")
        k25 = await catalog.batch_endpoints("moonshotai/kimi-k2.5")
        assert k25.endpoints == ()
        route = batch_route(k3, ProviderPolicy(exclude_below="int4"), WORKLOAD)
        assert route.only == ("together",)
        path = catalog.save_snapshot(tmp_path / "snap.json")
    offline = Catalog.load_snapshot(path)
    again = await offline.batch_endpoints("moonshotai/kimi-k3:batch")
    assert again == k3
