"""OpenRouter's provider sticky routing for prompt caching, as its docs describe it.

After a request that uses prompt caching, OpenRouter routes the same model's later
requests to the endpoint that served it, keeping the cache warm, when that endpoint's
cache-read price is below its prompt price (with a ``session_id``, whichever served
it). An unavailable sticky endpoint falls back as usual; ``provider.order`` turns
stickiness off; sessions expire after 10 minutes idle; ``session_id`` (body, else the
``x-session-id`` header) is the key. What the docs leave open is assumed
(docs/simulator.md, fidelity table): without ``session_id`` the key is the
conversation's opener per API key and model, and a ``sort`` turns stickiness off too.
At most ``capacity`` sessions are kept, the least recently used forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

from provider_router.testing.market.listing import EndpointSpec

__all__ = ["STICKY_IDLE_SECONDS", "StickyRoutes", "sticky_key"]

STICKY_IDLE_SECONDS: Final = 600.0
"""Sticky sessions expire after 10 minutes of inactivity (prompt-caching guide)."""

DEFAULT_STICKY_CAPACITY: Final = 100_000


def _opener(messages: Sequence[Any]) -> int | None:
    """A hash of the conversation's first message and first user message."""
    first = messages[0]
    parts: list[str] = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            parts.append(repr(message.get("content")))
            break
    if not parts:
        return None
    head = repr(first.get("content")) if isinstance(first, Mapping) else repr(first)
    return hash((head, parts[0]))


def sticky_key(
    key_label: str, model: str, body: Mapping[str, Any], header_session: str | None
) -> tuple[str, str, object] | None:
    """The sticky routing key of a request, or None when it has none."""
    session = body.get("session_id")
    if not isinstance(session, str) or not session:
        session = header_session or None
    if session is not None:
        return (key_label, model, session)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    opener = _opener(messages)
    return None if opener is None else (key_label, model, opener)


def caches_cheaper(endpoint: EndpointSpec) -> bool:
    """Whether stickiness may activate on ``endpoint``: cache reads cost less than prompts."""
    read = endpoint.cache_read_units
    return read is not None and read < endpoint.prompt_units


class StickyRoutes:
    """Which endpoint each sticky session is kept on, until it goes idle.

    Args:
        idle_seconds: simulated seconds of inactivity after which a session is forgotten.
        capacity: sessions kept (least recently used forgotten first).
    """

    __slots__ = ("_capacity", "_idle", "_routes")

    def __init__(
        self, idle_seconds: float = STICKY_IDLE_SECONDS, capacity: int = DEFAULT_STICKY_CAPACITY
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._idle = idle_seconds
        self._capacity = capacity
        # key -> (endpoint tag, simulated time of last use)
        self._routes: OrderedDict[tuple[str, str, object], tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._routes)

    def lookup(self, key: tuple[str, str, object], now: float) -> str | None:
        """The endpoint tag the session is kept on, or None (none, or idle too long)."""
        entry = self._routes.get(key)
        if entry is None:
            return None
        tag, last = entry
        if now - last >= self._idle:
            del self._routes[key]
            return None
        return tag

    def remember(
        self,
        key: tuple[str, str, object],
        endpoint: EndpointSpec,
        now: float,
        *,
        cache_hit: bool = False,
    ) -> None:
        """``endpoint`` served the session: keep it there.

        A conversation without ``session_id`` (its key's last part is the opener's
        hash, an int) is kept only after a cache hit (``cache_hit``), and only where
        caching makes it cheaper (the prompt-caching guide's activation rule).
        """
        if not isinstance(key[2], str) and not (cache_hit and caches_cheaper(endpoint)):
            return
        routes = self._routes
        routes[key] = (endpoint.tag, now)
        routes.move_to_end(key)
        while len(routes) > self._capacity:
            routes.popitem(last=False)

    def clear(self) -> None:
        """Forget every session."""
        self._routes.clear()


def stick(
    candidates: Sequence[EndpointSpec],
    tag: str | None,
    unstable_tags: frozenset[str] | set[str],
) -> Sequence[EndpointSpec]:
    """``candidates`` with the sticky endpoint first, when it is among them and stable."""
    if tag is None or tag in unstable_tags:
        return candidates
    for index, endpoint in enumerate(candidates):
        if endpoint.tag == tag:
            if index == 0 or endpoint.status < 0:
                return candidates
            return (endpoint, *candidates[:index], *candidates[index + 1 :])
    return candidates
