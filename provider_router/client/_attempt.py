"""One attempt of a request (a slot, a reservation, the exchange, the charge), and
the answer it ends with.

:class:`AttemptMixin` is the part of :class:`~provider_router.Router` that runs one
attempt of a prepared request, the unit the retry policy repeats: a re-pin when a
pinned request is retried, a limiter slot, a reservation of the worst case, the
exchange (the generation id attached as soon as a response names it), the charge,
and the outcome told to the limiter, health and metrics. The last answer is then
judged (an unallowed provider's is quarantined) and counted (``route.done``). A mixin,
because it reads state callers may replace while the router runs
(``router.budget_wait``, the ledger).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from provider_router._constants import REFUSAL_LIMIT
from provider_router._exceptions import (
    ConfigurationError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitError,
    RouterStopping,
)
from provider_router._log import DEBUG, get_logger
from provider_router._money import to_units
from provider_router._secrets import scrub
from provider_router.client._billing import unallowed_reason
from provider_router.client._completion import Completion, parse_completion
from provider_router.client._request import PreparedRequest
from provider_router.client._response_cache import STATUS_HEADER
from provider_router.client.affinity import blames_pin
from provider_router.client.results import routed
from provider_router.client.streaming import not_a_stream, read_stream
from provider_router.routing.route_plan import cache_saving

if TYPE_CHECKING:
    from provider_router._http.session import HttpClient
    from provider_router._types import Clock
    from provider_router.client._billing import Billing, Charged
    from provider_router.client._config import Safeguards, Timeouts
    from provider_router.client._live_plan import LivePlan
    from provider_router.client.admission import Admission, AdmissionTicket
    from provider_router.client.affinity import CacheAffinity
    from provider_router.client.health import ProviderHealth
    from provider_router.client.limiter import AdaptiveLimiter, Outcome
    from provider_router.client.metrics import Metrics
    from provider_router.client.results import ChatResult
    from provider_router.ledger import Reservation

__all__ = ["CHAT_PATH", "AttemptMixin", "route_gone"]

# The Router's logger: one attempt's lines are the router's lines.
log = get_logger("provider_router.client.router")

CHAT_PATH: Final = "/chat/completions"

_GONE_BY: Final = frozenset({"max_price", "quantization", "allowed_providers"})


def route_gone(exc: NotFoundError) -> bool:
    """Whether a 404 says the one endpoint an attempt was sent to is filtered out
    (``constraint_filtered`` by its own ``max_price``, quantization or allow-list):
    repriced or re-quantized since the listing was read. Nothing ran: it is free."""
    body = exc.body
    error = body.get("error") if isinstance(body, Mapping) else None
    availability = error.get("availability") if isinstance(error, Mapping) else None
    if not isinstance(availability, Mapping):
        return False
    excluded = availability.get("excluded_by")
    return (
        availability.get("code") == "constraint_filtered"
        and isinstance(excluded, list)
        and any(reason in _GONE_BY for reason in excluded)
    )


def _sent_to(request: PreparedRequest, named: str) -> str:
    """The provider an attempt's failure counts against: the listing's name of the one
    endpoint it was sent to (what admission demotes by), whatever name the error
    carries; ``named`` when it was not sent to one."""
    tag = request.endpoint
    if tag is not None and request.sent:
        for route in request.plan.routes:
            if route.tag == tag:
                return route.provider_name
    return named


class AttemptMixin:
    """Runs one attempt of a prepared request (mixed into the Router)."""

    # The Router's state one attempt reads (set by Router.__init__ and open()).
    model: str
    budget_wait: bool | float
    limiter: AdaptiveLimiter
    health: ProviderHealth
    metrics: Metrics | None
    affinity: CacheAffinity
    timeouts: Timeouts
    safeguards: Safeguards
    requests: int
    quarantined: int
    unknown_provider: int
    cache_saved: Decimal
    response_cache: int | None
    _violations_in_a_row: int
    _violations_halt: str | None
    _billing: Billing
    _clock: Clock
    _stopping: asyncio.Event
    _http: HttpClient | None
    _in_flight: int
    _pin_fallbacks: bool
    _admission: Admission | None
    _plans: LivePlan

    async def _attempt(self, request: PreparedRequest, attempt: int) -> Charged:
        billing = self._billing
        if billing.stopped is not None:
            raise billing.stopped_error()
        request.attempts = attempt
        if request.session is not None and attempt > 1:
            self._repin(request)
        limiter = self.limiter
        ticket = limiter.try_acquire()  # no coroutine when a slot is free (the usual case)
        if ticket is None:
            ticket = await limiter.acquire()
        outcome: Outcome = "neutral"
        started = self._clock()
        reservation: Reservation | None = None
        admitted: AdmissionTicket | None = None
        admission = self._admission
        assert admission is not None  # set by open(), which _build_request checked
        refusals = 0
        try:
            while True:
                request.generation_id = None
                request.sent = False
                if self._stopping.is_set():
                    raise self._not_started(request, attempt)
                # One endpoint, chosen here: no coroutine when one has room (the usual case).
                admitted = self._admit_now(request, admission)
                if admitted is None:
                    admitted = await self._admit_waiting(request, admission, attempt)
                self._route(request, admitted, admission)
                ledger = billing.ledger
                if ledger is not None:  # Billing.reserve, inlined: one coroutine less
                    # After admission: the admitted endpoint's own worst case, and nothing
                    # held while a request waits for an endpoint.
                    reservation = await ledger.reserve(
                        request.worst_case, key=request.key, wait=self.budget_wait
                    )
                    if self._stopping.is_set():
                        # Stopped while it waited for room or a slot: nothing was sent.
                        await ledger.release(reservation)
                        reservation = None
                        raise self._not_started(request, attempt)
                try:
                    try:
                        completion = await self._exchange(request, attempt, reservation)
                    except (PaymentRequiredError, PermissionDeniedError) as exc:
                        limit = exc.spend_limit  # every 402; a 403 only when it names a limit
                        if limit is None:
                            raise
                        completion = await billing.hold_spend_limit(
                            exc,
                            limit,
                            functools.partial(self._exchange, request, attempt, reservation),
                            key=request.key,
                            in_flight=self._in_flight,
                        )
                except RateLimitError as exc:
                    # The endpoint's own 429 (it names its provider; the platform's does
                    # not) while others of ours are in flight there: it is full, not
                    # failing. Back to admission, not a retry.
                    if not exc.provider_name or refusals >= REFUSAL_LIMIT:
                        raise
                    idle = admission.release(admitted, "refused", retry_after=exc.retry_after)
                    admitted = None
                    if idle:
                        raise  # nothing of ours there: a failure, retried with backoff
                    refusals += 1
                    if reservation is not None:
                        await billing.close_failed(reservation, request, exc)  # a 429 is free
                        reservation = None
                    self._refused(request, exc)
                    continue
                except NotFoundError as exc:
                    # The endpoint's route is gone (repriced above its max_price since
                    # the listing, re-quantized): free; go elsewhere, and re-read prices.
                    if not route_gone(exc) or not admission.retire(admitted.tag):
                        raise
                    if reservation is not None:
                        await billing.close_failed(reservation, request, exc)
                        reservation = None
                    admission.release(admitted, "neutral")
                    admitted = None
                    self._plans.expire()
                    log.warning("route.endpoint_gone", model=self.model, error=str(exc))
                    continue
                charged = await billing.charge(request, completion, reservation)
                reservation = None
                if completion.error is not None:
                    raise completion.error
                outcome = "success"
                self._served(request, admitted, admission, completion, charged, started)
                admitted = None
                return charged
        except BaseException as exc:
            if isinstance(exc, RateLimitError) and not exc.provider_name:
                outcome = "rate_limited"  # OpenRouter's own limit: the key's window shrinks
            provider = getattr(exc, "provider_name", None)
            if provider:
                self.health.record_failure(
                    _sent_to(request, provider), rate_limited=isinstance(exc, RateLimitError)
                )
            if request.pinned is not None and blames_pin(request, exc, provider):
                request.failed_pins = (*request.failed_pins, request.pinned)
            if self.metrics is not None and isinstance(exc, Exception):
                self.metrics.attempt_failed(
                    provider, type(exc).__name__, isinstance(exc, RateLimitError)
                )
            if reservation is not None:
                await billing.close_failed(reservation, request, exc)
            if admitted is not None:
                admission.release(admitted, "neutral")
            if isinstance(exc, Exception) and log.isEnabledFor(DEBUG):
                log.debug(
                    "route.attempt",
                    model=self.model,
                    key=request.key,
                    attempt=attempt,
                    endpoint=request.endpoint,
                    error_type=type(exc).__name__,
                    status=getattr(exc, "status", None),
                    provider=provider,
                    duration=round(self._clock() - started, 4),
                )
            raise
        finally:
            request.refusals += refusals
            limiter.release(ticket, outcome)

    # --- admission: which endpoint this attempt goes to -----------------------------

    def _admit_now(self, request: PreparedRequest, admission: Admission) -> AdmissionTicket | None:
        if not request.seq:
            request.seq = admission.next_seq()
        needs, min_context = request.pin_needs
        pinned = request.pinned
        queue = admission.queue(needs, min_context, pinned)
        admitted = admission.try_admit(queue, request.seq)
        if admitted is None and pinned is not None and self._pin_fallbacks:
            # pin_fallbacks: a full pin does not hold its request (one cache miss).
            admitted = admission.try_admit(admission.queue(needs, min_context), request.seq)
        return admitted

    async def _admit_waiting(
        self, request: PreparedRequest, admission: Admission, attempt: int
    ) -> AdmissionTicket:
        needs, min_context = request.pin_needs
        pinned = None if self._pin_fallbacks else request.pinned
        try:
            return await admission.admit(admission.queue(needs, min_context, pinned), request.seq)
        except RouterStopping:
            raise self._not_started(request, attempt) from None

    def _route(
        self, request: PreparedRequest, admitted: AdmissionTicket, admission: Admission
    ) -> None:
        """Send this attempt to the admitted endpoint alone, at its own ceilings."""
        request.plan = admission.plan  # the plan in force: exclusions reach queued requests
        request.endpoint = admitted.tag
        body = admitted.strict_body if request.strict else admitted.body
        request.payload = b"".join((request.head, body, b"}"))
        request.worst_case = admitted.route.worst_case(
            request.prompt_tokens, request.cap, request.images
        )
        request.waited += admitted.waited

    def _refused(self, request: PreparedRequest, exc: RateLimitError) -> None:
        provider = exc.provider_name
        assert provider is not None
        self.health.record_refused(_sent_to(request, provider))  # full, not failing
        if self.metrics is not None:
            self.metrics.refused(request.endpoint or "", provider)
        if log.isEnabledFor(DEBUG):
            log.debug(
                "route.refused",
                model=self.model,
                key=request.key,
                endpoint=request.endpoint,
                provider=provider,
                retry_after=exc.retry_after,
            )

    def _served(
        self,
        request: PreparedRequest,
        admitted: AdmissionTicket,
        admission: Admission,
        completion: Completion,
        charged: Charged,
        started: float,
    ) -> None:
        usage = completion.usage
        floor = None
        if usage is not None:
            floor = request.plan.floor_cost(
                usage.prompt_tokens,
                usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                cache_write_tokens=usage.cache_write_tokens,
            )
            if completion.provider is not None:
                self.health.record_success(
                    completion.provider,
                    latency=self._clock() - started,
                    completion_tokens=usage.completion_tokens,
                )
        elif completion.provider is not None:
            self.health.record_success(completion.provider, latency=self._clock() - started)
        request.floor_cost = floor
        cost = charged.cost
        if floor is not None and cost is not None and admission.max_premium is not None:
            admission.release(
                admitted, "served", paid_units=to_units(cost), floor_units=to_units(floor)
            )
        else:
            admission.release(admitted, "served")

    def _repin(self, request: PreparedRequest) -> None:
        """A retry of a pinned request: the session moves off the endpoint that failed."""
        session = request.session
        admission = self._admission
        assert session is not None
        assert admission is not None
        plan = admission.plan
        request.pinned = self.affinity.pin(
            session,
            plan,
            self._clock(),
            demoted=self.health.demoted(),
            failed=request.failed_pins,
            needs=request.pin_needs[0],
            min_context=request.pin_needs[1],
            prefer=functools.partial(admission.open_lanes, plan.order),
        )

    def _not_started(self, request: PreparedRequest, attempt: int) -> RouterStopping:
        what = "not sent" if attempt == 1 else f"attempt {attempt} not started"
        return RouterStopping(f"{request.key}: {what}: the router is stopping")

    async def _exchange(
        self, request: PreparedRequest, attempt: int, reservation: Reservation | None
    ) -> Completion:
        http = self._http
        if http is None:
            raise ConfigurationError("the Router was closed")
        request.sent = True
        if request.stream:
            return await self._exchange_stream(http, request, attempt, reservation)
        # No context manager: one coroutine and two objects less per request.
        response = await http.send(CHAT_PATH, request.payload, request_timeout=request.deadline)
        try:
            generation_id = response.headers.get("x-generation-id")
            if generation_id:
                generation_id = scrub(generation_id)  # it goes to the ledger and logs
                if response.complete:
                    # The whole body is here: the settle that follows records
                    # the id durably, one ledger write instead of two.
                    request.generation_id = generation_id
                else:
                    await self._billing.attach(request, reservation, generation_id)
            completion = parse_completion(await response.json())
            if self.response_cache is not None:
                completion.cache_status = response.headers.get(STATUS_HEADER)
        except BaseException:
            response.close()  # not read to its end, or not an answer: no reuse
            raise
        response.release()
        return completion

    async def _exchange_stream(
        self,
        http: HttpClient,
        request: PreparedRequest,
        attempt: int,
        reservation: Reservation | None,
    ) -> Completion:
        deadline_at = asyncio.get_running_loop().time() + request.deadline
        idle = self.timeouts.stream_idle
        post = http.post(
            CHAT_PATH,
            request.payload,
            request_timeout=request.deadline,
            idle_timeout=idle,
        )
        async with post as response:
            generation_id = response.headers.get("x-generation-id")
            if generation_id:
                generation_id = scrub(generation_id)  # it goes to the ledger and logs
                await self._billing.attach(request, reservation, generation_id)
            content_type = response.headers.get("content-type", "")
            if content_type and "text/event-stream" not in content_type.lower():
                completion = await not_a_stream(response, content_type)
            else:
                completion = await read_stream(
                    response,
                    request,
                    attempt,
                    reservation,
                    self._billing,
                    idle,
                    deadline_at=deadline_at,
                )
            if self.response_cache is not None:
                completion.cache_status = response.headers.get(STATUS_HEADER)
            return completion

    # --- the answer ------------------------------------------------------------------

    def _finish(self, request: PreparedRequest, charged: Charged, latency: float) -> ChatResult:
        """The answer judged (an unallowed provider quarantines it) and counted."""
        completion = charged.completion
        plan = request.plan
        provider = completion.provider
        # No provider named is unknown, not a violation: the paid answer is kept.
        reason = unallowed_reason(plan, provider)
        quarantined = reason is not None
        if provider is None:
            self.unknown_provider += 1
            log.warning(
                "route.unknown_provider",
                model=self.model,
                key=request.key,
                generation_id=completion.generation_id,
            )
        elif not quarantined:
            self._violations_in_a_row = 0
        if quarantined:
            self.quarantined += 1
            self._violations_in_a_row += 1
            if (
                self._violations_in_a_row >= self.safeguards.max_violations_in_a_row
                and self._violations_halt is None
            ):
                self._violations_halt = (
                    f"{self._violations_in_a_row} policy violations in a row (the last served "
                    f"by {provider!r}): OpenRouter is not honouring the routing object"
                )
            log.error(
                "route.policy_violation",
                model=self.model,
                key=request.key,
                provider=completion.provider,
                allowed=sorted(plan.allowed_providers),
                generation_id=completion.generation_id,
            )
        self.requests += 1
        usage = completion.usage
        if usage is not None and usage.cached_tokens:
            self.cache_saved += cache_saving(
                plan, provider, usage.prompt_tokens, usage.cached_tokens
            )
        result = charged.result(request.attempts, latency, reason)
        routed(result, request.floor_cost, request.waited, request.refusals, request.endpoint)
        if self.metrics is not None:
            usage = completion.usage
            self.metrics.answered(
                completion.provider,
                quarantined=quarantined,
                attempts=request.attempts,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                output_tokens=usage.completion_tokens if usage else 0,
                cost=charged.cost,
                latency=latency,
                finish_reason=completion.finish_reason,
                floor_cost=request.floor_cost,
                waited=request.waited,
            )
        if log.isEnabledFor(DEBUG):
            self._log_done(request, charged, latency, quarantined)
        return result

    def _log_done(
        self, request: PreparedRequest, charged: Charged, latency: float, quarantined: bool
    ) -> None:
        completion = charged.completion
        usage = completion.usage
        log.debug(
            "route.done",
            model=self.model,
            key=request.key,
            provider=completion.provider,
            generation_id=completion.generation_id,
            attempts=request.attempts,
            finish_reason=completion.finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            reasoning_tokens=usage.reasoning_tokens if usage else None,
            cost=str(charged.cost) if charged.cost is not None else None,
            estimate=str(charged.estimate) if charged.estimate is not None else None,
            reserved=str(charged.reserved) if charged.reserved is not None else None,
            latency=round(latency, 4),
            quarantined=quarantined,
        )
