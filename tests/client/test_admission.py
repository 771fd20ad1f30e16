"""Cost-first admission, on its own: lanes, learned capacity, waits, the premium cap.

A fake clock and ``tick()`` stand in for time; futures are driven by the test's loop.
No sleeps, no server: the Router's use of it over real sockets is in
``test_router_admission.py``.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provider_router import ConfigurationError, Endpoint, RouterStopping, Workload
from provider_router.client.admission import Admission, AdmissionTicket, check_max_premium
from provider_router.routing.route_plan import RoutePlan, build_route_plan

WORKLOAD = Workload(prompt_tokens=500, completion_tokens=2000)


class D:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.allowed = True


def ep(name: str, completion: str, **extra: Any) -> Endpoint:
    return Endpoint.model_validate(
        {
            "name": f"{name} | m",
            "provider_name": name,
            "tag": name.lower(),
            "pricing": {"prompt": "0.00000045", "completion": completion},
            "quantization": "int4",
            "uptime_last_30m": 100,
            "status": 0,
            "context_length": 262144,
            "supported_parameters": ["max_tokens", "tools"],
            **extra,
        }
    )


# Kimi K2.5's three cheapest allowed endpoints, and a fourth (per M output tokens).
CHUTES = ep("Chutes", "0.0000022")
NOVITA = ep("Novita", "0.0000023")
DEEPINFRA = ep("DeepInfra", "0.0000024", supported_parameters=["max_tokens"])
MOONSHOT = ep("Moonshot", "0.0000025")


def plan(*endpoints: Endpoint) -> RoutePlan:
    return build_route_plan(
        "a/m", [D(e) for e in endpoints or (CHUTES, NOVITA, DEEPINFRA)], workload=WORKLOAD
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admission(
    *endpoints: Endpoint,
    premium: str | None = "0.02",
    max_concurrency: int = 200,
    demoted: frozenset[str] = frozenset(),
    clock: Clock | None = None,
) -> tuple[Admission, Clock]:
    clock = clock or Clock()
    held = {"demoted": demoted}
    made = Admission(
        plan(*endpoints),
        max_premium=None if premium is None else Decimal(premium),
        max_concurrency=max_concurrency,
        clock=clock,
        demoted=lambda: held["demoted"],
    )
    made._test_demoted = held  # type: ignore[attr-defined]
    return made, clock


def take(a: Admission, n: int, pin: str | None = None) -> list[AdmissionTicket]:
    tickets = []
    for _ in range(n):
        ticket = a.try_admit(a.queue(pin=pin), a.next_seq())
        assert ticket is not None
        tickets.append(ticket)
    return tickets


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# --- the knob ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_value", "expected"),
    [(None, None), (0, Decimal(0)), ("0.02", Decimal("0.02")), (0.05, Decimal("0.05"))],
)
def test_max_premium_is_a_share_of_the_floor(given_value: Any, expected: Any) -> None:
    assert check_max_premium(given_value) == expected


@pytest.mark.parametrize("bad", [-0.01, "x", float("nan"), float("inf"), True, [0.02]])
def test_a_bad_max_premium_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_premium"):
        check_max_premium(bad)


# --- choosing a lane --------------------------------------------------------------------


async def test_the_best_lane_with_room_is_taken_and_full_resting_demoted_ones_skipped() -> None:
    a, clock = admission(premium=None, max_concurrency=2)
    assert [t.tag for t in take(a, 3)] == ["chutes", "chutes", "novita"]
    a._lanes["novita"].cooling_until = clock.now + 1  # resting after a Retry-After
    assert [t.tag for t in take(a, 1)] == ["deepinfra"]
    a2, _ = admission(premium=None, demoted=frozenset({"Chutes"}))
    assert [t.tag for t in take(a2, 1)] == ["novita"], "a demoted provider's lanes go last"
    a3, _ = admission(premium=None, demoted=frozenset({"Chutes", "Novita", "DeepInfra"}))
    assert [t.tag for t in take(a3, 1)] == ["chutes"], "all demoted: all count, in rank order"


async def test_an_arrival_does_not_jump_the_line() -> None:
    a, _ = admission(premium="0", max_concurrency=1)
    (first,) = take(a, 1)
    queue = a.queue()
    waiting = asyncio.ensure_future(a.admit(queue, a.next_seq()))
    await settle()
    assert not waiting.done()
    assert a.waiting == 1
    assert a.try_admit(queue, a.next_seq()) is None, "someone older waits"
    a.release(first, "served")
    ticket = await waiting
    assert ticket.tag == "chutes"
    assert ticket.waited == 0.0  # the fake clock did not move


# --- learning a lane's capacity -------------------------------------------------------------


async def test_refusals_teach_a_concurrency_limit() -> None:
    """200 sent to an endpoint that takes 60: what is still in flight when the refusals
    come back is what it takes; only the first refusal of the burst cuts a tenth."""
    a, _ = admission(CHUTES, premium=None, max_concurrency=200)
    tickets = take(a, 200)
    lane = a._lanes["chutes"]
    refused, accepted = tickets[60:], tickets[:60]
    for ticket in refused[::-1]:  # any order
        assert a.release(ticket, "refused") is False, "others were in flight: not idle"
    assert lane.limit == 60
    assert lane.epoch == 1, "one cut for the whole burst"
    stats = a.snapshot()["chutes"]
    assert (stats.capacity, stats.refused, stats.in_flight) == (60, 140, 60)
    # Successes climb back; a refusal of a ticket from after the cut cuts again.
    for ticket in accepted[:30]:
        a.release(ticket, "served")
    assert lane.window > 60 - 1e-9
    (probe,) = take(a, 1)
    a.release(probe, "refused")
    assert lane.epoch == 2
    assert lane.limit == int(30 * 0.9)  # capped at what was in flight, then a tenth off


async def test_a_refusal_with_nothing_else_in_flight_teaches_nothing() -> None:
    a, _ = admission(CHUTES, premium=None, max_concurrency=50)
    (ticket,) = take(a, 1)
    assert a.release(ticket, "refused", retry_after=5.0) is True
    lane = a._lanes["chutes"]
    assert (lane.limit, lane.epoch, lane.cooling_until) == (50, 0, float("-inf"))


async def test_retry_after_rests_the_lane_and_the_timer_wakes_its_waiters() -> None:
    a, clock = admission(CHUTES, NOVITA, premium="0", max_concurrency=2)
    first, second = take(a, 2)
    queue = a.queue()
    waiter = asyncio.ensure_future(a.admit(queue, a.next_seq()))
    await settle()
    a.release(first, "refused", retry_after=5.0)
    a.release(second, "served")
    await settle()
    assert a._lanes["chutes"].in_flight == 0
    assert not waiter.done(), "no admission to a resting lane (and Novita is over the premium)"
    assert a._timer_at == clock.now + 5.0, "one timer, at the rest's end"
    clock.now += 5.0
    a.tick()
    ticket = await waiter
    assert ticket.tag == "chutes"
    assert ticket.waited == pytest.approx(5.0)
    assert a.snapshot()["chutes"].cooldown_s == pytest.approx(5.0)
    a.release(ticket, "served")


# --- waiting: first in, first out --------------------------------------------------------


async def test_waiters_are_served_oldest_first_and_a_refused_request_keeps_its_place() -> None:
    a, _ = admission(CHUTES, premium=None, max_concurrency=2)
    held = take(a, 2)
    queue = a.queue()
    old_seq = a.next_seq()
    later = [asyncio.ensure_future(a.admit(queue, a.next_seq())) for _ in range(3)]
    await settle()
    back = asyncio.ensure_future(a.admit(queue, old_seq))  # back after a refusal
    await settle()
    a.release(held[0], "served")
    await settle()
    assert back.done()
    assert not any(w.done() for w in later)
    a.release(held[1], "served")
    await settle()
    assert later[0].done()
    assert not later[1].done()
    for f in (back, later[0]):
        a.release(f.result(), "served")
    await settle()
    assert all(w.done() for w in later)


async def test_pinned_and_common_waiters_of_one_lane_go_oldest_first() -> None:
    a, _ = admission(CHUTES, NOVITA, premium="0", max_concurrency=1)
    held = take(a, 1)  # Chutes full; Novita is over the premium for common requests
    common = asyncio.ensure_future(a.admit(a.queue(), a.next_seq()))
    await settle()
    pinned = a.try_admit(a.queue(pin="novita"), a.next_seq())
    assert pinned is not None, "a pin is not held to the premium"
    assert pinned.tag == "novita", "a pin is not held to the premium"
    a.release(pinned, "served")
    pinned_waiter = asyncio.ensure_future(a.admit(a.queue(pin="chutes"), a.next_seq()))
    await settle()
    a.release(held[0], "served")
    await settle()
    assert common.done()
    assert not pinned_waiter.done()
    a.release(common.result(), "served")
    await settle()
    assert pinned_waiter.done()


async def test_a_request_is_only_admitted_to_lanes_it_fits() -> None:
    a, _ = admission(premium=None, max_concurrency=1)
    take(a, 2)  # Chutes and Novita full
    tools = a.queue(needs=("tools",))
    assert tools.tags == ("chutes", "novita"), "DeepInfra does not list tools"
    assert a.try_admit(tools, a.next_seq()) is None
    plain = a.try_admit(a.queue(), a.next_seq())
    assert plain is not None
    assert plain.tag == "deepinfra"
    too_big = a.queue(min_context=300_000)
    assert too_big is a.queue(), "none fits: sent as if all did (OpenRouter answers)"


# --- cancellation and stop --------------------------------------------------------------


async def test_a_cancelled_waiter_is_skipped_and_a_granted_one_hands_its_place_on() -> None:
    a, _ = admission(CHUTES, premium=None, max_concurrency=1)
    (held,) = take(a, 1)
    queue = a.queue()
    gone = asyncio.ensure_future(a.admit(queue, a.next_seq()))
    granted_then_cancelled = asyncio.ensure_future(a.admit(queue, a.next_seq()))
    last = asyncio.ensure_future(a.admit(queue, a.next_seq()))
    await settle()
    gone.cancel()
    await settle()
    a.release(held, "served")  # grants the next live waiter...
    granted_then_cancelled.cancel()  # ...which is cancelled before it runs
    await settle()
    assert last.done(), "the cancelled grant handed its place on"
    a.release(last.result(), "served")
    assert a.snapshot()["chutes"].in_flight == 0
    assert a.waiting == 0


async def test_stop_fails_every_waiter_and_every_later_request() -> None:
    a, _ = admission(CHUTES, premium=None, max_concurrency=1)
    (held,) = take(a, 1)
    waiters = [asyncio.ensure_future(a.admit(a.queue(), a.next_seq())) for _ in range(3)]
    await settle()
    a.stop("not sent: the router is stopping")
    for waiter in waiters:
        with pytest.raises(RouterStopping, match="not sent"):
            await waiter
    with pytest.raises(RouterStopping):
        a.try_admit(a.queue(), a.next_seq())
    a.release(held, "served")  # an attempt under way still gives its place back
    assert a.snapshot()["chutes"].in_flight == 0


# --- the premium ------------------------------------------------------------------------


def _share(a: Admission, n: int) -> dict[str, int]:
    """Admit ``n`` requests one at a time while the floor is full: each served at the
    expected price, the floor's place freed again after each."""
    counts: dict[str, int] = {}
    floor = take(a, a._lanes["chutes"].limit)  # the floor, full
    for _ in range(n):
        ticket = a.try_admit(a.queue(), a.next_seq())
        if ticket is None:  # over the premium: the floor serves one, then try again
            served = floor.pop()
            a.release(served, "served", **_units(a, "chutes"))
            floor.append(take(a, 1)[0])
            counts["chutes"] = counts.get("chutes", 0) + 1
            continue
        counts[ticket.tag] = counts.get(ticket.tag, 0) + 1
        a.release(ticket, "served", **_units(a, ticket.tag))
    return counts


def _units(a: Admission, tag: str) -> dict[str, int]:
    from provider_router._money import to_units

    paid = to_units(a.plan.route(tag).cost_per_request)
    floor = to_units(a.plan.floor.cost_per_request)  # type: ignore[union-attr]
    return {"paid_units": paid, "floor_units": floor}


async def test_max_premium_zero_admits_only_the_floor() -> None:
    a, _ = admission(premium="0", max_concurrency=10)
    assert _share(a, 300) == {"chutes": 300}


async def test_max_premium_none_admits_any_lane_with_room() -> None:
    a, _ = admission(premium=None, max_concurrency=10)
    assert _share(a, 30) == {"novita": 30}


async def test_the_premium_holds_the_average_to_its_cap() -> None:
    """2 % of the floor earned per request, Novita's 4.4 % and DeepInfra's 8.7 % spent:
    over many requests the price paid stays within 1.02 x the floor."""
    a, _ = admission(premium="0.02", max_concurrency=10)
    counts = _share(a, 3000)
    routes = {r.tag: r.cost_per_request for r in a.plan.routes}
    paid = sum(routes[tag] * n for tag, n in counts.items())
    floor = routes["chutes"] * sum(counts.values())
    ratio = paid / floor
    assert Decimal("1.019") < ratio <= Decimal("1.02") + Decimal("1e-4")
    assert set(counts) == {"chutes", "novita"}, "the dearer lane never needed"
    assert a.credit >= -a._lanes["novita"].extra


async def test_a_long_answer_at_a_dearer_lane_is_paid_back_before_the_next() -> None:
    a, _ = admission(premium="0.02", max_concurrency=1)
    for _ in range(3):  # three answers at the floor: 6 % of one floor request to spend
        (floor,) = take(a, 1)
        a.release(floor, "served", **_units(a, "chutes"))
    take(a, 1)  # the floor, full
    credit = a.credit
    novita = a.try_admit(a.queue(), a.next_seq())
    assert novita is not None
    assert novita.tag == "novita"
    units = _units(a, "novita")
    # Ten times the tokens of the workload, at Novita's prices.
    a.release(
        novita,
        "served",
        paid_units=units["paid_units"] * 10,
        floor_units=units["floor_units"] * 10,
    )
    assert a.credit < credit - 3 * a._lanes["novita"].extra
    assert a.try_admit(a.queue(), a.next_seq()) is None, "only the floor until repaid"


async def test_a_demoted_floor_moves_the_floor_for_the_premium_without_debt() -> None:
    a, _ = admission(premium="0", max_concurrency=5, demoted=frozenset({"Chutes"}))
    tickets = take(a, 5)
    assert {t.tag for t in tickets} == {"novita"}, "the best usable lane is never held back"
    for ticket in tickets:
        a.release(ticket, "served", **_units(a, "novita"))
    assert a.credit == 0, "an outage of the floor runs no debt"


# --- the plan changes -------------------------------------------------------------------


async def test_a_new_plan_keeps_what_lanes_learned_and_retires_dropped_ones() -> None:
    a, _ = admission(CHUTES, NOVITA, premium=None, max_concurrency=100)
    tickets = take(a, 10)
    for ticket in tickets[5:]:
        a.release(ticket, "refused")
    learned = a._lanes["chutes"].limit
    pinned = asyncio.ensure_future(a.admit(a.queue(pin="novita"), a.next_seq()))
    a._lanes["novita"].limit = 0  # full, for the pinned waiter
    await settle()
    a.update(plan(CHUTES, DEEPINFRA))
    await settle()
    assert a._lanes["chutes"].limit == learned, "capacity belongs to the endpoint"
    assert a._lanes["deepinfra"].limit == 100, "a new lane starts unlimited"
    assert pinned.done(), "a retired pin's waiter goes where there is room"
    assert pinned.result().tag in ("chutes", "deepinfra")
    assert a.snapshot()["novita"].retired
    for ticket in tickets[:5]:
        a.release(ticket, "served")


# --- liveness ---------------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from([None, "chutes", "novita", "tools"])),
        st.tuples(st.just("serve"), st.integers(0, 50)),
        st.tuples(st.just("refuse"), st.integers(0, 50), st.sampled_from([None, 0.0, 2.0])),
        st.tuples(st.just("neutral"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("advance"), st.floats(0.0, 5.0)),
        st.tuples(st.just("demote"), st.sampled_from([(), ("Chutes",), ("Chutes", "Novita")])),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.sampled_from([None, "0", "0.02"]))
def test_no_waiter_is_left_behind(ops: list[tuple[Any, ...]], premium: str | None) -> None:
    """Whatever happens, a waiter is never left while a lane of its queue could take it,
    and while any wait, a release or a rest's timer is due to wake them."""

    async def run() -> None:
        a, clock = admission(premium=premium, max_concurrency=3)
        held: list[AdmissionTicket] = []
        waiting: list[asyncio.Future[AdmissionTicket]] = []
        for op in ops:
            kind = op[0]
            if kind == "arrive":
                tools = op[1] == "tools"
                queue = a.queue(needs=("tools",)) if tools else a.queue(pin=op[1])
                waiting.append(asyncio.ensure_future(a.admit(queue, a.next_seq())))
            elif kind in ("serve", "refuse", "neutral") and held:
                ticket = held.pop(op[1] % len(held))
                if kind == "serve":
                    a.release(ticket, "served", **_units(a, ticket.tag))
                elif kind == "refuse":
                    a.release(ticket, "refused", retry_after=op[2])
                else:
                    a.release(ticket, "neutral")
            elif kind == "cancel" and waiting:
                waiting[op[1] % len(waiting)].cancel()
            elif kind == "advance":
                clock.now += op[1]
                a.tick()
            elif kind == "demote":
                a._test_demoted["demoted"] = frozenset(op[1])  # type: ignore[attr-defined]
            await settle()
            for future in [f for f in waiting if f.done()]:
                waiting.remove(future)
                if not future.cancelled():
                    held.append(future.result())
            _check(a, clock)
        for future in waiting:
            future.cancel()
        await settle()

    asyncio.run(run())


def _check(a: Admission, clock: Clock) -> None:
    demoted = a._demoted()
    for queue in a._queues.values():
        live = [w for w in queue.waiters if not w.future.done()]
        if not live:
            continue
        lane, _ = a._pick(queue, clock.now, demoted)
        assert lane is None, f"a waiter of {queue.tags or queue.pin} left while {lane.tag} has room"
        due = any(lane.in_flight > 0 for lane in queue.lanes) or any(
            lane.cooling_until > clock.now for lane in queue.lanes
        )
        assert due, "waiters with nothing in flight and no rest to end: nobody would wake them"
        resting = [lane.cooling_until for lane in queue.lanes if lane.cooling_until > clock.now]
        if resting and not any(lane.in_flight > 0 for lane in queue.lanes):
            assert a._timer_at <= min(resting), "the timer is armed at the earliest rest"
    for lane in a._every.values():
        assert lane.in_flight >= 0
