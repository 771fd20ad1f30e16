"""Sync or batch: the plan projected on both routes, the times, and each dataset's route."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest
import pytest_asyncio
from _project_cli import MODEL as REFERENCE_MODEL
from _project_cli import REFERENCE, run_cli

from provider_router import ConfigurationError, ProviderPolicy
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.cli._project_render import format_duration
from provider_router.planning.compare import (
    BATCH_MEDIAN_SECONDS,
    BATCH_WINDOW_SECONDS,
    compare_routes,
    median_of_slowest,
)
from provider_router.planning.plan import load_plan
from provider_router.planning.workload import DatasetDemand, WorkloadEstimate
from provider_router.testing import SimulatorServer
from provider_router.testing.server import DEFAULT_TEST_KEY

K3, K25 = "moonshotai/kimi-k3", "moonshotai/kimi-k2.5"
POLICY = ProviderPolicy(exclude_below="int4")
WORKLOAD = WorkloadEstimate(200, 1600, cached_prompt_share="0.5")
SEEDS = [DatasetDemand(f"b{i}", target_output_tokens=10_000_000) for i in range(6)]

Listings = dict[str, tuple[ModelEndpoints, ModelEndpoints]]


@pytest_asyncio.fixture
async def listings(openrouter_sim: SimulatorServer) -> AsyncIterator[Listings]:
    # With a key: a listing asked without one has no recent latency (as real ones).
    async with Catalog(openrouter_sim.url, api_key=DEFAULT_TEST_KEY) as catalog:
        yield {m: (await catalog.endpoints(m), await catalog.batch_endpoints(m)) for m in (K3, K25)}


def test_batch_is_priced_at_the_pinned_batch_endpoint_without_cache(listings: Listings) -> None:
    sync, batch = listings[K3]
    routes = compare_routes(SEEDS, sync, batch, POLICY, WORKLOAD, budget=100, concurrency=2000)
    assert routes.batch_route.only == ("together",)
    assert routes.batch.projection is not None
    requests = 10_000_000 // 1600
    per_request = 200 * Decimal("0.608") / 10**6 + 1600 * Decimal("2.66") / 10**6
    assert routes.batch.expected_cost == 6 * requests * per_request
    assert routes.sync.expected_cost is not None
    assert routes.saving == routes.sync.expected_cost - routes.batch.expected_cost
    assert routes.saving is not None
    assert routes.saving > 0
    assert routes.batch.batches == 12  # 6,250 requests a dataset: two batches each
    assert routes.batch.worst_seconds == BATCH_WINDOW_SECONDS
    assert routes.batch.fits() is False  # $164 > $100
    assert [c.route for c in routes.choices] == ["sync"] * 6  # the plan's default


def test_sync_time_from_latency_and_throughput(listings: Listings) -> None:
    sync, batch = listings[K3]
    one = [DatasetDemand("one", max_requests=2000)]
    routes = compare_routes(one, sync, batch, POLICY, WORKLOAD, concurrency=2000)
    cheapest = routes.sync.projection.cheapest if routes.sync.projection else None
    assert cheapest is not None
    assert cheapest.latency_last_30m is not None
    assert cheapest.throughput_last_30m is not None
    p50 = cheapest.latency_last_30m.p50
    thr = cheapest.throughput_last_30m.p50
    assert p50 is not None
    assert thr is not None
    assert routes.sync.expected_seconds == pytest.approx(p50 / 1000 + 1600 / thr)
    assert routes.sync.worst_seconds is not None
    assert routes.sync.worst_seconds >= routes.sync.expected_seconds


def test_a_model_without_batch_endpoints(listings: Listings) -> None:
    sync, batch = listings[K25]
    routes = compare_routes(
        SEEDS[:2], sync, batch, POLICY, WORKLOAD, routes={"b0": "auto", "b1": "sync"}
    )
    assert not routes.batch.available
    assert routes.batch.expected_cost is None
    assert routes.saving is None
    assert [c.route for c in routes.choices] == ["sync", "sync"]
    assert "has no Batch API endpoint" in routes.choices[0].reason
    with pytest.raises(ConfigurationError, match="asks for route batch"):
        compare_routes(SEEDS[:1], sync, batch, POLICY, WORKLOAD, routes={"b0": "batch"})


@pytest.mark.parametrize(
    ("deadline", "route"), [(None, "batch"), (48.0, "batch"), (24.0, "batch"), (2.0, "sync")]
)
def test_auto_takes_batch_unless_the_deadline_is_sooner_than_the_window(
    listings: Listings, deadline: float | None, route: str
) -> None:
    sync, batch = listings[K3]
    routes = compare_routes(
        SEEDS[:1], sync, batch, POLICY, WORKLOAD, routes={"b0": "auto"}, deadlines={"b0": deadline}
    )
    assert routes.choices[0].route == route


def test_bad_route_and_concurrency(listings: Listings) -> None:
    sync, batch = listings[K3]
    with pytest.raises(ConfigurationError, match="route must be one of"):
        compare_routes(SEEDS[:1], sync, batch, POLICY, WORKLOAD, routes={"b0": "fast"})
    with pytest.raises(ConfigurationError, match="concurrency"):
        compare_routes(SEEDS[:1], sync, batch, POLICY, WORKLOAD, concurrency=0)


def test_the_slowest_of_many_batches() -> None:
    assert median_of_slowest(1) == pytest.approx(BATCH_MEDIAN_SECONDS)
    assert median_of_slowest(0) == 0
    times = [median_of_slowest(n) for n in (1, 2, 10, 100)]
    assert times == sorted(times)
    assert median_of_slowest(10**9) == BATCH_WINDOW_SECONDS


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "unknown"), (42, "42 s"), (420, "7 min"), (6019, "1 h 40 min"), (86400, "24 h 00 min")],
)
def test_durations_read_plainly(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_plan_route_and_deadline_fields(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": "p0", "prompt": "hi"}\n')
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {K3}\nbudget: 10\ndatasets:\n"
        "  - {name: a, input: a.jsonl, max_requests: 1, route: auto, deadline_hours: 30}\n"
    )
    (dataset,) = load_plan(plan).datasets
    assert (dataset.route, dataset.deadline_hours) == ("auto", 30)
    plan.write_text(
        f"model: {K3}\nbudget: 10\ndatasets:\n  - {{name: a, input: a.jsonl, route: fast}}\n"
    )
    with pytest.raises(ConfigurationError, match="route"):
        load_plan(plan)


def reference(model: str) -> list[str]:
    """The seeds' reference check (test_cli_project.REFERENCE) on ``model``."""
    return [model if arg == REFERENCE_MODEL else arg for arg in REFERENCE]


async def test_cli_project_shows_sync_and_batch_side_by_side(
    openrouter_sim: SimulatorServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*reference(K3), "--base-url", openrouter_sim.url]
    assert await run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "the batch pinned to together" in out
    assert "sync at 256 in flight" in out
    assert "6 batches" in out  # 5,000 requests a dataset: one batch each
    assert "24 h 00 min (the window)" in out
    assert "Batch saves $" in out
    assert await run_cli([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["routes"]["batch"]["available"] is True
    assert Decimal(data["routes"]["batch"]["expected_cost"]) < Decimal(
        data["routes"]["sync"]["expected_cost"]
    )
    assert data["routes"]["batch_pin"] == ["together"]


async def test_cli_project_says_plainly_when_a_model_has_no_batch_route(
    openrouter_sim: SimulatorServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*reference(K25), "--base-url", openrouter_sim.url]
    assert await run_cli(argv) == 0
    out = capsys.readouterr().out
    assert (
        "Batch route: moonshotai/kimi-k2.5 has no Batch API endpoint; only the sync route." in out
    )
