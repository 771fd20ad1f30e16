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
5. failures are retried by the :class:`~provider_router.client.retry.RetryPolicy`;
   a 402 is waited out when it is a temporary in-flight hold, and stops the
   router (:class:`~provider_router.CreditsExhausted`) when credits or the key
   limit ran out.

Logs (stdlib logger ``provider_router.client.router``, silent unless the application
configures logging): ``route.attempt`` (debug) per failed attempt, ``route.done``
(debug) per finished request, ``route.failed`` (warning), ``route.policy_violation``
(error), ``route.credits_exhausted`` (error). The API key never appears in any of them.

The money side (settle, release, reconcile) lives in :mod:`provider_router.client._billing`,
request encoding in :mod:`provider_router.client._request`, streaming in
:mod:`provider_router.client.streaming`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from ssl import SSLContext
from typing import Any, Final

from pydantic import SecretStr

from provider_router._constants import (
    DEFAULT_BUDGET_WAIT,
    DEFAULT_CATALOG_TTL,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_COST_SANITY_FACTOR,
    DEFAULT_MAX_VIOLATIONS_IN_A_ROW,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STREAM_IDLE_TIMEOUT,
    ENV_API_KEY,
    STREAM_DEADLINE_BASE,
    STREAM_DEADLINE_TOKENS_PER_SECOND,
)
from provider_router._exceptions import (
    ConfigurationError,
    ContextLengthExceeded,
    CreditsExhausted,
    LedgerWriteError,
    PaymentRequiredError,
    RateLimitError,
    RouterStopping,
)
from provider_router._http import session as _http
from provider_router._http.options import check_headers, check_ssl
from provider_router._log import DEBUG, get_logger
from provider_router._resource import AsyncResource
from provider_router._secrets import scrub
from provider_router._types import Clock, Message, Sleep
from provider_router.catalog._billable import (
    IMAGE_PROMPT_TOKENS_BOUND,
    check_fields,
    completion_cap,
    field_tokens,
    measure,
)
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import ModelEndpoints
from provider_router.client._billing import Billing, Charged, unallowed_reason
from provider_router.client._completion import Completion, parse_completion
from provider_router.client._cost_check import CostVerdict
from provider_router.client._request import (
    PreparedRequest,
    RequestEncoder,
    encode_json,
    messages_problem,
)
from provider_router.client.affinity import (
    DEFAULT_CACHE_HIT_RATE,
    CacheAffinity,
    blames_pin,
    session_of,
)
from provider_router.client.health import ProviderHealth
from provider_router.client.limiter import AdaptiveLimiter, Outcome
from provider_router.client.metrics import Metrics
from provider_router.client.results import ChatResult, StreamDelta
from provider_router.client.retry import RetryPolicy
from provider_router.client.streaming import ChatStream, read_stream
from provider_router.ledger import Ledger, Reservation
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload
from provider_router.routing.route_plan import RoutePlan, build_route_plan, cache_saving

__all__ = ["ChatStream", "Router"]

log = get_logger(__name__)

_CHAT_PATH: Final = "/chat/completions"
_PIN_NEEDS: Final = ("tools", "response_format")
"""Request fields a pinned endpoint must list: a one-tag pin has no fallback inside
OpenRouter, and an endpoint without them answers in plain text (paid)."""
_PIN_PLACEHOLDER: Final = b"{}"
"""The provider object of a pinned request until its pin is chosen (``Router._build_request``)."""
_RESERVED_PARAMS: Final = ("model", "provider", "messages", "stream")
_LEDGER_METHODS: Final = ("reserve", "settle", "release", "snapshot")
"""What a ledger is used for: an object without them is a mistake said at once."""
_UNSET: Final[Any] = object()
_CAP_CACHE_SIZE: Final = 256

DEFAULT_SLOW_START: Final = 0.05
"""Seconds in which the default limiter's window doubles until the first 429."""

DEFAULT_WORKLOAD = Workload(prompt_tokens=500, completion_tokens=2000)
"""The request shape endpoints are ranked for when none is given."""


def _cache_workload(workload: Workload, rate: Decimal | float | str | None) -> Workload:
    """The workload at its expected cache hit rate: what pinned sessions are ranked for."""
    share = rate if rate is not None else workload.cached_prompt_share or DEFAULT_CACHE_HIT_RATE
    try:  # Workload checks the share (a number 0..1)
        return dataclasses.replace(workload, cached_prompt_share=share)  # type: ignore[arg-type]
    except ConfigurationError as exc:
        raise ConfigurationError(f"cache_hit_rate={rate!r}: {exc}") from None


CONTEXT_BYTES_PER_TOKEN: Final = 32
"""Bytes of prompt text no token exceeds, for the check before sending: a request is
refused only when even that few prompt tokens plus its completion cap exceed every
allowed endpoint's context (an assumption on tokenizers: BPE vocabularies' longest
tokens are well under 32 bytes for text; the check errs toward sending)."""


def _check_fits(context: int, prompt_upper_bound: int, cap: int | None) -> None:
    """Refuse a request that cannot fit any allowed endpoint's context: it would be a 400.

    ``prompt_upper_bound`` counts UTF-8 bytes (plus template): divided by
    :data:`CONTEXT_BYTES_PER_TOKEN` it is a lower bound on the prompt's tokens. The
    prompt is what is judged (:class:`ContextLengthExceeded`: a batch counts the prompt
    and goes on); a completion cap alone beyond the context is left to the reservation
    and to OpenRouter's 400 (neither is paid).
    """
    least = prompt_upper_bound // CONTEXT_BYTES_PER_TOKEN
    completion = cap or 0
    if completion < context and least + completion > context:
        raise ContextLengthExceeded(
            context,
            least + completion,
            f"the request cannot fit: at least {least:,} prompt tokens plus max_tokens "
            f"{completion:,} exceed the largest context length of the allowed endpoints "
            f"({context:,} tokens); nothing was sent",
        )


class Router(AsyncResource):
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
            requests in flight to settle, a number waits at most that long (default
            600 s). A request that could not fit even if everything in flight
            settled at no cost is refused at once either way, and waiting requests
            are woken by the settles that free room (``docs/client.md``).
        catalog_ttl: seconds before the route plan is rebuilt from a fresh listing.
        request_timeout: seconds for a whole non-streaming request.
        stream_idle_timeout: seconds allowed between two stream events
            (keep-alive comments do not count as events).
        stream_deadline: seconds for a whole stream; default: 120 s plus
            ``max_tokens`` at 10 tokens per second, so a long answer is not cut
            for being long. A stream still delivering tokens at its deadline is
            not retried: it ends as it stands (``finish_reason="deadline"``),
            settled at what ``/generation`` says it cost.
        connect_timeout: seconds to open a connection.
        ssl: an :class:`ssl.SSLContext` for the ``https://`` base URL (a private CA,
            a client certificate); default: the system's CAs (``SSL_CERT_FILE``
            honoured). Used by the completions and the router's own catalog.
        headers: extra headers sent with every request, e.g. OpenRouter's
            attribution headers ``{"HTTP-Referer": "https://example.org",
            "X-OpenRouter-Title": "my job"}``; a header the library sets itself
            (``Authorization``, ``Host``, ``Content-Length``, ``Content-Type``,
            ``Transfer-Encoding``, ``Connection``...) is refused with a
            :class:`~provider_router.ConfigurationError` naming it.
        credits_hold_timeout: seconds one request may spend waiting out
            temporary (in-flight hold) 402s.
        cost_sanity_factor: an answer's ``usage.cost`` above this many times its
            reservation (default 2), or a negative one, is not booked on its
            word: OpenRouter's ``/generation`` record is asked first. Confirmed,
            it is booked; otherwise the worst case is booked and the figure is
            disputed (:attr:`disputes`, ``ChatResult.disputed_cost``). Either
            way :attr:`halted` names the generation id (a batch stops).
        max_violations_in_a_row: policy violations in a row that set
            :attr:`halted` (a batch stops).
        limiter: the concurrency limiter (default: AIMD up to ``max_concurrency``
            after a slow start that doubles every 50 ms from 32 until the first
            429, with every 429 capping the window at the requests in flight).
        health: per-provider health tracking (default :class:`ProviderHealth`).
        params: default request parameters merged under each call's own.
        cache_affinity: pin every session to one allowed endpoint, sent as
            ``session_id`` with a one-tag ``only`` (docs/client.md, "Cache-aware
            pinning"): a call's own ``session_id``, else the conversation (the
            messages up to its first user message). Off: a ``session_id`` is sent as
            given and nothing is pinned.
        pin_fallbacks: send a pinned request as ``order: [pin]`` with every allowed
            tag in ``only`` instead of a one-tag ``only``: a 429 at the pin falls back
            inside OpenRouter (one cache miss) instead of reaching the limiter and a
            retry (docs/client.md, "Cache-aware pinning").
        cache_hit_rate: the prompt share (0..1) expected from cache when choosing a
            pinned session's endpoint (default: the workload's
            ``cached_prompt_share``, else :data:`~.affinity.DEFAULT_CACHE_HIT_RATE`).
        metrics: live Prometheus metrics (:class:`~provider_router.Metrics`); ``None``
            (the default) costs nothing per request.
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
        budget_wait: bool | float = DEFAULT_BUDGET_WAIT,
        catalog_ttl: float = DEFAULT_CATALOG_TTL,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
        stream_deadline: float | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        ssl: SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        credits_hold_timeout: float = 300.0,
        cost_sanity_factor: Decimal | int = DEFAULT_COST_SANITY_FACTOR,
        max_violations_in_a_row: int = DEFAULT_MAX_VIOLATIONS_IN_A_ROW,
        limiter: AdaptiveLimiter | None = None,
        health: ProviderHealth | None = None,
        params: Mapping[str, Any] | None = None,
        cache_affinity: bool = False,
        pin_fallbacks: bool = False,
        cache_hit_rate: Decimal | float | str | None = None,
        metrics: Metrics | None = None,
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
            ("stream_deadline", 1.0 if stream_deadline is None else stream_deadline),
            ("connect_timeout", connect_timeout),
        ):
            if not value > 0:
                raise ConfigurationError(f"{name} must be > 0 seconds, got {value!r}")
        for reserved_name in _RESERVED_PARAMS:
            if params and reserved_name in params:
                raise ConfigurationError(f"params: {reserved_name!r} is set by the Router")
        if model.endswith(":online"):
            raise ConfigurationError(
                f"model {model!r}: refused, the ':online' variant adds web search fees the "
                "reservation cannot bound (docs/client.md, 'What is reserved')"
            )
        self._fields: dict[str, Any] = dict(params or {})
        check_fields(self._fields, "Router(params=...)")
        self._field_tokens = field_tokens(self._fields)
        self._caps: dict[int | None, int | None] = {}  # completion cap by max_tokens
        self.model = model
        self.policy = policy if policy is not None else ProviderPolicy()
        self.base_url = _http.resolve_base_url(base_url)
        self._api_key = _http.resolve_api_key(api_key)
        self._catalog = catalog
        self._own_catalog = False
        self._endpoints = endpoints
        self.retry = retry if retry is not None else RetryPolicy()
        self.workload = workload if workload is not None else DEFAULT_WORKLOAD
        self.cache_affinity = cache_affinity
        self.pin_fallbacks = pin_fallbacks
        self.affinity = CacheAffinity()
        """Which endpoint each pinned session goes to (``pinned`` and ``moves`` count)."""
        self._cache_workload = _cache_workload(self.workload, cache_hit_rate)
        self.allow_fallbacks = allow_fallbacks
        self.budget_wait = budget_wait
        self.catalog_ttl = catalog_ttl
        self.limiter = (
            limiter
            if limiter is not None
            else AdaptiveLimiter(
                max_concurrency,
                slow_start=DEFAULT_SLOW_START,
                shrink_to_in_flight=True,
                accelerate=True,
                clock=clock,
            )
        )
        self.health = health if health is not None else ProviderHealth(clock=clock)
        self._encoder = RequestEncoder(model, params or {})
        self._clock = clock
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._request_timeout = request_timeout
        self._stream_idle_timeout = stream_idle_timeout
        self._stream_deadline = stream_deadline
        self._connect_timeout = connect_timeout
        self._ssl = check_ssl(ssl)
        self._headers = check_headers(headers or {}, "Router(headers=...)")
        self._http: _http.HttpClient | None = None
        self._plan: RoutePlan | None = None
        self._plan_time = 0.0
        self._refresh: asyncio.Task[None] | None = None
        self._plan_lock = asyncio.Lock()  # one plan rebuild at a time (_rebuild_plan)
        if isinstance(cost_sanity_factor, bool) or not Decimal(cost_sanity_factor) >= 1:
            raise ConfigurationError(
                f"cost_sanity_factor must be a number >= 1, got {cost_sanity_factor!r}"
            )
        if (
            isinstance(max_violations_in_a_row, bool)
            or not isinstance(max_violations_in_a_row, int)
            or max_violations_in_a_row < 1
        ):
            raise ConfigurationError(
                f"max_violations_in_a_row must be an int >= 1, got {max_violations_in_a_row!r}"
            )
        if ledger is not None and not all(
            callable(getattr(ledger, name, None)) for name in _LEDGER_METHODS
        ):
            raise ConfigurationError(
                f"ledger must be a Ledger (MemoryLedger, SQLiteLedger or RedisLedger), got "
                f"{type(ledger).__name__}"
                + (
                    f": to cap spending at ${ledger}, pass ledger=MemoryLedger(Decimal('{ledger}'))"
                    if isinstance(ledger, Decimal | int | str) and not isinstance(ledger, bool)
                    else ""
                )
            )
        self._billing = Billing(
            model,
            ledger,
            self._open_http,
            sleep,
            credits_hold_timeout=credits_hold_timeout,
            clock=clock,
            cost_sanity_factor=Decimal(cost_sanity_factor),
        )
        self.max_violations_in_a_row = max_violations_in_a_row
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
            raise ConfigurationError("the Router is not open: use `async with Router(...)`")
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
            connect_timeout=self._connect_timeout,
            limit=self.limiter.max_concurrency,
            headers=self._headers,
            ssl=self._ssl,
        )
        try:
            if self._endpoints is None and self._catalog is None:
                self._catalog = Catalog(ttl=self.catalog_ttl, http=self._http)
                self._own_catalog = True
            await self._rebuild_plan()
        except BaseException:
            await self.close()
            raise
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
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
            self._refresh = None
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            await asyncio.gather(self._metrics_task, return_exceptions=True)
            self._metrics_task = None
        await self._billing.drain(grace=30.0)
        await self._billing.close_unresolved()
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

    async def _rebuild_plan(self, policy: ProviderPolicy | None = None) -> None:
        """Build the plan from ``policy`` (default: the one in force) and install both
        together. One rebuild at a time: a refresh started while :meth:`set_policy`
        rebuilds waits for it, then reads the policy it left; and the policy is published
        only with its plan, so the two never disagree, whichever fails."""
        async with self._plan_lock:
            if policy is None:
                policy = self.policy
            if self._endpoints is not None:
                listing = self._endpoints
            else:
                assert self._catalog is not None
                listing = await self._catalog.endpoints(self.model, refresh=self._plan is not None)
            decisions = policy.evaluate(listing, model_id=self.model)
            plan = build_route_plan(
                self.model,
                decisions,
                workload=self.workload,
                allow_fallbacks=self.allow_fallbacks,
                cache_workload=self._cache_workload,
                verified=policy.ranking_report(self.model),
            )
            self.policy, self._plan = policy, plan
            self._plan_time = self._clock()
        log.info(
            "route.plan",
            model=self.model,
            order=list(plan.order),
            ignore=list(plan.ignore),
            max_price=plan.provider_object()["max_price"],
        )

    async def set_policy(self, policy: ProviderPolicy) -> None:
        """Route new requests under ``policy`` from now on (e.g. a provider that failed a
        re-verification excluded mid-run); requests already prepared keep their plan. A
        plan refresh under way is let finish first; policy and plan change together.

        Raises:
            ProviderRouterError: it could not be applied (the listing could not be read,
                or it allows no endpoint): the router keeps its policy and plan.
        """
        await self._rebuild_plan(policy)

    async def _refresh_plan(self) -> None:
        try:
            await self._rebuild_plan()
        except Exception as exc:
            # Keep routing on the old plan; try again after another TTL.
            self._plan_time = self._clock()
            log.warning("route.plan_refresh_failed", model=self.model, error=str(exc))

    def _current_plan(self) -> RoutePlan:
        plan = self._plan
        if plan is None:
            raise ConfigurationError("the Router is not open: use `async with Router(...)`")
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

        Set by a cost above ``cost_sanity_factor`` times its reservation (or a
        negative one), confirmed or disputed, or by ``max_violations_in_a_row``
        policy violations in a row.
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
            CreditsExhausted: OpenRouter's credits or the key limit ran out (now or
                earlier: the router then takes no new work).
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
                    # "#13 wave 5").
                    functools.partial(self._attempt, request),
                    started=start,
                    sleep=self._sleep,
                    clock=self._clock,
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

    def _build_request(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        stream: bool,
        key: str | None,
        on_delta: Callable[[StreamDelta], Any] | None,
        params: Mapping[str, Any],
    ) -> PreparedRequest:
        if self._http is None or self._api_key is None:
            if self._http is None:
                raise ConfigurationError("the Router is not open: use `async with Router(...)`")
            # Said before sending: OpenRouter's 401 would not name the variable.
            raise ConfigurationError(
                f"no API key: set {ENV_API_KEY} to your OpenRouter key or pass "
                "Router(api_key=...) (create one at https://openrouter.ai/keys); nothing was sent"
            )
        if (
            max_tokens is not None
            and not (type(max_tokens) is int and max_tokens >= 1)
            and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1)
        ):
            raise ConfigurationError(f"max_tokens must be a positive int, got {max_tokens!r}")
        extra_tokens = self._field_tokens
        if params:
            for reserved_name in _RESERVED_PARAMS:
                if reserved_name in params:
                    raise ConfigurationError(
                        f"{reserved_name!r} is set by the Router, not per call"
                    )
            check_fields(params)
            # The larger cap: a provider may honour either (docs/client.md, "What is reserved").
            cap = completion_cap(max_tokens, {**self._fields, **params})
        else:
            # The router's own fields never change: one cap per max_tokens.
            cap = self._caps.get(max_tokens, _UNSET)
            if cap is _UNSET:
                cap = completion_cap(max_tokens, self._fields)
                if len(self._caps) < _CAP_CACHE_SIZE:
                    self._caps[max_tokens] = cap
        if cap is None and self._billing.ledger is not None:
            raise ConfigurationError(
                "max_tokens is required when a ledger is used (max_completion_tokens also counts)"
            )
        plan = self._current_plan()
        encoder = self._encoder
        session = pinned = None
        if self.cache_affinity:  # opt-in: a one-tag pin fares badly under 429s (#24)
            try:
                session = session_of(messages, params, self.affinity.digest_key)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        if session is None:
            provider = encoder.provider_bytes(plan, self.health.demoted())
        else:
            if "session_id" not in params:
                params = {**params, "session_id": session}
            needs = tuple(filter(params.__contains__, _PIN_NEEDS))
            # The pin needs the prompt's size (an endpoint whose window cannot hold
            # prompt and cap is not pinned): chosen once the body is measured, and
            # spliced in where the placeholder ends the body, as a re-pin does.
            provider = _PIN_PLACEHOLDER
        try:
            payload = encoder.encode(messages, max_tokens, stream, params, provider)
            if params:
                # The fields' JSON, already encoded for the body, bounds what tools and
                # schemas add to the prompt: no second encoding (docs/performance.md).
                extra_tokens = encoder.last_fields_bytes
            text_tokens, images = measure(messages)
        except (AttributeError, TypeError, KeyError) as exc:
            # Checked only once it failed: the per-request path pays nothing for it.
            problem = messages_problem(messages)
            if problem is None:
                raise
            raise ConfigurationError(problem) from exc
        prompt_tokens = text_tokens + extra_tokens
        if plan.max_context_length is not None:
            _check_fits(plan.max_context_length, prompt_tokens, cap)
        if session is not None:
            pinned = self.affinity.pin(
                session,
                plan,
                self._clock(),
                demoted=self.health.demoted(),
                needs=needs,
                min_context=prompt_tokens + (cap or 0),
            )
            provider = encode_json(
                plan.pinned_object(pinned, fallbacks=self.pin_fallbacks)
            ).encode()
            payload = b"".join((payload[: -len(_PIN_PLACEHOLDER) - 1], provider, b"}"))
        deadline = self._request_timeout
        if stream:
            # The stream deadline scales with the completion cap the provider may honour.
            deadline = self._stream_deadline or (
                STREAM_DEADLINE_BASE + (cap or 0) / STREAM_DEADLINE_TOKENS_PER_SECOND
            )
        # Positional (in PreparedRequest's field order): a keyword call costs more.
        request = PreparedRequest(
            payload,
            stream,
            key if key is not None else f"req-{next(self._seq)}",
            plan.worst_case(prompt_tokens, cap or 0, images),
            prompt_tokens + images * IMAGE_PROMPT_TOKENS_BOUND,
            plan,
            on_delta,
            None,  # generation_id
            0,  # attempts
            deadline,
        )
        if session is not None:
            request.session = session
            request.pinned = pinned
            request.provider_length = len(provider)
            request.pin_needs = (needs, prompt_tokens + (cap or 0))
        return request

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
            provider = encode_json(plan.pinned_object(tag, fallbacks=self.pin_fallbacks)).encode()
            head = request.payload[: -request.provider_length - 1]
            request.payload = b"".join((head, provider, b"}"))
            request.provider_length = len(provider)

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

    def _finish(self, request: PreparedRequest, charged: Charged, latency: float) -> ChatResult:
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
                self._violations_in_a_row >= self.max_violations_in_a_row
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

    # --- one attempt ------------------------------------------------------------------

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
        response = await http.send(_CHAT_PATH, request.payload, request_timeout=request.deadline)
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
        http: _http.HttpClient,
        request: PreparedRequest,
        attempt: int,
        reservation: Reservation | None,
    ) -> Completion:
        deadline_at = asyncio.get_running_loop().time() + request.deadline
        post = http.post(
            _CHAT_PATH,
            request.payload,
            request_timeout=request.deadline,
            idle_timeout=self._stream_idle_timeout,
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
                self._stream_idle_timeout,
                deadline_at=deadline_at,
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
