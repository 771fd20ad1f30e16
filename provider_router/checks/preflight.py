"""A preflight before real money: does the live service answer what a run relies on?

:func:`preflight` checks, in order, and stops at the first check the next ones depend
on: the key (``GET /key``), the account's credits, that the model exists, the
policy's verdicts, then one tiny request pinned to the top-ranked allowed endpoint:
the provider that served it, its ``usage.cost``, that cost against the listing's
price arithmetic (which every reservation relies on), and ``/generation``'s figure.
Each check is a :class:`Check` naming what held or what did not; nothing is raised for
a failed check (only for misuse). Given a ``ledger`` (a run's own), the request is
reserved and booked there like any other, so the ledger keeps counting every charge;
a budget with no room for it skips the request ("could not tell", not a failure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from pydantic import SecretStr

from provider_router._constants import COST_TOLERANCE, ENV_API_KEY
from provider_router._exceptions import (
    APIStatusError,
    AuthenticationError,
    BudgetExhausted,
    LedgerWriteError,
    NotFoundError,
    ProviderRouterError,
    ResponseCarriedError,
)
from provider_router._format import decimal_str, format_usd
from provider_router._http.session import HttpClient, resolve_api_key
from provider_router._money import reported_cost, to_decimal
from provider_router.catalog.fetch import Catalog
from provider_router.catalog.records import Endpoint, ModelEndpoints
from provider_router.checks._pinned_request import PinnedRequest
from provider_router.client._cost_check import CostVerdict
from provider_router.ledger import Ledger
from provider_router.routing.policy import ProviderPolicy
from provider_router.routing.ranking import Workload, rank

__all__ = ["Check", "PreflightReport", "preflight"]

PREFLIGHT_PROMPT: Final = "Reply with the single word OK."
GENERATION_ATTEMPTS: Final = 6
"""``/generation`` may 404 for a moment after the answer; try this many times."""
GENERATION_FIRST_WAIT: Final = 0.25

KEYS_URL: Final = "https://openrouter.ai/keys"
PROMPT_TOKENS_BOUND: Final = 256
"""An upper bound on the pinned request's prompt tokens (a 7-word prompt plus any chat
template): its reservation is the listed price of these and one completion token."""

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Check:
    """One preflight check.

    Attributes:
        name: ``key``, ``credits``, ``model``, ``policy``, ``request``,
            ``provider``, ``usage.cost``, ``price`` or ``generation``.
        ok: True held, False did not hold, None could not tell (not a failure).
        detail: what was found, in a sentence.
    """

    name: str
    ok: bool | None
    detail: str


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """Every check that ran, in order; :attr:`ok` when none failed."""

    model: str
    checks: tuple[Check, ...]
    cost: Decimal = Decimal(0)
    """USD the pinned request cost, every attempt (with a ledger: what it was charged)."""
    verdict: CostVerdict | None = None
    """Set when the answer's ``usage.cost`` was not sane: confirmed by ``/generation``
    and booked, or disputed (``verdict.disputed``) with the worst case booked."""

    @property
    def ok(self) -> bool:
        """No check failed (a check that could not tell is not a failure)."""
        return all(check.ok is not False for check in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        """The checks that did not hold."""
        return tuple(check for check in self.checks if check.ok is False)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "model": self.model,
            "ok": self.ok,
            "cost_usd": decimal_str(self.cost),
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def _usd(value: object) -> Decimal | None:
    try:
        return None if value is None else to_decimal(value, what="amount")
    except ValueError:
        return None


async def _key_checks(http: HttpClient) -> list[Check]:
    try:
        body = await http.get_json("/key")
    except AuthenticationError as exc:
        why = f"OpenRouter rejected the key ({exc.message})"
        return [Check("key", False, f"{why}: set {ENV_API_KEY} to a valid key ({KEYS_URL})")]
    data = body.get("data", {}) if isinstance(body, dict) else {}
    limit = _usd(data.get("limit"))
    remaining = _usd(data.get("limit_remaining"))
    usage = _usd(data.get("usage"))
    label = data.get("label") or "the key"
    if limit is None:
        checks = [
            Check("key", True, f"{label} is valid; no spending limit; used {format_usd(usage)}")
        ]
    else:
        ok = remaining is None or remaining > 0
        checks = [
            Check(
                "key",
                ok,
                f"{label} is valid; limit {format_usd(limit)}, {format_usd(remaining)} left"
                + (
                    ""
                    if ok
                    else ": the key's limit is used up (raise it at openrouter.ai/settings/keys)"
                ),
            )
        ]
    try:
        credits = await http.get_json("/credits")
    except APIStatusError as exc:
        checks.append(
            Check("credits", None, f"the balance is not readable with this key ({exc.status})")
        )
        return checks
    data = credits.get("data", {}) if isinstance(credits, dict) else {}
    total, used = _usd(data.get("total_credits")), _usd(data.get("total_usage"))
    if total is None or used is None:
        checks.append(Check("credits", None, "the balance was not reported"))
    else:
        balance = total - used
        checks.append(
            Check(
                "credits",
                balance > 0,
                f"balance {format_usd(balance)} "
                f"({format_usd(total)} bought, {format_usd(used)} used)"
                + ("" if balance > 0 else ": add credits at openrouter.ai/credits"),
            )
        )
    return checks


def _policy_check(listing: ModelEndpoints, policy: ProviderPolicy) -> tuple[Check, Endpoint | None]:
    decisions = policy.evaluate(listing)
    allowed = list(decisions.allowed)
    rejected = [d for d in decisions if not d.allowed]
    reasons = "; ".join(f"{d.endpoint.provider_name}: {d.reason}" for d in rejected)
    detail = f"{len(allowed)} of {len(decisions)} endpoints allowed" + (
        f" (rejected — {reasons})" if rejected else ""
    )
    if not allowed:
        return Check("policy", False, detail + ": nothing may serve this model"), None
    top = rank(allowed, workload=Workload(prompt_tokens=200, completion_tokens=2000))[0].endpoint
    return Check("policy", True, f"{detail}; top-ranked: {top.provider_name} ({top.tag})"), top


async def _generation_cost(http: HttpClient, generation_id: str, sleep: Sleep) -> Decimal | None:
    wait = GENERATION_FIRST_WAIT
    for attempt in range(GENERATION_ATTEMPTS):
        try:
            body = await http.get_json("/generation", params={"id": generation_id})
        except NotFoundError:
            if attempt + 1 < GENERATION_ATTEMPTS:
                await sleep(wait)
                wait *= 2
            continue
        data = body.get("data", {}) if isinstance(body, dict) else {}
        return _usd(data.get("total_cost"))
    return None


def _request_failed(top: Endpoint, request: PinnedRequest, exc: ProviderRouterError) -> Check:
    tries = f" after {request.attempts} attempts" if request.attempts > 1 else ""
    if isinstance(exc, ResponseCarriedError) and request.empty_answers == request.attempts:
        # Insured empty answers only: the provider is failing, the price is not wrong.
        return Check(
            "request",
            None,
            f"a 1-token request pinned to {top.tag} ended with an error each time{tries} "
            "(billed $0 under zero-completion insurance): its price could not be checked",
        )
    return Check("request", False, f"a 1-token request pinned to {top.tag} failed{tries}: {exc}")


async def _request_checks(
    http: HttpClient, model: str, top: Endpoint, request: PinnedRequest
) -> list[Check]:
    try:
        answered = await request.send()
    except BudgetExhausted:
        raise
    except ProviderRouterError as exc:
        return [_request_failed(top, request, exc)]
    answer = answered.body
    served = answer.get("provider")
    raw_usage = answer.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    generation_id = answer.get("id")
    has_id = isinstance(generation_id, str) and bool(generation_id)
    checks = [Check("request", True, f"a 1-token request pinned to {top.tag} was answered")]
    checks.append(
        Check(
            "provider",
            served == top.provider_name,
            f"served by {served!r}"
            + ("" if served == top.provider_name else f", not the pinned {top.provider_name!r}"),
        )
    )
    cost = answered.cost
    if answered.verdict is not None:
        checks.append(Check("usage.cost", False, answered.verdict.reason))
        return checks
    if cost is None:
        checks.append(
            Check(
                "usage.cost",
                False,
                "the answer has no usage.cost (as a JSON number): spend could not be "
                f"settled exactly; {format_usd(answered.booked)} was booked for it",
            )
        )
        return checks
    # One precision for the three figures of one request's price: exact (its digits).
    checks.append(Check("usage.cost", True, f"usage.cost ${decimal_str(cost)}"))
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    written = int(details.get("cache_write_tokens") or 0) if isinstance(details, dict) else 0
    try:
        expected: Decimal | None = top.pricing.cost(
            prompt, completion, cached_tokens=cached, cache_write_tokens=written
        )
    except ValueError as exc:
        expected = None
        checks.append(Check("price", False, f"the listing's price cannot be computed: {exc}"))
    if expected is not None:
        held = abs(expected - cost) <= COST_TOLERANCE
        checks.append(
            Check(
                "price",
                held,
                f"{prompt} prompt + {completion} completion tokens at the listed price = "
                f"${decimal_str(expected)}; usage.cost = ${decimal_str(cost)}"
                + ("" if held else ": the listing does not price what is billed"),
            )
        )
    if not has_id:
        checks.append(Check("generation", False, "the answer has no generation id"))
        return checks
    total = await request.generation_cost(str(generation_id))
    if total is None:
        checks.append(
            Check("generation", False, f"/generation?id={generation_id} reported no cost")
        )
    else:
        same = abs(total - cost) <= COST_TOLERANCE
        checks.append(
            Check(
                "generation",
                same,
                f"/generation total_cost ${decimal_str(total)}"
                + ("" if same else f" ≠ usage.cost ${decimal_str(cost)}"),
            )
        )
    return checks


async def _ledgered_request_checks(
    http: HttpClient, model: str, top: Endpoint, sleep: Sleep, ledger: Ledger | None
) -> tuple[list[Check], Decimal, CostVerdict | None]:
    """The request's checks, what it cost and its disputes; paid from ``ledger`` if given.

    Every attempt reserves its worst case there before it is sent and is settled
    (with its generation id) or released as the router would (:mod:`_pinned_request`).
    """
    try:
        worst = top.pricing.cost(PROMPT_TOKENS_BOUND, 1)
    except ValueError as exc:
        why = f"the listing's price cannot be computed ({exc}); nothing was sent"
        return [Check("request", False, why)], Decimal(0), None

    async def generation_cost(generation_id: str) -> Decimal | None:
        return await _generation_cost(http, generation_id, sleep)

    async def key_usage() -> Decimal | None:
        try:
            body = await http.get_json("/key")
        except ProviderRouterError:
            return None
        data = body.get("data") if isinstance(body, dict) else None
        value = reported_cost(data.get("usage")) if isinstance(data, dict) else None
        return value

    body = {
        "model": model,
        "messages": [{"role": "user", "content": PREFLIGHT_PROMPT}],
        "max_tokens": 1,
        "provider": {"only": [top.tag], "allow_fallbacks": False},
        "usage": {"include": True},
    }

    def pricing(usage: dict[str, Any]) -> Decimal | None:
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        try:
            return top.pricing.cost(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                cached_tokens=int(details.get("cached_tokens") or 0),
                cache_write_tokens=int(details.get("cache_write_tokens") or 0),
            )
        except (ValueError, TypeError):
            return None

    request = PinnedRequest(
        http, body, worst, ledger, sleep, generation_cost, key_usage, top.provider_name, pricing
    )
    try:
        checks = await _request_checks(http, model, top, request)
    except BudgetExhausted:
        why = f"not sent: the budget has no room for its worst case ({format_usd(worst)})"
        if request.attempts > 1:
            why = f"not retried: the budget has no room for its worst case ({format_usd(worst)})"
        return [Check("request", None, why)], request.charged, None
    except ProviderRouterError:
        raise
    except Exception as exc:  # a full disk, say: one clear error, not a traceback
        raise LedgerWriteError(
            f"the ledger could not record the preflight request's charge ({exc}); its "
            "reservation stays open at its worst case until the next run reconciles it",
            result=None,
        ) from exc
    return checks, request.charged, request.verdict


async def preflight(
    model: str,
    policy: ProviderPolicy | None = None,
    *,
    base_url: str | None = None,
    api_key: str | SecretStr | None = None,
    listing: ModelEndpoints | None = None,
    request: bool = True,
    ledger: Ledger | None = None,
    sleep: Sleep = asyncio.sleep,
) -> PreflightReport:
    """Check the key, the credits, the model, the policy and one tiny pinned request.

    Args:
        model: the model id the run will use.
        policy: the run's policy (default: no rules).
        base_url: API root (default ``$OPENROUTER_BASE_URL``, else OpenRouter).
        api_key: the key (default ``$OPENROUTER_API_KEY``).
        listing: the endpoints listing to judge and price against (default: fetched);
            pass a snapshot's to check that it still tells the truth.
        request: also send the 1-token pinned request and check its answer (checks
            5 to 9); without it the preflight is free (GETs only).
        ledger: reserve the request's worst case here and settle it at what it
            cost (a run passes its own ledger, so its spend counts every charge).
        sleep: waits between ``/generation`` lookups and 429 retries (injected in tests).
    """
    policy = policy if policy is not None else ProviderPolicy()
    if resolve_api_key(api_key) is None:
        return PreflightReport(
            model,
            (
                Check(
                    "key",
                    False,
                    f"no API key: set {ENV_API_KEY} to your OpenRouter key ({KEYS_URL})",
                ),
            ),
        )
    checks: list[Check] = []
    async with HttpClient(base_url, api_key) as http:
        checks += await _key_checks(http)
        if any(c.ok is False and c.name == "key" for c in checks):
            return PreflightReport(model, tuple(checks))
        if listing is None:
            try:
                async with Catalog(base_url=base_url, api_key=api_key) as catalog:
                    listing = await catalog.endpoints(model)
            except (NotFoundError, APIStatusError) as exc:
                checks.append(Check("model", False, f"{model} is not available: {exc}"))
                return PreflightReport(model, tuple(checks))
        checks.append(Check("model", True, f"{model}: {len(listing.endpoints)} endpoints listed"))
        verdict, top = _policy_check(listing, policy)
        checks.append(verdict)
        if not request or top is None or any(c.ok is False for c in checks):
            # No paid request when something it depends on already failed.
            return PreflightReport(model, tuple(checks))
        more, cost, anomaly = await _ledgered_request_checks(http, model, top, sleep, ledger)
    return PreflightReport(model, (*checks, *more), cost, anomaly)
