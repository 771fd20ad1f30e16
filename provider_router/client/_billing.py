"""The router's money: settling, releasing and reconciling ledger reservations.

:class:`Billing` owns what the :class:`~provider_router.Router` charged
(:attr:`Billing.spent`), the background reconciliations of cut responses, and the
router's reaction to a spend limit, a 402 or 403 (:meth:`Billing.hold_spend_limit`: the
in-flight hold is waited out; any other limit stops the router). One attempt's
reservation is **settled** when an answer came, **released** only when OpenRouter
provably did not bill it, **reconciled** through ``/generation`` when it may have
been billed and its generation id is known, or **held** at its worst case until
recovery can say (docs/ledger.md, "Unknown is not free"). A settle whose write fails
keeps its answer (``unsettled``); an overrun or an absurd ``usage.cost``
(:mod:`provider_router.client._cost_check`) halts the router's batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from provider_router._constants import DEFAULT_COST_SANITY_FACTOR, DEFAULT_CREDITS_HOLD_TIMEOUT
from provider_router._exceptions import (
    APIConnectionError,
    APIStatusError,
    ConfigurationError,
    CreditsExhausted,
    InvalidResponseError,
    LedgerUnavailableError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
)
from provider_router._http import session as _http
from provider_router._log import get_logger
from provider_router._money import from_units, reported_cost
from provider_router._spend_limits import SpendLimit, SpendLimitKind
from provider_router._types import Clock, Sleep
from provider_router.client._completion import Completion
from provider_router.client._cost_check import (
    LOW_COST_SHARE,
    CostVerdict,
    check_cost,
    check_low_cost,
)
from provider_router.client._request import PreparedRequest
from provider_router.client._response_cache import HIT
from provider_router.client.results import ChatResult, chat_result
from provider_router.client.retry import sleep_unless_stopping
from provider_router.ledger import Ledger, Reservation
from provider_router.routing.route_plan import RoutePlan

__all__ = ["LEDGER_RETRIES", "UNKNOWN_CHARGE_STATUSES", "Billing", "Charged", "provably_free"]

# The router's events keep one logger name, wherever the code lives (docs/client.md).
log = get_logger("provider_router.client.router")

_GENERATION_PATH: Final = "/generation"
_ZERO: Final = Decimal(0)
_KEY_PATH: Final = "/key"

UNKNOWN_CHARGE_STATUSES: Final = frozenset({408, 524})
"""Error statuses that say "timed out", not "refused": the provider may have
finished (and billed) the generation after OpenRouter or its edge gave up."""

LEDGER_RETRIES: Final = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Seconds waited before each retry of a ledger write that raised (then it fails)."""


def provably_free(exc: BaseException, sent: bool) -> bool:
    """Whether a failed attempt cannot have been billed, so its reservation may be released.

    ``sent`` says whether the request was handed to the HTTP layer at all.
    Free: never handed over; a connection that failed before the body was
    written; an error status OpenRouter does not charge for (all but 408/524);
    a spend limit that stopped the router. Anything else may have been billed.
    """
    if not sent or isinstance(exc, CreditsExhausted):
        return True
    if isinstance(exc, APIStatusError):
        return exc.status not in UNKNOWN_CHARGE_STATUSES
    if isinstance(exc, APIConnectionError):
        # A 408 arrives as a RequestTimeout that was sent: unknown, like a timeout.
        return not exc.request_sent
    return False


@dataclass(slots=True)
class Charged:
    """An attempt that got an answer, and what it was charged.

    ``unsettled`` is the ledger's error when the charge could not be recorded
    (after retries): the answer is still paid for and must be kept.
    """

    completion: Completion
    cost: Decimal | None
    estimate: Decimal | None
    reserved: Decimal | None
    unsettled: BaseException | None = None
    disputed: Decimal | None = None
    """The answer's ``usage.cost`` when it was disputed (``cost`` is what was booked)."""

    def result(self, attempts: int, latency: float, quarantine_reason: str | None) -> ChatResult:
        """The :class:`ChatResult` of the request this attempt finished."""
        c = self.completion
        return chat_result(
            c.text,
            c.reasoning,
            c.provider,
            c.model,
            c.generation_id,
            c.finish_reason,
            c.usage,
            self.cost,
            self.estimate,
            self.reserved,
            quarantine_reason is not None,
            quarantine_reason,
            attempts,
            latency,
            c.message,
            c.native_finish_reason,
            c.tool_calls,
            self.disputed,
            c.logprobs,
            cache_status=c.cache_status,
            router_metadata=c.router_metadata,
        )


def unallowed_reason(plan: RoutePlan, provider: str | None) -> str | None:
    """Why an answer served by ``provider`` is quarantined, or ``None`` (allowed, or no
    provider named: unknown is kept, not a violation)."""
    if provider is None or provider in plan.allowed_providers:
        return None
    return (
        f"served by {provider!r}, not one of the allowed providers "
        f"({', '.join(sorted(plan.allowed_providers))})"
    )


class Billing:
    """Settles, releases and reconciles one router's reservations.

    Args:
        model: the router's model (for log lines).
        ledger: the budget, or ``None`` (costs are still counted in ``spent``).
        http: returns the router's open HTTP client (raises when closed).
        sleep: awaited between ``/generation`` lookups and temporary 402s.
        credits_hold_timeout: seconds one request may wait out temporary 402s.
        cost_sanity_factor: an answer's cost above this many times its reservation
            is checked with ``/generation`` before it is booked, and halts
            (:attr:`halted`): booked when confirmed, disputed otherwise.
    """

    __slots__ = (
        "_background",
        "_clock",
        "_hold_timeout",
        "_http",
        "_sleep",
        "_stopped_message",
        "disputes",
        "halted",
        "held_since",
        "ledger",
        "model",
        "sanity_factor",
        "spent",
        "stopped",
        "stopping",
        "unresolved",
    )

    def __init__(
        self,
        model: str,
        ledger: Ledger | None,
        http: Callable[[], _http.HttpClient],
        sleep: Sleep,
        *,
        credits_hold_timeout: float = DEFAULT_CREDITS_HOLD_TIMEOUT,
        clock: Clock = time.monotonic,
        cost_sanity_factor: Decimal = DEFAULT_COST_SANITY_FACTOR,
    ) -> None:
        self.model = model
        self.sanity_factor = cost_sanity_factor
        self.stopping: asyncio.Event | None = None
        """Set by the router's stop: a temporary 402 is not waited out any more."""
        self.halted: str | None = None
        """Why a batch must stop (a cost anomaly or dispute), or ``None``."""
        self.disputes: list[CostVerdict] = []
        """Answers whose ``usage.cost`` was not booked (negative, or absurd and not
        confirmed by ``/generation``), oldest first."""
        self.ledger = ledger
        self._http = http
        self._sleep = sleep
        self._clock = clock
        self._background: set[asyncio.Task[None]] = set()
        self._hold_timeout = credits_hold_timeout
        self.spent = Decimal(0)
        """USD charged to the ledger (settled costs)."""
        self.stopped: CreditsExhausted | None = None
        """Why the router takes no new work (credits ran out), or ``None``."""
        self._stopped_message = ""
        self.unresolved: dict[str, Reservation] = {}
        """Reservations held open at their worst case because OpenRouter may have
        billed them and cannot say yet (by reservation id, with the generation id
        when one is known)."""
        self.held_since: dict[str, float] = {}
        """When (``clock``) each unresolved reservation's request was given up on."""

    async def reserve(self, request: PreparedRequest, wait: bool | float) -> Reservation | None:
        """Reserve the request's worst case (``None`` without a ledger)."""
        if self.ledger is None:
            return None
        return await self.ledger.reserve(request.worst_case, key=request.key, wait=wait)

    async def attach(
        self, request: PreparedRequest, reservation: Reservation | None, generation_id: str
    ) -> None:
        """Remember the generation id, durably on the reservation when there is one.

        A ledger that keeps failing does not stop the answer: the id travels with
        the settle too, so only a crash before that settle would miss it.
        """
        request.generation_id = generation_id
        ledger = self.ledger
        if reservation is not None and ledger is not None:
            try:
                await self._write(
                    functools.partial(ledger.attach, reservation, generation_id), "attach"
                )
            except ConfigurationError:
                raise
            except Exception as exc:
                log.error(
                    "route.attach_failed",
                    model=self.model,
                    key=request.key,
                    generation_id=generation_id,
                    error=repr(exc),
                )

    async def _write(
        self, call: Callable[[], Awaitable[None]], what: str, failed: Exception | None = None
    ) -> None:
        """Run a ledger write, retrying failures (not misuse) on :data:`LEDGER_RETRIES`.

        ``failed``: the caller made the first try itself and it raised this
        (retryable) error; the retries go on from there.
        """
        for delay in (*LEDGER_RETRIES, None):
            if failed is None:
                try:
                    await call()
                    return
                except (ConfigurationError, LedgerUnavailableError):
                    raise  # not open, closed ledger, or a store the ledger itself waited out
                except Exception as exc:
                    if delay is None:
                        raise
                    error = exc
            else:
                error, failed = failed, None
            assert delay is not None  # the last try raised above; ``failed`` is a first try
            log.warning("route.ledger_retry", action=what, error=repr(error), delay=delay)
            await self._sleep(delay)

    async def charge(
        self, request: PreparedRequest, completion: Completion, reservation: Reservation | None
    ) -> Charged:
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
        ledger = self.ledger
        if completion.error is not None and cost is None:
            # Zero completion insurance: an error finish is not charged.
            if reservation is not None and ledger is not None:
                await ledger.release(reservation)
            return Charged(completion, None, estimate, None)
        generation_id = completion.generation_id or request.generation_id
        if cost is None and completion.cache_status == HIT:
            # The answer says it came from OpenRouter's response cache: documented as
            # not billed. Only the answer's word counts, never the request's hope.
            cost = _ZERO
        if cost is None:
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
        unsettled: BaseException | None = None
        held = from_units(reservation.units) if reservation is not None else None  # .amount
        disputed: Decimal | None = None
        confirmed = False
        basis = held if held is not None else request.worst_case
        # is_sane, inlined (every answer passes here): 0 <= cost <= factor x hold.
        if cost < _ZERO or cost > basis * self.sanity_factor:
            verdict = await self._check(request.key, cost, basis, generation_id)
            cost, disputed, confirmed = verdict.booked, verdict.disputed, verdict.disputed is None
        elif (
            estimate is not None
            and cost < estimate * LOW_COST_SHARE  # too_low, inlined
            and completion.error is None  # an error finish is free: zero-completion insurance
        ):
            verdict = await self._check_low(request.key, cost, estimate, basis, generation_id)
            cost, disputed = verdict.booked, verdict.disputed
        if request.on_paid is not None and (completion.error is None or cost > _ZERO):
            # A charged error finish too (a billed partial answer, retried after this):
            # what was paid for is handed over, with ``finish_reason="error"``.
            paid = Charged(completion, cost, estimate, held, None, disputed)
            await self._hand_over(request, paid)
        if reservation is not None and ledger is not None:
            assert held is not None  # set with the reservation (for mypy)
            settled_cost = cost
            try:
                # The first try inline (no closure, no _write coroutine on the path
                # every answer takes); a failed one goes on in _write's retries.
                failed: Exception | None = None
                try:
                    await ledger.settle(
                        reservation,
                        settled_cost,
                        estimate=estimate,
                        provider=completion.provider,
                        generation_id=generation_id,
                    )
                except (ConfigurationError, LedgerUnavailableError):
                    raise
                except Exception as exc:
                    failed = exc
                if failed is not None:
                    # A partial, not a lambda: a lambda would make six locals of
                    # this frame cells on every settle, GC-tracked objects alive
                    # while the settle is written (docs/performance.md).
                    await self._write(
                        functools.partial(
                            ledger.settle,
                            reservation,
                            settled_cost,
                            estimate=estimate,
                            provider=completion.provider,
                            generation_id=generation_id,
                        ),
                        "settle",
                        failed,
                    )
            except Exception as exc:
                # The answer is paid for: keep it. The reservation stays open at its
                # worst case (recovery settles it through /generation).
                unsettled = exc
                log.error(
                    "route.settle_failed",
                    model=self.model,
                    key=request.key,
                    generation_id=generation_id,
                    cost=str(cost),
                    error=repr(exc),
                )
            if unsettled is None and cost > held:
                self._overran(request.key, reservation, cost, generation_id, confirmed)
        self.spent += cost
        return Charged(completion, cost, estimate, held, unsettled, disputed)

    async def _hand_over(self, request: PreparedRequest, charged: Charged) -> None:
        """Give a paid answer to the caller's ``on_paid`` before the settle: a crash after
        the settle then cannot lose it. A failing hook is logged; the settle goes on.

        A charged error finish (a partial answer that was billed) is handed over too,
        with ``finish_reason="error"``, before the request retries it."""
        assert request.on_paid is not None
        reason = unallowed_reason(request.plan, charged.completion.provider)
        result = charged.result(request.attempts, 0.0, reason)
        if charged.completion.error is not None and result.finish_reason != "error":
            result = dataclasses.replace(result, finish_reason="error")  # a charged error
        try:
            await request.on_paid(result)
        except Exception as exc:
            log.error(
                "route.on_paid_failed",
                model=self.model,
                key=request.key,
                generation_id=charged.completion.generation_id,
                error=repr(exc),
            )

    async def _check(
        self, key: str, reported: Decimal, held: Decimal, generation_id: str | None
    ) -> CostVerdict:
        """Ask OpenRouter's records about a cost that is not sane; halt on it either way."""
        verdict = await check_cost(
            reported,
            held,
            self.sanity_factor,
            key=key,
            generation_id=generation_id,
            generation_cost=self.generation_cost,
            key_usage=self.key_usage,
        )
        self._note_dispute(verdict, key, generation_id)
        if self.halted is None:
            self.halted = verdict.reason
        return verdict

    async def _check_low(
        self,
        key: str,
        reported: Decimal,
        estimate: Decimal,
        held: Decimal,
        generation_id: str | None,
    ) -> CostVerdict:
        """Ask OpenRouter's records about a cost far below its tokens' price; what is
        booked is never below what was charged, so nothing halts."""
        verdict = await check_low_cost(
            reported,
            estimate,
            held,
            key=key,
            generation_id=generation_id,
            generation_cost=self.generation_cost,
        )
        if not self._note_dispute(verdict, key, generation_id):
            log.warning(
                "route.cost_anomaly",
                model=self.model,
                key=key,
                generation_id=generation_id,
                cost=str(reported),
                estimate=str(estimate),
                confirmed=True,
            )
        return verdict

    def _note_dispute(self, verdict: CostVerdict, key: str, generation_id: str | None) -> bool:
        """Keep and log a disputed cost (the answer's word against OpenRouter's records);
        whether it was one."""
        if verdict.disputed is None:
            return False
        self.disputes.append(verdict)
        log.error(
            "route.cost_disputed",
            model=self.model,
            key=key,
            generation_id=generation_id,
            reported=str(verdict.disputed),
            record=None if verdict.record is None else str(verdict.record),
            booked=str(verdict.booked),
        )
        return True

    async def close_failed(
        self, reservation: Reservation, request: PreparedRequest, exc: BaseException
    ) -> None:
        """Release, reconcile or hold the reservation of an attempt that failed."""
        ledger = self.ledger
        if ledger is None:
            return
        if provably_free(exc, request.sent) and isinstance(exc, Exception):
            await ledger.release(reservation)
            return
        # Unknown is not free: the provider may have produced (and billed) it, or we
        # were cancelled mid-request. With an id, ask OpenRouter in the background (a
        # cancelled task must not wait here); without one, hold the worst case.
        generation_id = request.generation_id
        held = Reservation(
            reservation.id, reservation.units, reservation.key, generation_id, reservation.owner
        )
        self.unresolved[held.id] = held
        self.held_since[held.id] = self._clock()
        log.warning(
            "route.unresolved",
            model=self.model,
            key=request.key,
            generation_id=generation_id,
            held=str(reservation.amount),
            error_type=type(exc).__name__,
        )
        if generation_id:
            task = asyncio.ensure_future(self._reconcile_quietly(held))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _reconcile(self, held: Reservation) -> bool:
        """Settle a held reservation through ``/generation``; False while OpenRouter cannot say."""
        ledger = self.ledger
        assert ledger is not None
        generation_id = held.generation_id
        cost = await self.generation_cost(generation_id) if generation_id else None
        if cost is None:
            return False  # stays held at worst case; recovery asks again later
        try:
            await self._write(
                functools.partial(ledger.settle, held, cost, generation_id=generation_id), "settle"
            )
        except ConfigurationError:
            # Already closed: a settle cancelled mid-write still landed. Counted once.
            self._forget(held)
            return False
        self._forget(held)
        if cost > held.amount:
            self._overran(held.key, held, cost, generation_id)
        self.spent += cost
        log.info("route.reconciled", model=self.model, generation_id=generation_id, cost=str(cost))
        return True

    def _forget(self, held: Reservation) -> None:
        self.unresolved.pop(held.id, None)
        self.held_since.pop(held.id, None)

    def hand_over(self, held: Reservation) -> None:
        """Stop tracking a held reservation: it stays open for a later recovery to close."""
        self._forget(held)

    async def settle_held(self, held: Reservation, cost: Decimal) -> None:
        """Settle a held reservation at ``cost`` (found by account reconciliation)."""
        ledger = self.ledger
        assert ledger is not None
        await self._write(functools.partial(ledger.settle, held, cost), "settle")
        self._forget(held)
        self.spent += cost

    async def key_usage(self) -> Decimal | None:
        """What the key has been charged in all (``GET /key``: ``data.usage``), if it says."""
        try:
            body = await self._http().get_json(_KEY_PATH)
        except (APIStatusError, APIConnectionError, InvalidResponseError) as exc:
            log.warning("route.key_lookup_failed", error=str(exc))
            return None
        return _data_amount(body, "usage")

    async def _reconcile_quietly(self, held: Reservation) -> None:
        try:
            await self._reconcile(held)
        except Exception as exc:  # still held at worst case: nothing is lost
            log.error(
                "route.reconcile_failed",
                model=self.model,
                generation_id=held.generation_id,
                error=repr(exc),
            )

    async def close_unresolved(self) -> None:
        """Count held reservations that have no generation id at their worst case.

        Nothing can ever say what those cost (there is no id to ask about), so the
        worst case is what they cost. Held ones with an id stay open: the next
        recovery settles them at their real cost through ``/generation``.
        """
        ledger = self.ledger
        if ledger is None:
            return
        for held in list(self.unresolved.values()):
            if held.generation_id:
                continue
            try:
                await self._write(functools.partial(ledger.settle, held, held.amount), "settle")
            except Exception as exc:  # stays open: the next recovery counts it
                log.error("route.reconcile_failed", model=self.model, error=repr(exc))
                continue
            self._forget(held)
            self.spent += held.amount
            log.warning(
                "route.unresolved_counted",
                model=self.model,
                key=held.key,
                worst_case=str(held.amount),
            )

    async def reconcile(self) -> int:
        """Ask ``/generation`` again for every held reservation with an id; how many settled."""
        settled = 0
        for held in list(self.unresolved.values()):
            if held.generation_id and await self._reconcile(held):
                settled += 1
        return settled

    def _overran(
        self,
        key: str,
        reservation: Reservation,
        cost: Decimal,
        generation_id: str | None,
        confirmed: bool = False,
    ) -> None:
        """Say loudly that a settle passed its reservation; halt on an absurd one.

        ``confirmed``: ``/generation`` confirmed the cost (:meth:`_check` halted already).
        """
        reserved = reservation.amount
        log.error(
            "route.overrun",
            model=self.model,
            key=key,
            generation_id=generation_id,
            cost=str(cost),
            reserved=str(reserved),
            overrun=str(cost - reserved),
        )
        if cost > reserved * self.sanity_factor:
            reason = (
                f"cost anomaly: generation {generation_id or '(no id)'} of {key!r} settled at "
                f"${cost}, more than {self.sanity_factor}x its reservation of ${reserved}; "
                "check the prices OpenRouter reports before going on"
            )
            log.error(
                "route.cost_anomaly",
                model=self.model,
                key=key,
                generation_id=generation_id,
                cost=str(cost),
                reserved=str(reserved),
                factor=str(self.sanity_factor),
                confirmed=confirmed,
            )
            if self.halted is None:
                self.halted = reason

    async def drain(self, grace: float) -> None:
        """Let background reconciliations finish; cancel any still running after ``grace`` s."""
        if not self._background:
            return
        _, pending = await asyncio.wait(self._background, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def generation_cost(
        self, generation_id: str, *, attempts: int = 6, delay: float = 0.5
    ) -> Decimal | None:
        """The authoritative cost of a generation from ``GET /generation?id=``.

        The record appears a little after the response, so a 404 is retried
        (``attempts`` times, doubling ``delay``). ``None`` when it never appears
        or the lookup fails: the caller then counts the worst case.
        """
        http = self._http()
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
            return _data_amount(body, "total_cost")
        return None

    # --- 402 and 403: spend limits -------------------------------------------------------

    async def hold_spend_limit(
        self,
        exc: APIStatusError,
        limit: SpendLimit,
        again: Callable[[], Awaitable[Completion]],
        *,
        key: str,
        in_flight: int,
    ) -> Completion:
        """Wait out the in-flight hold, calling ``again`` after each wait; stop on any other
        spend limit (:mod:`provider_router._spend_limits`).

        Raises:
            APIStatusError: an in-flight hold lasted past ``credits_hold_timeout``, or the
                router is stopping.
            CreditsExhausted: a limit that does not pass by itself (the router stops).
        """
        waited = 0.0
        while True:
            delay = exc.retry_after if exc.retry_after and exc.retry_after > 0 else 1.0
            if limit.transient and waited + delay <= self._hold_timeout:
                log.info(
                    "route.credits_hold",
                    model=self.model,
                    key=key,
                    retry_after=delay,
                    in_flight=in_flight,
                )
                waited += delay
                stopping = self.stopping
                if stopping is None:
                    await self._sleep(delay)
                else:
                    await sleep_unless_stopping(self._sleep, delay, stopping)
                    if stopping.is_set():
                        raise exc  # stopping: no new exchange (nothing was billed for it)
                try:
                    return await again()
                except (PaymentRequiredError, PermissionDeniedError) as refused:
                    again_limit = refused.spend_limit
                    if again_limit is None:
                        raise
                    exc, limit = refused, again_limit
                    continue
            if limit.transient:
                raise exc  # held for too long: fail this request, keep the router going
            await self._stop(exc, limit, in_flight)
            raise self.stopped_error() from exc

    def stopped_error(self) -> CreditsExhausted:
        """A fresh :class:`CreditsExhausted` for a stopped router."""
        # A fresh instance per raise: concurrent requests must not share a traceback.
        stopped = self.stopped
        assert stopped is not None
        return CreditsExhausted(
            self._stopped_message,
            limit_source=stopped.limit_source,
            spent=self.spent,
            remaining=stopped.remaining,
            limit=stopped.limit,
        )

    async def _stop(self, exc: APIStatusError, limit: SpendLimit, in_flight: int) -> None:
        if self.stopped is not None:
            return
        # Mark the router stopped before any await: concurrent requests refused
        # with the same limit must find it stopped (one log line, no half state).
        self._stopped_message = (
            f"OpenRouter refused with {exc.status}: {limit.what} is used up "
            f"({exc.message}); the router takes no new work"
        )
        source = limit.limit_source
        self.stopped = CreditsExhausted(
            self._stopped_message, limit_source=source, spent=self.spent, limit=limit
        )
        log.error(
            "route.credits_exhausted",
            model=self.model,
            limit_source=source,
            # Named "kind" so the command line's count says which limit (not for credits:
            # their sentence is keyed on the event alone).
            kind=None if limit.kind is SpendLimitKind.CREDITS else limit.kind.value,
            status=exc.status,
            spent=str(self.spent),
            in_flight=in_flight,
        )
        if self.ledger is None:
            return
        try:
            remaining = (await self.ledger.snapshot()).available
        except Exception:  # a report, not a reason to fail differently
            return
        self.stopped = CreditsExhausted(
            self._stopped_message,
            limit_source=source,
            spent=self.spent,
            remaining=remaining,
            limit=limit,
        )


def _data_amount(body: Any, name: str) -> Decimal | None:
    """``body["data"][name]`` as an exact amount; ``None`` when absent, not a JSON
    number (a string, NaN: :func:`~provider_router._money.reported_cost`) or negative."""
    data = body.get("data") if isinstance(body, Mapping) else None
    value = reported_cost(data.get(name)) if isinstance(data, Mapping) else None
    return None if value is None or value < 0 else value
