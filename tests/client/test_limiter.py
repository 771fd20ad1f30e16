"""AdaptiveLimiter: admission, FIFO waiting, AIMD window, cool-down and cancellation."""

from __future__ import annotations

import asyncio

import pytest

from provider_router import ConfigurationError
from provider_router.client.limiter import AdaptiveLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be >= 1"),
        ({"max_concurrency": 2.5}, "max_concurrency must be an int"),
        ({"max_concurrency": True}, "max_concurrency must be an int"),
        ({"max_concurrency": 10, "min_concurrency": 0}, "min_concurrency"),
        ({"max_concurrency": 10, "min_concurrency": 11}, "min_concurrency"),
        ({"max_concurrency": 10, "initial": 11}, "initial"),
        ({"max_concurrency": 10, "min_concurrency": 5, "initial": 4}, "initial"),
        ({"max_concurrency": 10, "decrease_factor": 1.0}, "decrease_factor"),
        ({"max_concurrency": 10, "decrease_factor": 0.0}, "decrease_factor"),
        ({"max_concurrency": 10, "increase": 0}, "increase"),
        ({"max_concurrency": 10, "cooldown": -1}, "cooldown"),
        ({"max_concurrency": 10, "slow_start": 0}, "slow_start"),
        ({"max_concurrency": 10, "slow_start": -1.0}, "slow_start"),
    ],
)
def test_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        AdaptiveLimiter(**kwargs)


async def test_admits_up_to_the_limit_then_queues_fifo() -> None:
    limiter = AdaptiveLimiter(2)
    await limiter.acquire()
    t2 = await limiter.acquire()
    assert limiter.in_flight == 2
    assert not limiter.has_capacity()
    order: list[str] = []

    async def waiter(name: str) -> None:
        await limiter.acquire()
        order.append(name)

    tasks = [asyncio.create_task(waiter(n)) for n in "abc"]
    await _settle()
    assert limiter.waiting == 3
    assert order == []
    limiter.release(t2, "neutral")
    await _settle()
    assert order == ["a"]
    assert limiter.in_flight == 2
    limiter.release(0, "neutral")
    limiter.release(0, "neutral")
    await _settle()
    assert order == ["a", "b", "c"]
    assert limiter.waiting == 0
    await asyncio.gather(*tasks)


async def test_newcomer_does_not_overtake_waiters() -> None:
    limiter = AdaptiveLimiter(1)
    ticket = await limiter.acquire()
    queued = asyncio.create_task(limiter.acquire())
    await _settle()
    limiter.release(ticket, "neutral")
    # the slot went to the queued waiter, so there is no capacity for a newcomer
    assert not limiter.has_capacity()
    assert limiter.in_flight == 1
    await queued


async def test_multiplicative_decrease_on_rate_limit() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(100, decrease_factor=0.5, cooldown=0, clock=clock)
    ticket = await limiter.acquire()
    limiter.release(ticket, "rate_limited")
    assert limiter.limit == 50
    assert limiter.window == 50.0


async def test_decrease_counts_once_per_window_of_requests() -> None:
    """Requests sent before a decrease that fail together shrink the window once."""
    limiter = AdaptiveLimiter(100, decrease_factor=0.5, cooldown=0, clock=Clock())
    tickets = [await limiter.acquire() for _ in range(10)]
    for ticket in tickets:
        limiter.release(ticket, "rate_limited")
    assert limiter.limit == 50
    # a request started after the decrease and still rate limited: decrease again
    fresh = await limiter.acquire()
    limiter.release(fresh, "rate_limited")
    assert limiter.limit == 25


async def test_cooldown_spaces_decreases_in_time() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(100, decrease_factor=0.5, cooldown=2.0, clock=clock)
    limiter.release(await limiter.acquire(), "rate_limited")
    assert limiter.limit == 50
    clock.now = 1.9
    limiter.release(await limiter.acquire(), "rate_limited")
    assert limiter.limit == 50  # too soon
    clock.now = 2.0
    limiter.release(await limiter.acquire(), "rate_limited")
    assert limiter.limit == 25


async def test_never_below_min_concurrency() -> None:
    limiter = AdaptiveLimiter(10, min_concurrency=3, decrease_factor=0.1, cooldown=0)
    for _ in range(5):
        limiter.release(await limiter.acquire(), "rate_limited")
    assert limiter.limit == 3
    assert limiter.window == 3.0


async def test_additive_increase_about_one_slot_per_window() -> None:
    limiter = AdaptiveLimiter(20, initial=10, increase=1.0)
    for _ in range(10):
        limiter.release(await limiter.acquire(), "success")
    # 10 successes at window ~10 add about one slot
    assert limiter.limit == 10
    assert 10.9 < limiter.window < 11.0
    limiter.release(await limiter.acquire(), "success")
    assert limiter.limit == 11


async def test_increase_is_capped_at_max() -> None:
    limiter = AdaptiveLimiter(5, initial=4, increase=100.0)
    for _ in range(3):
        limiter.release(await limiter.acquire(), "success")
    assert limiter.limit == 5
    assert limiter.window == 5.0


async def test_neutral_outcome_only_frees_the_slot() -> None:
    limiter = AdaptiveLimiter(10, initial=5)
    limiter.release(await limiter.acquire(), "neutral")
    assert limiter.window == 5.0
    assert limiter.in_flight == 0


async def test_growth_admits_waiters() -> None:
    limiter = AdaptiveLimiter(10, initial=1, increase=1.0)
    first = await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await _settle()
    assert limiter.waiting == 1
    # success at window 1 → window 2: the waiter gets a slot
    limiter.release(first, "success")
    await _settle()
    assert waiter.done()
    assert limiter.in_flight == 1
    assert limiter.limit == 2


async def test_shrinking_below_in_flight_blocks_admission() -> None:
    limiter = AdaptiveLimiter(4, decrease_factor=0.5, cooldown=0)
    tickets = [await limiter.acquire() for _ in range(4)]
    limiter.release(tickets[0], "rate_limited")  # window 2, 3 still in flight
    assert limiter.limit == 2
    waiter = asyncio.create_task(limiter.acquire())
    await _settle()
    limiter.release(tickets[1], "neutral")  # 2 in flight: still full
    await _settle()
    assert not waiter.done()
    limiter.release(tickets[2], "neutral")  # 1 in flight: admit
    await _settle()
    assert waiter.done()


async def test_cancelled_waiter_leaves_the_queue() -> None:
    limiter = AdaptiveLimiter(1)
    ticket = await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await _settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.waiting == 0
    limiter.release(ticket, "neutral")
    assert limiter.in_flight == 0
    assert limiter.has_capacity()


async def test_waiter_cancelled_after_grant_passes_the_slot_on() -> None:
    limiter = AdaptiveLimiter(1)
    ticket = await limiter.acquire()
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await _settle()
    limiter.release(ticket, "neutral")  # grants `first` its slot...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await _settle()
    assert second.done()
    assert limiter.in_flight == 1
    assert limiter.waiting == 0


async def test_ticket_of_a_waiter_is_the_epoch_at_admission() -> None:
    limiter = AdaptiveLimiter(2, decrease_factor=0.5, cooldown=0)
    a = await limiter.acquire()
    b = await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await _settle()
    limiter.release(a, "rate_limited")  # epoch 1, window 1, one in flight: waiter waits
    limiter.release(b, "neutral")
    await _settle()
    assert await waiter == 1  # started after the decrease: its 429 counts
    limiter.release(1, "rate_limited")
    assert limiter.limit == 1  # min_concurrency holds


async def test_release_without_acquire_is_an_error() -> None:
    limiter = AdaptiveLimiter(3)
    with pytest.raises(RuntimeError, match="more times than acquire"):
        limiter.release(0)


async def test_unknown_outcome_is_an_error() -> None:
    limiter = AdaptiveLimiter(3)
    ticket = await limiter.acquire()
    with pytest.raises(ValueError, match="unknown outcome"):
        limiter.release(ticket, "exploded")  # type: ignore[arg-type]


def test_repr_shows_state() -> None:
    assert repr(AdaptiveLimiter(7, initial=3)) == (
        "AdaptiveLimiter(limit=3, max=7, in_flight=0, waiting=0)"
    )


async def test_aimd_settles_near_a_capacity_under_a_simulated_rate_limit() -> None:
    """A crude closed loop: anything above capacity 50 draws a 429."""
    clock = Clock()
    limiter = AdaptiveLimiter(200, decrease_factor=0.9, cooldown=0.5, clock=clock)
    limits: list[int] = []
    for _round in range(400):
        clock.now += 0.1
        tickets = [await limiter.acquire() for _ in range(limiter.limit)]
        for i, ticket in enumerate(tickets):
            limiter.release(ticket, "rate_limited" if i >= 50 else "success")
        limits.append(limiter.limit)
    tail = limits[-100:]
    assert min(tail) >= 45
    assert max(tail) <= 56


async def test_slow_start_doubles_the_window_per_period_of_the_clock() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(1000, slow_start=0.05, clock=clock)
    assert limiter.slow_start
    assert limiter.limit == 32  # SLOW_START_WINDOW
    tickets = [await limiter.acquire() for _ in range(32)]  # the clock starts here
    waiters = [asyncio.create_task(limiter.acquire()) for _ in range(100)]
    await _settle()
    assert limiter.waiting == 100
    clock.now = 0.05  # one doubling: 64
    limiter.tick()
    await _settle()
    assert limiter.limit == 64
    assert limiter.in_flight == 64
    assert limiter.waiting == 68
    clock.now = 0.10  # 128
    limiter.tick()
    await _settle()
    assert limiter.in_flight == 128
    clock.now = 0.15  # 256: everyone is in
    limiter.tick()
    await _settle()
    assert limiter.in_flight == 132
    assert all(w.done() for w in waiters)
    clock.now = 1.0  # 32 * 2**20 is past the ceiling: slow start is over
    limiter.release(tickets[0], "success")
    assert limiter.limit == 1000
    assert not limiter.slow_start


async def test_slow_start_timer_admits_waiters_without_answers() -> None:
    # Real time here: the limiter's own timer must grow the window while nothing returns.
    limiter = AdaptiveLimiter(8, initial=1, slow_start=0.001)
    await limiter.acquire()
    waiters = [asyncio.create_task(limiter.acquire()) for _ in range(7)]
    await asyncio.wait_for(asyncio.gather(*waiters), timeout=5)
    assert limiter.in_flight == 8


async def test_first_counted_429_ends_slow_start_at_what_was_in_flight() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(
        2000, slow_start=0.05, shrink_to_in_flight=True, decrease_factor=0.5, clock=clock
    )
    tickets = [await limiter.acquire() for _ in range(32)]
    clock.now = 0.2  # the window would be 512 by now
    tickets += [await limiter.acquire() for _ in range(8)]
    assert limiter.limit == 512
    limiter.release(tickets.pop(), "rate_limited")  # 39 still in flight
    assert not limiter.slow_start
    assert limiter.window == 39 * 0.5
    clock.now = 10.0  # time no longer grows the window
    limiter.release(tickets.pop(), "success")
    assert limiter.limit == 19


async def test_shrink_to_in_flight_does_not_hand_a_429s_slot_to_a_waiter() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(10, shrink_to_in_flight=True, cooldown=5.0, clock=clock)
    tickets = [await limiter.acquire() for _ in range(10)]
    limiter.release(tickets.pop(), "rate_limited")  # counted: 9 in flight, x0.9
    assert limiter.limit == 8
    waiter = asyncio.create_task(limiter.acquire())
    await _settle()
    assert not waiter.done()
    # Not counted (cool-down), yet the slot is not handed on either.
    limiter.release(tickets.pop(), "neutral")  # 8 in flight
    limiter.release(tickets.pop(), "rate_limited")  # 7 in flight: window capped at 7
    await _settle()
    assert limiter.limit == 7
    assert not waiter.done()
    # A success frees a slot for the waiter (ack clocking).
    limiter.release(tickets.pop(), "success")
    await _settle()
    assert waiter.done()


async def test_plain_aimd_hands_a_429s_slot_on() -> None:
    limiter = AdaptiveLimiter(10, cooldown=5.0, clock=Clock())
    tickets = [await limiter.acquire() for _ in range(10)]
    limiter.release(tickets.pop(), "rate_limited")  # window 9, 9 in flight
    limiter.release(tickets.pop(), "rate_limited")  # cool-down: no decrease; 8 in flight
    waiter = asyncio.create_task(limiter.acquire())
    await _settle()
    assert waiter.done()


async def test_accelerate_grows_the_step_between_decreases() -> None:
    plain = AdaptiveLimiter(1000, initial=20)
    fast = AdaptiveLimiter(1000, initial=20, accelerate=True)
    for limiter in (plain, fast):
        for _ in range(100):  # about five windows' worth of successes
            limiter.release(await limiter.acquire(), "success")
    assert 24 <= plain.limit <= 25  # about one slot per window
    assert fast.limit >= 35  # the step doubled each window
    # A decrease resets the step to one slot per window.
    fast.release(await fast.acquire(), "rate_limited")
    before = fast.window
    for _ in range(int(before)):
        fast.release(await fast.acquire(), "success")
    assert fast.window - before < 1.6


async def test_accelerate_stops_at_the_last_known_limit() -> None:
    limiter = AdaptiveLimiter(1000, initial=100, accelerate=True, cooldown=0, clock=Clock())
    limiter.release(await limiter.acquire(), "rate_limited")  # the limit: 100; window 90
    assert limiter.limit == 90
    for _ in range(400):  # accelerates back to 100 within a few windows...
        limiter.release(await limiter.acquire(), "success")
        if limiter.window >= 100:
            break
    assert limiter.window >= 100
    # ...then probes one slot per window of successes, as plain AIMD does.
    before = limiter.window
    for _ in range(100):
        limiter.release(await limiter.acquire(), "success")
    assert limiter.window - before < 1.1


async def test_a_slow_start_overshoot_sets_no_limit_to_stop_at() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(
        1000, slow_start=0.05, shrink_to_in_flight=True, accelerate=True, clock=clock
    )
    tickets = [await limiter.acquire() for _ in range(20)]
    limiter.release(tickets.pop(), "rate_limited")  # slow start ends at 19 * 0.9
    assert limiter.limit == 17
    for ticket in tickets:
        limiter.release(ticket, "neutral")
    for _ in range(200):
        limiter.release(await limiter.acquire(), "success")
    assert limiter.limit > 60  # still accelerating: no ceiling from the overshoot


async def test_try_acquire_takes_a_free_slot_and_never_overtakes_a_waiter() -> None:
    limiter = AdaptiveLimiter(2)
    assert limiter.try_acquire() == 0
    ticket = limiter.try_acquire()
    assert ticket == 0
    assert limiter.in_flight == 2
    assert limiter.try_acquire() is None  # full: nothing taken
    assert limiter.in_flight == 2
    queued = asyncio.create_task(limiter.acquire())
    await _settle()
    limiter.release(ticket, "neutral")  # the slot goes to the waiter
    assert limiter.try_acquire() is None
    await queued
    limiter.release(0, "neutral")
    assert limiter.try_acquire() == 0
