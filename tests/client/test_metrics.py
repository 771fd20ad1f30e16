"""Prometheus metrics of a Router, scraped over a real socket from prometheus_client's server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from decimal import Decimal

import aiohttp
import pytest
from _router_helpers import MESSAGES, MakeRouter
from prometheus_client.parser import text_string_to_metric_families

from provider_router import (
    BudgetExhausted,
    ConfigurationError,
    MemoryLedger,
    Metrics,
    MissingDependencyError,
)
from provider_router.jobs.batch_api.journal import BatchIntent
from provider_router.jobs.observe.batch_view import Sighting, build_view
from provider_router.testing import SimulatorServer

pytestmark = pytest.mark.openrouter_sim(
    completion_tokens=40,
    faults=[{"kind": "rate_limit", "provider": "Chutes", "times": 1, "no_fallback": True}],
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(url: str) -> Samples:
    """Every sample of the exposition at ``url``, keyed by (name, sorted labels)."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metrics_url(metrics: Metrics) -> str:
    assert metrics.address is not None
    host, port = metrics.address
    return f"http://{host}:{port}/metrics"


async def test_a_router_serves_its_metrics_and_they_match_what_happened(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    metrics = Metrics(interval=0.005)
    metrics.serve(0)
    try:
        ledger = MemoryLedger(Decimal(10))
        router = await make_router(openrouter_sim, ledger=ledger, metrics=metrics)
        results = await asyncio.gather(*(router.chat(MESSAGES, max_tokens=100) for _ in range(12)))
        spent = (await ledger.snapshot()).spent
        url = metrics_url(metrics)
        for _ in range(2000):  # the ledger sampler runs every 5 ms
            samples = await scrape(url)
            if samples[("provider_router_spent_usd", ())] == float(spent):
                break
            await asyncio.sleep(0.005)
        prefix = "provider_router_"
        by_provider: dict[str, int] = {}
        for result in results:
            assert result.provider is not None
            by_provider[result.provider] = by_provider.get(result.provider, 0) + 1
        for provider, count in by_provider.items():
            labels = (("outcome", "success"), ("provider", provider))
            assert samples[(prefix + "requests_total", labels)] == count
        tokens = sum(r.usage.completion_tokens for r in results if r.usage)
        assert tokens == 12 * 40
        assert (
            sum(v for (n, _), v in samples.items() if n == prefix + "output_tokens_total") == tokens
        )
        cost = sum(v for (n, _), v in samples.items() if n == prefix + "cost_usd_total")
        assert cost == pytest.approx(float(spent))
        # The one 429 (Chutes, no fallback) came while others were in flight there: a
        # full endpoint's refusal, counted as a 429 and taken back to admission (no retry,
        # no failed attempt).
        assert samples[(prefix + "rate_limited_total", (("provider", "Chutes"),))] == 1
        refused = (("endpoint", "chutes"), ("provider", "Chutes"))
        assert samples[(prefix + "admission_refused_total", refused)] == 1
        assert samples[(prefix + "retries_total", ())] == 0
        assert not any(n == prefix + "attempt_failures_total" for n, _ in samples)
        # Admission's gauges, read at the scrape; the floor's cost beside the cost.
        assert samples[(prefix + "admission_in_flight", (("endpoint", "chutes"),))] == 0
        assert samples[(prefix + "admission_waiting", (("endpoint", "chutes"),))] == 0
        assert samples[(prefix + "admission_capacity", (("endpoint", "chutes"),))] >= 1
        floor = sum(v for (n, _), v in samples.items() if n == prefix + "floor_cost_usd_total")
        assert floor == pytest.approx(float(sum(r.floor_cost or 0 for r in results)))
        latency = sum(
            v for (n, _), v in samples.items() if n == prefix + "request_latency_seconds_count"
        )
        assert latency == 12
        assert samples[(prefix + "spent_usd", ())] == float(spent)
        assert samples[(prefix + "budget_limit_usd", ())] == 10
        assert samples[(prefix + "reserved_usd", ())] == 0
        assert samples[(prefix + "limiter_window", ())] == router.limiter.window
        assert samples[(prefix + "in_flight", ())] == 0
    finally:
        metrics.close()
    assert metrics.address is None


async def test_a_refused_request_is_counted_by_its_error(
    openrouter_sim: SimulatorServer, make_router: MakeRouter
) -> None:
    metrics = Metrics()
    ledger = MemoryLedger(Decimal("0.00001"))  # cannot cover one worst case
    router = await make_router(openrouter_sim, ledger=ledger, metrics=metrics)
    with pytest.raises(BudgetExhausted):
        await router.chat(MESSAGES, max_tokens=100)
    value = metrics.registry.get_sample_value(
        "provider_router_requests_total", {"provider": "none", "outcome": "BudgetExhausted"}
    )
    assert value == 1
    assert metrics.registry.get_sample_value("provider_router_retries_total") == 0


def test_without_prometheus_client_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingDependencyError, match=r"provider-router-openrouter\[metrics\]"):
        Metrics()


def test_a_port_in_use_is_a_clear_error() -> None:
    first = Metrics()
    first.serve(0)
    try:
        assert first.address is not None
        second = Metrics()
        with pytest.raises(ConfigurationError, match=r"cannot serve metrics on 127\.0\.0\.1:"):
            second.serve(first.address[1])
        with pytest.raises(ConfigurationError, match="already served"):
            first.serve(0)
    finally:
        first.close()


def test_a_router_without_metrics_never_loads_prometheus() -> None:
    """Zero cost when disabled: not even the import."""
    code = (
        "import sys, provider_router as pr\n"
        "r = pr.Router('a/b', base_url='http://127.0.0.1:9/api/v1', api_key='k')\n"
        "print(r.metrics, 'prometheus_client' in sys.modules)\n"
    )
    out = subprocess.run(  # noqa: S603 - our own fixed script
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["None", "False"]


async def test_the_batch_route_shows_its_batches_per_dataset() -> None:
    live = BatchIntent("i1", "a", ("p1", "p2"), 1000, {}, 125_000_000_000, batch_id="b1")
    done = BatchIntent(
        "i2", "a", ("p3", "p4", "p5"), 900, {}, 9, batch_id="b2", collected=True,
        cost_units=50_000_000_000, failed_ids=("p5",), settled=True,
    )  # fmt: skip
    seen = {"b1": Sighting("in_progress", "Together", 1000 + 86400)}
    view = build_view([live, done], seen, pinned="Together")
    metrics = Metrics()
    metrics.serve(0)
    try:
        metrics.batch_view(view, now=1000 + 3600)
        samples = await scrape(metrics_url(metrics))
    finally:
        metrics.close()

    def sample(name: str, **labels: str) -> float:
        return samples[(f"provider_router_{name}", tuple(sorted(labels.items())))]

    assert sample("batches", dataset="a", state="submitted") == 2
    assert sample("batches", dataset="a", state="in_progress") == 1
    assert sample("batches", dataset="a", state="completed") == 1
    assert sample("batches", dataset="a", state="validating") == 0
    assert sample("batch_lines", dataset="a", outcome="done") == 2
    assert sample("batch_lines", dataset="a", outcome="failed") == 1
    assert sample("batch_lines", dataset="a", outcome="in_batches") == 2
    assert sample("batch_cost_usd", dataset="a", kind="held") == 0.125
    assert sample("batch_cost_usd", dataset="a", kind="booked") == 0.05
    assert sample("batch_provider_batches", dataset="a", provider="Together") == 2
    assert sample("batch_window_seconds", dataset="a") == 86400 - 3600
