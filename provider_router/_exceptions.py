"""Every error provider_router raises, under one root.

Misuse (a wrong argument, a bad data file) and runtime failure (OpenRouter or a
provider said no, the money ran out) are separate branches, so a caller can
catch "my mistake" apart from "the world's"::

    ProviderRouterError
    ├── ConfigurationError (ValueError)      misuse: bad argument, option or setting
    │   ├── DataFileError                    a data file is wrong; names file and line
    │   ├── JobRefused                       a run refused before anything is sent or written
    │   └── MissingDependencyError (ImportError)
    │                                        an optional extra is not installed
    ├── APIError                             talking to OpenRouter failed
    │   ├── APIConnectionError (ConnectionError)
    │   │   └── RequestTimeout (TimeoutError)
    │   ├── InvalidResponseError             a body that is not what the route returns
    │   │   └── ResponseCarriedError         HTTP 200 whose body or stream carries an error
    │   └── APIStatusError                   a non-2xx answer; carries status, body, headers
    │       ├── BadRequestError              400 (and 422)
    │       │   └── ContextLengthExceeded        too long for every allowed context (not sent)
    │       ├── AuthenticationError          401
    │       ├── PaymentRequiredError         402, with ``limit_source``
    │       ├── PermissionDeniedError        403
    │       ├── NotFoundError                404
    │       ├── RateLimitError               429, with ``retry_after``
    │       └── ProviderUnavailableError     5xx: 500, 502, 503, 524, 529
    ├── BudgetError                          the money side said no
    │   ├── BudgetExhausted                  the ledger cannot cover a reservation
    │   ├── CreditsExhausted                 a spend limit OpenRouter keeps ran out (402 or 403)
    │   ├── LedgerWriteError                 a paid answer the ledger could not record
    │   ├── LedgerUnavailableError           the ledger's store was gone past its outage window
    │   └── JobStopped                       a job (on Ray) ended with prompts not sent
    ├── PolicyViolationError                 an unallowed provider served a request
    ├── RouterStopping                       stopping (Router.stop): no new attempt started
    ├── PreflightFailed                      a run's preflight found what it relies on missing
    └── AllAttemptsFailed (ExceptionGroup)   every attempt failed; holds each attempt's error

Only ``_http`` translates aiohttp's exceptions into these (``raise ... from exc``).
No message, repr or attribute here ever holds an API key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from provider_router._constants import DISTRIBUTION
from provider_router._format import format_usd
from provider_router._secrets import scrub, scrub_json
from provider_router._spend_limits import SpendLimit, classify

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AllAttemptsFailed",
    "AuthenticationError",
    "BadRequestError",
    "BudgetError",
    "BudgetExhausted",
    "ConfigurationError",
    "ContextLengthExceeded",
    "CreditsExhausted",
    "DataFileError",
    "InvalidResponseError",
    "JobRefused",
    "JobStopped",
    "LedgerUnavailableError",
    "LedgerWriteError",
    "MissingDependencyError",
    "NotFoundError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "PolicyViolationError",
    "PreflightFailed",
    "ProviderRouterError",
    "ProviderUnavailableError",
    "RateLimitError",
    "RequestTimeout",
    "ResponseCarriedError",
    "RouterStopping",
    "error_for_status",
]


class ProviderRouterError(Exception):
    """Root of every error this package raises."""


# --- misuse -----------------------------------------------------------------


class ConfigurationError(ProviderRouterError, ValueError):
    """A wrong argument, option or setting: fix the call, not the network."""


class DataFileError(ConfigurationError):
    """A data file (market, faults, plan, prompts, snapshot) is wrong.

    The message always names the file and, where there is one, the line.
    """

    def __init__(self, path: str | Path, message: str, *, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        self.detail = message
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {message}")


class JobRefused(ConfigurationError):
    """A run cannot start with what it was given: a prompt file missing or without a
    usable line, a job directory it may not write, no API key, options that do not fit
    the plan. Raised before anything is sent or written; the message says what to change."""


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional extra is needed: the message says what to install."""

    def __init__(self, feature: str, extra: str) -> None:
        self.feature = feature
        self.extra = extra
        super().__init__(
            f"{feature} needs the optional dependency set {extra!r}: "
            f"pip install '{DISTRIBUTION}[{extra}]'"
        )


# --- talking to OpenRouter ----------------------------------------------------


class APIError(ProviderRouterError):
    """Talking to OpenRouter failed.

    Its message never holds an API key, even one the server echoed back
    (:mod:`provider_router._secrets`).

    Attributes:
        provider_name: the upstream provider involved, when OpenRouter named one.
    """

    provider_name: str | None = None

    def __init__(self, *args: object) -> None:
        clean = tuple(scrub(a) if isinstance(a, str) else a for a in args)
        super().__init__(*clean)
        self.args = clean  # OSError-derived subclasses took the raw args in __new__


class APIConnectionError(APIError, ConnectionError):
    """The connection failed or was cut before a complete answer arrived.

    Attributes:
        request_sent: ``False`` only when the request provably never reached
            OpenRouter (the connection, DNS lookup or TLS handshake failed before
            any byte of the body was written): only then can it not have been
            billed. ``True`` (the default) means it may have been.
    """

    request_sent: bool = True


class RequestTimeout(APIConnectionError, TimeoutError):
    """No (complete) answer within the configured timeout."""


class InvalidResponseError(APIError):
    """The body is not what the route returns: says what was expected and what came."""


class ResponseCarriedError(InvalidResponseError):
    """HTTP 200, but the body (or a stream chunk) carries an ``error`` object.

    OpenRouter does this when a provider fails after the response has started:
    ``finish_reason: "error"`` and an ``error`` with code and message.
    """

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        provider_name: str | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        self.code = code
        self.provider_name = None if provider_name is None else scrub(provider_name)
        self.body: Mapping[str, Any] | None = None if body is None else scrub_json(body)
        super().__init__(message)


class APIStatusError(APIError):
    """OpenRouter answered with a non-2xx status.

    Attributes:
        status: the HTTP status.
        message: OpenRouter's ``error.message`` (or the reason phrase).
        body: the parsed JSON body, or ``None`` when it was not JSON.
        headers: response headers, lower-cased names.
        provider_name: ``error.metadata.provider_name`` when present.
        error_type: ``error.metadata.error_type`` (or ``error.error_type``) when present.
        retry_after: seconds to wait, from ``Retry-After`` or the body, when given.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        provider_name: str | None = None,
        error_type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        # A server may echo the key anywhere: keep only scrubbed copies.
        message = scrub(message)
        provider_name = None if provider_name is None else scrub(provider_name)
        self.status = status
        self.message = message
        self.body: Mapping[str, Any] | None = None if body is None else scrub_json(body)
        self.headers: dict[str, str] = {
            scrub(k.lower()): scrub(v) for k, v in (headers or {}).items()
        }
        self.provider_name = provider_name
        self.error_type = None if error_type is None else scrub(error_type)
        self.retry_after = retry_after
        where = f" from {provider_name}" if provider_name else ""
        super().__init__(f"HTTP {status}{where}: {message}")

    @property
    def spend_limit(self) -> SpendLimit | None:
        """The spend limit this answer means (a 402, or a 403 naming a key limit, a
        workspace or guardrail budget), or ``None`` (docs/errors.md, "Spend limits")."""
        return classify(self.status, self.message, self.body)


class BadRequestError(APIStatusError):
    """400 or 422: the request itself is wrong; retrying will not help.

    A prompt too long for every endpoint (``error_type`` ``context_length_exceeded``)
    is one: :attr:`context_limit` and :attr:`requested_tokens` say by how much.
    """

    @property
    def context_limit(self) -> int | None:
        """The context length the request exceeded (tokens), when OpenRouter says."""
        return _context_numbers(self)[0]

    @property
    def requested_tokens(self) -> int | None:
        """The tokens the request asked for (prompt + completion), when OpenRouter says."""
        return _context_numbers(self)[1]


class ContextLengthExceeded(BadRequestError):
    """A request too long for every allowed endpoint's context, refused before it was
    sent (a 400 ``context_length_exceeded`` is what OpenRouter would answer).

    Attributes:
        limit: the largest context length among the allowed endpoints (tokens).
        least: a lower bound on the tokens the request needs (prompt + completion cap).
    """

    request_sent = False

    def __init__(self, limit: int, least: int, message: str) -> None:
        super().__init__(400, message, error_type="context_length_exceeded")
        self.limit = limit
        self.least = least

    @property
    def context_limit(self) -> int | None:
        return self.limit

    @property
    def requested_tokens(self) -> int | None:
        return self.least


_CONTEXT_WORDING = re.compile(
    r"maximum context length is (\d+) tokens.*?requested about (\d+) tokens", re.DOTALL
)


def _context_numbers(error: APIStatusError) -> tuple[int | None, int | None]:
    if error.error_type not in (None, "context_length_exceeded"):
        return None, None
    match = _CONTEXT_WORDING.search(error.message[:2000])
    if match is None:
        return None, None
    return int(match.group(1)), int(match.group(2))


class AuthenticationError(APIStatusError):
    """401: missing, unknown or expired key."""


class PaymentRequiredError(APIStatusError):
    """402: credits or a key limit do not cover the request.

    Attributes:
        limit_source: ``error.metadata.limit_source`` when OpenRouter says which
            limit it was (``"openrouter_credits"``, ``"openrouter_key_limit"``, or the
            transient ``"openrouter_in_flight_budget"``), else ``None``.
    """

    @property
    def limit_source(self) -> str | None:
        metadata = _error_metadata(self.body)
        value = metadata.get("limit_source")
        return value if isinstance(value, str) else None


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this, a guardrail or moderation refused the input, or a
    spend limit is used up (a key past its limit, a workspace or guardrail budget:
    :attr:`spend_limit` says which; the router then raises :class:`CreditsExhausted`)."""


class NotFoundError(APIStatusError):
    """404: unknown model, or no endpoint left after the routing filters."""


class RateLimitError(APIStatusError):
    """429: OpenRouter or the upstream provider is rate limiting us."""


class ProviderUnavailableError(APIStatusError):
    """5xx: the provider failed, is down or overloaded, or the edge timed out."""


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    402: PaymentRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    422: BadRequestError,
    429: RateLimitError,
}


def error_for_status(status: int) -> type[APIStatusError]:
    """The exception class for an HTTP status (408 maps to a timeout elsewhere)."""
    if status >= 500:
        return ProviderUnavailableError
    return _STATUS_ERRORS.get(status, APIStatusError)


def _error_metadata(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not body:
        return {}
    error = body.get("error")
    if not isinstance(error, Mapping):
        return {}
    metadata = error.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


# --- money ----------------------------------------------------------------------


class BudgetError(ProviderRouterError):
    """The money side refused: our ledger or OpenRouter's balance."""


class BudgetExhausted(BudgetError):
    """The ledger cannot cover a reservation.

    Attributes:
        requested: the reservation asked for, in USD.
        spent: settled spend so far, in USD.
        reserved: held by requests in flight, in USD.
        limit: the ledger's limit, in USD.
    """

    def __init__(
        self, *, requested: Decimal, spent: Decimal, reserved: Decimal, limit: Decimal
    ) -> None:
        self.requested = requested
        self.spent = spent
        self.reserved = reserved
        self.limit = limit
        available = limit - spent - reserved
        message = (
            f"budget exhausted: a reservation of {format_usd(requested)} does not fit "
            f"(limit {format_usd(limit)}, spent {format_usd(spent)}, reserved "
            f"{format_usd(reserved)}, available {format_usd(available)})"
        )
        if spent > limit:
            message += (
                f"; spent is {format_usd(spent - limit)} above the limit (a settle overran its "
                "reservation, or the limit was lowered below what requests in flight held): "
                "nothing is admitted until the limit covers it"
            )
        super().__init__(message)


class CreditsExhausted(BudgetError):
    """A spend limit OpenRouter keeps ran out: the account's balance, the key's limit, a
    workspace or guardrail budget (a 402 or 403 that will not pass).

    Attributes:
        limit_source: which limit OpenRouter named, when it did.
        spent: what this client spent, in USD.
        remaining: what this client's ledger still allows, when it has one. The
            ledger's budget may outlast OpenRouter's balance: that is why this
            error exists.
        limit: the limit as classified (``limit.kind``, ``limit.what``,
            ``limit.remedy``: what lifts it), when the answer was read.
    """

    def __init__(
        self,
        message: str,
        *,
        limit_source: str | None = None,
        spent: Decimal | None = None,
        remaining: Decimal | None = None,
        limit: SpendLimit | None = None,
    ) -> None:
        self.limit_source = limit_source
        self.spent = spent
        self.remaining = remaining
        self.limit = limit
        parts = [message]
        if limit_source:
            parts.append(f"limit_source={limit_source}")
        if spent is not None:
            parts.append(f"spent {format_usd(spent)}")
        if remaining is not None:
            parts.append(f"ledger budget left {format_usd(remaining)}")
        super().__init__("; ".join(parts))


class LedgerWriteError(BudgetError):
    """An answer was paid for, but the ledger could not record its charge.

    The ledger call was retried (bounded) first. The answer is not lost: it is
    in :attr:`result`; its reservation stays open in the ledger at its worst
    case, with the generation id when the ledger took it, so the next recovery
    settles it through ``/generation``. Do not send the request again.

    Attributes:
        result: the paid answer (a :class:`~provider_router.ChatResult`).
    """

    def __init__(self, message: str, *, result: Any) -> None:
        self.result = result
        super().__init__(message)


class LedgerUnavailableError(BudgetError):
    """The ledger's store (Redis) stayed unreachable for longer than its outage window,
    or lost the ledger (a Redis restarted without persistence): the message says which.

    Shorter outages are waited out: every ledger call is retried with backoff,
    so admission pauses and resumes with nothing lost. Past the window a run
    stops; nothing is lost either (open reservations stay in the store, and are
    settled or recovered when it is back): run the same command again.
    """


class JobStopped(BudgetError):
    """A job ended with prompts not sent (the budget, or OpenRouter's credits).

    Every paid answer is kept in the job's store and output; :attr:`summary` says
    what is left, and the message what budget finishes it.

    Attributes:
        summary: the job's :class:`~provider_router.jobs.RunSummary` (also written
            as ``summary.json``).
    """

    def __init__(self, message: str, summary: Any) -> None:
        self.summary = summary
        super().__init__(message)


# --- policy -----------------------------------------------------------------------


class PolicyViolationError(ProviderRouterError):
    """A provider the policy does not allow served a request."""

    def __init__(self, provider: str, allowed: Sequence[str]) -> None:
        self.provider = provider
        self.allowed = tuple(allowed)
        super().__init__(
            f"request served by {provider!r}, which the policy does not allow "
            f"(allowed: {', '.join(self.allowed) or 'none'})"
        )


class RouterStopping(ProviderRouterError):
    """The router is stopping (:meth:`Router.stop`): this request starts no new attempt.

    Raised instead of a retry (its back-off is cut short) or a first attempt that
    had not started. ``errors`` holds the attempts' errors so far, oldest first
    (empty when none was made); the last one is also the ``__cause__``. Nothing
    was sent for it after the stop, so nothing was paid for it after the stop.
    """

    def __init__(self, message: str, errors: Sequence[BaseException] = ()) -> None:
        super().__init__(message)
        self.errors = tuple(errors)


class PreflightFailed(ProviderRouterError):
    """A run's preflight found something the run relies on that does not hold.

    Attributes:
        report: every check, with the failures (a
            :class:`~provider_router.checks.preflight.PreflightReport`).
    """

    def __init__(self, report: Any) -> None:
        self.report = report
        names = ", ".join(c.name for c in report.failures)
        super().__init__(f"the preflight of {report.model} failed ({names})")


class AllAttemptsFailed(ExceptionGroup[Exception], ProviderRouterError):
    """Every attempt at a request failed; ``exceptions`` holds each attempt's error."""
