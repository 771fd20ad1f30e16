"""OpenRouter's response cache, as a router uses it (docs/client.md, "Response caching").

A router whose headers send ``X-OpenRouter-Cache: true`` (``cache_headers(ttl)``)
opts in for every request: an answer
OpenRouter already gave to the same key, model, stream mode and body bytes comes back
free, marked ``X-OpenRouter-Cache-Status: HIT``. Two samples of one prompt would send
the same bytes and get the same answer back, so each request's body carries a sample
id derived from its label (the prompt's key): a re-sent prompt sends the same bytes
(and hits), two prompts never do. An unlabelled call gets a label of its own, so it
never hits. A hit is booked at $0 only when the answer says ``HIT``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from provider_router._exceptions import ConfigurationError

__all__ = [
    "CACHE_HEADER",
    "DEFAULT_TTL",
    "HIT",
    "MAX_TTL",
    "SAMPLE_FIELD",
    "STATUS_HEADER",
    "TTL_HEADER",
    "cache_headers",
    "cache_ttl_of",
    "with_sample_id",
]

CACHE_HEADER: Final = "X-OpenRouter-Cache"
TTL_HEADER: Final = "X-OpenRouter-Cache-TTL"
STATUS_HEADER: Final = "x-openrouter-cache-status"
"""The answer's verdict, ``HIT`` or ``MISS`` (lower case: how responses are read)."""
HIT: Final = "HIT"
DEFAULT_TTL: Final = 300
"""OpenRouter's default TTL in seconds, when the headers give none."""
MAX_TTL: Final = 86_400
SAMPLE_FIELD: Final = "provider_router_sample"
"""The ``metadata`` key that keeps two samples' bodies apart (OpenRouter's ``metadata``:
string pairs with no effect on the answer)."""
_METADATA_PAIRS: Final = 16


def cache_headers(ttl: int = DEFAULT_TTL) -> dict[str, str]:
    """The request headers that opt in for ``ttl`` seconds (1–86,400), for
    ``Router(headers=...)``.

    Raises:
        ConfigurationError: ``ttl`` is not a whole number of seconds in 1–86,400.
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TTL:
        raise ConfigurationError(
            f"the response cache's TTL must be whole seconds from 1 to {MAX_TTL:,}, got {ttl!r}"
        )
    return {CACHE_HEADER: "true", TTL_HEADER: str(ttl)}


def cache_ttl_of(headers: Mapping[str, str]) -> int | None:
    """The TTL a router's headers ask OpenRouter's response cache for, or None: they do
    not opt in (``X-OpenRouter-Cache: true``). A TTL read as OpenRouter reads it: its
    leading digits, clamped to 1–86,400; none: 300."""
    lowered = {name.lower(): value.strip() for name, value in headers.items()}
    if lowered.get(CACHE_HEADER.lower(), "").lower() != "true":
        return None
    digits = ""
    for ch in lowered.get(TTL_HEADER.lower(), ""):
        if not ch.isdigit():
            break
        digits += ch
    return max(1, min(MAX_TTL, int(digits))) if digits else DEFAULT_TTL


def with_sample_id(
    params: Mapping[str, Any], key: str, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``params`` with ``metadata`` carrying the sample id of ``key`` (a digest: the
    label itself never leaves the process), over the router's own ``metadata`` in
    ``defaults`` when the call gives none.

    Raises:
        ConfigurationError: the ``metadata`` is not an object or is already full.
    """
    metadata = params["metadata"] if "metadata" in params else defaults.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise ConfigurationError(f"metadata must be an object of strings, got {metadata!r}")
    if SAMPLE_FIELD not in metadata and len(metadata) >= _METADATA_PAIRS:
        raise ConfigurationError(
            f"metadata has {len(metadata)} pairs, OpenRouter's most: with response_cache "
            f"on, the router adds {SAMPLE_FIELD!r} (keep at most {_METADATA_PAIRS - 1})"
        )
    sample = hashlib.sha256(key.encode()).hexdigest()[:32]
    return {**params, "metadata": {**metadata, SAMPLE_FIELD: sample}}
