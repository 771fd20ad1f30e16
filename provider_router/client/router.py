"""The routed, budgeted async client: :class:`Router`.

A request takes the route plan in force (:mod:`._live_plan`: policy and ranking,
rebuilt on the catalog TTL), is prepared once (:mod:`._prepare`: checked, encoded,
measured, pinned), and each attempt (:mod:`._attempt`) takes a limiter slot, is
admitted to one endpoint (:mod:`.admission`: the best with room within
``max_premium``), reserves that endpoint's worst case, sends there alone and settles
(:mod:`._billing`); failures are retried by the
:class:`~provider_router.client.retry.RetryPolicy`. Options are :mod:`._config`'s
value objects. Logs go to the stdlib logger ``provider_router.client.router``
(silent unless the application configures logging); the key never appears in them.
docs/client.md tells the whole story.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from ssl import SSLContext
from typing import Any

from pydantic import SecretStr

from provider_router._constants import (
    DEFAULT_BUDGET_WAIT,
    DEFAULT_CATALOG_TTL,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_PREMIUM,
)
from provider_router._exceptions import ConfigurationError, CreditsExhausted, LedgerWriteError
from provider_router._http import session as _http
from provider_router._http.options import check_headers, check_ssl
from provider_router._log import get_logger
from provider_router._resource import AsyncResource
from provider_router._types import Clock, Message, Sleep
from provider_router.catalog._billable import check_fields, field_tokens
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.client._attempt import AttemptMixin
from provider_router.client._billing import Billing
from provider_router.client._config import (
    DEFAULT_SLOW_START,
    DEFAULT_WORKLOAD,
    AffinityOptions,
    Safeguards,
    Timeouts,
    cache_workload,
    check_ledger,
    check_model,
    check_params,
    option,
    pinning,
)
from provider_router.client._cost_check import CostVerdict
from provider_router.client._deprecated import Given, fold_deprecated
from provider_router.client._live_plan import NOT_OPEN, LivePlan
from provider_router.client._prepare import PrepareMixin
from provider_router.client._request import PreparedRequest, RequestEncoder
from provider_router.client._response_cache import cache_ttl_of
from provider_router.client.admission import Admission, check_max_premium
from provider_router.client.affinity import CacheAffinity
from provider_router.client.health import ProviderHealth
from provider_router.client.limiter import AdaptiveLimiter
from provider_router.client.metrics import Metrics
from provider_router.client.results import ChatResult, StreamDelta
from provider_router.client.retry import RetryPolicy
from provider_router.client.streaming import ChatStream
from provider_router.ledger import Ledger, Reservation
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload
from provider_router.routing.route_plan import RoutePlan

__all__ = ["AffinityOptions", "ChatStream", "Router", "Safeguards", "Timeouts"]

log = get_logger(__name__)


def _less_waited(clock: Clock, request: PreparedRequest) -> float:
    return clock() - request.waited


class Router(PrepareMixin, AttemptMixin, AsyncResource):
    """Sends chat completions for one model only to allowed providers, within a budget.

    Use it as an async context manager::

        async with Router(model="moonshotai/kimi-k2.5",
                          policy=ProviderPolicy(exclude_below="int4"),
                          ledger=SQLiteLedger("run.ledger", limit=Decimal(100)),
                          timeouts=Timeouts(request=300)) as router:
            result = await router.chat(messages, max_tokens=8192)

    Args:
        model: the OpenRouter model id.
        policy: which endpoints may serve (default: a policy with no rules).
        ledger: the budget every attempt reserves from; ``None`` spends unchecked.
        budget_wait: passed to :meth:`Ledger.reserve`: ``False`` raises
            :class:`~provider_router.BudgetExhausted` at once, ``True`` waits for
            requests in flight to settle, a number waits at most that long (default
            600 s). A request that could not fit even if everything in flight
            settled at no cost is refused at once either way, and waiting requests
            are woken by the settles that free room (``docs/client.md``).
        max_concurrency: the most requests in flight: a number (the default limiter:
            AIMD up to it after a slow start that doubles every 50 ms from 32 until
            the first 429, with every 429 capping the window at the requests in
            flight; default 2000), or an :class:`~provider_router.AdaptiveLimiter`
            of your own (``AdaptiveLimiter(n)``: plain AIMD from ``n``).
        base_url: OpenRouter's API root (default ``OPENROUTER_BASE_URL``, else
            ``https://openrouter.ai/api/v1``).
        api_key: the key (default ``OPENROUTER_API_KEY``); kept as a ``SecretStr``.
        ssl: an :class:`ssl.SSLContext` for the ``https://`` base URL (a private CA,
            a client certificate); default: the system's CAs (``SSL_CERT_FILE``
            honoured). Used by the completions and the router's own catalog.
        headers: extra headers sent with every request, e.g. OpenRouter's
            attribution headers ``{"HTTP-Referer": "https://example.org",
            "X-OpenRouter-Title": "my job"}``, OpenRouter's response cache
            (``cache_headers(ttl)``: ``X-OpenRouter-Cache: true``; docs/client.md,
            "Response caching": each body then carries a sample id from its ``key``,
            so two samples of one prompt never share an answer, and a hit is booked
            at $0 on the answer's word), or OpenRouter's routing trace,
            :data:`~provider_router.client.router_metadata.METADATA_HEADERS`
            (``X-OpenRouter-Metadata: enabled``: each result's ``router_metadata``);
            a header the library sets itself
            (``Authorization``, ``Host``, ``Content-Length``, ``Content-Type``,
            ``Transfer-Encoding``, ``Connection``...) is refused with a
            :class:`~provider_router.ConfigurationError` naming it.
        endpoints: where the model's endpoints come from: a fixed
            :class:`~provider_router.ModelEndpoints` listing (never refreshed), or a
            :class:`~provider_router.Catalog` of yours (the route plan is rebuilt
            every ``Catalog.ttl`` seconds; you close it); default: a catalog of the
            router's own on its base URL, key and connection, refreshed every 300 s
            (OpenRouter's own max-age).
        workload: the request shape endpoints are ranked for.
        max_premium: the most this router pays above the floor, averaged over its
            requests, as a share of the floor (``0.02``, the default: 2 %). The
            floor is every token at the cheapest allowed endpoint's price (for the
            router's workload). The best endpoint with room always serves; a dearer
            one serves only while the requests so far leave room in the average;
            otherwise a request waits, first in first out, for an endpoint it may
            use. ``0``: the floor alone, waits as long as its capacity makes them;
            ``None``: latency first, the cheapest endpoint with room, waiting only
            when every allowed endpoint is full.
        cache_affinity: pin every session to one allowed endpoint, sent as
            ``session_id`` with a one-tag ``only`` (docs/client.md, "Cache-aware
            pinning"): a call's own ``session_id``, else the conversation (the
            messages up to its first user message). ``True`` pins with the default
            :class:`AffinityOptions`, an :class:`AffinityOptions` with those. Off
            (``False``, the default): a ``session_id`` is sent as given and nothing
            is pinned.
        params: default request parameters merged under each call's own. Its
            ``provider`` may carry the routing fields the policy does not decide
            (``enforce_distillable_text``, ``zdr``, ``data_collection``): they join
            every request's ``provider`` object.
        retry: the retry policy (default :class:`RetryPolicy`; its ``rng`` seeds
            the backoff's jitter).
        timeouts: how long each part of a request may take (default
            :class:`Timeouts`: 600 s a request, 10 s to connect, 120 s between
            stream events, a stream deadline that scales with ``max_tokens``).
        safeguards: when the router waits out 402 holds, doubts a cost or halts
            (default :class:`Safeguards`: 300 s of 402 holds, costs above 2× their
            reservation checked, 3 policy violations in a row halt).
        health: per-provider health tracking (default :class:`ProviderHealth`).
        metrics: live Prometheus metrics (:class:`~provider_router.Metrics`); ``None``
            (the default) costs nothing per request.
        clock: monotonic seconds; sleep: awaited between retries and 402 holds.
        **deprecated: the previous release's keywords (``request_timeout``,
            ``connect_timeout``, ``stream_idle_timeout``, ``stream_deadline``,
            ``credits_hold_timeout``, ``cost_sanity_factor``,
            ``max_violations_in_a_row``, ``pin_fallbacks``, ``cache_hit_rate``,
            ``catalog``, ``catalog_ttl``, ``limiter``, ``rng``; ``allow_fallbacks``,
            which no longer affects requests: each attempt goes to one endpoint
            admission chose, with ``allow_fallbacks: false``), still taken with a
            ``DeprecationWarning`` naming the new spelling; one given with the
            argument that replaces it is a :class:`~provider_router.ConfigurationError`.
    """

    def __init__(
        self,
        model: str,
        *,
        policy: ProviderPolicy | None = None,
        ledger: Ledger | None = None,
        budget_wait: bool | float = DEFAULT_BUDGET_WAIT,
        max_concurrency: int | AdaptiveLimiter = DEFAULT_MAX_CONCURRENCY,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        ssl: SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        endpoints: ModelEndpoints | Catalog | None = None,
        workload: Workload | None = None,
        max_premium: Decimal | float | str | None = DEFAULT_MAX_PREMIUM,
        cache_affinity: bool | AffinityOptions = False,
        params: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        timeouts: Timeouts | None = None,
        safeguards: Safeguards | None = None,
        health: ProviderHealth | None = None,
        metrics: Metrics | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        **deprecated: Any,
    ) -> None:
        catalog_ttl: float | None = None
        allow_fallbacks = True
        if deprecated:
            given = Given(timeouts, cache_affinity, safeguards, endpoints, max_concurrency, retry)
            (
                timeouts,
                cache_affinity,
                safeguards,
                endpoints,
                max_concurrency,
                retry,
                catalog_ttl,
                allow_fallbacks,
            ) = fold_deprecated(given, deprecated)
        self.model = check_model(model)
        self.max_premium = check_max_premium(max_premium)
        """The most paid above the floor, averaged, as a share (``None``: no cap)."""
        check_params(params)
        check_ledger(ledger)
        self.timeouts = option("timeouts", timeouts, Timeouts)
        """How long each part of a request may take (read-only)."""
        self.safeguards = option("safeguards", safeguards, Safeguards)
        """When the router waits out 402 holds, doubts a cost or halts (read-only)."""
        self.cache_affinity = options = pinning(cache_affinity)
        """The pinning options in force, or ``None``: nothing is pinned."""
        self._pin_fallbacks = options is not None and options.pin_fallbacks
        self._fields: dict[str, Any] = dict(params or {})
        # The caller's provider fields (enforce_distillable_text, zdr, data_collection)
        # join the routing object the plan builds; they are not a body field of their own.
        provider_fields = self._fields.pop("provider", None)
        check_fields(self._fields, "Router(params=...)")
        self._field_tokens = field_tokens(self._fields)
        self._caps: dict[int | None, int | None] = {}  # completion cap by max_tokens
        self.base_url = _http.resolve_base_url(base_url)
        self._api_key = _http.resolve_api_key(api_key)
        if catalog_ttl is None:
            catalog_ttl = endpoints.ttl if isinstance(endpoints, Catalog) else DEFAULT_CATALOG_TTL
        workload = workload if workload is not None else DEFAULT_WORKLOAD
        self._plans = LivePlan(
            model,
            policy if policy is not None else ProviderPolicy(),
            endpoints,
            ttl=catalog_ttl,
            workload=workload,
            allow_fallbacks=allow_fallbacks,
            cache_workload=cache_workload(workload, options or AffinityOptions()),
            clock=clock,
        )
        self.retry = retry if retry is not None else RetryPolicy()
        self.affinity = CacheAffinity()
        """Which endpoint each pinned session goes to (``pinned`` and ``moves`` count)."""
        self.budget_wait = budget_wait
        self.limiter = (
            max_concurrency
            if isinstance(max_concurrency, AdaptiveLimiter)
            else AdaptiveLimiter(
                max_concurrency,
                slow_start=DEFAULT_SLOW_START,
                shrink_to_in_flight=True,
                accelerate=True,
                clock=clock,
            )
        )
        self.health = health if health is not None else ProviderHealth(clock=clock)
        self._encoder = RequestEncoder(model, self._fields, provider_fields)
        self._default_logprobs = self._fields.get("logprobs") is True
        self._clock = clock
        self._sleep = sleep
        self._rng = self.retry.rng if self.retry.rng is not None else random.Random()
        self._ssl = check_ssl(ssl)
        self._headers = check_headers(headers or {}, "Router(headers=...)")
        self.response_cache = cache_ttl_of(self._headers)
        """Seconds OpenRouter keeps an answer for a re-send (the headers ask for its
        response cache), or ``None``: caching off."""
        self._http: _http.HttpClient | None = None
        self._billing = Billing(
            model,
            ledger,
            self._open_http,
            sleep,
            credits_hold_timeout=self.safeguards.credits_hold_timeout,
            clock=clock,
            cost_sanity_factor=Decimal(self.safeguards.cost_sanity_factor),
        )
        self._admission: Admission | None = None
        self._violations_in_a_row = 0
        self._violations_halt: str | None = None
        self._seq = itertools.count(1)
        self._in_flight = 0
        self._stopping = asyncio.Event()
        self._billing.stopping = self._stopping
        self.requests = 0
        """Requests finished successfully."""
        self.failures = 0
        """Requests that raised."""
        self.quarantined = 0
        """Requests served by a provider the policy does not allow."""
        self.unknown_provider = 0
        """Requests whose response named no provider (kept: not a violation)."""
        self.cache_saved = Decimal(0)
        """USD prompt caching saved on the answers so far: their cached tokens at the
        serving provider's prompt price less its cache-read price (exact)."""
        self.metrics = metrics
        self._metrics_task: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.watch(lambda: self.limiter.window, lambda: self._in_flight)

    def stop(self) -> None:
        """Start no new attempt of any request from now on (a batch's first Ctrl-C).

        Attempts in flight finish (or are cut at their deadline); a retry's back-off
        under way is cut short, and a request that would start another attempt, or
        its first, raises :class:`RouterStopping` instead, reserving nothing. There
        is no undo: a stopped router is closed, not restarted.
        """
        if not self._stopping.is_set():
            log.info("route.stopping", model=self.model, in_flight=self._in_flight)
            self._stopping.set()
            if self._admission is not None:
                self._admission.stop()  # requests waiting for an endpoint: not sent

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (no new attempt starts)."""
        return self._stopping.is_set()

    def __repr__(self) -> str:
        state = "open" if self._http is not None else "closed"
        return f"Router(model={self.model!r}, base_url={self.base_url!r}, {state})"

    @property
    def ledger(self) -> Ledger | None:
        """The budget every attempt reserves from (``None``: unchecked)."""
        return self._billing.ledger

    @ledger.setter
    def ledger(self, ledger: Ledger | None) -> None:
        self._billing.ledger = ledger

    @property
    def spent(self) -> Decimal:
        """USD this router charged to its ledger (settled costs)."""
        return self._billing.spent

    def _open_http(self) -> _http.HttpClient:
        http = self._http
        if http is None:
            raise ConfigurationError(NOT_OPEN)
        return http

    # --- life cycle -------------------------------------------------------------

    async def _on_enter(self) -> None:
        await self.open()

    async def _on_exit(self) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the connection pool and build the first route plan."""
        if self._http is not None:
            return
        self._http = _http.HttpClient(
            self.base_url,
            self._api_key,
            connect_timeout=self.timeouts.connect,
            limit=self.limiter.max_concurrency,
            headers=self._headers,
            ssl=self._ssl,
        )
        try:
            await self._plans.open(self._http)
        except BaseException:
            await self.close()
            raise
        self._admission = Admission(
            self._plans.plan,
            max_premium=self.max_premium,
            max_concurrency=self.limiter.max_concurrency,
            clock=self._clock,
            demoted=self.health.demoted,
            max_rest=self.retry.max_retry_after,
            provider_fields=self._encoder.provider_fields,
        )
        if self._stopping.is_set():
            self._admission.stop()
        if self.metrics is not None:
            self.metrics.watch_admission(self._admission)
        if self.metrics is not None:
            self._metrics_task = asyncio.ensure_future(self._sample_ledger(self.metrics))

    async def _sample_ledger(self, metrics: Metrics) -> None:
        """Keep the metrics' spend, reserved and limit fresh (a ledger read per interval)."""
        while True:
            ledger = self.ledger
            if ledger is not None:
                with contextlib.suppress(Exception):  # a dashboard figure: never fail for it
                    metrics.ledger_state(await ledger.snapshot())
            # A background cadence, not a retry: the injected sleep is for retries.
            await asyncio.sleep(metrics.interval)

    async def close(self) -> None:
        """Finish pending reconciliations (briefly), then close connections.

        Held reservations without a generation id are counted at their worst case
        (nothing can ever say what they cost); held ones with an id stay open for
        the next recovery to settle through ``/generation``.
        """
        await self._plans.close()
        if self._admission is not None:
            self._admission.stop("not sent: the router was closed")
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            await asyncio.gather(self._metrics_task, return_exceptions=True)
            self._metrics_task = None
        await self._billing.drain(grace=30.0)
        await self._billing.close_unresolved()
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    # --- the route plan -----------------------------------------------------------

    @property
    def plan(self) -> RoutePlan:
        """The route plan in force (raises if the router is not open)."""
        return self._plans.plan

    @property
    def policy(self) -> ProviderPolicy:
        """The policy the plan in force was built from (:meth:`set_policy` changes it)."""
        return self._plans.policy

    @property
    def workload(self) -> Workload:
        """The request shape endpoints are ranked for."""
        return self._plans.workload

    @property
    def allow_fallbacks(self) -> bool:
        """The route plan's ``allow_fallbacks`` (its ``provider_object``; requests go to
        one endpoint each, with no fallback)."""
        return self._plans.allow_fallbacks

    @property
    def catalog_ttl(self) -> float:
        """Seconds before the route plan is rebuilt from a fresh listing."""
        return self._plans.ttl

    async def set_policy(self, policy: ProviderPolicy) -> None:
        """Route requests under ``policy`` from now on (e.g. a provider that failed a
        re-verification excluded mid-run): new ones, and those waiting for an endpoint
        (an attempt under way finishes where it was sent). A plan refresh under way is
        let finish first; policy and plan change together.

        Raises:
            ProviderRouterError: it could not be applied (the listing could not be read,
                or it allows no endpoint): the router keeps its policy and plan.
        """
        await self._plans.rebuild(policy)
        if self._admission is not None:
            self._admission.update(self._plans.plan)

    @property
    def admission(self) -> Admission:
        """Where each attempt goes: every allowed endpoint's learned capacity, waits and
        refusals (:meth:`Admission.snapshot`; raises if the router is not open)."""
        if self._admission is None:
            raise ConfigurationError(NOT_OPEN)
        return self._admission

    # --- requests -------------------------------------------------------------------

    @property
    def stopped(self) -> CreditsExhausted | None:
        """Why the router takes no new work (a spend limit ran out), or ``None``."""
        return self._billing.stopped

    @property
    def unresolved(self) -> list[Reservation]:
        """Reservations held at their worst case: sent, maybe billed, cost not yet known.

        A timeout or a dropped connection after the request was sent (or a 408 or
        524) may have been billed: its money stays held until ``/generation``
        answers (:meth:`reconcile`) or a later recovery settles it.
        """
        return list(self._billing.unresolved.values())

    async def key_usage(self) -> Decimal | None:
        """What OpenRouter has charged this router's key in all (``GET /key``), if it says."""
        return await self._billing.key_usage()

    async def reconcile(self) -> int:
        """Ask ``/generation`` again for each :attr:`unresolved` reservation with an id.

        Returns how many were settled at their real cost; the others stay held.
        """
        return await self._billing.reconcile()

    @property
    def halted(self) -> str | None:
        """Why a batch using this router must stop, or ``None``.

        Set by a cost above :attr:`Safeguards.cost_sanity_factor` times its
        reservation (or a negative one), confirmed or disputed, or by
        :attr:`Safeguards.max_violations_in_a_row` policy violations in a row.
        The router itself keeps serving: the caller decides (the batch runner stops).
        """
        return self._billing.halted or self._violations_halt

    @property
    def disputes(self) -> list[CostVerdict]:
        """Answers whose ``usage.cost`` was not booked, oldest first (docs/ledger.md).

        Each says what the answer reported (``disputed``), what OpenRouter's
        ``/generation`` record said (``record``), what was booked and why.
        """
        return list(self._billing.disputes)

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
        on_paid: Callable[[ChatResult], Awaitable[None]] | None = None,
        **params: Any,
    ) -> ChatResult:
        """Send one chat completion and return its result.

        Args:
            messages: OpenAI-format chat messages.
            max_tokens: the completion cap; required with a ledger unless
                ``max_completion_tokens`` is given (the worst case is priced from
                the larger of the two).
            stream: read the answer as a stream (idle timeout and deadline apply)
                and return it whole.
            key: the label of the ledger reservation (e.g. a prompt id).
            on_delta: called with each :class:`StreamDelta` of a stream.
            on_paid: awaited with the answer once its cost is known and *before* the
                ledger settles it (its ``latency`` is not known yet: 0): store it
                durably here, and a crash after the settle cannot lose a paid answer
                (the Ray stage does). An error it raises is logged
                (``route.on_paid_failed``) and the settle goes on. An attempt whose
                error finish was charged (a billed partial answer) is handed over
                too, with ``finish_reason="error"``, before it is retried: the hook
                may then run more than once for one call, and only a result whose
                ``finish_reason`` is not ``"error"`` is the call's answer.
            **params: further request fields (``temperature``, ``reasoning``,
                ``tools``...). ``model`` and ``provider`` are the router's; fields
                whose charge cannot be reserved for (``n > 1``, ``models``,
                ``plugins``...) are refused (docs/client.md, "What is reserved").

        Raises:
            CreditsExhausted: a spend limit OpenRouter keeps ran out: the credits,
                the key's limit, a workspace or guardrail budget (now or earlier: the
                router then takes no new work; ``.limit`` says which and what lifts it).
            BudgetExhausted: the ledger cannot cover the worst case.
            ConfigurationError: a field the reservation cannot price.
            AllAttemptsFailed: every attempt failed with a retryable error.
            APIStatusError: a non-retryable answer (400, 401, 403, 404...).
        """
        if self._billing.stopped is not None:
            raise self._billing.stopped_error()
        request = self._build_request(messages, max_tokens, stream, key, on_delta, params)
        if on_paid is not None:
            request.on_paid = on_paid
        start = self._clock()
        self._in_flight += 1
        try:
            # The first attempt is awaited here rather than through RetryPolicy.run:
            # one coroutine layer less on every wake-up of every request. A failed
            # first attempt goes on in RetryPolicy.resume, as run would go on.
            failed: Exception | None = None
            try:
                charged = await self._attempt(request, 1)
            except Exception as exc:
                failed = exc
            if failed is not None:
                charged = await self.retry.resume(
                    failed,
                    # A partial, not a lambda: a lambda would make ``request`` and
                    # ``self`` cells of this frame on every call, two GC-tracked
                    # objects alive for the whole request (docs/performance.md,
                    # "Where a request's CPU goes").
                    functools.partial(self._attempt, request),
                    started=start,
                    sleep=self._sleep,
                    # The deadline counts time not spent waiting for an endpoint: a
                    # job queued for the cheap ones is not failing.
                    clock=functools.partial(_less_waited, self._clock, request),
                    rng=self._rng,
                    stopping=self._stopping,
                )
        except BaseException as exc:
            self.failures += 1
            if self.metrics is not None:
                self.metrics.failed(exc, request.attempts)
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
        result = self._finish(request, charged, self._clock() - start)
        if charged.unsettled is not None:
            raise LedgerWriteError(
                f"the ledger could not record the charge of a paid answer "
                f"(generation {result.generation_id}, ${result.cost}): "
                f"{type(charged.unsettled).__name__}: {charged.unsettled}; the answer is kept "
                "in .result and the reservation stays held for recovery",
                result=result,
            ) from charged.unsettled
        return result

    def stream(
        self, messages: Sequence[Message], *, max_tokens: int | None = None, **params: Any
    ) -> ChatStream:
        """Stream a chat completion: ``async with router.stream(...) as s: async for d in s``.

        Deltas of a retried attempt carry a higher ``attempt`` (see
        :class:`StreamDelta`); :attr:`ChatStream.result` holds the final result.
        """
        return ChatStream(
            lambda on_delta: self.chat(
                messages, max_tokens=max_tokens, stream=True, on_delta=on_delta, **params
            )
        )

    async def generation_cost(
        self, generation_id: str, *, attempts: int = 6, delay: float = 0.5
    ) -> Decimal | None:
        """The authoritative cost of a generation from ``GET /generation?id=``.

        The record appears a little after the response, so a 404 is retried
        (``attempts`` times, doubling ``delay``). ``None`` when it never appears
        or the lookup fails: the caller then counts the worst case.
        """
        return await self._billing.generation_cost(generation_id, attempts=attempts, delay=delay)

    async def resolve(self, reservation: Reservation) -> Decimal | None:
        """A :data:`~provider_router.ledger.CostResolver` for ``Ledger.recover``.

        Resolves an orphaned reservation's cost through its generation id;
        ``None`` (count the worst case) when it has none or the lookup fails.
        """
        if not reservation.generation_id:
            return None
        return await self.generation_cost(reservation.generation_id)
