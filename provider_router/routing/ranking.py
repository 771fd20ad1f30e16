"""What a workload costs on each endpoint, adjusted for reliability, best first.

Pure: no I/O, no clock, exact :class:`~decimal.Decimal` throughout, and a total order,
so the same endpoints rank the same way whatever order they come in. The score is the
*expected cost per successful request*: a request's cost divided by the endpoint's
uptime blended over OpenRouter's windows (:data:`UPTIME_WEIGHTS`), an upper bound;
endpoints marked down go last, and a degraded one follows a healthy one at equal
score. With a verification report the score is the *cost per accepted sample* (divided
by the endpoint's pass rate, docs/policy.md): unknown is not free, so an endpoint the
report does not measure ranks after every measured one with a pass rate above zero,
and one whose every sample failed after those.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final

from provider_router._exceptions import ConfigurationError
from provider_router._format import tidy
from provider_router._money import to_decimal
from provider_router.catalog.records import Endpoint, EndpointHealth
from provider_router.catalog.verdicts import VerificationReport

__all__ = [
    "DEFAULT_ASSUMED_UPTIME",
    "UPTIME_WEIGHTS",
    "RankedEndpoint",
    "Workload",
    "blended_uptime",
    "rank",
    "workload_cost",
]

DEFAULT_ASSUMED_UPTIME: Final = Decimal(95)
"""Uptime percent assumed when an endpoint reports none: OpenRouter's "normal routing" floor."""

UPTIME_WEIGHTS: Final = (
    ("uptime_last_5m", Decimal("0.2")),
    ("uptime_last_30m", Decimal("0.5")),
    ("uptime_last_1d", Decimal("0.3")),
)
"""How much each uptime window counts in the reliability term (sum 1).

Thirty minutes is the main signal: recent, yet over enough minutes to mean
something. The day is the steadier record: a flaky provider that is fine right
now still pays for its history. Five minutes reacts first to an outage in
progress but is noisy (OpenRouter counts only minutes with 10 or more attempts,
so it is often one or two minutes, or null). Windows an endpoint does not report
are left out and the weights of the others renormalised, so a single window is
used as is."""

_MIN_SUCCESS: Final = Decimal("0.01")
"""A 0 % uptime would divide by zero; one success in a hundred is the floor."""

_HEALTH_ORDER: Final = {
    EndpointHealth.OK: 0,
    EndpointHealth.UNKNOWN: 0,
    EndpointHealth.DEGRADED: 1,
    EndpointHealth.DOWN: 2,
}

_THOUSAND: Final = Decimal(1000)
_MILLION: Final = Decimal(1_000_000)
_HUNDRED: Final = Decimal(100)


@dataclass(frozen=True, slots=True)
class Workload:
    """The shape of one request, as an expected value.

    Args:
        prompt_tokens: prompt tokens per request (including cached ones).
        completion_tokens: visible output tokens per request.
        reasoning_tokens: reasoning tokens per request; billed at the completion
            rate, on top of ``completion_tokens``.
        cached_prompt_share: fraction (0..1) of the prompt read from the
            provider's cache; billed at ``input_cache_read`` where priced.
        cache_write_share: fraction (0..1) of the prompt written to the cache
            (explicit caches, or implicit ones that price writes); billed at
            ``input_cache_write`` where priced. Cached plus written is at most 1.
    """

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    cached_prompt_share: Decimal = field(default=Decimal(0))
    cache_write_share: Decimal = field(default=Decimal(0))

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"Workload.{name} must be an integer ≥ 0, got {value!r}")
        try:
            share = to_decimal(self.cached_prompt_share, what="Workload.cached_prompt_share")
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if not 0 <= share <= 1:
            raise ConfigurationError(
                f"Workload.cached_prompt_share must be between 0 and 1, got {share}"
            )
        object.__setattr__(self, "cached_prompt_share", share)
        try:
            written = to_decimal(self.cache_write_share, what="Workload.cache_write_share")
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if not 0 <= written <= 1 - share:
            raise ConfigurationError(
                "Workload.cache_write_share must be between 0 and 1 - cached_prompt_share, "
                f"got {written}"
            )
        object.__setattr__(self, "cache_write_share", written)

    @property
    def output_tokens(self) -> int:
        """Billed output tokens per request: completion plus reasoning."""
        return self.completion_tokens + self.reasoning_tokens

    @property
    def cached_tokens(self) -> Decimal:
        """Expected cached prompt tokens per request (may be fractional)."""
        return self.prompt_tokens * self.cached_prompt_share

    @property
    def cache_write_tokens(self) -> Decimal:
        """Expected prompt tokens written to the cache per request (may be fractional)."""
        return self.prompt_tokens * self.cache_write_share


def workload_cost(endpoint: Endpoint, workload: Workload) -> Decimal:
    """Exact expected USD of one request of ``workload`` on ``endpoint``.

    Raises:
        ConfigurationError: the endpoint's pricing is dynamic (``"-1"``), so it
            has no cost to compute.
    """
    if endpoint.pricing.is_dynamic:
        raise ConfigurationError(
            f"endpoint {endpoint.slug!r} ({endpoint.provider_name}) has dynamic pricing "
            "('-1' sentinel) and cannot be ranked"
        )
    return endpoint.pricing.cost(
        workload.prompt_tokens,
        workload.output_tokens,
        cached_tokens=workload.cached_tokens,
        cache_write_tokens=workload.cache_write_tokens,
    )


@dataclass(frozen=True, slots=True)
class RankedEndpoint:
    """An endpoint's place in the ranking and the numbers that put it there.

    Attributes:
        rank: 1 for the best.
        endpoint: the endpoint.
        cost_per_request: expected USD per request of the workload.
        cost_per_1k_requests: the same, per 1,000 requests.
        cost_per_million_output_tokens: USD per million billed output tokens
            (``None`` for a workload with no output).
        success_probability: uptime as a fraction (floored at 0.01).
        uptime_assumed: true when the endpoint reported no uptime and
            ``assumed_uptime`` was used.
        expected_cost_per_success: ``cost_per_request / success_probability``,
            the primary sort key.
        health: what the endpoint's status means (the second key).
        pass_rate: with a verification report, the share of its canary samples that
            were accepted, exact (``accepted / judged``); None when not ranked by
            one, or the report did not measure it.
        cost_per_accepted_sample: ``expected_cost_per_success / pass_rate``, the
            primary sort key when ranked by a report (None: not ranked by one, not
            measured, or no sample accepted).
    """

    rank: int
    endpoint: Endpoint
    cost_per_request: Decimal
    cost_per_1k_requests: Decimal
    cost_per_million_output_tokens: Decimal | None
    success_probability: Decimal
    uptime_assumed: bool
    expected_cost_per_success: Decimal
    health: EndpointHealth
    pass_rate: Decimal | None = None
    cost_per_accepted_sample: Decimal | None = None

    @property
    def effective_cost_per_1k_requests(self) -> Decimal:
        """Expected cost per 1,000 successful requests (failed attempts' share included):
        the ``$/1k ok req`` column of ``provider-router endpoints``."""
        return tidy(self.expected_cost_per_success * _THOUSAND)


def blended_uptime(endpoint: Endpoint) -> Decimal | None:
    """The endpoint's uptime percent, weighted over its windows (:data:`UPTIME_WEIGHTS`).

    None when it reports no window at all (unknown, never 0).
    """
    total = weights = Decimal(0)
    for name, weight in UPTIME_WEIGHTS:
        value = getattr(endpoint, name)
        if value is not None:
            total += weight * to_decimal(value, what=name)
            weights += weight
    return None if not weights else total / weights


def _success_probability(endpoint: Endpoint, assumed_uptime: Decimal) -> tuple[Decimal, bool]:
    uptime = blended_uptime(endpoint)
    if uptime is None:
        percent, assumed = assumed_uptime, True
    else:
        percent, assumed = uptime, False
    return max(percent / _HUNDRED, _MIN_SUCCESS), assumed


def _acceptance(
    report: VerificationReport | None, endpoint: Endpoint, expected: Decimal
) -> tuple[int, Decimal | None, Decimal | None]:
    """(tier, pass rate, cost per accepted sample) under ``report``. Tier 0: measured
    with a sample accepted (or no report); 1: not measured; 2: measured, none accepted."""
    if report is None:
        return 0, None, None
    verdict = report.verdict(endpoint.slug)
    if verdict is None or verdict.judged == 0:
        return 1, None, None
    rate = Decimal(verdict.accepted) / Decimal(verdict.judged)
    if verdict.accepted == 0:
        return 2, rate, None
    return 0, rate, expected * verdict.judged / verdict.accepted


def rank(
    endpoints: Iterable[Endpoint],
    *,
    workload: Workload,
    assumed_uptime: Decimal | float | int = DEFAULT_ASSUMED_UPTIME,
    verified: VerificationReport | None = None,
) -> list[RankedEndpoint]:
    """Rank endpoints by expected cost per successful request of ``workload``, or by
    cost per accepted sample under a verification report.

    Sort keys, in order: down endpoints last; with ``verified``, measured endpoints
    with a sample accepted, then unmeasured ones, then ones with none accepted (module
    doc); the score (cost per accepted sample for the first group, else expected cost
    per success); health (healthy before degraded); plain cost per request; higher
    success probability; then the endpoint's slug, provider name and name, and
    finally its full JSON form, so the result never depends on the input order.

    Args:
        endpoints: candidates, typically ``decisions.allowed``.
        workload: the request shape to price.
        assumed_uptime: percent used for endpoints that report no uptime.
        verified: a :class:`~provider_router.VerificationReport` of these endpoints'
            model: rank by cost per accepted sample (price ÷ pass rate).

    Raises:
        ConfigurationError: an endpoint has dynamic pricing, ``assumed_uptime``
            is not a percentage, or ``verified`` is not a report.
    """
    try:
        assumed = to_decimal(assumed_uptime, what="assumed_uptime")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not 0 <= assumed <= 100:
        raise ConfigurationError(f"assumed_uptime must be a percentage 0..100, got {assumed}")
    if verified is not None and not isinstance(verified, VerificationReport):
        raise ConfigurationError(
            f"verified must be a VerificationReport, got {type(verified).__name__}"
        )
    output_tokens = workload.output_tokens
    scored = []
    for endpoint in endpoints:
        cost = workload_cost(endpoint, workload)
        success, uptime_assumed = _success_probability(endpoint, assumed)
        expected = cost / success
        tier, rate, per_accepted = _acceptance(verified, endpoint, expected)
        health = endpoint.health
        key = (
            health is EndpointHealth.DOWN,
            tier,
            expected if per_accepted is None else per_accepted,
            _HEALTH_ORDER[health],
            cost,
            -success,
            endpoint.sort_key,
            endpoint.model_dump_json(),
        )
        scored.append(
            (key, endpoint, cost, success, uptime_assumed, expected, health, rate, per_accepted)
        )
    scored.sort(key=lambda item: item[0])
    return [
        RankedEndpoint(
            rank=position,
            endpoint=endpoint,
            cost_per_request=cost,
            cost_per_1k_requests=tidy(cost * _THOUSAND),
            cost_per_million_output_tokens=(
                cost * _MILLION / output_tokens if output_tokens else None
            ),
            success_probability=success,
            uptime_assumed=uptime_assumed,
            expected_cost_per_success=expected,
            health=health,
            pass_rate=rate,
            cost_per_accepted_sample=per_accepted,
        )
        for position, (
            _,
            endpoint,
            cost,
            success,
            uptime_assumed,
            expected,
            health,
            rate,
            per_accepted,
        ) in enumerate(scored, start=1)
    ]
