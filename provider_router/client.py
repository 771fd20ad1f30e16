"""The routed, budgeted async client: :class:`Router`.

One request goes through these steps (``docs/client.md`` tells the whole story):

1. the route plan (policy decisions + ranking, refreshed on the catalog TTL)
   gives the ``provider`` object and the price ceilings;
2. per attempt: a slot from the adaptive limiter, then a ledger reservation of
   the worst case (prompt estimate × highest prompt price + ``max_tokens`` ×
   highest completion price + request fee);
3. the request is sent; the generation id is attached to the reservation as
   soon as a response names it;
4. the serving provider is checked against the policy (an unallowed one
   quarantines the result), and the reservation is settled to ``usage.cost``
   (with our own estimate beside it), or released when nothing was charged;
5. failures are retried by the :class:`~provider_router.retry.RetryPolicy`;
   a 402 is waited out when it is a temporary in-flight hold, and stops the
   router (:class:`~provider_router.CreditsExhausted`) when credits or the key
   limit ran out.

Logs: ``route.attempt`` (debug) per failed attempt, ``route.done`` (info) per
finished request, ``route.failed`` (warning), ``route.policy_violation`` (error),
``route.credits_exhausted`` (error). The API key never appears in any of them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import TracebackType
from typing import Any, Self

import structlog
from pydantic import SecretStr

from provider_router import _http
from provider_router._completion import Completion, StreamAccumulator, parse_completion
from provider_router._constants import (
    DEFAULT_CATALOG_TTL,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STREAM_IDLE_TIMEOUT,
)
from provider_router._exceptions import (
    APIConnectionError,
    APIStatusError,
    ConfigurationError,
    CreditsExhausted,
    InvalidResponseError,
    NotFoundError,
    PaymentRequiredError,
    RateLimitError,
)
from provider_router._money import to_decimal
from provider_router._types import Clock, JSONObject, Message, Sleep
from provider_router.catalog import Catalog
from provider_router.health import ProviderHealth
from provider_router.ledger import Ledger, Reservation
from provider_router.limiter import AdaptiveLimiter, Outcome
from provider_router.policy import ProviderPolicy
from provider_router.ranking import Workload
from provider_router.records import ModelEndpoints
from provider_router.results import ChatResult, StreamDelta
from provider_router.retry import RetryPolicy
from provider_router.routing import RoutePlan, build_route_plan, estimate_prompt_tokens
from provider_router.sse import DONE

__all__ = ["ChatStream", "Router"]

log = structlog.get_logger(__name__)

_CHAT_PATH = "/chat/completions"
_GENERATION_PATH = "/generation"

TRANSIENT_402_SOURCES = frozenset({"openrouter_in_flight_budget"})
"""``limit_source`` values of a 402 that clears by itself as requests in flight settle."""

DEFAULT_WORKLOAD = Workload(prompt_tokens=500, completion_tokens=2000)
"""The request shape endpoints are ranked for when none is given."""


@dataclass(slots=True)
class _Request:
    """What every attempt of one request shares."""

    body: JSONObject
    payload: bytes
    stream: bool
    key: str
    worst_case: Decimal
    prompt_estimate: int
    plan: RoutePlan
    on_delta: Callable[[StreamDelta], Any] | None
    generation_id: str | None = None
    attempts: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Charged:
    completion: Completion
    cost: Decimal | None
    estimate: Decimal | None
    reserved: Decimal | None


class Router:
    """Sends chat completions for one model only to allowed providers, within a budget.

    Use it as an async context manager::

        async with Router(model="moonshotai/kimi-k2.5",
                          policy=ProviderPolicy(exclude_below="int4"),
                          ledger=SQLiteLedger("run.ledger", limit=Decimal(100))) as router:
            result = await router.chat(messages, max_tokens=8192)

    Args:
        model: the OpenRouter model id.
        policy: which endpoints may serve (default: a policy with no rules).
        ledger: the budget every attempt reserves from; ``None`` spends unchecked.
        max_concurrency: the most requests in flight (the limiter's ceiling).
        base_url: OpenRouter's API root (default ``OPENROUTER_BASE_URL``, else
            ``https://openrouter.ai/api/v1``).
        api_key: the key (default ``OPENROUTER_API_KEY``); kept as a ``SecretStr``.
        catalog: a :class:`~provider_router.Catalog` to read endpoints from
            (default: one of our own on the same base URL and key).
        endpoints: a fixed endpoint listing instead of a catalog (no refresh).
        retry: the retry policy (default :class:`RetryPolicy`).
        workload: the request shape endpoints are ranked for.
        allow_fallbacks: let OpenRouter fall back inside the allowed set.
        budget_wait: passed to :meth:`Ledger.reserve`: ``False`` raises
            :class:`~provider_router.BudgetExhausted` at once, ``True`` waits for
            requests in flight to settle, a number waits at most that long.
        catalog_ttl: seconds before the route plan is rebuilt from a fresh listing.
        request_timeout: seconds for a whole non-streaming request.
        stream_idle_timeout: seconds allowed between two stream events
            (keep-alive comments do not count as events).
        stream_deadline: seconds for a whole stream.
        connect_timeout: seconds to open a connection.
        credits_hold_timeout: seconds one request may spend waiting out
            temporary (in-flight hold) 402s.
        limiter: the concurrency limiter (default: AIMD up to ``max_concurrency``).
        health: per-provider health tracking (default :class:`ProviderHealth`).
        params: default request parameters merged under each call's own.
        clock: monotonic seconds; sleep: awaited between retries; rng: jitter.
    """

    def __init__(
        self,
        model: str,
        *,
        policy: ProviderPolicy | None = None,
        ledger: Ledger | None = None,
        max_concurrency: int = 2000,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        catalog: Catalog | None = None,
        endpoints: ModelEndpoints | None = None,
        retry: RetryPolicy | None = None,
        workload: Workload | None = None,
        allow_fallbacks: bool = True,
        budget_wait: bool | float = False,
        catalog_ttl: float = DEFAULT_CATALOG_TTL,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
        stream_deadline: float = DEFAULT_REQUEST_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        credits_hold_timeout: float = 300.0,
        limiter: AdaptiveLimiter | None = None,
        health: ProviderHealth | None = None,
        params: Mapping[str, Any] | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not isinstance(model, str) or "/" not in model:
            raise ConfigurationError(f"model must be an 'author/slug' id, got {model!r}")
        for name, value in (
            ("catalog_ttl", catalog_ttl),
            ("request_timeout", request_timeout),
            ("stream_idle_timeout", stream_idle_timeout),
            ("stream_deadline", stream_deadline),
            ("connect_timeout", connect_timeout),
        ):
            if not value > 0:
                raise ConfigurationError(f"{name} must be > 0 seconds, got {value!r}")
        self.model = model
        self.policy = policy if policy is not None else ProviderPolicy()
        self.ledger = ledger
        self.base_url = _http.resolve_base_url(base_url)
        self._api_key = _http.resolve_api_key(api_key)
        self._catalog = catalog
        self._own_catalog = False
        self._endpoints = endpoints
        self.retry = retry if retry is not None else RetryPolicy()
        self.workload = workload if workload is not None else DEFAULT_WORKLOAD
        self.allow_fallbacks = allow_fallbacks
        self.budget_wait = budget_wait
        self.catalog_ttl = catalog_ttl
        self.limiter = (
            limiter if limiter is not None else AdaptiveLimiter(max_concurrency, clock=clock)
        )
        self.health = health if health is not None else ProviderHealth(clock=clock)
        self._params = dict(params or {})
        self._clock = clock
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._request_timeout = request_timeout
        self._stream_idle_timeout = stream_idle_timeout
        self._stream_deadline = stream_deadline
        self._connect_timeout = connect_timeout
        self._credits_hold_timeout = credits_hold_timeout
        self._http: _http.HttpClient | None = None
        self._plan: RoutePlan | None = None
        self._plan_time = 0.0
        self._refresh: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._stopped: CreditsExhausted | None = None
        self._stopped_message = ""
        self._seq = itertools.count(1)
        self._in_flight = 0
        self.spent = Decimal(0)
        """USD this router charged to its ledger (settled costs)."""
        self.requests = 0
        """Requests finished successfully."""
        self.failures = 0
        """Requests that raised."""
        self.quarantined = 0
        """Requests served by a provider the policy does not allow."""

    def __repr__(self) -> str:
        state = "open" if self._http is not None else "closed"
        return f"Router(model={self.model!r}, base_url={self.base_url!r}, {state})"

    # --- life cycle -------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the connection pool and build the first route plan."""
        if self._http is not None:
            return
        self._http = _http.HttpClient(
            self.base_url,
            self._api_key,
            connect_timeout=self._connect_timeout,
            limit=self.limiter.max_concurrency,
        )
        try:
            if self._endpoints is None and self._catalog is None:
                self._catalog = Catalog(ttl=self.catalog_ttl, http=self._http)
                self._own_catalog = True
            await self._rebuild_plan()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Finish pending reconciliations (briefly), then close connections."""
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
            self._refresh = None
        if self._background:
            _, pending = await asyncio.wait(self._background, timeout=30.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._own_catalog and self._catalog is not None:
            await self._catalog.aclose()
            self._catalog = None
            self._own_catalog = False
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    # --- the route plan -----------------------------------------------------------

    @property
    def plan(self) -> RoutePlan:
        """The route plan in force (raises if the router is not open)."""
        if self._plan is None:
            raise ConfigurationError("the Router is not open: use `async with Router(...)`")
        return self._plan

    async def _rebuild_plan(self) -> None:
        if self._endpoints is not None:
            listing = self._endpoints
        else:
            assert self._catalog is not None
            listing = await self._catalog.endpoints(self.model, refresh=self._plan is not None)
        decisions = self.policy.evaluate(listing, model_id=self.model)
        self._plan = build_route_plan(
            self.model, decisions, workload=self.workload, allow_fallbacks=self.allow_fallbacks
        )
        self._plan_time = self._clock()
        log.info(
            "route.plan",
            model=self.model,
            order=list(self._plan.order),
            ignore=list(self._plan.ignore),
            max_price=self._plan.provider_object()["max_price"],
        )

    async def _refresh_plan(self) -> None:
        try:
            await self._rebuild_plan()
        except Exception as exc:
            # Keep routing on the old plan; try again after another TTL.
            self._plan_time = self._clock()
            log.warning("route.plan_refresh_failed", model=self.model, error=str(exc))

    def _current_plan(self) -> RoutePlan:
        plan = self.plan
        if (
            self._endpoints is None
            and self._clock() - self._plan_time >= self.catalog_ttl
            and (self._refresh is None or self._refresh.done())
        ):
            self._refresh = asyncio.create_task(self._refresh_plan())
        return plan

    # --- requests -------------------------------------------------------------------

    @property
    def stopped(self) -> CreditsExhausted | None:
        """Why the router takes no new work (credits ran out), or ``None``."""
        return self._stopped

    @property
    def in_flight(self) -> int:
        """Requests started and not finished."""
        return self._in_flight

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        stream: bool = False,
        key: str | None = None,
        on_delta: Callable[[StreamDelta], Any] | None = None,
        **params: Any,
    ) -> ChatResult:
        """Send one chat completion and return its result.

        Args:
            messages: OpenAI-format chat messages.
            max_tokens: the completion cap; required with a ledger (the worst case
                is priced from it).
            stream: read the answer as a stream (idle timeout and deadline apply)
                and return it whole.
            key: the label of the ledger reservation (e.g. a prompt id).
            on_delta: called with each :class:`StreamDelta` of a stream.
            **params: further request fields (``temperature``, ``reasoning``...).
                ``model`` and ``provider`` are the router's.

        Raises:
            CreditsExhausted: OpenRouter's credits or the key limit ran out (now or
                earlier: the router then takes no new work).
            BudgetExhausted: the ledger cannot cover the worst case.
            AllAttemptsFailed: every attempt failed with a retryable error.
            APIStatusError: a non-retryable answer (400, 401, 403, 404...).
        """
        if self._stopped is not None:
            raise self._stopped_error()
        request = self._build_request(messages, max_tokens, stream, key, on_delta, params)
        start = self._clock()
        self._in_flight += 1
        try:
            charged = await self.retry.run(
                lambda n: self._attempt(request, n),
                sleep=self._sleep,
                clock=self._clock,
                rng=self._rng,
            )
        except BaseException as exc:
            self.failures += 1
            log.warning(
                "route.failed",
                model=self.model,
                key=request.key,
                attempts=request.attempts,
                error_type=type(exc).__name__,
                error=str(exc),
            )
            raise
        finally:
            self._in_flight -= 1
        return self._finish(request, charged, self._clock() - start)

    def _build_request(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        stream: bool,
        key: str | None,
        on_delta: Callable[[StreamDelta], Any] | None,
        params: Mapping[str, Any],
    ) -> _Request:
        if self._http is None:
            raise ConfigurationError("the Router is not open: use `async with Router(...)`")
        if max_tokens is None and self.ledger is not None:
            raise ConfigurationError("max_tokens is required when a ledger is used")
        if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
            raise ConfigurationError(f"max_tokens must be a positive int, got {max_tokens!r}")
        for reserved_name in ("model", "provider", "messages", "stream"):
            if reserved_name in params:
                raise ConfigurationError(f"{reserved_name!r} is set by the Router, not per call")
        plan = self._current_plan()
        body: JSONObject = {"model": self.model, "messages": messages}
        if self._params:
            body.update(self._params)
        if params:
            body.update(params)
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stream:
            body["stream"] = True
        body["provider"] = plan.provider_object(self.health.demoted())
        prompt_estimate = estimate_prompt_tokens(messages)
        return _Request(
            body=body,
            payload=json.dumps(body, separators=(",", ":")).encode(),
            stream=stream,
            key=key if key is not None else f"req-{next(self._seq)}",
            worst_case=plan.worst_case(prompt_estimate, max_tokens or 0),
            prompt_estimate=prompt_estimate,
            plan=plan,
            on_delta=on_delta,
        )

    def stream(
        self, messages: Sequence[Message], *, max_tokens: int | None = None, **params: Any
    ) -> ChatStream:
        """Stream a chat completion: ``async with router.stream(...) as s: async for d in s``.

        Deltas of a retried attempt carry a higher ``attempt`` (see
        :class:`StreamDelta`); :attr:`ChatStream.result` holds the final result.
        """
        return ChatStream(self, messages, max_tokens=max_tokens, params=params)

    def _finish(self, request: _Request, charged: _Charged, latency: float) -> ChatResult:
        completion = charged.completion
        plan = request.plan
        quarantined = completion.provider not in plan.allowed_providers
        reason = None
        if quarantined:
            self.quarantined += 1
            reason = (
                f"served by {completion.provider!r}, not one of the allowed providers "
                f"({', '.join(sorted(plan.allowed_providers))})"
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
        result = ChatResult(
            text=completion.text,
            reasoning=completion.reasoning,
            provider=completion.provider,
            model=completion.model,
            generation_id=completion.generation_id,
            finish_reason=completion.finish_reason,
            usage=usage,
            cost=charged.cost,
            estimate=charged.estimate,
            reserved=charged.reserved,
            quarantined=quarantined,
            quarantine_reason=reason,
            attempts=request.attempts,
            latency=latency,
            message=completion.message,
            native_finish_reason=completion.native_finish_reason,
        )
        log.info(
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
        return result

    # --- one attempt ------------------------------------------------------------------

    async def _attempt(self, request: _Request, attempt: int) -> _Charged:
        if self._stopped is not None:
            raise self._stopped_error()
        request.attempts = attempt
        request.generation_id = None
        ticket = await self.limiter.acquire()
        outcome: Outcome = "neutral"
        started = self._clock()
        reservation: Reservation | None = None
        try:
            if self.ledger is not None:
                reservation = await self.ledger.reserve(
                    request.worst_case, key=request.key, wait=self.budget_wait
                )
            completion = await self._exchange_holding_402(request, attempt, reservation)
            charged = await self._charge(request, completion, reservation)
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
            if reservation is not None:
                await self._close_failed(reservation, request, exc)
            if isinstance(exc, Exception):
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
            self.limiter.release(ticket, outcome)

    async def _exchange_holding_402(
        self, request: _Request, attempt: int, reservation: Reservation | None
    ) -> Completion:
        waited = 0.0
        while True:
            try:
                return await self._exchange(request, attempt, reservation)
            except PaymentRequiredError as exc:
                delay = exc.retry_after if exc.retry_after and exc.retry_after > 0 else 1.0
                transient = exc.limit_source in TRANSIENT_402_SOURCES
                if transient and waited + delay <= self._credits_hold_timeout:
                    log.info(
                        "route.credits_hold",
                        model=self.model,
                        key=request.key,
                        retry_after=delay,
                        in_flight=self._in_flight,
                    )
                    waited += delay
                    await self._sleep(delay)
                    continue
                if transient:
                    raise  # held for too long: fail this request, keep the router going
                await self._stop_for_credits(exc)
                raise self._stopped_error() from exc

    async def _exchange(
        self, request: _Request, attempt: int, reservation: Reservation | None
    ) -> Completion:
        http = self._http
        if http is None:
            raise ConfigurationError("the Router was closed")
        if request.stream:
            post = http.post(
                _CHAT_PATH,
                request.payload,
                request_timeout=self._stream_deadline,
                idle_timeout=self._stream_idle_timeout,
            )
        else:
            post = http.post(_CHAT_PATH, request.payload, request_timeout=self._request_timeout)
        async with post as response:
            generation_id = response.headers.get("x-generation-id")
            if generation_id:
                request.generation_id = generation_id
                if reservation is not None:
                    await self.ledger.attach(reservation, generation_id)  # type: ignore[union-attr]
            if not request.stream:
                return parse_completion(await response.json())
            return await self._read_stream(request, attempt, reservation, response)

    async def _read_stream(
        self,
        request: _Request,
        attempt: int,
        reservation: Reservation | None,
        response: _http.PostResponse,
    ) -> Completion:
        accumulator = StreamAccumulator()
        on_delta = request.on_delta
        done = False
        async for data in response.events(idle_timeout=self._stream_idle_timeout):
            if data == DONE:
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise InvalidResponseError(f"a stream event is not JSON: {data[:200]!r}") from exc
            known = accumulator.result.generation_id
            delta = accumulator.feed(chunk, attempt)
            generation_id = accumulator.result.generation_id
            if known is None and generation_id and request.generation_id is None:
                request.generation_id = generation_id
                if reservation is not None and self.ledger is not None:
                    await self.ledger.attach(reservation, generation_id)
            if delta is not None and on_delta is not None:
                on_delta(delta)
        completion = accumulator.finish()
        if not done and completion.error is None:
            raise APIConnectionError("the stream ended before its [DONE] event")
        return completion

    # --- money ----------------------------------------------------------------------------

    async def _charge(
        self, request: _Request, completion: Completion, reservation: Reservation | None
    ) -> _Charged:
        """Settle (or release) the reservation of an attempt that got an answer."""
        usage = completion.usage
        cost = usage.cost if usage is not None else None
        estimate = None
        if usage is not None:
            estimate = request.plan.estimate(
                completion.provider,
                usage.prompt_tokens,
                usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                cache_write_tokens=usage.cache_write_tokens,
            )
        if completion.error is not None and cost is None:
            # Zero completion insurance: an error finish is not charged.
            if reservation is not None and self.ledger is not None:
                await self.ledger.release(reservation)
            return _Charged(completion, None, estimate, None)
        if cost is None:
            generation_id = completion.generation_id or request.generation_id
            if generation_id:
                cost = await self.generation_cost(generation_id)
            if cost is None:
                cost = request.worst_case
                log.warning(
                    "route.cost_unknown",
                    model=self.model,
                    key=request.key,
                    generation_id=generation_id,
                    charged=str(cost),
                )
        if reservation is not None and self.ledger is not None:
            await self.ledger.settle(
                reservation,
                cost,
                estimate=estimate,
                provider=completion.provider,
                generation_id=completion.generation_id or request.generation_id,
            )
        self.spent += cost
        return _Charged(
            completion, cost, estimate, reservation.amount if reservation is not None else None
        )

    async def _close_failed(
        self, reservation: Reservation, request: _Request, exc: BaseException
    ) -> None:
        """Release or reconcile the reservation of an attempt that failed."""
        ledger = self.ledger
        if ledger is None:
            return
        never_billed = isinstance(exc, APIStatusError | CreditsExhausted) or (
            request.generation_id is None and isinstance(exc, Exception)
        )
        if never_billed and isinstance(exc, Exception):
            await ledger.release(reservation)
            return
        # The provider may have produced (and billed) something, or we were
        # cancelled mid-request: ask OpenRouter in the background (a cancelled
        # task must not wait here), counting the worst case if it cannot say.
        task = asyncio.ensure_future(self._reconcile(reservation, request.generation_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reconcile(self, reservation: Reservation, generation_id: str | None) -> None:
        ledger = self.ledger
        assert ledger is not None
        cost = await self.generation_cost(generation_id) if generation_id else None
        charged = cost if cost is not None else reservation.amount
        await ledger.settle(reservation, charged, generation_id=generation_id)
        self.spent += charged
        log.info(
            "route.reconciled",
            model=self.model,
            generation_id=generation_id,
            cost=str(charged),
            worst_case=cost is None,
        )

    async def generation_cost(
        self, generation_id: str, *, attempts: int = 6, delay: float = 0.5
    ) -> Decimal | None:
        """The authoritative cost of a generation from ``GET /generation?id=``.

        The record appears a little after the response, so a 404 is retried
        (``attempts`` times, doubling ``delay``). ``None`` when it never appears
        or the lookup fails: the caller then counts the worst case.
        """
        http = self._http
        if http is None:
            raise ConfigurationError("the Router is not open: use `async with Router(...)`")
        wait = delay
        for attempt in range(1, attempts + 1):
            try:
                body = await http.get_json(_GENERATION_PATH, params={"id": generation_id})
            except NotFoundError:
                if attempt == attempts:
                    return None
                await self._sleep(wait)
                wait *= 2
                continue
            except (APIStatusError, APIConnectionError, InvalidResponseError) as exc:
                log.warning(
                    "route.generation_lookup_failed", generation_id=generation_id, error=str(exc)
                )
                return None
            data = body.get("data") if isinstance(body, Mapping) else None
            total = data.get("total_cost") if isinstance(data, Mapping) else None
            if total is None:
                return None
            try:
                return to_decimal(total, what="total_cost")
            except ValueError:
                return None
        return None

    async def resolve(self, reservation: Reservation) -> Decimal | None:
        """A :data:`~provider_router.ledger.Resolver` for ``Ledger.recover``.

        Resolves an orphaned reservation's cost through its generation id;
        ``None`` (count the worst case) when it has none or the lookup fails.
        """
        if not reservation.generation_id:
            return None
        return await self.generation_cost(reservation.generation_id)

    def _stopped_error(self) -> CreditsExhausted:
        # A fresh instance per raise: concurrent requests must not share a traceback.
        stopped = self._stopped
        assert stopped is not None
        return CreditsExhausted(
            self._stopped_message,
            limit_source=stopped.limit_source,
            spent=self.spent,
            remaining=stopped.remaining,
        )

    async def _stop_for_credits(self, exc: PaymentRequiredError) -> None:
        if self._stopped is None:
            remaining = None
            if self.ledger is not None:
                try:
                    remaining = (await self.ledger.snapshot()).available
                except Exception:  # a report, not a reason to fail differently
                    remaining = None
            self._stopped_message = (
                f"OpenRouter refused with 402 ({exc.message}); the router takes no new work"
            )
            self._stopped = CreditsExhausted(
                self._stopped_message,
                limit_source=exc.limit_source,
                spent=self.spent,
                remaining=remaining,
            )
            log.error(
                "route.credits_exhausted",
                model=self.model,
                limit_source=exc.limit_source,
                spent=str(self.spent),
                in_flight=self._in_flight,
            )


class ChatStream:
    """An async iterator of :class:`StreamDelta` for one streamed request.

    Use as ``async with router.stream(...) as stream: async for delta in stream``;
    afterwards :attr:`result` is the :class:`ChatResult`. Leaving the block early
    cancels the request.
    """

    def __init__(
        self,
        router: Router,
        messages: Sequence[Message],
        *,
        max_tokens: int | None,
        params: Mapping[str, Any],
    ) -> None:
        self._router = router
        self._messages = messages
        self._max_tokens = max_tokens
        self._params = dict(params)
        self._queue: asyncio.Queue[StreamDelta | None] = asyncio.Queue()
        self._task: asyncio.Task[ChatResult] | None = None
        self.result: ChatResult | None = None

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                self._router.chat(
                    self._messages,
                    max_tokens=self._max_tokens,
                    stream=True,
                    on_delta=self._queue.put_nowait,
                    **self._params,
                )
            )
            self._task.add_done_callback(lambda _: self._queue.put_nowait(None))

    def __aiter__(self) -> AsyncIterator[StreamDelta]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[StreamDelta]:
        self._start()
        assert self._task is not None
        while True:
            delta = await self._queue.get()
            if delta is None:
                break
            yield delta
        self.result = await self._task

    async def aclose(self) -> None:
        """Cancel the request if it is still running."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif task is not None and task.done() and not task.cancelled():
            # Surface nothing here: the iterator re-raises the task's error.
            task.exception()
