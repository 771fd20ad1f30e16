"""Response caching (``X-OpenRouter-Cache: true``), as OpenRouter's guide describes it.

A request that opts in is looked up by API key, model, endpoint type, stream mode and
the SHA-256 of its body (whitespace ignored, key order kept: a reordered body is
another entry). A hit is answered from the entry without a provider: a new generation
id, every billable usage counter 0, cost 0, no ``openrouter_metadata``, a stream
replayed as the same SSE chunks. A miss is generated as usual and kept for its TTL if
it ended in a whole 200 answer. Identical requests in flight are not coalesced: each
misses and is billed. Off under account-level zero data retention.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from provider_router._json import loads
from provider_router.testing.chat import bodies

__all__ = [
    "AGE_HEADER",
    "CACHE_HEADER",
    "CLEAR_HEADER",
    "DEFAULT_TTL",
    "MAX_TTL",
    "SOURCE_HEADER",
    "STATUS_HEADER",
    "TTL_HEADER",
    "WHOLE",
    "CacheLookup",
    "Entry",
    "ResponseCache",
    "hit_headers",
    "kept_stream",
    "parse_ttl",
    "replay_json",
    "replay_stream",
]

CACHE_HEADER: Final = "X-OpenRouter-Cache"
TTL_HEADER: Final = "X-OpenRouter-Cache-TTL"
CLEAR_HEADER: Final = "X-OpenRouter-Cache-Clear"
STATUS_HEADER: Final = "X-OpenRouter-Cache-Status"
AGE_HEADER: Final = "X-OpenRouter-Cache-Age"
SOURCE_HEADER: Final = "X-OpenRouter-Cache-Source-Id"
"""The original generation's id on a hit: read by field clients, not in the docs (the
documented place is ``/generation``'s ``response_cache_source_id``)."""
DEFAULT_TTL: Final = 300
MIN_TTL: Final = 1
MAX_TTL: Final = 86_400
_DONE: Final = b"[DONE]"
WHOLE: Final = frozenset(("ok", "no_usage_cost"))
"""Outcomes of a whole answer (one without a cost in its usage is whole)."""


def parse_ttl(value: str | None) -> int:
    """Seconds an entry lives: the header's leading integer (``60abc`` is 60, ``1.5``
    is 1) clamped to [1, 86400]; absent or not numeric: the default, 300."""
    if value is None:
        return DEFAULT_TTL
    text = value.strip()
    sign = ""
    if text and text[0] in "+-":
        sign, text = text[0], text[1:]
    digits = ""
    for ch in text:
        if not ch.isdigit():
            break
        digits += ch
    if not digits:
        return DEFAULT_TTL
    seconds = int(sign + digits)
    return max(MIN_TTL, min(MAX_TTL, seconds))


@dataclass(slots=True)
class Entry:
    """One cached answer: what a hit replays, and what its ``/generation`` record says."""

    source_id: str
    stored_at: float
    ttl: int
    payload: bytes
    """The JSON body, or the stream's SSE bytes (keep-alive comments dropped)."""
    provider: str
    tag: str
    finish_reason: str


@dataclass(slots=True)
class CacheLookup:
    """What caching does to one request: its key and TTL, and the entry to replay if any."""

    key: bytes
    ttl: int
    hit: Entry | None = None
    age: int = 0

    def miss_headers(self) -> dict[str, str]:
        return {STATUS_HEADER: "MISS", TTL_HEADER: str(self.ttl)}


class ResponseCache:
    """Cached answers by key, oldest first, at most ``limit`` (older ones are evicted
    early, as the guide allows); and which hit replayed which generation."""

    def __init__(self, limit: int, *, enabled: bool = True) -> None:
        self.enabled = enabled
        """False under account-level zero data retention: nothing is cached."""
        self._limit = max(1, limit)
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self._sources: OrderedDict[str, str] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.hit_cost = True
        """Whether a hit's ``usage`` says ``cost: 0`` (False: no cost field, the other
        reading of docs that show no hit body)."""

    def lookup(
        self,
        headers: Mapping[str, str],
        key_label: str,
        model: str,
        stream: bool,
        body: Any,
        now: float,
    ) -> CacheLookup | None:
        """None when the request does not opt in (or caching is off); else its key,
        TTL and, on a hit, the entry (``X-OpenRouter-Cache-Clear: true`` drops it first)."""
        if not self.enabled or headers.get(CACHE_HEADER, "").strip().lower() != "true":
            return None
        ttl = parse_ttl(headers.get(TTL_HEADER))
        # Whitespace is not part of the key, the order of the keys is.
        digest = hashlib.sha256(bodies.dumps(body)).hexdigest()
        key = "\0".join((key_label, model, "chat", "stream" if stream else "json", digest))
        lookup = CacheLookup(key.encode(), ttl)
        if headers.get(CLEAR_HEADER, "").strip().lower() == "true":
            self._entries.pop(lookup.key, None)
            self.misses += 1
            return lookup
        entry = self._entries.get(lookup.key)
        if entry is not None and now - entry.stored_at >= entry.ttl:
            del self._entries[lookup.key]
            entry = None
        if entry is None:
            self.misses += 1
            return lookup
        self.hits += 1
        lookup.hit = entry
        lookup.age = int(now - entry.stored_at)
        return lookup

    def store(self, lookup: CacheLookup, entry: Entry) -> None:
        """Keep a whole 200 answer for ``lookup``'s TTL (a later one replaces it)."""
        entries = self._entries
        entries.pop(lookup.key, None)
        if len(entries) >= self._limit:
            entries.popitem(last=False)
        entries[lookup.key] = entry

    def replayed(self, gen_id: str, source_id: str) -> None:
        """Remember that hit ``gen_id`` replayed ``source_id`` (for ``/generation``)."""
        if len(self._sources) >= self._limit:
            self._sources.popitem(last=False)
        self._sources[gen_id] = source_id

    def source_of(self, gen_id: str) -> str | None:
        """``response_cache_source_id``: the generation a hit replayed, else None."""
        return self._sources.get(gen_id)

    def __len__(self) -> int:
        return len(self._entries)


def hit_headers(lookup: CacheLookup, gen_id: str) -> dict[str, str]:
    entry = lookup.hit
    assert entry is not None
    return {
        "X-Generation-Id": gen_id,
        STATUS_HEADER: "HIT",
        AGE_HEADER: str(lookup.age),
        TTL_HEADER: str(max(0, entry.ttl - lookup.age)),
        SOURCE_HEADER: entry.source_id,
    }


def _zeroed(value: Any) -> Any:
    """Every number in a usage object set to 0 (a hit bills nothing); flags kept."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return 0
    if isinstance(value, dict):
        return {k: _zeroed(v) for k, v in value.items()}
    return value


def _rewrite(payload: dict[str, Any], gen_id: str, created: int, with_cost: bool) -> dict[str, Any]:
    payload["id"] = gen_id
    if "created" in payload:
        payload["created"] = created
    usage = payload.get("usage")
    if isinstance(usage, dict):
        payload["usage"] = usage = _zeroed(usage)
        if not with_cost:
            usage.pop("cost", None)
            usage.pop("cost_details", None)
    payload.pop("openrouter_metadata", None)
    return payload


def replay_json(entry: Entry, gen_id: str, with_cost: bool = True) -> bytes:
    """The cached JSON answer with a new id and time, usage zeroed."""
    return bodies.dumps(_rewrite(loads(entry.payload), gen_id, int(time.time()), with_cost))


def replay_stream(entry: Entry, gen_id: str, with_cost: bool = True) -> bytes:
    """The cached stream's events, each with the new id and time, usage zeroed."""
    created = int(time.time())
    out: list[bytes] = []
    for event in entry.payload.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        data = event[len(b"data: ") :]
        if data == _DONE:
            out.append(b"data: [DONE]\n\n")
            continue
        event_body = bodies.dumps(_rewrite(loads(data), gen_id, created, with_cost))
        out.append(b"data: " + event_body + b"\n\n")
    return b"".join(out)


def kept_stream(tap: list[bytes]) -> bytes | None:
    """A stream's bytes worth keeping: whole (ended by ``[DONE]``, no error chunk),
    without its keep-alive comments; None otherwise."""
    data = b"".join(tap)
    if not data.rstrip().endswith(b"data: [DONE]"):
        return None
    events = [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]
    if any(b'"error"' in e and b'"finish_reason":"error"' in e for e in events):
        return None
    return b"\n\n".join(events) + b"\n\n"
