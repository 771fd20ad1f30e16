"""RetryPolicy: classification, the backoff schedule, Retry-After, attempts and deadline."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from provider_router import (
    AllAttemptsFailed,
    APIConnectionError,
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    BudgetExhausted,
    ConfigurationError,
    InvalidResponseError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    PolicyViolationError,
    ProviderUnavailableError,
    RateLimitError,
    RequestTimeout,
    ResponseCarriedError,
)
from provider_router._exceptions import error_for_status
from provider_router.client.retry import Backoff, RetryPolicy, is_retryable


def _status(status: int, *, retry_after: float | None = None, body: dict | None = None):
    return error_for_status(status)(status, "boom", retry_after=retry_after, body=body)


class FakeClock:
    """A clock that only moves when the recording sleep is awaited."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class MaxRandom:
    """``uniform(a, b)`` returns ``b``: the schedule's ceilings, deterministically."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (APIConnectionError("reset"), True),
        (RequestTimeout("slow"), True),
        (InvalidResponseError("truncated"), True),
        (ResponseCarriedError("200 with error", code=502), True),
        (_status(408), True),
        (_status(429), True),
        (_status(500), True),
        (_status(502), True),
        (_status(503), True),
        (_status(524), True),
        (_status(529), True),
        (_status(400), False),
        (_status(401), False),
        (_status(402), False),
        (_status(403), False),
        (_status(404), False),
        (_status(413), False),
        (_status(422), False),
        (_status(409), False),
        (_status(404, body={"error": {"availability": {"retryable": True}}}), False),
        (_status(409, body={"error": {"availability": {"retryable": True}}}), True),
        (_status(409, body={"error": {"availability": {"retryable": "yes"}}}), False),
        (
            BudgetExhausted(
                requested=Decimal(1), spent=Decimal(0), reserved=Decimal(0), limit=Decimal(1)
            ),
            False,
        ),
        (PolicyViolationError("Fireworks", ["chutes"]), False),
        (ValueError("bug"), False),
    ],
)
def test_is_retryable_table(error: BaseException, expected: bool) -> None:
    assert is_retryable(error) is expected


def test_status_classes_match_the_table() -> None:
    assert isinstance(_status(400), BadRequestError)
    assert isinstance(_status(401), AuthenticationError)
    assert isinstance(_status(402), PaymentRequiredError)
    assert isinstance(_status(403), PermissionDeniedError)
    assert isinstance(_status(404), NotFoundError)
    assert isinstance(_status(429), RateLimitError)
    assert isinstance(_status(502), ProviderUnavailableError)


def test_backoff_ceilings_grow_exponentially_and_cap() -> None:
    backoff = Backoff(base=0.5, multiplier=2.0, max_delay=5.0)
    assert [backoff.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff.ceiling(10_000) == 5.0  # no overflow on absurd counts


def test_full_jitter_stays_within_zero_and_the_ceiling() -> None:
    backoff = Backoff(base=1.0, multiplier=3.0, max_delay=20.0)
    rng = random.Random(7)
    for retry in range(1, 6):
        delays = [backoff.delay(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= backoff.ceiling(retry) for d in delays)
        # full jitter really spreads: both halves of the range are used
        assert (
            min(delays) < backoff.ceiling(retry) / 4 < backoff.ceiling(retry) * 3 / 4 < max(delays)
        )


def test_no_jitter_waits_the_ceiling() -> None:
    assert Backoff(base=2.0, jitter=False).delay(2, random.Random(0)) == 4.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": 0}, "Backoff.base"),
        ({"base": -1}, "Backoff.base"),
        ({"multiplier": 0.5}, "Backoff.multiplier"),
        ({"base": 2, "max_delay": 1}, "Backoff.max_delay"),
        ({"base": float("nan")}, "Backoff.base"),
    ],
)
def test_backoff_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Backoff(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"deadline": 0}, "deadline"),
        ({"deadline": -5}, "deadline"),
        ({"max_retry_after": -1}, "max_retry_after"),
    ],
)
def test_policy_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)


async def test_schedule_recorded_until_success() -> None:
    clock = FakeClock()
    policy = RetryPolicy(max_attempts=5, deadline=None, backoff=Backoff(base=1, max_delay=100))
    outcomes: list[Exception | str] = [
        APIConnectionError("reset"),
        _status(502),
        RequestTimeout("slow"),
        "ok",
    ]
    seen: list[int] = []

    async def attempt(n: int) -> str:
        seen.append(n)
        outcome = outcomes[n - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    result = await policy.run(attempt, sleep=clock.sleep, clock=clock, rng=MaxRandom())
    assert result == "ok"
    assert seen == [1, 2, 3, 4]
    assert clock.sleeps == [1.0, 2.0, 4.0]


async def test_non_retryable_error_is_raised_as_is_without_waiting() -> None:
    clock = FakeClock()
    calls = 0

    async def attempt(n: int) -> None:
        nonlocal calls
        calls += 1
        raise _status(401)

    with pytest.raises(AuthenticationError):
        await RetryPolicy().run(attempt, sleep=clock.sleep, clock=clock, rng=MaxRandom())
    assert calls == 1
    assert clock.sleeps == []


async def test_non_retryable_after_retries_is_raised_as_is() -> None:
    clock = FakeClock()
    errors = [_status(429), _status(400)]

    async def attempt(n: int) -> None:
        raise errors[n - 1]

    with pytest.raises(BadRequestError):
        await RetryPolicy().run(attempt, sleep=clock.sleep, clock=clock, rng=MaxRandom())
    assert len(clock.sleeps) == 1


async def test_attempts_exhausted_raises_group_with_every_error() -> None:
    clock = FakeClock()
    raised: list[Exception] = []

    async def attempt(n: int) -> None:
        error = _status(503) if n % 2 else APIConnectionError(f"reset {n}")
        raised.append(error)
        raise error

    policy = RetryPolicy(max_attempts=4, deadline=None, backoff=Backoff(base=0.5, jitter=False))
    with pytest.raises(AllAttemptsFailed) as info:
        await policy.run(attempt, sleep=clock.sleep, clock=clock)
    assert list(info.value.exceptions) == raised
    assert len(raised) == 4
    assert clock.sleeps == [0.5, 1.0, 2.0]
    assert "all 4 attempts failed" in str(info.value)


async def test_single_attempt_policy_raises_the_error_itself() -> None:
    async def attempt(n: int) -> None:
        raise _status(503)

    with pytest.raises(ProviderUnavailableError):
        await RetryPolicy.never().run(attempt, sleep=FakeClock().sleep)


async def test_retry_after_is_a_floor_on_the_wait() -> None:
    clock = FakeClock()
    errors = [_status(429, retry_after=7.0), _status(429, retry_after=0.1)]

    async def attempt(n: int) -> str:
        if n <= len(errors):
            raise errors[n - 1]
        return "ok"

    policy = RetryPolicy(backoff=Backoff(base=1.0, jitter=False), deadline=None)
    assert await policy.run(attempt, sleep=clock.sleep, clock=clock) == "ok"
    # 7 s from the header beats a 1 s backoff; a 0.1 s header does not shorten a 2 s backoff
    assert clock.sleeps == [7.0, 2.0]


async def test_retry_after_ignored_when_not_honoured() -> None:
    clock = FakeClock()

    async def attempt(n: int) -> str:
        if n == 1:
            raise _status(429, retry_after=60.0)
        return "ok"

    policy = RetryPolicy(backoff=Backoff(base=1.0, jitter=False), honour_retry_after=False)
    await policy.run(attempt, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == [1.0]


async def test_retry_after_beyond_the_cap_gives_up_at_once() -> None:
    clock = FakeClock()

    async def attempt(n: int) -> None:
        raise _status(429, retry_after=3600)

    with pytest.raises(RateLimitError):
        await RetryPolicy(max_retry_after=300).run(attempt, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


async def test_deadline_stops_before_a_wait_that_would_overrun_it() -> None:
    clock = FakeClock()
    durations = iter([3.0, 3.0, 3.0, 3.0])

    async def attempt(n: int) -> None:
        clock.now += next(durations)  # each attempt takes 3 s
        raise APIConnectionError("reset")

    policy = RetryPolicy(
        max_attempts=100, deadline=10.0, backoff=Backoff(base=1.0, multiplier=1.0, jitter=False)
    )
    with pytest.raises(AllAttemptsFailed) as info:
        await policy.run(attempt, sleep=clock.sleep, clock=clock)
    # t=3 wait 1 → t=4..7 wait 1 → t=8..11: 11 + 1 > 10, stop after 3 attempts
    assert len(info.value.exceptions) == 3
    assert clock.sleeps == [1.0, 1.0]


def test_next_delay_is_pure_and_reproducible_by_seed() -> None:
    policy = RetryPolicy()
    error = _status(503)
    a = [policy.next_delay(n, error, 0.0, random.Random(42)) for n in range(1, 6)]
    b = [policy.next_delay(n, error, 0.0, random.Random(42)) for n in range(1, 6)]
    assert a == b
    assert policy.next_delay(policy.max_attempts, error, 0.0, random.Random(0)) is None


async def test_on_retry_hook_sees_attempt_error_and_delay() -> None:
    clock = FakeClock()
    hooks: list[tuple[int, str, float]] = []
    error = _status(500)

    async def attempt(n: int) -> str:
        if n < 3:
            raise error
        return "ok"

    await RetryPolicy(backoff=Backoff(base=0.25, jitter=False)).run(
        attempt,
        sleep=clock.sleep,
        clock=clock,
        on_retry=lambda n, exc, d: hooks.append((n, type(exc).__name__, d)),
    )
    assert hooks == [(1, "ProviderUnavailableError", 0.25), (2, "ProviderUnavailableError", 0.5)]


async def test_custom_predicate_composes() -> None:
    clock = FakeClock()

    def only_timeouts(error: BaseException) -> bool:
        return isinstance(error, TimeoutError)

    async def attempt(n: int) -> None:
        raise _status(503)

    with pytest.raises(ProviderUnavailableError):
        await RetryPolicy(retryable=only_timeouts).run(attempt, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


def test_generic_status_error_without_class() -> None:
    assert type(_status(408)) is APIStatusError


async def _failing_schedule(
    use_resume: bool,
) -> tuple[list[int], list[float], list[tuple[int, float]], bool]:
    """Attempts, waits and on_retry calls of a policy whose every attempt fails."""
    policy = RetryPolicy(max_attempts=4, deadline=None, backoff=Backoff(base=0.5, jitter=False))
    clock = FakeClock()
    seen: list[int] = []
    raised: list[Exception] = []
    retried: list[tuple[int, float]] = []

    async def attempt(n: int) -> None:
        seen.append(n)
        error = _status(503) if n % 2 else APIConnectionError(f"reset {n}")
        raised.append(error)
        raise error

    def on_retry(n: int, error: BaseException, delay: float) -> None:
        retried.append((n, delay))

    async def run() -> None:
        if not use_resume:
            await policy.run(attempt, sleep=clock.sleep, clock=clock, on_retry=on_retry)
            return
        started = clock()
        try:
            await attempt(1)
        except Exception as exc:
            first = exc
        await policy.resume(
            first, attempt, started=started, sleep=clock.sleep, clock=clock, on_retry=on_retry
        )

    with pytest.raises(AllAttemptsFailed) as info:
        await run()
    return seen, clock.sleeps, retried, list(info.value.exceptions) == raised


async def test_resume_goes_on_exactly_as_run_after_a_failed_first_attempt() -> None:
    """The router makes the first attempt itself and hands a failure to ``resume``."""
    expected = ([1, 2, 3, 4], [0.5, 1.0, 2.0], [(1, 0.5), (2, 1.0), (3, 2.0)], True)
    assert await _failing_schedule(use_resume=False) == expected
    assert await _failing_schedule(use_resume=True) == expected


async def test_resume_raises_a_first_error_that_is_not_retried_as_it_is() -> None:
    clock = FakeClock()
    error = _status(401)

    async def attempt(n: int) -> None:
        raise AssertionError("no second attempt")

    with pytest.raises(AuthenticationError) as info:
        await RetryPolicy().resume(error, attempt, started=clock(), sleep=clock.sleep, clock=clock)
    assert info.value is error
    assert clock.sleeps == []


async def test_resume_counts_the_deadline_from_the_first_attempt() -> None:
    clock = FakeClock()
    policy = RetryPolicy(max_attempts=10, deadline=3.0, backoff=Backoff(base=1.0, jitter=False))
    started = clock()
    clock.now += 2.5  # the first attempt took 2.5 s: a 1 s wait would end past the deadline

    async def attempt(n: int) -> None:
        raise AssertionError("no second attempt")

    with pytest.raises(ProviderUnavailableError):
        await policy.resume(_status(503), attempt, started=started, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


async def test_a_policy_seeded_with_its_own_rng_repeats_its_jittered_schedule() -> None:
    async def always_failing(n: int) -> str:
        raise APIConnectionError("reset")

    schedules = []
    for _ in range(2):
        clock = FakeClock()
        policy = RetryPolicy(max_attempts=5, deadline=None, rng=random.Random(7))
        with pytest.raises(AllAttemptsFailed):
            await policy.run(always_failing, sleep=clock.sleep, clock=clock)
        schedules.append(clock.sleeps)
    assert schedules[0] == schedules[1]
    assert len(schedules[0]) == 4
    # The jitter source is not part of the policy's value.
    assert RetryPolicy(rng=random.Random(1)) == RetryPolicy()
    # A run's own rng still wins over the policy's.
    clock = FakeClock()
    with pytest.raises(AllAttemptsFailed):
        await RetryPolicy(max_attempts=2, deadline=None, rng=random.Random(7)).run(
            always_failing, sleep=clock.sleep, clock=clock, rng=MaxRandom()
        )
    assert clock.sleeps == [Backoff().ceiling(1)]
