"""Which spend limit a 402 or 403 from OpenRouter means, and what lifts it.

OpenRouter refuses a request that a limit cannot cover in more than one form: its
docs describe 402s with ``error.metadata.limit_source`` (``openrouter_credits``,
``openrouter_key_limit``, the transient ``openrouter_in_flight_budget``) and a
``reason`` (``in_flight_budget_exhausted``, ``weight_exceeds_budget``), while keys past
their limit answer a bare 403 ``Key limit exceeded (monthly limit)`` in the field, and
workspace and guardrail budgets answer 403s of their own (docs/openrouter.md,
"Spend limits"). :func:`classify` reads status, message, ``limit_source`` and ``reason``
into one :class:`SpendLimit`, or ``None`` for a 403 that is no spend limit (a guardrail
content block, moderation, a key not allowed to do something). Only an in-flight hold
passes by itself; every other limit stops a run until someone lifts it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

__all__ = ["KEYS_URL", "SpendLimit", "SpendLimitKind", "classify"]

KEYS_URL: Final = "https://openrouter.ai/settings/keys"
CREDITS_URL: Final = "https://openrouter.ai/settings/credits"


class SpendLimitKind(StrEnum):
    """Which limit refused the request."""

    IN_FLIGHT = "in_flight"
    """The account's in-flight budget: holds of requests in flight (transient)."""
    CREDITS = "credits"
    """The account's balance cannot cover the request."""
    REQUEST_TOO_LARGE = "request_too_large"
    """One request's estimate is above the whole in-flight budget (``weight_exceeds_budget``)."""
    KEY_LIMIT = "key_limit"
    """The API key's own credit limit."""
    WORKSPACE_BUDGET = "workspace_budget"
    """The workspace's budget (Enterprise)."""
    GUARDRAIL_BUDGET = "guardrail_budget"
    """The budget of a guardrail that applies to the key."""
    OTHER = "other"
    """A limit OpenRouter named in a way we do not know (its ``limit_source`` is kept)."""


_SOURCES: Final = {
    "openrouter_in_flight_budget": SpendLimitKind.IN_FLIGHT,
    "openrouter_credits": SpendLimitKind.CREDITS,
    "openrouter_key_limit": SpendLimitKind.KEY_LIMIT,
    "openrouter_workspace_budget": SpendLimitKind.WORKSPACE_BUDGET,
    "openrouter_guardrail_budget": SpendLimitKind.GUARDRAIL_BUDGET,
}
_REASONS: Final = {
    "in_flight_budget_exhausted": SpendLimitKind.IN_FLIGHT,
    "weight_exceeds_budget": SpendLimitKind.REQUEST_TOO_LARGE,
}
_BUDGETS: Final = frozenset(
    {
        SpendLimitKind.KEY_LIMIT,
        SpendLimitKind.WORKSPACE_BUDGET,
        SpendLimitKind.GUARDRAIL_BUDGET,
        SpendLimitKind.OTHER,
    }
)

# Field wordings (docs/openrouter.md, "Spend limits"), lower-cased before matching.
_KEY_LIMIT = re.compile(r"key limit exceeded(?: \((daily|weekly|monthly|total) limit\))?")
_WORKSPACE = re.compile(r"workspace (?:(daily|weekly|monthly|lifetime) )?budget\b.*\bexceeded")
_GUARDRAIL = re.compile(r"guardrail.*\bbudget|\bbudget\b.*guardrail|budget limit exceeded")
_AFFORD = re.compile(r"can only afford|more credits are required|prompt tokens limit exceeded")
_KEY_REMEDY = re.compile(r"settings/keys|openrouter\.ai/keys|key with a higher")
_CONTENT_BLOCK: Final = frozenset({"patterns", "reasons", "flagged_input"})
"""``metadata`` fields of a guardrail content block or a moderation refusal."""


@dataclass(frozen=True, slots=True)
class SpendLimit:
    """A spend limit that refused a request, and what lifts it.

    Attributes:
        kind: which limit.
        status: the HTTP status it came with (402 or 403).
        message: OpenRouter's ``error.message`` (never holds a key: it comes from an
            error whose text was scrubbed).
        limit_source: ``error.metadata.limit_source``, when it was given.
        reason: ``error.metadata.reason``, when it was given.
        interval: the limit's window when the message names one (``daily``,
            ``weekly``, ``monthly``, ``total``, ``lifetime``).
    """

    kind: SpendLimitKind
    status: int
    message: str
    limit_source: str | None = None
    reason: str | None = None
    interval: str | None = None

    @property
    def transient(self) -> bool:
        """It passes by itself (the in-flight hold): worth waiting out and retrying."""
        return self.kind is SpendLimitKind.IN_FLIGHT

    @property
    def is_budget(self) -> bool:
        """A budget someone set (a key's, workspace's or guardrail's limit), not the
        account's money: a job stops on it as on its own budget (exit 3)."""
        return self.kind in _BUDGETS

    @property
    def what(self) -> str:
        """The limit in a few words (``the key's monthly limit``)."""
        window = f"{self.interval} " if self.interval and self.interval != "total" else ""
        kind = self.kind
        if kind is SpendLimitKind.KEY_LIMIT:
            return f"the API key's {window}limit"
        if kind is SpendLimitKind.WORKSPACE_BUDGET:
            return f"the workspace's {window}budget"
        if kind is SpendLimitKind.GUARDRAIL_BUDGET:
            return "a guardrail's budget"
        if kind is SpendLimitKind.CREDITS:
            return "the account's credits"
        if kind is SpendLimitKind.IN_FLIGHT:
            return "the account's in-flight budget"
        if kind is SpendLimitKind.REQUEST_TOO_LARGE:
            return "the account's in-flight budget (one request's estimate is above it)"
        return f"a spend limit ({self.limit_source or 'unnamed'})"

    @property
    def remedy(self) -> str:
        """What lifts it, as an instruction."""
        kind = self.kind
        resets = self.interval in ("daily", "weekly", "monthly")
        wait = f", or wait until the {self.interval} window resets" if resets else ""
        if kind is SpendLimitKind.KEY_LIMIT:
            return f"raise the key's limit on {KEYS_URL} or use another key{wait}"
        if kind is SpendLimitKind.WORKSPACE_BUDGET:
            return f"ask the workspace admin to raise the workspace's budget{wait}"
        if kind is SpendLimitKind.GUARDRAIL_BUDGET:
            return "ask the admin of the guardrail that applies to the key to raise its budget"
        if kind is SpendLimitKind.CREDITS:
            return f"top up the OpenRouter credits at {CREDITS_URL}"
        if kind is SpendLimitKind.IN_FLIGHT:
            return "let the requests in flight settle, or add credits"
        if kind is SpendLimitKind.REQUEST_TOO_LARGE:
            return "lower max_tokens or shorten the prompts, or add credits"
        return f"check the key's limits on {KEYS_URL} and the account's budgets"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``summary.json``'s ``spend_limit``)."""
        return {
            "kind": self.kind.value,
            "status": self.status,
            "limit_source": self.limit_source,
            "reason": self.reason,
            "interval": self.interval,
            "message": self.message,
            "remedy": self.remedy,
        }


def classify(status: int, message: str, body: Mapping[str, Any] | None) -> SpendLimit | None:
    """The spend limit a 402 or 403 answer means, or ``None`` when it means none.

    Every 402 is one (an unnamed one counts as the account's credits). A 403 is one
    when its ``limit_source`` or ``reason`` names a limit, or its message is a known
    key-limit, workspace-budget or guardrail-budget wording; a content block or a
    moderation refusal (``metadata`` with ``patterns``, ``reasons`` or
    ``flagged_input``) never is.

    Args:
        status: the HTTP status.
        message: ``error.message``.
        body: the parsed JSON body (``error.metadata`` is read from it), if any.
    """
    if status not in (402, 403):
        return None
    metadata = _metadata(body)
    source = _text(metadata.get("limit_source"))
    reason = _text(metadata.get("reason"))
    said = message.lower()
    interval = None
    kind = _REASONS.get(reason or "")
    if kind is None and source is not None:
        kind = _SOURCES.get(source, SpendLimitKind.OTHER)
    if kind is None and not _CONTENT_BLOCK & metadata.keys():
        kind, interval = _from_message(status, said)
    if kind is None:
        return None
    if interval is None:
        interval = _interval(said)
    return SpendLimit(kind, status, message, source, reason, interval)


def _from_message(status: int, said: str) -> tuple[SpendLimitKind | None, str | None]:
    if (match := _KEY_LIMIT.search(said)) is not None:
        return SpendLimitKind.KEY_LIMIT, match.group(1)
    if (match := _WORKSPACE.search(said)) is not None:
        return SpendLimitKind.WORKSPACE_BUDGET, match.group(1)
    if _GUARDRAIL.search(said) is not None:
        return SpendLimitKind.GUARDRAIL_BUDGET, None
    if _AFFORD.search(said) is not None and _KEY_REMEDY.search(said) is not None:
        return SpendLimitKind.KEY_LIMIT, None
    if status == 402:
        return SpendLimitKind.CREDITS, None
    return None, None


def _interval(said: str) -> str | None:
    """The window a limit-source-named refusal's message names, in the field's wordings."""
    for pattern in (_KEY_LIMIT, _WORKSPACE):
        match = pattern.search(said)
        if match is not None and match.group(1):
            return match.group(1)
    return None


def _metadata(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    error = body.get("error") if isinstance(body, Mapping) else None
    metadata = error.get("metadata") if isinstance(error, Mapping) else None
    return metadata if isinstance(metadata, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
