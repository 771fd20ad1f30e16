"""Cost-first admission: each attempt goes to one endpoint we chose, the best with room.

Offered several endpoints, OpenRouter answers a full one's 429 by falling back inside
the request: under load, to a dearer endpoint the client never sees. Here every allowed
endpoint is a *lane* whose capacity is learned from its own answers (AIMD: a refusal
caps the window at what is still in flight there, the first of a burst cuts a tenth
more, successes climb back, ``Retry-After`` rests it), and each attempt is admitted to
the best lane with room and sent there alone (one-tag ``only``, no fallbacks). A dearer
lane serves only while the average premium over the floor stays within ``max_premium``;
otherwise the request waits, first in first out. Waiters are futures woken by releases
and one timer, never polled. docs/client.md, "Cost-first admission".
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal, TypeAlias

from provider_router._exceptions import ConfigurationError, RouterStopping
from provider_router._format import decimal_str
from provider_router._money import to_units
from provider_router._types import Clock
from provider_router.client._request import provider_json
from provider_router.routing.endpoint_route import EndpointRoute
from provider_router.routing.route_plan import RoutePlan

__all__ = ["Admission", "AdmissionTicket", "LaneStats", "Release", "check_max_premium"]

Release: TypeAlias = Literal["served", "refused", "neutral"]
"""How an admitted attempt ended, as far as its lane cares: answered, refused (the
endpoint's 429), or anything else (no word on the lane's capacity)."""

_LN2: Final = math.log(2)
_DECREASE: Final = 0.9
WAIT_BUCKETS: Final = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Seconds: the bounds a lane's waits are counted in (their 95th percentile is read as
the bound of its bucket)."""
_NO_DEMOTIONS: Final[frozenset[str]] = frozenset()


def check_max_premium(value: Decimal | float | str | None) -> Decimal | None:
    """``max_premium`` as a Decimal share of the floor (``None``: no cap, latency first).

    Raises:
        ConfigurationError: not a finite number ≥ 0.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Decimal | float | int | str):
        raise ConfigurationError(f"max_premium must be a number >= 0 or None, got {value!r}")
    try:
        share = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except ArithmeticError:
        share = Decimal("NaN")
    if not share.is_finite() or share < 0:
        raise ConfigurationError(
            f"max_premium must be a share of the floor >= 0 (0.02 is 2 %) or None, got {value!r}"
        )
    return share


@dataclass(frozen=True, slots=True)
class LaneStats:
    """One lane (allowed endpoint) as admission has seen it.

    Attributes:
        tag: the endpoint's tag.
        provider: its provider's display name.
        rank: its place in the plan's ranking.
        premium: its price above the floor per request of the plan's workload, as a
            share (``0`` for the floor).
        in_flight: our attempts there now.
        capacity: the requests in flight it takes, as learned from its refusals
            (``None``: it never refused).
        admitted: attempts admitted to it.
        served: of those, answered.
        refused: refused (its 429).
        waited_requests: requests that waited before being admitted to it.
        wait_s_total: their seconds of waiting.
        wait_s_mean: the mean wait of those that waited (0 when none did).
        wait_s_p95: the bound of the wait bucket holding their 95th percentile.
        wait_s_max: the longest wait.
        cooldown_s: seconds it rested after refusals (``Retry-After`` and backoff).
        retired: no longer in the plan in force.
    """

    tag: str
    provider: str
    rank: int
    premium: Decimal
    in_flight: int
    capacity: int | None
    admitted: int
    served: int
    refused: int
    waited_requests: int
    wait_s_total: float
    wait_s_mean: float
    wait_s_p95: float
    wait_s_max: float
    cooldown_s: float
    retired: bool = False

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the premium as an exact decimal string)."""
        return {
            "provider": self.provider,
            "rank": self.rank,
            "premium": decimal_str(self.premium),
            "capacity_estimate": self.capacity,
            "admitted": self.admitted,
            "served": self.served,
            "refused": self.refused,
            "waited_requests": self.waited_requests,
            "wait_s_total": round(self.wait_s_total, 3),
            "wait_s_mean": round(self.wait_s_mean, 3),
            "wait_s_p95": self.wait_s_p95,
            "wait_s_max": round(self.wait_s_max, 3),
            "cooldown_s": round(self.cooldown_s, 3),
            **({"retired": True} if self.retired else {}),
        }


class _Lane:
    """One allowed endpoint: its route, its learned window and its counts."""

    __slots__ = (
        "admitted",
        "body",
        "ceiling",
        "cooldown_total",
        "cooling_until",
        "epoch",
        "extra",
        "in_flight",
        "limit",
        "max",
        "probe",
        "provider",
        "refused",
        "retired",
        "route",
        "served",
        "strict_body",
        "tag",
        "wait_hist",
        "wait_max",
        "wait_total",
        "waited",
        "window",
    )

    def __init__(
        self, route: EndpointRoute, max_concurrency: int, fields: Mapping[str, Any]
    ) -> None:
        self.tag = route.tag
        self.provider = route.provider_name
        self.max = max_concurrency
        self.window = float(max_concurrency)  # no limit known yet
        self.limit = max_concurrency
        self.epoch = 0
        self.ceiling = math.inf
        self.probe = 1.0
        self.in_flight = 0
        self.cooling_until = -math.inf
        self.retired = False
        self.extra = 0
        self.admitted = self.served = self.refused = self.waited = 0
        self.wait_total = self.wait_max = self.cooldown_total = 0.0
        self.wait_hist = [0] * (len(WAIT_BUCKETS) + 1)
        self.route = route
        self.body = self.strict_body = b""
        self._encode(fields)

    def _encode(self, fields: Mapping[str, Any]) -> None:
        # Both built once per route: a request asking logprobs takes the strict one.
        self.body = provider_json(self.route.object, fields)
        self.strict_body = provider_json(self.route.object, fields, strict=True)

    def set_route(self, route: EndpointRoute, fields: Mapping[str, Any]) -> None:
        self.route = route
        self.provider = route.provider_name
        self._encode(fields)
        self.retired = False

    def _set_window(self, window: float) -> None:
        self.window = window
        self.limit = max(1, int(window))

    def grow(self) -> None:
        """A success: one slot per window of successes, faster below the last limit."""
        window = self.window
        if window < self.max:
            step = 1.0 / window
            if window < self.ceiling:
                step *= self.probe
                self.probe = min(self.probe * (1.0 + _LN2 / window), max(1.0, window / 2))
            self._set_window(min(float(self.max), window + step))

    def cut(self, epoch: int) -> None:
        """A refusal: what is still in flight is what the endpoint takes; the first
        refusal of a burst (a ticket from before the last cut) also cuts a tenth."""
        in_flight = max(1, self.in_flight)
        if self.window > in_flight:
            self._set_window(float(in_flight))
        self.ceiling = min(self.ceiling, self.window)
        if epoch >= self.epoch:
            self.ceiling = self.window
            self.probe = 1.0
            self.epoch += 1
            self._set_window(max(1.0, self.window * _DECREASE))

    def rest(self, until: float, now: float) -> None:
        start = max(self.cooling_until, now)
        if until > start:
            self.cooldown_total += until - start
            self.cooling_until = until

    def stats(self, floor_units: int) -> LaneStats:
        waited = self.waited
        p95 = 0.0
        if waited:
            threshold = math.ceil(waited * 0.95)
            seen = 0
            for bound, count in zip((*WAIT_BUCKETS, math.inf), self.wait_hist, strict=True):
                seen += count
                if seen >= threshold:
                    p95 = bound if math.isfinite(bound) else round(self.wait_max, 3)
                    break
        premium = Decimal(0)
        if floor_units > 0:
            premium = (Decimal(self.extra) / Decimal(floor_units)).quantize(Decimal("0.0001"))
        return LaneStats(
            tag=self.tag,
            provider=self.provider,
            rank=self.route.rank,
            premium=premium,
            in_flight=self.in_flight,
            capacity=None if self.epoch == 0 else self.limit,
            admitted=self.admitted,
            served=self.served,
            refused=self.refused,
            waited_requests=waited,
            wait_s_total=self.wait_total,
            wait_s_mean=self.wait_total / waited if waited else 0.0,
            wait_s_p95=p95,
            wait_s_max=self.wait_max,
            cooldown_s=self.cooldown_total,
            retired=self.retired,
        )


class AdmissionTicket:
    """An attempt admitted to one lane: give it back to :meth:`Admission.release`."""

    __slots__ = ("_charge", "_epoch", "_exempt", "_lane", "waited")

    def __init__(self, lane: _Lane, charge: int, exempt: bool) -> None:
        self._lane = lane
        self._epoch = lane.epoch
        self._charge = charge
        self._exempt = exempt
        self.waited = 0.0
        """Seconds this admission waited for a lane."""

    def __repr__(self) -> str:
        return f"AdmissionTicket({self._lane.tag!r}, waited={self.waited:.3f})"

    @property
    def tag(self) -> str:
        """The endpoint's tag."""
        return self._lane.tag

    @property
    def route(self) -> EndpointRoute:
        """The endpoint's route (its ``provider`` object and ceilings)."""
        return self._lane.route

    @property
    def body(self) -> bytes:
        """The route's ``provider`` object with the router's own fields, encoded."""
        return self._lane.body

    @property
    def strict_body(self) -> bytes:
        """:attr:`body` with ``require_parameters: true`` (a request asking logprobs)."""
        return self._lane.strict_body


class _Waiter:
    __slots__ = ("future", "seq", "since")

    def __init__(self, future: asyncio.Future[AdmissionTicket], seq: int, since: float) -> None:
        self.future = future
        self.seq = seq
        self.since = since


class AdmissionQueue:
    """The requests that may use the same lanes (a fit class, or one pinned lane)."""

    __slots__ = ("_order", "lanes", "pin", "tags", "waiters")

    def __init__(self, tags: tuple[str, ...] | None, pin: str | None) -> None:
        self.tags = tags
        """The tags it may use (``None``: every lane)."""
        self.pin = pin
        """The one lane a pinned request may use (not held to the premium)."""
        self.lanes: tuple[_Lane, ...] = ()
        self.waiters: deque[_Waiter] = deque()
        self._order: tuple[frozenset[str], tuple[_Lane, ...]] = (_NO_DEMOTIONS, ())

    def order(self, demoted: frozenset[str]) -> tuple[_Lane, ...]:
        """Its lanes, demoted providers' last (cached per demoted set)."""
        cached_for, order = self._order
        if cached_for is demoted and order:
            return order
        lanes = self.lanes
        if demoted:
            order = tuple(
                [lane for lane in lanes if lane.provider not in demoted]
                + [lane for lane in lanes if lane.provider in demoted]
            )
        else:
            order = lanes
        self._order = (demoted, order)
        return order


class Admission:
    """Admits each attempt to one lane (see the module docstring).

    Args:
        plan: the route plan whose allowed endpoints are the lanes.
        max_premium: the most paid above the floor, averaged over the requests, as a
            share of the floor (``Decimal("0.02")``: 2 %); ``None``: no cap (the
            cheapest lane with room, waiting only when every lane is full).
        max_concurrency: a new lane's window (no limit known yet).
        clock: monotonic seconds (with a fake one, call :meth:`tick` after moving it).
        demoted: the providers demoted now (their lanes are used last).
        max_rest: the longest ``Retry-After`` honoured, in seconds.
        provider_fields: the router's own ``provider`` fields (``enforce_distillable_text``,
            ``zdr``, ``data_collection``), in every lane's ``provider`` object.
    """

    def __init__(
        self,
        plan: RoutePlan,
        *,
        max_premium: Decimal | None,
        max_concurrency: int,
        clock: Clock = time.monotonic,
        demoted: Callable[[], frozenset[str]] = lambda: _NO_DEMOTIONS,
        max_rest: float = 300.0,
        provider_fields: Mapping[str, Any] | None = None,
    ) -> None:
        self._fields: Mapping[str, Any] = dict(provider_fields or {})
        self._premium = max_premium
        self._max = max_concurrency
        self._clock = clock
        self._demoted = demoted
        self._max_rest = max_rest
        self._lanes: dict[str, _Lane] = {}
        self._every: dict[str, _Lane] = {}  # every lane ever, retired ones included
        self._order: tuple[_Lane, ...] = ()
        self._queues: dict[tuple[tuple[str, ...] | None, str | None], AdmissionQueue] = {}
        self._common = self._queues[(None, None)] = AdmissionQueue(None, None)
        self._least_context = 0.0
        self._floor_units = 0
        self._earn = 0
        self.credit = 0
        """The premium still allowed, in picodollars: what the requests so far earned
        (``max_premium`` of their floor cost) less what they paid above the floor."""
        self._seq = 0
        self._waiting = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._stopped: str | None = None
        self.plan = plan
        self.update(plan)

    def __repr__(self) -> str:
        premium = "none" if self._premium is None else format(self._premium, "f")
        return f"Admission(lanes={len(self._lanes)}, max_premium={premium}, waiting={self.waiting})"

    @property
    def max_premium(self) -> Decimal | None:
        """The cap on the premium over the floor (``None``: no cap)."""
        return self._premium

    @property
    def waiting(self) -> int:
        """Requests waiting for a lane now."""
        return sum(1 for q in self._queues.values() for w in q.waiters if not w.future.done())

    def waiting_by_lane(self) -> dict[str, int]:
        """Requests waiting now, by the lane each waits for first (its best)."""
        counts: dict[str, int] = {}
        demoted = self._demoted()
        for q in self._queues.values():
            live = sum(1 for w in q.waiters if not w.future.done())
            if live:
                order = q.order(demoted)
                tag = order[0].tag if order else "?"
                counts[tag] = counts.get(tag, 0) + live
        return counts

    # --- the plan ----------------------------------------------------------------------

    def update(self, plan: RoutePlan) -> None:
        """Take the lanes of ``plan``: a lane keeps what it learned (by tag), a new one
        starts with no limit known, one the plan dropped is retired (never admitted to
        again; its attempts in flight release into it harmlessly)."""
        if not plan.routes or plan.floor is None:
            raise ConfigurationError(f"the route plan of {plan.model!r} has no endpoint routes")
        self.plan = plan
        lanes: dict[str, _Lane] = {}
        for route in plan.routes:
            lane = self._every.get(route.tag)
            if lane is None:
                lane = self._every[route.tag] = _Lane(route, self._max, self._fields)
            else:
                lane.set_route(route, self._fields)
            lanes[route.tag] = lane
        for tag, lane in self._lanes.items():
            if tag not in lanes:
                lane.retired = True
        self._lanes = lanes
        self._order = tuple(lanes[route.tag] for route in plan.routes)
        self._floor_units = to_units(plan.floor.cost_per_request)
        self._earn = 0 if self._premium is None else int(self._floor_units * self._premium)
        for lane in self._order:
            lane.extra = to_units(lane.route.cost_per_request) - self._floor_units
        contexts = [lane.route.endpoint.context_length or 0 for lane in self._order]
        self._least_context = float(min((c for c in contexts if c > 0), default=math.inf))
        for queue in self._queues.values():
            self._place(queue)
        self._wake()

    def retire(self, tag: str) -> bool:
        """Admit nothing more to ``tag`` until the next plan (its route is gone: a 404
        at it). Returns whether another lane is left."""
        lane = self._lanes.get(tag)
        if lane is not None:
            lane.retired = True
            for queue in self._queues.values():
                self._place(queue)
            self._wake()  # a retired pin's waiters may go elsewhere now
        return any(not lane.retired for lane in self._order)

    def _place(self, queue: AdmissionQueue) -> None:
        live = tuple(lane for lane in self._order if not lane.retired)
        if queue.pin is not None:
            pinned = self._lanes.get(queue.pin)
            lanes = (pinned,) if pinned is not None and not pinned.retired else live
        elif queue.tags is not None:
            lanes = tuple(lane for lane in live if lane.tag in queue.tags) or live
        else:
            lanes = live
        queue.lanes = lanes
        queue._order = (_NO_DEMOTIONS, ())

    def queue(
        self, needs: Collection[str] = (), min_context: int = 0, pin: str | None = None
    ) -> AdmissionQueue:
        """The queue of a request needing ``needs`` (``tools``, ``response_format``) and
        ``min_context`` tokens, or pinned to ``pin``: the lanes it may use."""
        if pin is None:
            if not needs and min_context <= self._least_context:
                return self._common
            tags: tuple[str, ...] | None = tuple(
                lane.tag for lane in self._order if lane.route.fits(needs, min_context)
            )
            if tags is not None and len(tags) in (0, len(self._order)):
                return self._common  # none fits (send as if all did) or all do
        else:
            tags = None
        key = (tags, pin)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = AdmissionQueue(tags, pin)
            self._place(queue)
        return queue

    # --- admitting ---------------------------------------------------------------------

    def next_seq(self) -> int:
        """A new arrival's place in line."""
        self._seq += 1
        return self._seq

    def _pick(
        self, queue: AdmissionQueue, now: float, demoted: frozenset[str]
    ) -> tuple[_Lane | None, bool]:
        order = queue.order(demoted)
        if not order:
            return None, False
        if queue.pin is None:
            first = order[0]  # the best usable lane of the queue: never held back
            gated = self._premium is not None
        else:
            # A pin was chosen within the premium: it waits for its own lane only, and
            # pays the premium as any request there does.
            common = self._common.order(demoted)
            first = common[0] if common else order[0]
            gated = False
        for lane in order:
            if lane.in_flight >= lane.limit or lane.cooling_until > now:
                continue
            if (
                not gated
                or lane is first
                or lane.extra <= 0
                or self.credit + self._earn - lane.extra >= 0
            ):
                return lane, lane is first
        return None, False

    def _take(self, lane: _Lane, exempt: bool) -> AdmissionTicket:
        lane.in_flight += 1
        lane.admitted += 1
        charge = 0
        if self._premium is not None:
            earn, extra = self._earn, lane.extra
            charge = earn - (min(extra, earn) if exempt else extra)
            self.credit += charge
        return AdmissionTicket(lane, charge, exempt)

    def try_admit(self, queue: AdmissionQueue, seq: int = 0) -> AdmissionTicket | None:
        """A lane without waiting, or ``None`` when the request must wait (no lane of its
        queue has room within the premium, or older requests wait in it).

        ``seq``: a request coming back after a refusal keeps its place in line.

        Raises:
            RouterStopping: :meth:`stop` was called.
        """
        if self._stopped is not None:
            raise RouterStopping(self._stopped)
        waiters = queue.waiters
        if waiters:
            while waiters and waiters[0].future.done():
                waiters.popleft()
            if waiters and not (seq and seq < waiters[0].seq):
                return None
        lane, exempt = self._pick(queue, self._clock(), self._demoted())
        if lane is None:
            return None
        return self._take(lane, exempt)

    async def admit(self, queue: AdmissionQueue, seq: int) -> AdmissionTicket:
        """Wait for a lane of ``queue`` (first in first out by ``seq``).

        Raises:
            RouterStopping: :meth:`stop` was called, before or while it waited.
        """
        ticket = self.try_admit(queue, seq)
        if ticket is not None:
            return ticket
        future: asyncio.Future[AdmissionTicket] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, seq, self._clock())
        waiters = queue.waiters
        if not waiters or seq > waiters[-1].seq:
            waiters.append(waiter)
        else:
            # A request back after a refusal: before everyone who arrived after it.
            waiters.insert(bisect.bisect_left(waiters, seq, key=lambda w: w.seq), waiter)
        self._arm()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), "neutral")  # granted just before the cancel
            raise

    def release(
        self,
        ticket: AdmissionTicket,
        outcome: Release,
        *,
        retry_after: float | None = None,
        paid_units: int = 0,
        floor_units: int = 0,
    ) -> bool:
        """Free the attempt's place in its lane and learn from how it ended.

        Args:
            ticket: what :meth:`try_admit` or :meth:`admit` returned.
            outcome: ``"served"``, ``"refused"`` (the endpoint's 429) or ``"neutral"``.
            retry_after: a refusal's ``Retry-After`` (seconds): the lane rests that long
                (a refusal with others of ours in flight there: it is full).
            paid_units: a served answer's cost, in picodollars.
            floor_units: the same tokens at the floor's prices, in picodollars.

        Returns:
            Whether a refusal came with nothing else of ours in flight at the lane: it
            says nothing of the lane's capacity (an outage, a rate limit of the
            endpoint's own), so nothing is learned; the caller fails the attempt.
        """
        lane = ticket._lane
        lane.in_flight -= 1
        premium = self._premium
        if premium is not None:
            self.credit -= ticket._charge
        idle = False
        if outcome == "served":
            lane.served += 1
            lane.grow()
            if premium is not None:
                allowed = int(floor_units * premium)
                above = paid_units - floor_units
                self.credit += allowed - (min(above, allowed) if ticket._exempt else above)
        elif outcome == "refused":
            lane.refused += 1
            idle = lane.in_flight == 0
            if not idle:
                # Full: what is still in flight there is what it takes. (Refused with
                # nothing of ours there says nothing of its capacity: the caller treats
                # it as a failure, retried with backoff.)
                lane.cut(ticket._epoch)
                if retry_after is not None:
                    now = self._clock()
                    lane.rest(now + min(retry_after, self._max_rest), now)
        elif outcome != "neutral":
            raise ValueError(f"unknown outcome {outcome!r}")
        if self._waiting_any():
            self._wake()
        return idle

    def stop(self, reason: str = "not sent: the router is stopping") -> None:
        """Admit nothing from now on: every waiter, and every later request, raises
        :class:`~provider_router.RouterStopping` with ``reason``."""
        if self._stopped is None:
            self._stopped = reason
        for queue in self._queues.values():
            while queue.waiters:
                future = queue.waiters.popleft().future
                if not future.done():
                    future.set_exception(RouterStopping(reason))
        self._cancel_timer()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped is not None

    def tick(self) -> None:
        """Admit waiters a rest's end makes room for (the timer's callback; call it after
        moving a fake clock)."""
        self._timer = None
        self._timer_at = math.inf
        self._wake()

    # --- waking ------------------------------------------------------------------------

    def _waiting_any(self) -> bool:
        return any(q.waiters for q in self._queues.values())

    def _wake(self) -> None:
        if self._stopped is not None:
            return
        queues = [q for q in self._queues.values() if q.waiters]
        if not queues:
            return
        now = self._clock()
        demoted = self._demoted()
        while True:
            best: AdmissionQueue | None = None
            best_lane: _Lane | None = None
            best_exempt = False
            best_seq = math.inf
            for queue in queues:
                waiters = queue.waiters
                while waiters and waiters[0].future.done():
                    waiters.popleft()
                if not waiters or waiters[0].seq >= best_seq:
                    continue
                lane, exempt = self._pick(queue, now, demoted)
                if lane is not None:
                    best, best_lane, best_exempt, best_seq = queue, lane, exempt, waiters[0].seq
            if best is None or best_lane is None:
                break
            waiter = best.waiters.popleft()
            ticket = self._take(best_lane, best_exempt)
            waited = ticket.waited = max(now - waiter.since, 0.0)
            best_lane.waited += 1
            best_lane.wait_total += waited
            if waited > best_lane.wait_max:
                best_lane.wait_max = waited
            best_lane.wait_hist[bisect.bisect_left(WAIT_BUCKETS, waited)] += 1
            waiter.future.set_result(ticket)
        self._arm()

    def _arm(self) -> None:
        """One timer, at the earliest rest's end among lanes someone waits for."""
        now = self._clock()
        soonest = math.inf
        for queue in self._queues.values():
            if queue.waiters:
                for lane in queue.lanes:
                    if now < lane.cooling_until < soonest:
                        soonest = lane.cooling_until
        if soonest == math.inf or soonest >= self._timer_at:
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(soonest - now, self.tick)
        self._timer_at = soonest

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf

    # --- reading -----------------------------------------------------------------------

    def lanes(self) -> Iterable[str]:
        """The tags of the lanes in force, best first."""
        return [lane.tag for lane in self._order]

    def open_lanes(self, tags: Iterable[str]) -> list[str]:
        """Of ``tags``, those with room now (not full, not resting, not demoted): where
        a new pinned session may go. (A pin is chosen by its cost with cache reads,
        which the premium's per-request figures leave out; its answers then count
        toward the premium at what they cost.)"""
        now = self._clock()
        demoted = self._demoted()
        wanted = set(tags)
        return [
            lane.tag
            for lane in self._order
            if lane.tag in wanted
            and not lane.retired
            and lane.provider not in demoted
            and lane.in_flight < lane.limit
            and lane.cooling_until <= now
        ]

    def snapshot(self) -> dict[str, LaneStats]:
        """Every lane's figures so far, by tag (the plan's best first, retired last)."""
        floor = self._floor_units
        result = {lane.tag: lane.stats(floor) for lane in self._order}
        for tag, lane in self._every.items():
            if tag not in result:
                result[tag] = lane.stats(floor)
        return result
