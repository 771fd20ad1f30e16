"""ProviderHealth: observed stats, demotion on failures, cool-down with an injected clock."""

from __future__ import annotations

import pytest

from provider_router import ConfigurationError, ProviderHealth


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_demote_for_the_cooldown() -> None:
    clock = Clock()
    health = ProviderHealth(failure_threshold=3, cooldown=60, clock=clock)
    version = health.version
    for _ in range(2):
        health.record_failure("Chutes")
    assert not health.is_demoted("Chutes")
    health.record_failure("Chutes", rate_limited=True)
    assert health.is_demoted("Chutes")
    assert health.version > version
    stats = health.stats("Chutes")
    assert stats is not None
    assert (stats.errors, stats.rate_limited, stats.demotions) == (2, 1, 1)
    clock.now = 59.9
    assert health.demoted() == frozenset({"Chutes"})
    clock.now = 60.0
    assert health.demoted() == frozenset()
    # a fresh start: one more failure does not demote again
    health.record_failure("Chutes")
    assert not health.is_demoted("Chutes")


def test_a_full_endpoints_refusals_never_demote_it() -> None:
    """A 429 while others of ours are in flight there says the endpoint is full, not
    failing: counted, never toward a demotion, nor does it break a run of failures'
    count (a refusal is no success either)."""
    health = ProviderHealth(failure_threshold=3, min_samples=5, error_rate_threshold=0.1)
    version = health.version
    for _ in range(100):
        health.record_refused("Chutes")
    assert not health.is_demoted("Chutes")
    assert health.version == version
    stats = health.stats("Chutes")
    assert stats is not None
    assert (stats.requests, stats.rate_limited, stats.errors, stats.demotions) == (100, 100, 0, 0)
    health.record_failure("Chutes")
    health.record_failure("Chutes")
    health.record_refused("Chutes")
    health.record_failure("Chutes")
    assert health.is_demoted("Chutes")


def test_success_resets_the_run_of_failures() -> None:
    health = ProviderHealth(failure_threshold=2, clock=Clock())
    health.record_failure("A")
    health.record_success("A", latency=2.0, completion_tokens=100)
    health.record_failure("A")
    assert not health.is_demoted("A")
    stats = health.stats("A")
    assert stats is not None
    assert stats.latency == 2.0
    assert stats.throughput == 50.0


def test_error_rate_demotes_after_min_samples() -> None:
    health = ProviderHealth(
        failure_threshold=100, error_rate_threshold=0.3, min_samples=10, alpha=0.5, clock=Clock()
    )
    for _ in range(4):
        health.record_success("B")
        health.record_failure("B")
    assert not health.is_demoted("B")  # 8 samples: not enough yet
    health.record_success("B")
    health.record_failure("B")
    assert health.is_demoted("B")


def test_moving_averages_weigh_new_samples() -> None:
    health = ProviderHealth(alpha=0.5, clock=Clock())
    health.record_success("C", latency=1.0)
    health.record_success("C", latency=3.0)
    stats = health.stats("C")
    assert stats is not None
    assert stats.latency == 2.0
    assert stats.throughput is None  # no tokens reported


def test_snapshot_is_a_copy_and_unknown_provider_is_none() -> None:
    health = ProviderHealth(clock=Clock())
    health.record_success("D")
    snap = health.snapshot()
    snap["D"].successes = 99
    stats = health.stats("D")
    assert stats is not None
    assert stats.successes == 1
    assert health.stats("nobody") is None


def test_several_providers_expire_independently() -> None:
    clock = Clock()
    health = ProviderHealth(failure_threshold=1, cooldown=10, clock=clock)
    health.record_failure("A")
    clock.now = 5
    health.record_failure("B")
    assert health.demoted() == {"A", "B"}
    clock.now = 10
    assert health.demoted() == {"B"}
    clock.now = 15
    assert health.demoted() == frozenset()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failure_threshold": 0}, "failure_threshold"),
        ({"error_rate_threshold": 0}, "error_rate_threshold"),
        ({"error_rate_threshold": 1.5}, "error_rate_threshold"),
        ({"min_samples": 0}, "min_samples"),
        ({"cooldown": -1}, "cooldown"),
        ({"alpha": 0}, "alpha"),
    ],
)
def test_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ProviderHealth(**kwargs)
