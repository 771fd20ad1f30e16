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
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from provider_router._exceptions import (
    ConfigurationError,
    PaymentRequiredError,
    RateLimitError,
    RouterStopping,
)
from provider_router._log import DEBUG, get_logger
from provider_router._secrets import scrub
from provider_router.client._billing import unallowed_reason
from provider_router.client._completion import Completion, parse_completion
from provider_router.client._request import PreparedRequest
from provider_router.client.affinity import blames_pin
from provider_router.client.streaming import read_stream
from provider_router.routing.route_plan import cache_saving

if TYPE_CHECKING:
    from provider_router._http.session import HttpClient
    from provider_router._types import Clock
    from provider_router.client._billing import Billing, Charged
    from provider_router.client._config import Safeguards, Timeouts
    from provider_router.client._request import RequestEncoder
    from provider_router.client.affinity import CacheAffinity
    from provider_router.client.health import ProviderHealth
    from provider_router.client.limiter import AdaptiveLimiter, Outcome
    from provider_router.client.metrics import Metrics
    from provider_router.client.results import ChatResult
    from provider_router.ledger import Reservation

__all__ = ["CHAT_PATH", "AttemptMixin"]

# The Router's logger: one attempt's lines are the router's lines.
log = get_logger("provider_router.client.router")

CHAT_PATH: Final = "/chat/completions"


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
    _violations_in_a_row: int
    _violations_halt: str | None
    _billing: Billing
    _clock: Clock
    _stopping: asyncio.Event
    _http: HttpClient | None
    _in_flight: int
    _pin_fallbacks: bool
    _encoder: RequestEncoder

    async def _attempt(self, request: PreparedRequest, attempt: int) -> Charged:
        billing = self._billing
        if billing.stopped is not None:
            raise billing.stopped_error()
        request.attempts = attempt
        request.generation_id = None
        request.sent = False
        if request.session is not None and attempt > 1:
            self._repin(request)
        limiter = self.limiter
        ticket = limiter.try_acquire()  # no coroutine when a slot is free (the usual case)
        if ticket is None:
            ticket = await limiter.acquire()
        outcome: Outcome = "neutral"
        started = self._clock()
        reservation: Reservation | None = None
        try:
            if self._stopping.is_set():
                raise self._not_started(request, attempt)
            ledger = billing.ledger
            if ledger is not None:  # Billing.reserve, inlined: one coroutine less
                reservation = await ledger.reserve(
                    request.worst_case, key=request.key, wait=self.budget_wait
                )
                if self._stopping.is_set():
                    # Stopped while it waited for room or a slot: nothing was sent.
                    await ledger.release(reservation)
                    reservation = None
                    raise self._not_started(request, attempt)
            try:
                completion = await self._exchange(request, attempt, reservation)
            except PaymentRequiredError as exc:
                completion = await billing.hold_402(
                    exc,
                    functools.partial(self._exchange, request, attempt, reservation),
                    key=request.key,
                    in_flight=self._in_flight,
                )
            charged = await billing.charge(request, completion, reservation)
            reservation = None
            if completion.error is not None:
                raise completion.error
            outcome = "success"
            if completion.provider is not None:
                usage = completion.usage
                self.health.record_success(
                    completion.provider,
                    latency=self._clock() - started,
                    completion_tokens=usage.completion_tokens if usage else 0,
                )
            return charged
        except BaseException as exc:
            if isinstance(exc, RateLimitError):
                outcome = "rate_limited"
            provider = getattr(exc, "provider_name", None)
            if provider:
                self.health.record_failure(provider, rate_limited=outcome == "rate_limited")
            if request.pinned is not None and blames_pin(request, exc, provider):
                request.failed_pins = (*request.failed_pins, request.pinned)
            if self.metrics is not None and isinstance(exc, Exception):
                self.metrics.attempt_failed(provider, type(exc).__name__, outcome == "rate_limited")
            if reservation is not None:
                await billing.close_failed(reservation, request, exc)
            if isinstance(exc, Exception) and log.isEnabledFor(DEBUG):
                log.debug(
                    "route.attempt",
                    model=self.model,
                    key=request.key,
                    attempt=attempt,
                    error_type=type(exc).__name__,
                    status=getattr(exc, "status", None),
                    provider=provider,
                    duration=round(self._clock() - started, 4),
                )
            raise
        finally:
            limiter.release(ticket, outcome)

    def _repin(self, request: PreparedRequest) -> None:
        """A retry of a pinned request: the session moves off the endpoint that failed."""
        session = request.session
        assert session is not None
        plan = request.plan
        tag = self.affinity.pin(
            session,
            plan,
            self._clock(),
            demoted=self.health.demoted(),
            failed=request.failed_pins,
            needs=request.pin_needs[0],
            min_context=request.pin_needs[1],
        )
        if tag != request.pinned:
            request.pinned = tag
            provider = self._encoder.provider_json(
                plan.pinned_object(tag, fallbacks=self._pin_fallbacks), strict=request.strict
            )
            head = request.payload[: -request.provider_length - 1]
            request.payload = b"".join((head, provider, b"}"))
            request.provider_length = len(provider)

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
            return await read_stream(
                response,
                request,
                attempt,
                reservation,
                self._billing,
                idle,
                deadline_at=deadline_at,
            )

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
