"""What one request of a workload looks like, and how much each dataset asks for.

Pure values and statistics (no I/O): :class:`WorkloadEstimate` is the request
shape a projection prices, with the spread of response lengths;
:class:`DatasetDemand` is how much a dataset asks for; :class:`SampleStats`
turns measured lengths (a pilot) into a mean with a confidence interval. Reading
prompt files and running a pilot live in :mod:`provider_router.planning.workload_stats`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Final, TypeAlias

from provider_router._exceptions import ConfigurationError
from provider_router._money import to_decimal
from provider_router.planning.plan import Plan
from provider_router.routing.ranking import Workload

__all__ = [
    "DatasetDemand",
    "SampleStats",
    "WorkloadEstimate",
    "demands_from_plan",
    "estimate_from_samples",
]

_ZERO: Final = Decimal(0)

Number: TypeAlias = Decimal | int | float | str
"""A count or fraction as a caller may give it; stored as an exact Decimal."""


def _count(value: Decimal) -> int:
    """An expected token count as a whole number (half-even)."""
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


def _decimal(value: object, what: str) -> Decimal:
    try:
        return to_decimal(value, what=what)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


@dataclass(frozen=True, slots=True, init=False)
class WorkloadEstimate:
    """Per-request token expectations, with the spread of response lengths.

    Counts may be fractional (they are means). ``completion_tokens`` counts every
    billed output token, reasoning included (as ``usage.completion_tokens`` and the
    batch runner's output-token targets do); ``reasoning_tokens`` says how many of
    them are reasoning.

    Args:
        prompt_tokens: prompt tokens per request (cached ones included).
        completion_tokens: expected output tokens per response.
        completion_tokens_low: a low estimate of the mean (default: the expected).
        completion_tokens_high: a high estimate of the mean (default: the expected).
        reasoning_tokens: expected reasoning tokens per response (part of
            ``completion_tokens``); scaled with it in the low/high scenarios.
        cached_prompt_share: fraction (0..1) of prompt tokens read from cache.
        cache_write_share: fraction (0..1) of prompt tokens written to the cache
            (billed at ``input_cache_write`` where an endpoint prices writes).
        source: where the numbers came from, for people (``"given"``,
            ``"pilot of 200 requests, 95% CI"``...).

    Raises:
        ConfigurationError: a negative or non-numeric count, no output, low >
            expected > high, reasoning above completion, or a share outside 0..1.
    """

    prompt_tokens: Decimal
    completion_tokens: Decimal
    low: Decimal
    """The low estimate of output tokens per response."""
    high: Decimal
    """The high estimate of output tokens per response."""
    reasoning_tokens: Decimal
    cached_prompt_share: Decimal
    cache_write_share: Decimal
    source: str

    def __init__(
        self,
        prompt_tokens: Number,
        completion_tokens: Number,
        *,
        completion_tokens_low: Number | None = None,
        completion_tokens_high: Number | None = None,
        reasoning_tokens: Number = 0,
        cached_prompt_share: Number = 0,
        cache_write_share: Number = 0,
        source: str = "given",
    ) -> None:
        set_ = object.__setattr__  # frozen: assign once, here
        counts = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "reasoning_tokens": reasoning_tokens,
        }
        for name, raw in counts.items():
            value = _decimal(raw, f"WorkloadEstimate.{name}")
            if value < 0:
                raise ConfigurationError(f"WorkloadEstimate.{name} must be ≥ 0, got {value}")
            set_(self, name, value)
        if self.completion_tokens <= 0:
            raise ConfigurationError(
                "WorkloadEstimate.completion_tokens must be > 0 (a response with no output "
                "never reaches a token target)"
            )
        bounds: tuple[tuple[str, str, Number | None], ...] = (
            ("completion_tokens_low", "low", completion_tokens_low),
            ("completion_tokens_high", "high", completion_tokens_high),
        )
        for name, attribute, bound in bounds:
            value = self.completion_tokens if bound is None else _decimal(bound, name)
            if value <= 0:
                raise ConfigurationError(f"WorkloadEstimate.{name} must be > 0, got {value}")
            set_(self, attribute, value)
        if not self.low <= self.completion_tokens <= self.high:
            raise ConfigurationError(
                "WorkloadEstimate needs completion_tokens_low ≤ completion_tokens ≤ "
                f"completion_tokens_high, got {self.low} ≤ {self.completion_tokens} ≤ {self.high}"
            )
        if self.reasoning_tokens > self.completion_tokens:
            raise ConfigurationError(
                f"WorkloadEstimate.reasoning_tokens ({self.reasoning_tokens}) are part of "
                f"completion_tokens ({self.completion_tokens}) and cannot exceed them"
            )
        share = _decimal(cached_prompt_share, "WorkloadEstimate.cached_prompt_share")
        if not 0 <= share <= 1:
            raise ConfigurationError(
                f"WorkloadEstimate.cached_prompt_share must be between 0 and 1, got {share}"
            )
        set_(self, "cached_prompt_share", share)
        written = _decimal(cache_write_share, "WorkloadEstimate.cache_write_share")
        if not 0 <= written <= 1 - share:
            raise ConfigurationError(
                "WorkloadEstimate.cache_write_share must be between 0 and "
                f"1 - cached_prompt_share, got {written}"
            )
        set_(self, "cache_write_share", written)
        set_(self, "source", source)

    def capped(self, max_tokens: int | None) -> WorkloadEstimate:
        """This workload with no response longer than ``max_tokens`` (a dataset's cap).

        A provider stops at ``max_tokens``: a mean (or its low and high) above it
        can never be billed. Reasoning keeps its share of what remains. ``self``
        when the cap changes nothing.
        """
        if max_tokens is None or self.high <= max_tokens:
            return self
        cap = Decimal(max_tokens)
        completion = min(self.completion_tokens, cap)
        return WorkloadEstimate(
            self.prompt_tokens,
            completion,
            completion_tokens_low=min(self.low, cap),
            completion_tokens_high=min(self.high, cap),
            reasoning_tokens=self.reasoning_tokens * completion / self.completion_tokens,
            cached_prompt_share=self.cached_prompt_share,
            source=f"{self.source}, capped at max_tokens {max_tokens:,}",
        )

    @property
    def reasoning_share(self) -> Decimal:
        """Fraction of output tokens that are reasoning."""
        return self.reasoning_tokens / self.completion_tokens

    def to_workload(self) -> Workload:
        """The expected request shape as the ranking's :class:`Workload` (whole tokens)."""
        reasoning = _count(self.reasoning_tokens)
        return Workload(
            prompt_tokens=_count(self.prompt_tokens),
            completion_tokens=max(_count(self.completion_tokens) - reasoning, 0),
            reasoning_tokens=reasoning,
            cached_prompt_share=self.cached_prompt_share,
            cache_write_share=self.cache_write_share,
        )


@dataclass(frozen=True, slots=True)
class DatasetDemand:
    """How much one dataset asks for: the projection's view of a plan's dataset.

    A dataset stops at whichever comes first (as the batch runner does): its
    output-token target, its request cap, or its prompts running out. At least
    one of the three must be known.

    Args:
        name: the dataset's name.
        target_output_tokens: stop once this many output tokens are completed.
        max_requests: stop after this many completed requests.
        available_prompts: how many prompts its input files hold (each is sent once).
        workload: this dataset's own workload, overriding the plan-wide one.
        max_tokens: its completion cap: no response is projected longer
            (:meth:`WorkloadEstimate.capped`).
    """

    name: str
    target_output_tokens: int | None = None
    max_requests: int | None = None
    available_prompts: int | None = None
    workload: WorkloadEstimate | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for what in ("target_output_tokens", "max_requests", "available_prompts", "max_tokens"):
            value = getattr(self, what)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"dataset {self.name!r}: {what} must be an integer")
            if value is not None and value < 0:
                raise ConfigurationError(f"dataset {self.name!r}: {what} must be ≥ 0, got {value}")
        if (
            self.target_output_tokens is None
            and self.max_requests is None
            and self.available_prompts is None
        ):
            raise ConfigurationError(
                f"dataset {self.name!r} has no output-token target, no request cap and no "
                "prompt count: nothing bounds it, so it cannot be projected"
            )


def demands_from_plan(
    plan: Plan,
    *,
    prompt_counts: Mapping[str, int] | None = None,
    workloads: Mapping[str, WorkloadEstimate] | None = None,
) -> tuple[DatasetDemand, ...]:
    """The demand of every dataset of a batch :class:`~provider_router.planning.plan.Plan`.

    Args:
        plan: the plan; its dataset order is the priority order.
        prompt_counts: prompts per dataset (count them with
            :func:`provider_router.planning.workload_stats.count_prompts`); datasets without a
            count are bounded by their target or cap alone.
        workloads: per-dataset workloads (e.g. from each dataset's own prompt files).
    """
    counts = prompt_counts or {}
    own = workloads or {}
    return tuple(
        DatasetDemand(
            name=spec.name,
            target_output_tokens=spec.target_output_tokens,
            max_requests=spec.max_requests,
            available_prompts=counts.get(spec.name),
            workload=own.get(spec.name),
            max_tokens=plan.params_for(spec).max_tokens,
        )
        for spec in plan.datasets
    )


# --- statistics of measured samples ----------------------------------------------------


def _t_quantile(probability: float, degrees: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion around the normal one.

    At 95 % it is within 0.2 % of the exact value from 5 degrees of freedom and
    within 0.01 % from 10 (0.7 % low at 3); a pilot has hundreds, where the error
    is far below its sampling error. It keeps scipy out of the dependencies.
    """
    z = statistics.NormalDist().inv_cdf(probability)
    v = float(degrees)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


@dataclass(frozen=True, slots=True)
class SampleStats:
    """Mean of measured values with a confidence interval, and their spread.

    Statistics of token counts, not money: floats are fine here, and the
    projection converts the bounds to Decimal once.

    Attributes:
        n: how many values.
        mean: their mean.
        stdev: their sample standard deviation.
        mean_low: the lower bound of the confidence interval of the mean.
        mean_high: the upper bound.
        confidence: the interval's confidence level (0.95 = 95 %).
        p10: the 10th percentile of the values (their spread, not the mean's).
        p50: the median.
        p90: the 90th percentile.
        minimum: the smallest value.
        maximum: the largest value.
    """

    n: int
    mean: float
    stdev: float
    mean_low: float
    mean_high: float
    confidence: float
    p10: float
    p50: float
    p90: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, values: Iterable[float], *, confidence: float = 0.95) -> SampleStats:
        """Summarise ``values`` with a two-sided Student-t interval for the mean.

        Raises:
            ConfigurationError: fewer than two values, a negative or non-finite
                value, or a confidence outside (0, 1).
        """
        data = [float(v) for v in values]
        if len(data) < 2:
            raise ConfigurationError(
                f"a confidence interval needs at least 2 measured values, got {len(data)}"
            )
        if not all(math.isfinite(v) and v >= 0 for v in data):
            raise ConfigurationError("measured token counts must be finite and ≥ 0")
        if not 0 < confidence < 1:
            raise ConfigurationError(f"confidence must be between 0 and 1, got {confidence}")
        n = len(data)
        mean = statistics.fmean(data)
        stdev = statistics.stdev(data, mean)
        half = _t_quantile(0.5 + confidence / 2, n - 1) * stdev / math.sqrt(n)
        deciles = statistics.quantiles(data, n=10, method="inclusive")
        return cls(
            n=n,
            mean=mean,
            stdev=stdev,
            mean_low=max(mean - half, 0.0),
            mean_high=mean + half,
            confidence=confidence,
            p10=deciles[0],
            p50=statistics.median(data),
            p90=deciles[-1],
            minimum=min(data),
            maximum=max(data),
        )

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over the mean: the projection's relative error bound."""
        return (self.mean_high - self.mean_low) / 2 / self.mean if self.mean else math.inf


def _exact(value: float) -> Decimal:
    # Token means need no more than a hundredth of a token.
    return Decimal(repr(value)).quantize(Decimal("0.01"))


def estimate_from_samples(
    prompt_tokens: Iterable[int],
    completion_tokens: Iterable[int],
    *,
    reasoning_tokens: Iterable[int] | None = None,
    cached_tokens: Iterable[int] | None = None,
    confidence: float = 0.95,
    source: str | None = None,
) -> WorkloadEstimate:
    """A :class:`WorkloadEstimate` from per-request usage measured in a pilot.

    The response-length range is the confidence interval of the mean completion
    length (what matters for a total over many requests), not the spread of single
    responses. The cached share is total cached over total prompt tokens.

    Raises:
        ConfigurationError: fewer than two requests, or lists of different lengths.
    """
    prompts = list(prompt_tokens)
    completions = list(completion_tokens)
    reasoning = list(reasoning_tokens) if reasoning_tokens is not None else [0] * len(prompts)
    cached = list(cached_tokens) if cached_tokens is not None else [0] * len(prompts)
    if not len(prompts) == len(completions) == len(reasoning) == len(cached):
        raise ConfigurationError(
            "pilot samples must have one prompt, completion, reasoning and cached count "
            f"per request; got {len(prompts)}, {len(completions)}, {len(reasoning)}, "
            f"{len(cached)}"
        )
    stats = SampleStats.of(completions, confidence=confidence)
    if stats.mean <= 0:
        raise ConfigurationError("every pilot response had 0 output tokens: nothing to project")
    total_prompt = sum(prompts)
    mean = _exact(stats.mean)
    return WorkloadEstimate(
        prompt_tokens=_exact(statistics.fmean(prompts)),
        completion_tokens=mean,
        completion_tokens_low=min(max(_exact(stats.mean_low), Decimal("0.01")), mean),
        completion_tokens_high=max(_exact(stats.mean_high), mean),
        reasoning_tokens=min(_exact(statistics.fmean(reasoning)), mean),
        cached_prompt_share=(
            Decimal(sum(cached)) / Decimal(total_prompt) if total_prompt else _ZERO
        ),
        source=source
        or f"pilot of {stats.n} requests, {confidence:.0%} CI of the mean response length",
    )
