"""The preflight's pinned request: sent, retried and paid for as any request is.

Each attempt reserves its worst case (when there is a ledger), attaches the generation
id as soon as the answer's headers name it (so a preflight cut by a kill is reconciled
by the next run's recovery), and closes its reservation as the router would
(docs/ledger.md, "Unknown is not free"): an answer is settled at its checked
``usage.cost`` (:mod:`provider_router.client._cost_check`: one far below what its
tokens cost at the listed price is checked with ``/generation`` too), an insured empty answer at
$0 and retried, a failure OpenRouter does not bill is released (and retried when
transient, on :data:`PREFLIGHT_RETRY`), and one that may have been billed is settled
at ``/generation``'s figure or its worst case, and retried.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from provider_router._constants import DEFAULT_COST_SANITY_FACTOR
from provider_router._exceptions import ProviderRouterError, ResponseCarriedError
from provider_router._http.session import HttpClient
from provider_router._money import reported_cost
from provider_router._secrets import scrub
from provider_router.client._billing import provably_free
from provider_router.client._cost_check import (
    CostVerdict,
    check_cost,
    check_low_cost,
    is_sane,
    too_low,
)
from provider_router.client.retry import Backoff, RetryPolicy
from provider_router.ledger import Ledger, Reservation

__all__ = ["PREFLIGHT_RETRY", "PinnedAnswer", "PinnedRequest"]

PREFLIGHT_RETRY: Final = RetryPolicy(
    max_attempts=4,
    deadline=120.0,
    backoff=Backoff(base=1.0, max_delay=10.0),
    max_retry_after=60.0,
)
"""The pinned request's retries: 429, 5xx, a cut connection and an insured empty
answer, as any request's (``is_retryable``), within two minutes."""
LEDGER_KEY: Final = "preflight"

Sleep = Callable[[float], Awaitable[None]]
CostLookup = Callable[[str], Awaitable[Decimal | None]]
Pricing = Callable[[dict[str, Any]], Decimal | None]
"""What an answer's ``usage`` costs at the pinned endpoint's listed prices (None: unknown)."""


@dataclass(slots=True)
class PinnedAnswer:
    """The answer an attempt got, and what was booked for it.

    Attributes:
        body: the decoded answer.
        cost: the answer's ``usage.cost`` as a JSON number (``None``: missing).
        booked: what was charged for it (``usage.cost``, ``/generation``'s
            figure, the worst case or a disputed cost's verdict).
        verdict: set when the cost was not sane (:func:`check_cost`).
    """

    body: dict[str, Any]
    cost: Decimal | None
    booked: Decimal
    verdict: CostVerdict | None = None


@dataclass(slots=True)
class PinnedRequest:
    """Sends the pinned request until it is answered; :attr:`charged` sums every attempt.

    ``generation_cost`` reads ``/generation`` (``None`` when it has no record);
    ``key_usage`` reads ``/key``'s ``usage``.
    """

    http: HttpClient
    body: dict[str, Any]
    worst: Decimal
    ledger: Ledger | None
    sleep: Sleep
    generation_cost: CostLookup
    key_usage: Callable[[], Awaitable[Decimal | None]]
    provider: str | None = None
    pricing: Pricing | None = None
    sanity_factor: Decimal = DEFAULT_COST_SANITY_FACTOR
    charged: Decimal = Decimal(0)
    attempts: int = 0
    empty_answers: int = 0
    verdict: CostVerdict | None = None
    """The last answer's, when its cost was not sane."""
    _rng: random.Random = field(default_factory=random.Random)

    async def send(self) -> PinnedAnswer:
        """The first answer that is not an insured empty one.

        Raises:
            BudgetExhausted: the ledger has no room for an attempt's worst case.
            ProviderRouterError: the last attempt's failure, once not retried.
        """
        payload = json.dumps(self.body, separators=(",", ":")).encode()
        elapsed = 0.0
        while True:
            try:
                return await self._attempt(payload)
            except ProviderRouterError as exc:
                delay = PREFLIGHT_RETRY.next_delay(self.attempts, exc, elapsed, self._rng)
                if delay is None:
                    raise
            elapsed += delay
            await self.sleep(delay)

    async def _attempt(self, payload: bytes) -> PinnedAnswer:
        self.attempts += 1
        ledger = self.ledger
        hold = await ledger.reserve(self.worst, key=LEDGER_KEY) if ledger is not None else None
        generation_id: str | None = None
        try:
            async with self.http.post("/chat/completions", payload) as response:
                header = response.headers.get("x-generation-id")
                if header:
                    generation_id = scrub(header)
                    if hold is not None and ledger is not None:
                        await ledger.attach(hold, generation_id)
                answer = await response.json()
        except BaseException as exc:
            await self._failed(hold, exc, generation_id)
            raise
        if not isinstance(answer, dict):
            answer = {}
        generation_id = _text(answer.get("id")) or generation_id
        raw_usage = answer.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        cost = reported_cost(usage.get("cost"))
        empty = _error_finish(answer)
        if empty is not None and (cost is None or cost == 0):
            # Zero-completion insurance: an error finish is not charged. Retried.
            self.empty_answers += 1
            await self._book(hold, Decimal(0), generation_id)
            raise ResponseCarriedError(
                f"the answer ended with an error (billed $0): {empty}", body=answer
            )
        verdict = None
        if cost is not None and not is_sane(cost, self.worst, self.sanity_factor):
            verdict = await check_cost(
                cost,
                self.worst,
                self.sanity_factor,
                key=LEDGER_KEY,
                generation_id=generation_id,
                generation_cost=self.generation_cost,
                key_usage=self.key_usage,
            )
            booked = verdict.booked
            self.verdict = verdict
        elif cost is not None:
            booked = cost
            estimate = self.pricing(usage) if self.pricing is not None else None
            if too_low(cost, estimate):
                assert estimate is not None  # too_low says so (for mypy)
                # Booked as OpenRouter's records say (never below what was charged).
                low = await check_low_cost(
                    cost,
                    estimate,
                    self.worst,
                    key=LEDGER_KEY,
                    generation_id=generation_id,
                    generation_cost=self.generation_cost,
                )
                booked = low.booked
        else:
            found = await self.generation_cost(generation_id) if generation_id else None
            booked = found if found is not None else self.worst  # unknown is not free
        await self._book(hold, booked, generation_id)
        return PinnedAnswer(answer, cost, booked, verdict)

    async def _failed(
        self, hold: Reservation | None, exc: BaseException, generation_id: str | None
    ) -> None:
        """Close a failed attempt's hold: released when provably free, else charged."""
        if isinstance(exc, Exception) and provably_free(exc, sent=True):
            if hold is not None and self.ledger is not None:
                await self.ledger.release(hold)
            return
        found = None
        if generation_id and isinstance(exc, Exception):
            found = await self.generation_cost(generation_id)
        await self._book(hold, found if found is not None else self.worst, generation_id)

    async def _book(
        self, hold: Reservation | None, cost: Decimal, generation_id: str | None
    ) -> None:
        if hold is not None and self.ledger is not None:
            await self.ledger.settle(
                hold,
                cost,
                estimate=self.worst,
                provider=self.provider,
                generation_id=generation_id or None,
            )
        self.charged += cost


def _text(value: object) -> str | None:
    return scrub(value) if isinstance(value, str) and value else None


def _error_finish(answer: dict[str, Any]) -> str | None:
    """The error an answer ended with (``finish_reason: "error"``), or ``None``."""
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict):
        return None
    error = first.get("error")
    if first.get("finish_reason") != "error" and not isinstance(error, dict):
        return None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else "finish_reason error"
