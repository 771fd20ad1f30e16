"""Cache-aware pinning: requests that share a prefix go to one provider, and stay there.

Providers cache the prompts they serve, and a later prompt that starts the same way
reads that prefix at the cache-read price. Two things lose those hits: a conversation
whose turns land on different providers, and a ``provider.order``, which turns
OpenRouter's own sticky routing off. So a request with a *session* (its
``session_id``, or with ``Router(cache_affinity=True)`` the conversation's opener) is
pinned to one endpoint chosen once from the plan's cache-aware ranking, sent with a
one-tag ``only``, no ``order`` and the session as ``session_id``; it moves on after
:data:`MOVE_AFTER_FAILURES` failures, a demotion or :data:`SESSION_IDLE_SECONDS` idle
(docs/client.md). A pinned request waits for its own endpoint's room (admission), and
a new session goes to the best endpoint with room then.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from provider_router._exceptions import APIConnectionError
from provider_router._types import Message
from provider_router.client._request import PreparedRequest
from provider_router.routing.route_plan import RoutePlan

__all__ = [
    "DEFAULT_CACHE_HIT_RATE",
    "DEFAULT_MAX_SESSIONS",
    "MOVE_AFTER_FAILURES",
    "SESSION_IDLE_SECONDS",
    "CacheAffinity",
    "conversation_session",
]

SESSION_IDLE_SECONDS: Final = 600.0
"""OpenRouter forgets a sticky session after 10 minutes of inactivity (prompt-caching guide)."""

DEFAULT_MAX_SESSIONS: Final = 100_000
"""Sessions remembered (about 200 bytes each) before the least recently used goes."""

MOVE_AFTER_FAILURES: Final = 2
"""Failures of one request on its pinned endpoint that move its session elsewhere."""

DEFAULT_CACHE_HIT_RATE: Final = Decimal("0.5")
"""The prompt share assumed read from cache when ranking for pinned sessions and the
workload says nothing (an assumption: a pilot's measured share replaces it)."""

_SESSION_PREFIX: Final = "pr-"
_MAX_SESSION_LENGTH: Final = 256  # OpenRouter's limit on session_id
_DIGEST_KEY_BYTES: Final = 16
_ENCODE: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str).encode


def conversation_session(messages: Sequence[Message], key: bytes = b"") -> str | None:
    """The session of a conversation: a digest of its messages up to the first user one.

    None when there is no user message (nothing identifies a conversation). The
    digest is of the text as sent, so only the same opener shares a session
    (BLAKE2b, 64 bits, as ``pr-`` + 16 hex digits). Keyed (a Router keys it with a
    random secret of its own, :attr:`CacheAffinity.digest_key`), it confirms nothing
    to whoever holds a guessed prompt: unkeyed, anyone with a candidate opener could
    check it against the ``session_id`` OpenRouter and its logs see.
    """
    for index, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            opener = _ENCODE(list(messages[: index + 1])).encode()
            digest = hashlib.blake2b(opener, digest_size=8, key=key).hexdigest()
            return _SESSION_PREFIX + digest
    return None


def check_session(value: object) -> str:
    """A caller's ``session_id``, checked as OpenRouter bounds it."""
    if not isinstance(value, str) or not value or len(value) > _MAX_SESSION_LENGTH:
        raise ValueError(
            f"session_id must be a non-empty string of at most {_MAX_SESSION_LENGTH} "
            f"characters, got {type(value).__name__} of length {len(str(value))}"
        )
    return value


class CacheAffinity:
    """Which allowed endpoint each session is pinned to.

    Args:
        idle_seconds: a session unused this long is chosen afresh.
        max_sessions: sessions remembered (least recently used forgotten first).
    """

    __slots__ = ("_idle", "_max", "_pins", "digest_key", "moves", "pinned")

    def __init__(
        self,
        *,
        idle_seconds: float = SESSION_IDLE_SECONDS,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self.digest_key = secrets.token_bytes(_DIGEST_KEY_BYTES)
        """Keys the conversation digests (:func:`conversation_session`): random per
        Router, as a pin is per Router too; a pinned request cannot go elsewhere, so
        OpenRouter need not see one conversation under one id across processes."""
        if not idle_seconds > 0:
            raise ValueError(f"idle_seconds must be > 0, got {idle_seconds!r}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions!r}")
        self._idle = idle_seconds
        self._max = max_sessions
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.pinned = 0
        """Sessions given an endpoint (a new session, an idle one, or after a move)."""
        self.moves = 0
        """Sessions moved off an endpoint that failed them."""

    def __len__(self) -> int:
        return len(self._pins)

    def pin(
        self,
        session: str,
        plan: RoutePlan,
        now: float,
        *,
        demoted: Collection[str] = (),
        failed: Sequence[str] = (),
        needs: Collection[str] = (),
        min_context: int = 0,
        prefer: Callable[[], Collection[str]] | None = None,
    ) -> str:
        """The endpoint tag ``session`` goes to now.

        Args:
            session: the session key.
            plan: the route plan in force (its allowed endpoints).
            now: the router's clock.
            demoted: provider display names currently demoted (avoided for a new pin).
            failed: the tags that failed this request, once per failure: a tag that
                failed it :data:`MOVE_AFTER_FAILURES` times, or failed it and is
                demoted, is not chosen again for it.
            needs: ``supported_parameters`` the request relies on (``tools``,
                ``response_format``): a one-tag pin has no fallback inside
                OpenRouter, so an endpoint without them is not pinned (while one
                with them is allowed).
            min_context: the context the request needs at least (its completion
                cap): an endpoint whose window is smaller is not pinned either.
            prefer: called only when the session needs a new endpoint: the tags
                where a request could go now (room, within the premium); the best of
                them is chosen, so new sessions spread over the endpoints with room
                as requests do, then stay.
        """
        pins = self._pins
        entry = pins.get(session)
        allowed = plan.order
        excluded = _excluded(plan, demoted, failed) if failed else frozenset()
        if needs or min_context:
            excluded |= _unfit(plan, needs, min_context)
        if entry is not None:
            tag, last = entry
            if now - last < self._idle and tag in allowed and tag not in excluded:
                pins[session] = (tag, now)
                pins.move_to_end(session)
                return tag
            if tag in excluded:
                self.moves += 1
        tag = _choose(plan, demoted, excluded, prefer() if prefer is not None else None)
        pins[session] = (tag, now)
        pins.move_to_end(session)
        self.pinned += 1
        while len(pins) > self._max:
            pins.popitem(last=False)
        return tag


def _excluded(plan: RoutePlan, demoted: Collection[str], failed: Sequence[str]) -> frozenset[str]:
    names = {r.endpoint.slug: r.endpoint.provider_name for r in plan.ranked}
    return frozenset(
        tag
        for tag in failed
        if failed.count(tag) >= MOVE_AFTER_FAILURES or names.get(tag) in demoted
    )


def _unfit(plan: RoutePlan, needs: Collection[str], min_context: int) -> frozenset[str]:
    """Tags that cannot take the request, unless none can (then pin as if all could)."""
    unfit = frozenset(
        r.endpoint.slug
        for r in plan.ranked
        if any(need not in r.endpoint.supported_parameters for need in needs)
        or (r.endpoint.context_length is not None and r.endpoint.context_length < min_context)
    )
    return frozenset() if len(unfit) == len(plan.ranked) else unfit


def _choose(
    plan: RoutePlan,
    demoted: Collection[str],
    failed: Collection[str],
    open_now: Collection[str] | None = None,
) -> str:
    ranked = plan.cache_ranked or plan.ranked
    fallback: str | None = None
    if open_now:
        for entry in ranked:
            tag = entry.endpoint.slug
            if tag in open_now and tag not in failed:
                return tag
    for entry in ranked:
        tag = entry.endpoint.slug
        if tag in failed:
            continue
        if entry.endpoint.provider_name not in demoted:
            return tag
        if fallback is None:
            fallback = tag
    # Every endpoint is demoted or failed: the best not yet failed, else the best.
    return fallback or ranked[0].endpoint.slug


def blames_pin(request: PreparedRequest, exc: BaseException, provider: str | None) -> bool:
    """Whether a failed attempt counts against its pinned endpoint (toward a move).

    Not when nothing reached a provider (never sent, or a connection that failed
    before the body was written: OpenRouter's side, not the pin's), nor when the
    error names another provider (with ``pin_fallbacks`` OpenRouter may have
    fallen back past the pin): moving would lose the session's cache for nothing.
    An error naming no provider after the request was sent may be the pin's.
    """
    if not isinstance(exc, Exception) or not request.sent:
        return False
    if isinstance(exc, APIConnectionError) and not exc.request_sent:
        return False
    if not provider:
        return True
    pinned = request.pinned
    return any(
        r.endpoint.slug == pinned and r.endpoint.provider_name == provider
        for r in request.plan.ranked
    )


def session_of(
    messages: Sequence[Message], params: Mapping[str, Any], digest_key: bytes | None
) -> str | None:
    """The session a request belongs to: its ``session_id``, else (given the key that
    digests openers) its opener."""
    explicit = params.get("session_id")
    if explicit is not None:
        return check_session(explicit)
    return None if digest_key is None else conversation_session(messages, digest_key)
